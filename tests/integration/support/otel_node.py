"""The traced upstream of the trace tests: tests/support/otel/upstream.js, a
node http server instrumented with the OpenTelemetry SDK for Node at the
versions pinned in tests/support/otel/package-lock.json, exporting over
OTLP/HTTP JSON (to a support.otlp.OtlpReceiver).

The packages are installed by support/npm.py, as test_sdk_errors.py's
SDKs: `npm ci --ignore-scripts` into <build>/tests/support/otel (or
IDEMPROXY_OTEL_DIR, or $XDG_CACHE_HOME/idemproxy/otel), never the source
tree, and again only when package.json or package-lock.json changed. To move the pins: edit
tests/support/otel/package.json, run `npm install --package-lock-only`
there and commit both files; the pinned versions run on node 18.19 (Debian
12's) and later.

Without node or npm, install_modules raises NodeUnavailable (the fixtures:
skip); a failing `npm ci` raises AssertionError (the fixtures: fail).

Functions, for any caller:
  otel_dir()                      where the packages are installed
  install_modules(dest=None)      -> the directory holding node_modules
  Upstream(log_dir, modules, endpoint=None, service_name=None, port=0,
           env=None, name="upstream")
                                  upstream.js running; .port, .url, .pid,
                                  .count(key), .log(), .stop(timeout),
                                  .check_stopped()
Fixtures (import them into a test module):
  otel_modules    session: install_modules(), or skip without node/npm
  otlp_receiver   a started support.otlp.OtlpReceiver, stopped after
  make_upstream   factory: make_upstream(endpoint=..., **kw) -> Upstream;
                  each stopped at teardown, which asserts exit 0
"""
import json
import os
import select
import signal
import subprocess
import urllib.parse
from pathlib import Path

import pytest

from . import npm
from .http import http_get
from .npm import NodeUnavailable, tools  # noqa: F401 (their API too)
from .otlp import OtlpReceiver
from .procs import ROOT, read_text

OTEL_SRC = Path(ROOT) / "tests" / "support" / "otel"
UPSTREAM_JS = OTEL_SRC / "upstream.js"
DEFAULT_SERVICE = "orders-upstream"


def otel_dir():
    """Where the packages are installed: never in the source tree."""
    return npm.install_dir("otel", "IDEMPROXY_OTEL_DIR")


def install_modules(dest=None):
    """`npm ci` of tests/support/otel into `dest` (default otel_dir())
    unless it already holds that install; returns the directory."""
    return npm.install(OTEL_SRC, dest or otel_dir())


def node_env(extra=None):
    """The environment for node: no HTTP proxy variables (the exporter
    talks to 127.0.0.1), no NODE_OPTIONS, no OTEL_* of the caller's; plus
    `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.lower().endswith("_proxy") and k != "NODE_OPTIONS"
           and not k.startswith("OTEL_")}
    env.update(extra or {})
    return env


class Upstream:
    """upstream.js on 127.0.0.1:`port` (0: ephemeral), its stderr in
    log_dir/<name>.stderr, exporting to `endpoint` (an OtlpReceiver's .url;
    None: no export) as service.name `service_name` (default
    orders-upstream). Started once it has printed its PORT line."""

    def __init__(self, log_dir, modules, endpoint=None, service_name=None,
                 port=0, env=None, name="upstream", start_timeout=15):
        node, _ = tools()
        self.name = name
        self.service_name = service_name or DEFAULT_SERVICE
        self.log_path = Path(log_dir) / f"{name}.stderr"
        self._log = open(self.log_path, "wb")
        extra = {"OTEL_SERVICE_NAME": self.service_name}
        if endpoint:
            extra["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = endpoint
        extra.update(env or {})
        self.proc = subprocess.Popen(
            [node, str(UPSTREAM_JS), str(port), str(modules)],
            stdout=subprocess.PIPE, stderr=self._log, env=node_env(extra))
        self.pid = self.proc.pid
        self.stopped = False
        ready, _, _ = select.select([self.proc.stdout], [], [], start_timeout)
        line = self.proc.stdout.readline().decode() if ready else ""
        if not line.startswith("PORT "):
            self.proc.kill()
            self.proc.wait()
            self._close()
            raise RuntimeError(f"upstream.js did not start: {line!r}\n"
                               f"{self.log()}")
        self.port = int(line.split()[1])

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def log(self):
        return read_text(self.log_path)

    def count(self, key):
        """How many times requests with Idempotency-Key `key` executed."""
        status, body = http_get(
            self.port, "/count?key=" + urllib.parse.quote(key, safe=""))
        assert status == 200, (status, body)
        return json.loads(body)["count"]

    def _close(self):
        for f in (self.proc.stdout, self._log):
            f.close()

    def stop(self, timeout=10):
        """SIGTERM by PID (it flushes its spans), wait up to `timeout`,
        then SIGKILL; returns the exit code (negative when killed)."""
        if self.stopped:
            return self.proc.returncode
        self.stopped = True
        try:
            if self.proc.poll() is None:
                os.kill(self.pid, signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                return self.proc.wait()
        finally:
            self._close()

    def check_stopped(self):
        rc = self.stop()
        assert rc == 0, f"{self.name} exited {rc}\n{self.log()}"


# ------------------------------------------------------------ fixtures

@pytest.fixture(scope="session")
def otel_modules():
    """The directory whose node_modules holds the pinned OpenTelemetry
    packages."""
    try:
        return install_modules()
    except NodeUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture
def otlp_receiver():
    with OtlpReceiver() as rx:
        yield rx


@pytest.fixture
def make_upstream(tmp_path, otel_modules):
    """make_upstream(endpoint=None, service_name=None, port=0, env=None,
    name=...) -> Upstream; every one stopped at teardown (exit 0
    asserted), its stderr printed."""
    started = []

    def make(endpoint=None, **kw):
        kw.setdefault("name", f"upstream{len(started)}")
        u = Upstream(tmp_path, otel_modules, endpoint, **kw)
        started.append(u)
        return u

    yield make
    errors = []
    for u in started:
        try:
            u.check_stopped()
        except AssertionError as e:
            errors.append(str(e))
        finally:
            print(f"--- {u.log_path.name} ---\n{u.log()}")
    assert not errors, "\n".join(errors)
