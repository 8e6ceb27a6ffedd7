"""Fixtures and helpers for idemproxy's integration tests.

Processes:
  stub       a running tests/support/stub_upstream (STUB_UPSTREAM_BIN)
  proxy      idemproxy (IDEMPROXY_BIN) in front of `stub`, one worker
  make_proxy factory: make_proxy(*extra_flags, upstream=..., env=...) -> Proxy

Every process is started on 127.0.0.1 with free ports, its stderr captured
to a file in tmp_path (printed at teardown: pytest shows it for failing
tests), stopped with SIGTERM by PID at teardown, and must then exit 0 with no
AddressSanitizer / LeakSanitizer / UBSan report.

Protocol helpers: RawConn speaks HTTP/1.1 over a plain socket and reads
responses framed by Content-Length, chunked or close, with interim 1xx.
"""
import http.client
import json
import os
import select
import signal
import socket
import subprocess
import threading
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

IDEMPROXY_BIN = os.environ.get("IDEMPROXY_BIN",
                               os.path.join(ROOT, "build", "proxy", "idemproxy"))
STUB_BIN = os.environ.get("STUB_UPSTREAM_BIN",
                          os.path.join(ROOT, "build", "tests", "support",
                                       "stub_upstream"))

SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                     "runtime error:")

PATTERN = b"abcdefghijklmnopqrstuvwxyz"


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "stores(*setups): the store setups a test runs with "
        "(default: memory, postgres, postgres+redis)")
    for path, what in ((IDEMPROXY_BIN, "IDEMPROXY_BIN"),
                       (STUB_BIN, "STUB_UPSTREAM_BIN")):
        if not os.access(path, os.X_OK):
            raise pytest.UsageError(
                f"{what}: {path} is not an executable; build first "
                f"(meson compile -C build) or set {what}")


# ---------------------------------------------------------------- helpers

def send_together(conns, raw, timeout=30.0):
    """Each of the connected RawConns sends `raw` at the same moment (a
    barrier); returns their responses in order and closes them."""
    import concurrent.futures as cf
    barrier = threading.Barrier(len(conns))

    def one(c):
        barrier.wait(timeout)
        c.send(raw)
        return c.read_response()

    try:
        with cf.ThreadPoolExecutor(len(conns)) as ex:
            return list(ex.map(one, conns))
    finally:
        for c in conns:
            c.close()


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


# ---------------------------------------------------------------- raw HTTP

class Response:
    def __init__(self):
        self.version = None
        self.status = None
        self.reason = None
        self.headers = []       # [(name, value)] in order, names as sent
        self.body = b""
        self.body_len = 0       # also set when a sink consumed the body
        self.interim = []       # [(status, headers)] of 1xx responses
        self.framing = None     # "length" | "chunked" | "close" | "none"
        self.complete = False   # body ended as framed (not cut short)

    def header(self, name, default=None):
        name = name.lower()
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return default

    def header_all(self, name):
        name = name.lower()
        return [v for k, v in self.headers if k.lower() == name]

    def has(self, name):
        return self.header(name) is not None

    def json(self):
        return json.loads(self.body)

    def connection_tokens(self):
        toks = []
        for v in self.header_all("Connection"):
            toks += [t.strip().lower() for t in v.split(",") if t.strip()]
        return toks

    def __repr__(self):
        return (f"<Response {self.status} {self.headers!r} "
                f"body={self.body[:300]!r}>")


class RawConn:
    """One client connection with a read buffer."""

    def __init__(self, port, timeout=10.0, host="127.0.0.1"):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.eof = False

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def settimeout(self, t):
        self.sock.settimeout(t)

    def send(self, data):
        if isinstance(data, str):
            data = data.encode("latin-1")
        self.sock.sendall(data)

    def _fill(self):
        """Read more into buf; False at EOF (or reset)."""
        if self.eof:
            return False
        try:
            data = self.sock.recv(1 << 20)
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def _read_line(self):
        while b"\r\n" not in self.buf:
            if not self._fill():
                raise EOFError("connection closed in a line: %r" % self.buf)
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _read_exact(self, n, sink=None):
        got = 0
        out = []
        while got < n:
            if not self.buf and not self._fill():
                raise EOFError(f"connection closed after {got} of {n} bytes")
            take = self.buf[:n - got]
            self.buf = self.buf[len(take):]
            got += len(take)
            if sink:
                sink(take)
            else:
                out.append(take)
        return b"".join(out)

    def read_head(self):
        """Status line and headers of the next message: (ver, status, reason, headers)."""
        while b"\r\n\r\n" not in self.buf:
            if not self._fill():
                if self.buf:
                    raise EOFError("connection closed in a head: %r" % self.buf)
                raise EOFError("connection closed before a response")
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        ver, status = parts[0], int(parts[1])
        reason = parts[2] if len(parts) > 2 else ""
        headers = []
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers.append((name, value.strip(" \t")))
        return ver, status, reason, headers

    def read_response(self, method="GET", sink=None, allow_truncated=False):
        """Read one final response (collecting 1xx into .interim).

        sink: called with each body piece instead of keeping the body.
        allow_truncated: a body cut short by EOF returns complete=False
        instead of raising.
        """
        r = Response()
        while True:
            r.version, r.status, r.reason, r.headers = self.read_head()
            if 100 <= r.status < 200 and r.status != 101:
                r.interim.append((r.status, r.headers))
                continue
            break
        pieces = []

        def keep(b):
            r.body_len += len(b)
            if sink:
                sink(b)
            else:
                pieces.append(b)

        te = ",".join(r.header_all("Transfer-Encoding")).lower()
        try:
            if method == "HEAD" or r.status in (204, 304):
                r.framing = "none"
            elif "chunked" in te:
                r.framing = "chunked"
                while True:
                    line = self._read_line()
                    size = int(line.split(b";")[0].strip(), 16)
                    if size == 0:
                        while self._read_line() != b"":
                            pass        # trailers
                        break
                    self._read_exact(size, keep)
                    if self._read_line() != b"":
                        raise AssertionError("bad chunk terminator")
            elif r.header("Content-Length") is not None:
                r.framing = "length"
                self._read_exact(int(r.header("Content-Length")), keep)
            else:
                r.framing = "close"
                while True:
                    if self.buf:
                        b, self.buf = self.buf, b""
                        keep(b)
                    if not self._fill():
                        break
            r.complete = True
        except EOFError:
            if not allow_truncated:
                raise
        r.body = b"".join(pieces)
        return r

    def request(self, method, target, headers=None, body=None,
                version="HTTP/1.1", host="example.test"):
        self.send(build_request(method, target, headers, body, version, host))
        return self.read_response(method)

    def wait_closed(self, timeout=5.0):
        """True when the peer closes (EOF or reset) within timeout, with no
        further data arriving; False on timeout."""
        deadline = time.monotonic() + timeout
        old = self.sock.gettimeout()
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.sock.settimeout(left)
                try:
                    data = self.sock.recv(65536)
                except socket.timeout:
                    return False
                except ConnectionResetError:
                    return True
                if not data:
                    self.eof = True
                    return True
                self.buf += data
        finally:
            self.sock.settimeout(old)


def build_request(method, target, headers=None, body=None,
                  version="HTTP/1.1", host="example.test"):
    """Bytes of a request. headers: list of (name, value); a Host header is
    added when absent unless host is None; Content-Length when body is bytes
    and no framing header was given."""
    headers = list(headers or [])
    names = {k.lower() for k, _ in headers}
    if host is not None and "host" not in names:
        headers.insert(0, ("Host", host))
    if isinstance(body, str):
        body = body.encode()
    if body is not None and "content-length" not in names \
            and "transfer-encoding" not in names:
        headers.append(("Content-Length", str(len(body))))
    out = f"{method} {target} {version}\r\n"
    out += "".join(f"{k}: {v}\r\n" for k, v in headers)
    out += "\r\n"
    return out.encode("latin-1") + (body or b"")


def chunked(body, size=4096):
    """body framed as chunks of `size`."""
    out = []
    for i in range(0, len(body), size):
        piece = body[i:i + size]
        out.append(b"%x\r\n" % len(piece) + piece + b"\r\n")
    out.append(b"0\r\n\r\n")
    return b"".join(out)


def request(port, method, target, headers=None, body=None, timeout=10.0,
            **kw):
    """One request on a fresh connection."""
    with RawConn(port, timeout=timeout) as c:
        return c.request(method, target, headers, body, **kw)


def upstream_echo(resp):
    """The stub's echo of what reached the upstream, with helpers."""
    assert resp.status is not None
    doc = resp.json()
    doc["hdict"] = {}
    for k, v in doc["headers"]:
        doc["hdict"].setdefault(k.lower(), []).append(v)
    return doc


def assert_problem(resp, status, slug):
    assert resp.status == status, resp
    ctype = (resp.header("Content-Type") or "").split(";")[0].strip()
    assert ctype == "application/problem+json", resp
    doc = resp.json()
    assert doc.get("type") == f"urn:idemproxy:problem:{slug}", doc
    assert doc.get("status") == status, doc
    assert isinstance(doc.get("title"), str) and doc["title"], doc
    assert "detail" in doc, doc
    return doc


def http_get(port, path, timeout=5.0):
    """(status, body) via http.client; raises on connection errors."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


# ---------------------------------------------------------------- processes

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
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("stub did not exit on SIGTERM")
        finally:
            self.proc.stdout.close()
            self._log.close()
        return rc

    def check_stopped(self):
        rc = self.stop()
        text = read_text(self.log_path)
        assert not sanitizer_report(text), text
        assert rc == 0, f"stub exited {rc}: {text}"


class Proxy:
    def __init__(self, tmp_path, upstream, *flags, env=None, workers=1,
                 name="idemproxy", wait_ready=True):
        self.port = free_port()
        self.admin_port = free_port()
        self.log_path = tmp_path / f"{name}.stderr"
        self.out_path = tmp_path / f"{name}.stdout"
        self._log = open(self.log_path, "wb")
        self._out = open(self.out_path, "wb")
        self.args = [IDEMPROXY_BIN]
        if upstream is not None:
            self.args += ["--upstream", upstream]
        self.args += ["--listen", f"127.0.0.1:{self.port}",
                      "--admin-listen", f"127.0.0.1:{self.admin_port}",
                      "--workers", str(workers)]
        self.args += list(flags)
        self.proc = subprocess.Popen(self.args, stdout=self._out,
                                     stderr=self._log, env=clean_env(env))
        self.pid = self.proc.pid
        self.stopped = False
        if wait_ready:
            self.wait_healthy()

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
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"idemproxy did not exit within {timeout}s "
                                 f"of SIGTERM\n{self.log()}")
        finally:
            self._log.close()
            self._out.close()
        return rc

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


@pytest.fixture
def stub(tmp_path):
    s = Stub(tmp_path)
    yield s
    print(f"--- stub stderr ---\n{read_text(s.log_path)}")
    s.check_stopped()


@pytest.fixture
def make_proxy(tmp_path, stub):
    """make_proxy(*flags, upstream=stub.url, env=None, workers=1)."""
    started = []

    def make(*flags, upstream=None, **kw):
        kw.setdefault("name", f"idemproxy{len(started)}")
        p = Proxy(tmp_path, stub.url if upstream is None else upstream,
                  *flags, **kw)
        started.append(p)
        return p

    yield make
    errors = []
    for p in started:
        try:
            p.check_stopped()
        except AssertionError as e:
            errors.append(str(e))
        finally:
            print(f"--- {p.log_path.name} ---\n{p.log()}")
    assert not errors, "\n".join(errors)


@pytest.fixture
def proxy(make_proxy):
    return make_proxy()


# ---------------------------------------------------------------- stores
#
# PostgreSQL 15 and Redis started by the tests (issue 4 "Tests"):
#
#   pg_server    session: a private PostgreSQL 15 cluster in a temp dir,
#                127.0.0.1 on a free port, fsync off; .stop() / .start() /
#                .crash() restart it on the same port mid-test
#   pg_db        per test: a fresh database t_<n> on it (.url, .psql(sql))
#   redis_server session: redis-server on a free port, no persistence;
#                .stop() / .kill() / .start() / .pause() / .resume()
#   redis        per test: redis_server running and flushed
#   store_setup  "memory" | "postgres" | "postgres+redis"; a test that uses
#                it (directly or through store_args) runs once per setup.
#                @pytest.mark.stores("memory", "postgres") narrows the set.
#   store_args   the proxy flags of the test's store setup
#   spawn_proxy  like make_proxy, but a proxy the test SIGKILLed (.kill())
#                is only checked for sanitizer reports at teardown
#
# Missing binaries (PostgreSQL 15's initdb, redis-server) skip the tests
# that need them. Every server is stopped by PID at the end of the session.

import itertools
import pwd
import shutil
import tempfile

PG_BINDIR = os.environ.get("PG_BINDIR", "/usr/lib/postgresql/15/bin")
REDIS_BIN = os.environ.get("REDIS_SERVER_BIN",
                           shutil.which("redis-server") or
                           "/usr/bin/redis-server")
PSQL_BIN = os.path.join(PG_BINDIR, "psql")

STORE_SETUPS = ("memory", "postgres", "postgres+redis")


def pytest_generate_tests(metafunc):
    if "store_setup" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("stores")
        setups = marker.args if marker else STORE_SETUPS
        for s in setups:
            assert s in STORE_SETUPS, s
        metafunc.parametrize("store_setup", setups, indirect=True)


class PgServer:
    """A private PostgreSQL cluster. As root, every pg binary runs as the
    postgres user through runuser, from cwd /; clients connect over TCP
    with trust auth as user postgres."""

    def __init__(self):
        self.base = tempfile.mkdtemp(prefix="ipg", dir="/tmp")   # short
        self.data = os.path.join(self.base, "d")
        self.sock = os.path.join(self.base, "s")
        self.log_path = os.path.join(self.base, "pg.log")
        self.port = free_port()
        self.as_pg = []
        os.makedirs(self.data)
        os.makedirs(self.sock)
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            for d in (self.base, self.data, self.sock):
                os.chown(d, pw.pw_uid, pw.pw_gid)
            self.as_pg = ["runuser", "-u", "postgres", "--"]
        os.chmod(self.data, 0o700)
        self._run([os.path.join(PG_BINDIR, "initdb"), "-D", self.data,
                   "-U", "postgres", "-A", "trust", "-E", "UTF8",
                   "--no-sync", "--no-instructions"], timeout=120)
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            f.write(f"\nport = {self.port}\n"
                    "listen_addresses = '127.0.0.1'\n"
                    f"unix_socket_directories = '{self.sock}'\n"
                    "max_connections = 300\n"
                    # fsync off survives a server crash (not an OS
                    # crash); synchronous_commit stays on so that an
                    # immediate stop loses no committed claim
                    "fsync = off\n"
                    "full_page_writes = off\n"
                    "log_min_messages = warning\nlog_checkpoints = off\n")
        self.start()

    def _run(self, argv, timeout=60, check=True):
        r = subprocess.run(self.as_pg + argv, cwd="/", capture_output=True,
                           timeout=timeout, env=clean_env())
        if check and r.returncode != 0:
            raise RuntimeError(f"{argv[0]} exited {r.returncode}: "
                               f"{r.stdout.decode()}{r.stderr.decode()}"
                               f"{read_text(self.log_path)[-3000:]}")
        return r

    def _pg_ctl(self, *args, timeout=60, check=True):
        return self._run([os.path.join(PG_BINDIR, "pg_ctl"), "-D", self.data,
                          *args], timeout=timeout, check=check)

    def postmaster_pid(self):
        try:
            with open(os.path.join(self.data, "postmaster.pid")) as f:
                return int(f.readline().strip())
        except (OSError, ValueError):
            return None

    def running(self):
        pid = self.postmaster_pid()
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False

    def start(self):
        """Start (or restart) on the same port; returns once it accepts."""
        self._pg_ctl("-w", "-t", "60", "-l", self.log_path, "start")
        deadline = time.monotonic() + 30
        while True:          # pg_ctl -w checks the socket; wait for TCP too
            try:
                socket.create_connection(("127.0.0.1", self.port), 1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self, mode="fast"):
        """pg_ctl stop: fast (disconnects clients, clean) or immediate
        (a crash: no shutdown checkpoint, recovery at the next start)."""
        self._pg_ctl("-w", "-t", "60", "-m", mode, "stop")

    def crash(self):
        self.stop("immediate")

    def ensure_running(self):
        if not self.running():
            self.start()

    def psql(self, sql, db="postgres", timeout=30, check=True):
        """Run sql with psql -Atc; returns stdout stripped."""
        r = subprocess.run(
            [PSQL_BIN, "-h", "127.0.0.1", "-p", str(self.port),
             "-U", "postgres", "-d", db, "-v", "ON_ERROR_STOP=1", "-Atqc",
             sql], capture_output=True, timeout=timeout,
            env=clean_env({"PGCONNECT_TIMEOUT": "5"}))
        if check and r.returncode != 0:
            raise RuntimeError(f"psql {sql!r}: {r.stderr.decode()}")
        return r.stdout.decode().strip()

    def url(self, db):
        return f"postgres://postgres@127.0.0.1:{self.port}/{db}"

    def shutdown(self):
        try:
            if self.running():
                self._pg_ctl("-w", "-t", "30", "-m", "immediate", "stop",
                             check=False)
        except subprocess.TimeoutExpired:
            pass
        pid = self.postmaster_pid()
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.base, ignore_errors=True)


class PgDb:
    def __init__(self, server, name):
        self.server = server
        self.name = name
        self.url = server.url(name)

    def psql(self, sql, **kw):
        return self.server.psql(sql, db=self.name, **kw)

    def count(self, where="true"):
        return int(self.psql(
            f"select count(*) from idempotency_keys where {where}"))

    def table_exists(self):
        return self.psql("select to_regclass('idempotency_keys') "
                         "is not null") == "t"


@pytest.fixture(scope="session")
def pg_server():
    if not os.access(os.path.join(PG_BINDIR, "initdb"), os.X_OK):
        pytest.skip(f"PostgreSQL 15 not installed ({PG_BINDIR}/initdb)")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("runuser missing: cannot run PostgreSQL as root")
    server = PgServer()
    try:
        yield server
    finally:
        server.shutdown()


_db_numbers = itertools.count(1)
_dbs_to_drop = []


@pytest.fixture
def pg_db(pg_server):
    """A fresh, empty database (no table: the proxy or migrate creates it).
    It is dropped when the next test asks for one: by then every proxy
    that used it has stopped (a drop at this fixture's teardown could run
    before the proxies' teardown and cut their connections)."""
    pg_server.ensure_running()
    while _dbs_to_drop:
        old = _dbs_to_drop.pop()
        pg_server.psql(f"drop database if exists {old} with (force)",
                       check=False)
    name = f"t_{next(_db_numbers)}"
    pg_server.psql(f"create database {name}")
    _dbs_to_drop.append(name)
    log_start = os.path.getsize(pg_server.log_path) \
        if os.path.exists(pg_server.log_path) else 0
    yield PgDb(pg_server, name)
    with open(pg_server.log_path, "rb") as f:
        f.seek(log_start)
        print(f"--- postgresql log ---\n"
              f"{f.read()[-4000:].decode('utf-8', 'replace')}")


def resp_command(port, *args, timeout=5.0):
    """One Redis command over a fresh connection (RESP2); returns the
    decoded reply (str/int/list/None); an error reply raises."""
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    with socket.create_connection(("127.0.0.1", port), timeout) as s:
        s.sendall(out)
        f = s.makefile("rb")

        def parse():
            line = f.readline()
            if not line:
                raise EOFError("redis closed the connection")
            kind, rest = line[:1], line[1:-2]
            if kind == b"+":
                return rest.decode()
            if kind == b"-":
                raise RuntimeError(rest.decode())
            if kind == b":":
                return int(rest)
            if kind == b"$":
                n = int(rest)
                if n < 0:
                    return None
                data = f.read(n + 2)[:-2]
                return data
            if kind == b"*":
                n = int(rest)
                return None if n < 0 else [parse() for _ in range(n)]
            raise RuntimeError(f"bad RESP: {line!r}")

        return parse()


class RedisServer:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="irds", dir="/tmp")
        self.log_path = os.path.join(self.dir, "redis.log")
        self.port = free_port()
        self.proc = None
        self.start()

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def start(self, timeout=15.0):
        assert self.proc is None or self.proc.poll() is not None
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [REDIS_BIN, "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--daemonize", "no",
             "--dir", self.dir],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=self.dir)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited "
                                   f"{self.proc.returncode}: "
                                   f"{read_text(self.log_path)[-2000:]}")
            try:
                if self.cmd("PING", timeout=1) == "PONG":
                    return
            except (OSError, EOFError, RuntimeError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not answer PING")
            time.sleep(0.02)

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def ensure_running(self):
        if not self.running():
            self.start()

    def _end(self, sig, timeout=15):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGCONT)   # in case it is paused
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()

    def stop(self):
        """SIGTERM (a clean shutdown; no persistence: data gone)."""
        self._end(signal.SIGTERM)

    def kill(self):
        self._end(signal.SIGKILL)

    def pause(self):
        """SIGSTOP: connections stay open, nothing answers (a slow Redis)."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self):
        self.proc.send_signal(signal.SIGCONT)

    def cmd(self, *args, timeout=5.0):
        return resp_command(self.port, *args, timeout=timeout)

    def shutdown(self):
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_server():
    if not os.access(REDIS_BIN, os.X_OK):
        pytest.skip(f"redis-server not installed ({REDIS_BIN})")
    server = RedisServer()
    try:
        yield server
    finally:
        server.shutdown()


@pytest.fixture
def redis(redis_server):
    """The session's Redis, running and empty."""
    redis_server.ensure_running()
    redis_server.cmd("FLUSHALL")
    yield redis_server
    try:
        redis_server.ensure_running()
    except Exception as e:
        print(f"redis restart: {e}")


@pytest.fixture
def store_setup(request):
    return request.param


@pytest.fixture
def store_args(store_setup, request):
    """Proxy flags for the test's store setup (a fresh database, a flushed
    Redis)."""
    if store_setup == "memory":
        return []
    db = request.getfixturevalue("pg_db")
    args = ["--store", db.url]
    if store_setup == "postgres+redis":
        args += ["--redis", request.getfixturevalue("redis").url]
    return args


def proxy_kill(p):
    """SIGKILL a Proxy (by PID) and reap it; teardown by spawn_proxy then
    only checks its log for sanitizer reports."""
    p.killed = True
    if p.proc.poll() is None:
        p.proc.send_signal(signal.SIGKILL)
    p.proc.wait(15)


@pytest.fixture
def spawn_proxy(tmp_path, stub):
    """spawn_proxy(*flags, upstream=stub.url, ...) -> Proxy, like
    make_proxy; a proxy ended with proxy_kill(p) is allowed a non-zero exit
    status."""
    started = []

    def make(*flags, upstream=None, **kw):
        kw.setdefault("name", f"idemproxy{len(started)}")
        p = Proxy(tmp_path, stub.url if upstream is None else upstream,
                  *flags, **kw)
        p.killed = False
        started.append(p)
        return p

    yield make
    errors = []
    for p in started:
        try:
            if p.killed:
                p.stop()
                text = p.log()
                if sanitizer_report(text):
                    errors.append(text)
            else:
                p.check_stopped()
        except AssertionError as e:
            errors.append(str(e))
        finally:
            print(f"--- {p.log_path.name} ---\n{p.log()}")
    assert not errors, "\n".join(errors)


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
