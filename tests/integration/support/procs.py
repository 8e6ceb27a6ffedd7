"""The processes under test and what is read from them.

Every process is started on 127.0.0.1 with free ports and its stderr
captured to a file; Stub and Proxy stop by PID with SIGTERM and then check
that the process exited 0 with no AddressSanitizer / LeakSanitizer / UBSan
report (check_stopped).
"""
import json
import os
import select
import signal
import socket
import subprocess
import threading
import time

from .http import RawConn, http_get

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))

IDEMPROXY_BIN = os.environ.get("IDEMPROXY_BIN",
                               os.path.join(ROOT, "build", "proxy", "idemproxy"))
STUB_BIN = os.environ.get("STUB_UPSTREAM_BIN",
                          os.path.join(ROOT, "build", "tests", "support",
                                       "stub_upstream"))

SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                     "runtime error:")

PATTERN = b"abcdefghijklmnopqrstuvwxyz"


_ports_given = set()


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago, and never handed
    out before in this run (the kernel may offer the same ephemeral port to
    two calls in a row, e.g. --listen and --admin-listen of one proxy)."""
    for _ in range(100):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        if port not in _ports_given:
            _ports_given.add(port)
            return port
    raise RuntimeError("no fresh free port")


def clean_env(extra=None):
    """The environment without IDEMPROXY_* variables, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("IDEMPROXY_")}
    env.setdefault("ASAN_OPTIONS", "detect_leaks=1")
    env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1")
    env.update(extra or {})
    return env


def sanitizer_report(text):
    return [m for m in SANITIZER_MARKERS if m in text]


def read_text(path):
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""


def pattern_bytes(offset, n):
    """n bytes of the stub's body pattern starting at `offset`."""
    start = offset % 26
    reps = (start + n) // 26 + 1
    return (PATTERN * reps)[start:start + n]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


class RssSampler:
    """Samples a process's VmRSS every 50 ms in a thread; .peak_kib."""

    def __init__(self, pid):
        self.pid = pid
        self.base_kib = rss_kib(pid)
        self.peak_kib = self.base_kib
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.05):
            try:
                self.peak_kib = max(self.peak_kib, rss_kib(self.pid))
            except (OSError, RuntimeError):
                return

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    @property
    def growth_mib(self):
        return (self.peak_kib - self.base_kib) / 1024.0


def sigterm_and_wait(proc, timeout, files, what):
    """SIGTERM `proc` (unless it has exited) and wait up to `timeout`;
    returns its exit code. One that does not exit is SIGKILLed and reaped,
    then AssertionError(what()). `files` are closed either way."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(what())
    finally:
        for f in files:
            f.close()


class Stub:
    def __init__(self, tmp_path, port=0, name="stub"):
        self.log_path = tmp_path / f"{name}.stderr"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [STUB_BIN, "--listen", f"127.0.0.1:{port}"],
            stdout=subprocess.PIPE, stderr=self._log, env=clean_env())
        ready, _, _ = select.select([self.proc.stdout], [], [], 15)
        line = self.proc.stdout.readline().decode() if ready else ""
        if not line.startswith("listening 127.0.0.1:"):
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"stub did not start: {line!r} "
                               f"{read_text(self.log_path)}")
        self.port = int(line.strip().rsplit(":", 1)[1])
        self.stopped = False

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def stats(self):
        status, body = http_get(self.port, "/__stats")
        assert status == 200
        return json.loads(body)

    def reset(self):
        with RawConn(self.port) as c:
            r = c.request("POST", "/__reset", body=b"")
            assert r.status == 200

    def stop(self, timeout=15):
        """SIGTERM, wait; returns the exit code. Asserts no sanitizer report."""
        if self.stopped:
            return self.proc.returncode
        self.stopped = True
        return sigterm_and_wait(self.proc, timeout,
                                (self.proc.stdout, self._log),
                                lambda: "stub did not exit on SIGTERM")

    def check_stopped(self):
        rc = self.stop()
        text = read_text(self.log_path)
        assert not sanitizer_report(text), text
        assert rc == 0, f"stub exited {rc}: {text}"


def with_hosts_file(hosts, argv, resolv=None):
    """argv run with `hosts` in place of /etc/hosts (and `resolv`, if
    given, in place of /etc/resolv.conf): a private mount namespace
    (unshare -m, as root) whose files are bind mounts of them. The shell
    execs argv, so the PID is argv's. Nothing outside changes."""
    return ["unshare", "-m", "sh", "-c",
            'mount --bind "$0" /etc/hosts && '
            '{ [ "$1" = - ] || mount --bind "$1" /etc/resolv.conf; } && '
            'shift && exec "$@"', str(hosts),
            str(resolv) if resolv else "-"] + argv


class Proxy:
    def __init__(self, tmp_path, upstream, *flags, env=None, workers=1,
                 name="idemproxy", wait_ready=True, hosts=None,
                 resolv=None, listen_host="127.0.0.1"):
        self.port = free_port()
        self.admin_port = free_port()
        self.log_path = tmp_path / f"{name}.stderr"
        self.out_path = tmp_path / f"{name}.stdout"
        self._log = open(self.log_path, "wb")
        self._out = open(self.out_path, "wb")
        self.args = [IDEMPROXY_BIN]
        if upstream is not None:
            self.args += ["--upstream", upstream]
        self.args += ["--listen", f"{listen_host}:{self.port}",
                      "--admin-listen", f"{listen_host}:{self.admin_port}",
                      "--workers", str(workers)]
        self.args += list(flags)
        argv = self.args if hosts is None else with_hosts_file(
            hosts, self.args, resolv)
        self.proc = subprocess.Popen(argv, stdout=self._out,
                                     stderr=self._log, env=clean_env(env))
        self.pid = self.proc.pid
        self.stopped = False
        if wait_ready:
            try:
                self.wait_healthy()
            except BaseException:
                # nobody holds this Proxy to stop it later
                self.proc.kill()
                self.proc.wait()
                raise

    def log(self):
        return read_text(self.log_path)

    def wait_healthy(self, timeout=15.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"idemproxy exited {self.proc.returncode} at start: "
                    f"{self.args}\n{self.log()}")
            try:
                status, _ = http_get(self.admin_port, "/healthz", timeout=1)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"idemproxy not healthy in {timeout}s\n{self.log()}")

    def metrics(self):
        status, body = http_get(self.admin_port, "/metrics")
        assert status == 200
        return body.decode()

    def signal(self, sig):
        self.proc.send_signal(sig)

    def stop(self, timeout=30):
        """SIGTERM (unless already exited), wait; returns the exit code."""
        if self.stopped:
            return self.proc.returncode
        self.stopped = True
        return sigterm_and_wait(
            self.proc, timeout, (self._log, self._out),
            lambda: f"idemproxy did not exit within {timeout}s of SIGTERM\n"
                    f"{self.log()}")

    def check_stopped(self):
        rc = self.stop()
        text = self.log()
        assert not sanitizer_report(text), text
        assert rc == 0, f"idemproxy exited {rc}\n{text}"


def metric_value(text, name, labels=None):
    """Sum of the samples of `name` whose labels include `labels` (dict)."""
    total = None
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        if "{" in series:
            mname, _, rest = series.partition("{")
            lab = dict(kv.split("=", 1) for kv in
                       rest.rstrip("}").split(",") if "=" in kv)
            lab = {k.strip(): v.strip().strip('"') for k, v in lab.items()}
        else:
            mname, lab = series, {}
        if mname != name:
            continue
        if labels and any(lab.get(k) != v for k, v in labels.items()):
            continue
        total = (total or 0.0) + float(value)
    return total


def proxy_kill(p):
    """SIGKILL a Proxy (by PID) and reap it; teardown by spawn_proxy then
    only checks its log for sanitizer reports."""
    p.killed = True
    if p.proc.poll() is None:
        p.proc.send_signal(signal.SIGKILL)
    p.proc.wait(15)


def readyz(p):
    """/readyz status of a Proxy (None when the admin port does not answer)."""
    try:
        return http_get(p.admin_port, "/readyz", timeout=2)[0]
    except OSError:
        return None


def wait_readyz(p, want=200, timeout=15.0):
    """Poll /readyz until it answers `want`; returns the elapsed seconds,
    raises AssertionError on timeout (the proxy's log attached)."""
    t0 = time.monotonic()
    while True:
        status = readyz(p)
        if status == want:
            return time.monotonic() - t0
        if p.proc.poll() is not None:
            raise AssertionError(f"idemproxy exited {p.proc.returncode}\n"
                                 f"{p.log()}")
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"/readyz still {status} (want {want}) "
                                 f"after {timeout}s\n{p.log()}")
        time.sleep(0.05)
