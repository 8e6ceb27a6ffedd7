"""Command line: bad values exit 2 with one line naming the option, before
anything listens; --help and --version print to stdout and exit 0."""
import re
import socket
import subprocess

import pytest

from support.http import request, upstream_echo
from support.procs import (IDEMPROXY_BIN, Proxy, clean_env, free_port,
                           sanitizer_report)


def run(args, env=None, timeout=15):
    return subprocess.run([IDEMPROXY_BIN] + args, capture_output=True,
                          env=clean_env(env), timeout=timeout)


def assert_usage_error(res, *names):
    err = res.stderr.decode(errors="replace")
    assert not sanitizer_report(err), err
    assert res.returncode == 2, (res.returncode, err, res.stdout)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line on stderr: {err!r}"
    assert any(n in lines[0] for n in names), \
        f"{lines[0]!r} does not name any of {names}"
    return lines[0]


BASE = ["--upstream", "http://127.0.0.1:9"]


@pytest.mark.parametrize("args,names", [
    (BASE + ["--ttl", "10x"], ("ttl",)),
    (BASE + ["--ttl", ""], ("ttl",)),
    (BASE + ["--lease", "-1s"], ("lease",)),
    (BASE + ["--max-body", "1GB?"], ("max-body", "max_body")),
    (BASE + ["--max-body", "12XiB"], ("max-body", "max_body")),
    (BASE + ["--workers", "0"], ("workers",)),
    (BASE + ["--workers", "two"], ("workers",)),
    (BASE + ["--in-flight", "maybe"], ("in-flight", "in_flight")),
    (BASE + ["--store-down", "sideways"], ("store-down", "store_down")),
    (BASE + ["--require-key", "perhaps"], ("require-key", "require_key")),
    (BASE + ["--bogus-flag", "1"], ("bogus-flag",)),
    (BASE + ["--listen"], ("listen",)),
    (BASE + ["--listen", "nonsense"], ("listen",)),
    (["--upstream", "ftp://127.0.0.1:9"], ("upstream",)),
    ([], ("upstream",)),
    (BASE + ["--lease", "1s", "--upstream-timeout", "2s"],
     ("lease", "upstream-timeout", "upstream_timeout")),
    (BASE + ["--config", "/nonexistent/idemproxy.ini"], ("config",)),
])
def test_bad_flags_exit_2(args, names):
    assert_usage_error(run(args), *names)


def test_bad_environment_value_exit_2():
    res = run(BASE, env={"IDEMPROXY_TTL": "forever"})
    assert_usage_error(res, "IDEMPROXY_TTL", "ttl")


def test_bad_environment_value_is_an_error_even_when_flag_overrides():
    res = run(BASE + ["--ttl", "1h"], env={"IDEMPROXY_TTL": "forever"})
    assert_usage_error(res, "IDEMPROXY_TTL", "ttl")


def test_bad_config_file_value_exit_2(tmp_path):
    cfg = tmp_path / "bad.ini"
    cfg.write_text("[idemproxy]\nupstream = http://127.0.0.1:9\nmax_body = lots\n")
    res = run(["--config", str(cfg)])
    assert_usage_error(res, "max_body", "max-body")


def test_bad_value_exits_before_listening():
    port = free_port()
    res = run(BASE + ["--listen", f"127.0.0.1:{port}", "--ttl", "bad"])
    assert res.returncode == 2
    # the port is still free: nothing was bound
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.close()


def test_help():
    res = run(["--help"])
    assert res.returncode == 0
    out = res.stdout.decode()
    for opt in ("--upstream", "--listen", "--store", "--ttl", "--lease",
                "--upstream-timeout", "--max-body", "--drain-timeout",
                "IDEMPROXY_UPSTREAM"):
        assert opt in out, opt
    assert not sanitizer_report(res.stderr.decode())


def test_version():
    res = run(["--version"])
    assert res.returncode == 0
    assert re.search(r"\d+\.\d+\.\d+", res.stdout.decode()), res.stdout
    assert not sanitizer_report(res.stderr.decode())


def test_check_config(tmp_path):
    cfg = tmp_path / "ok.ini"
    cfg.write_text("[idemproxy]\nupstream = http://127.0.0.1:9\nttl = 2h\n")
    res = run(["--check-config", str(cfg)])
    assert res.returncode == 0, res.stderr
    out = res.stdout.decode()
    assert "http://127.0.0.1:9" in out
    assert not sanitizer_report(res.stderr.decode())


def test_environment_configures_the_proxy(tmp_path, stub):
    """IDEMPROXY_UPSTREAM alone is enough to run."""
    p = Proxy(tmp_path, None, env={"IDEMPROXY_UPSTREAM": stub.url})
    try:
        r = request(p.port, "GET", "/env")
        assert upstream_echo(r)["target"] == "/env"
    finally:
        p.check_stopped()


def test_config_file_configures_the_proxy(tmp_path, stub):
    cfg = tmp_path / "run.ini"
    cfg.write_text(f"[idemproxy]\nupstream = {stub.url}\n")
    p = Proxy(tmp_path, None, "--config", str(cfg))
    try:
        r = request(p.port, "GET", "/cfg")
        assert upstream_echo(r)["target"] == "/cfg"
    finally:
        p.check_stopped()


def test_flag_overrides_environment(tmp_path, stub):
    p = Proxy(tmp_path, stub.url, env={"IDEMPROXY_UPSTREAM":
                                       "http://127.0.0.1:9"})
    try:
        assert request(p.port, "GET", "/flag").status == 200
    finally:
        p.check_stopped()
