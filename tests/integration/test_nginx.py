"""nginx in front of two idemproxy instances sharing PostgreSQL (issue 6,
"nginx upstream chaining"; DESIGN.md §1 items 6, 9, 10; deploy/nginx/).

    client ──▶ nginx ──▶ idemproxy A ─┐
                    └─▶ idemproxy B ─┴─▶ stub (counts executions)
                 A and B share one PostgreSQL database (pg_db)

Every test runs a private nginx (Debian's /usr/sbin/nginx, or $NGINX_BIN)
in a temp dir. Its http{} block includes deploy/nginx/idemproxy.conf
rewritten only where a test must: the two `server 127.0.0.1:8080/8081`
lines get A's and B's ports, `listen 80` becomes a free 127.0.0.1 port
(the [::]:80 listener is dropped), and a test may override a directive's
value (`proxy_read_timeout` for the timeout retry). Everything else -- the
upstream block with keepalive, proxy_http_version, the X-Forwarded-*
headers, proxy_next_upstream -- is the shipped file. The wrapper adds only
the main-context settings (daemon off, one worker, pid/log/temp paths in
the temp dir) and an access log with $upstream_addr / $upstream_status, so
the tests can see which instance nginx tried and whether it retried.

Which instance nginx picks first: the shipped upstream is plain round-robin
with equal weights. In a freshly started nginx with one worker, the first
request goes to the first `server` (A): nginx's smooth weighted round-robin
starts every peer at current_weight 0 and picks the first of the equal
maxima. The retry tests therefore send their request as the first one
through a fresh nginx, and check the access log and both instances'
metrics to prove the path was A, then B.

nginx is stopped by PID (SIGQUIT, then SIGKILL of the master and its
workers) at teardown. Missing nginx skips the module.
"""
import concurrent.futures as cf
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

from support.http import RawConn, assert_problem, send_together, upstream_echo
from support.procs import (ROOT, clean_env, free_port, metric_value,
                           proxy_kill, read_text, wait_readyz)
from test_idempotency import (ORDER, assert_identical, assert_one_original,
                              executions, kreq, newkey, outcomes, replayed)

NGINX_BIN = os.environ.get("NGINX_BIN", shutil.which("nginx") or
                           "/usr/sbin/nginx")
SHIPPED_CONF = os.path.join(ROOT, "deploy", "nginx", "idemproxy.conf")

pytestmark = pytest.mark.skipif(not os.access(NGINX_BIN, os.X_OK),
                                reason=f"nginx not installed ({NGINX_BIN})")

# The client connects from another loopback address so that nginx's
# $remote_addr (the client) and idemproxy's peer address (nginx, which
# connects from 127.0.0.1) can be told apart in X-Forwarded-For.
CLIENT_ADDR = "127.0.0.2"


# ------------------------------------------------ nginx

def rewrite_shipped(text, listen_port, a_port, b_port, overrides=None):
    """The shipped site with the test's ports, and `overrides`
    ({directive: value}) applied to directives the file sets (a directive
    the file has commented out is enabled). Every substitution must match
    exactly once: a changed file fails here instead of being tested
    half-way."""
    def sub_once(pattern, repl, text, what):
        new, n = re.subn(pattern, repl, text, flags=re.M)
        assert n == 1, f"shipped nginx conf: {what} found {n} times"
        return new

    text = sub_once(r"^(\s*server\s+)127\.0\.0\.1:8080\b",
                    rf"\g<1>127.0.0.1:{a_port}", text, "server :8080")
    text = sub_once(r"^(\s*server\s+)127\.0\.0\.1:8081\b",
                    rf"\g<1>127.0.0.1:{b_port}", text, "server :8081")
    text = sub_once(r"^(\s*)listen\s+80\s*;",
                    rf"\g<1>listen 127.0.0.1:{listen_port};", text,
                    "listen 80")
    text = sub_once(r"^(\s*)listen\s+\[::\]:80\s*;", r"\g<1># (no IPv6)",
                    text, "listen [::]:80")
    for name, value in (overrides or {}).items():
        text = sub_once(rf"^(\s*)#?\s*{re.escape(name)}\s[^;]*;",
                        rf"\g<1>{name} {value};", text, name)
    return text


def shipped_directive(name):
    """Active values of `name` in the shipped file (comments stripped)."""
    out = []
    for line in read_text(SHIPPED_CONF).splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith(name + " ") or line.startswith(name + "\t"):
            out.append(line[len(name):].strip().rstrip(";").strip())
    return out


class Nginx:
    def __init__(self, a_port, b_port, overrides=None):
        self.dir = tempfile.mkdtemp(prefix="ingx", dir="/tmp")
        os.chmod(self.dir, 0o755)           # workers run as nobody as root
        self.port = free_port()
        self.error_log = os.path.join(self.dir, "error.log")
        self.access_log = os.path.join(self.dir, "access.log")
        site = rewrite_shipped(read_text(SHIPPED_CONF), self.port, a_port,
                               b_port, overrides)
        self.site_path = os.path.join(self.dir, "idemproxy.conf")
        with open(self.site_path, "w") as f:
            f.write(site)
        d = self.dir
        user = "user nobody nogroup;\n" if os.geteuid() == 0 else ""
        self.conf_path = os.path.join(d, "nginx.conf")
        with open(self.conf_path, "w") as f:
            f.write(f"""{user}daemon off;
master_process on;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log info;
events {{ worker_connections 512; }}
http {{
    log_format idem '$remote_addr "$request" $status '
                    'up="$upstream_addr" ups="$upstream_status" '
                    'rt=$request_time';
    access_log {d}/access.log idem;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    include {self.site_path};
}}
""")
        argv = [NGINX_BIN, "-p", d + "/", "-c", self.conf_path,
                "-e", self.error_log]
        t = subprocess.run(argv + ["-t"], capture_output=True, timeout=30,
                           env=clean_env())
        assert t.returncode == 0, \
            f"nginx -t failed:\n{t.stderr.decode()}\n{site}"
        self._out = open(os.path.join(d, "nginx.stderr"), "wb")
        self.proc = subprocess.Popen(argv, stdout=self._out,
                                     stderr=subprocess.STDOUT,
                                     env=clean_env())
        self.pid = self.proc.pid
        deadline = time.monotonic() + 15
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"nginx exited {self.proc.returncode}: "
                                     f"{self.log()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), 1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"nginx not listening: {self.log()}")
                time.sleep(0.05)

    def log(self):
        return (read_text(os.path.join(self.dir, "nginx.stderr")) +
                read_text(self.error_log))

    def access(self):
        return read_text(self.access_log).splitlines()

    def access_entries(self):
        """[(status, [upstream addrs], [upstream statuses])] in order."""
        out = []
        for line in self.access():
            m = re.search(r'" (\d{3}) up="([^"]*)" ups="([^"]*)"', line)
            if m:
                out.append((int(m.group(1)),
                            [x.strip() for x in m.group(2).split(",")],
                            [x.strip() for x in m.group(3).split(",")]))
        return out

    def wait_access(self, n, timeout=5.0):
        """The access log once it has n entries (written after the
        response)."""
        deadline = time.monotonic() + timeout
        while True:
            e = self.access_entries()
            if len(e) >= n or time.monotonic() > deadline:
                return e
            time.sleep(0.02)

    def _children(self):
        kids = set()
        try:
            for tid in os.listdir(f"/proc/{self.pid}/task"):
                with open(f"/proc/{self.pid}/task/{tid}/children") as f:
                    kids.update(int(x) for x in f.read().split())
        except OSError:
            pass
        return kids

    def stop(self):
        """SIGQUIT (graceful) by PID, then SIGKILL of the master and the
        workers it had."""
        kids = self._children()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                kids |= self._children()
                self.proc.kill()
                self.proc.wait()
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._out.close()


@pytest.fixture
def make_nginx():
    started = []

    def make(a, b, overrides=None):
        n = Nginx(a.port, b.port, overrides)
        started.append(n)
        return n

    yield make
    for n in started:
        n.stop()
        print(f"--- nginx {n.dir} ---\n{n.log()[-6000:]}\n"
              f"--- access log ---\n" + "\n".join(n.access()[-50:]))
        shutil.rmtree(n.dir, ignore_errors=True)


# ------------------------------------------------ clients

class Client(RawConn):
    """RawConn from CLIENT_ADDR."""

    def __init__(self, port, timeout=20.0):
        self.sock = socket.socket()
        self.sock.settimeout(timeout)
        self.sock.bind((CLIENT_ADDR, 0))
        self.sock.connect(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.eof = False


def npost(port, key, target="/orders", body=ORDER, headers=None,
          timeout=20.0):
    with Client(port, timeout) as c:
        c.send(kreq("POST", target, key, body, headers))
        return c.read_response()


def nburst(port, n, raw, timeout=30.0):
    conns = [Client(port, timeout) for _ in range(n)]
    return send_together(conns, raw, timeout)


def start_pair(spawn_proxy, pg_db, *flags, a_flags=(), b_flags=()):
    a = spawn_proxy("--store", pg_db.url, *flags, *a_flags, workers=2,
                    name="a")
    b = spawn_proxy("--store", pg_db.url, *flags, *b_flags, workers=2,
                    name="b")
    wait_readyz(a)
    wait_readyz(b)
    return a, b


def wait_executions(stub, n, timeout=3.0):
    deadline = time.monotonic() + timeout
    while executions(stub) < n:
        assert time.monotonic() < deadline, \
            f"{executions(stub)} executions, want {n}"
        time.sleep(0.01)


def total_outcomes(*ps):
    tot = {}
    for p in ps:
        for k, v in outcomes(p).items():
            tot[k] = tot.get(k, 0) + v
    return {k: v for k, v in tot.items() if v}


# ------------------------------------------------ the shipped file

def test_shipped_conf_retry_and_chaining_directives():
    """The directives the retry story and the chaining rely on are active
    in the shipped file (not only in comments)."""
    nu = shipped_directive("proxy_next_upstream")
    assert len(nu) == 1, nu
    conds = nu[0].split()
    assert {"error", "timeout", "non_idempotent"} <= set(conds), conds
    # an idemproxy 502/504 released a key the app may have executed
    assert not {"http_500", "http_502", "http_503", "http_504",
                "http_429"} & set(conds), conds
    assert shipped_directive("proxy_next_upstream_tries") == ["2"]
    assert shipped_directive("proxy_http_version") == ["1.1"]
    assert shipped_directive("proxy_set_header").count('Connection ""') == 1
    assert any(v.startswith("X-Forwarded-For $proxy_add_x_forwarded_for")
               for v in shipped_directive("proxy_set_header"))
    assert shipped_directive("keepalive") and \
        int(shipped_directive("keepalive")[0]) > 0
    # nginx must outlast idemproxy's own answers (defaults: 20s upstream
    # timeout, 10s wait timeout): an idemproxy 504 / 409 reaches the client
    [rt] = shipped_directive("proxy_read_timeout")
    assert rt.endswith("s") and int(rt[:-1]) > 20, rt
    # the keep-alive pool gives up before idemproxy's 60s idle timeout
    [kt] = shipped_directive("keepalive_timeout")
    assert kt.endswith("s") and int(kt[:-1]) < 60, kt


# ------------------------------------------------ (1) as direct requests

def test_e1_e2_e3_through_nginx(spawn_proxy, pg_db, stub, make_nginx):
    """The article's E1-E3 through nginx and two instances: the same
    results as direct requests to one instance."""
    a, b = start_pair(spawn_proxy, pg_db)
    ngx = make_nginx(a, b)

    # E1: 8 concurrent clicks, upstream 10 ms -> 1 execution, 8 identical
    key = newkey("e1")
    rs = nburst(ngx.port, 8, kreq("POST", "/orders?delay_ms=10", key, ORDER))
    assert all(r.status == 200 for r in rs), rs
    assert_identical(rs)
    assert_one_original(rs)
    assert upstream_echo(rs[0])["n"] == 1
    assert stub.stats()["keys"] == {key: 1}
    # nginx spread them over both instances (round-robin)
    e1 = ngx.wait_access(8)
    ups = {u[0] for _, u, _ in e1}
    assert ups == {f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"}, e1

    # E2: a payment callback delivered 5 times -> 1 execution
    body = b"out_trade_no=T20240101&trade_status=SUCCESS&total_amount=100.00"
    form = [("Content-Type", "application/x-www-form-urlencoded")]
    rs2 = [npost(ngx.port, "T20240101", "/pay/callback", body, form)
           for _ in range(5)]
    assert all(r.status == 200 for r in rs2), rs2
    assert_identical(rs2)
    assert not replayed(rs2[0])
    assert all(replayed(r) for r in rs2[1:])
    assert stub.stats()["keys"]["T20240101"] == 1

    # E3: 100 x the same key on one client connection -> 1 execution, 99
    # replays; the same key with another body -> 422
    key3 = newkey("e3")
    rs3 = []
    with Client(ngx.port) as c:
        for _ in range(100):
            c.send(kreq("POST", "/orders", key3, ORDER))
            rs3.append(c.read_response())
    assert all(r.status == 200 for r in rs3), [r.status for r in rs3]
    assert_identical(rs3)
    assert not replayed(rs3[0])
    assert sum(replayed(r) for r in rs3) == 99
    r = npost(ngx.port, key3, "/orders", b'{"item":"book","amount":999}')
    assert_problem(r, 422, "idempotency-key-mismatch")
    assert not replayed(r)
    assert stub.stats()["keys"][key3] == 1
    assert executions(stub) == 3

    # both instances served E3's requests, and replayed each other's work
    for p in (a, b):
        o = outcomes(p)
        assert o["replayed"] >= 40 and o["mismatch"] <= 1, (p.args, o)
    assert total_outcomes(a, b) == {"forwarded": 3, "replayed": 7 + 4 + 99,
                                    "mismatch": 1}
    # every request went to one instance, none was retried
    e3 = ngx.wait_access(8 + 5 + 101)
    assert all(len(up) == 1 for _, up, _ in e3), e3
    # nginx keeps idle connections to idemproxy open (the upstream
    # keepalive pool, HTTP/1.1, empty Connection header): after the
    # requests, both instances still hold client connections from nginx
    # (without the pool nginx closes each one after its response)
    conns = [metric_value(p.metrics(), "idemproxy_connections")
             for p in (a, b)]
    assert all(c is not None and 1 <= c <= 16 for c in conns), conns


def test_forwarded_headers_and_replay_marker_through_nginx(
        spawn_proxy, pg_db, stub, make_nginx):
    """X-Forwarded-For reaching the app is the chain client, nginx (each
    hop appends its peer); X-Forwarded-Proto / -Host set by nginx are kept
    by idemproxy; Idempotent-Replayed: true and the stored headers survive
    nginx."""
    a, b = start_pair(spawn_proxy, pg_db)
    ngx = make_nginx(a, b)
    key = newkey("xff")
    target = "/orders?status=201&header=X-Order:7"
    first = npost(ngx.port, key, target,
                  headers=[("X-Forwarded-For", "203.0.113.7")])
    assert first.status == 201 and not replayed(first), first
    echo = upstream_echo(first)
    h = echo["hdict"]
    # 203.0.113.7 (what the client claimed), 127.0.0.2 (the client, as
    # nginx saw it), 127.0.0.1 (nginx, as idemproxy saw it)
    assert h.get("x-forwarded-for") == \
        [f"203.0.113.7, {CLIENT_ADDR}, 127.0.0.1"], h
    assert h.get("x-forwarded-proto") == ["http"], h
    assert h.get("x-forwarded-host") == ["example.test"], h
    assert h.get("host") == ["example.test"], h
    assert h.get("idempotency-key") == [key], h
    assert "connection" not in h, h

    # a client without X-Forwarded-For: the chain starts at the client
    key2 = newkey("xff2")
    r = npost(ngx.port, key2)
    assert upstream_echo(r)["hdict"].get("x-forwarded-for") == \
        [f"{CLIENT_ADDR}, 127.0.0.1"]

    # replays, on whichever instance nginx picks, keep the marker and the
    # stored end-to-end headers
    for _ in range(4):
        d = npost(ngx.port, key, target,
                  headers=[("X-Forwarded-For", "203.0.113.7")])
        assert d.status == 201 and replayed(d), d
        assert d.header_all("Idempotent-Replayed") == ["true"], d
        assert d.header("X-Order") == "7", d
        assert d.body == first.body
    used = {u[0] for _, u, _ in ngx.wait_access(6)}
    assert used == {f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"}
    assert executions(stub) == 2


# ------------------------------------------------ (2) the retry story

def test_retry_after_nginx_timeout_replays_original(spawn_proxy, pg_db, stub,
                                                    make_nginx):
    """A is slow (stub delay 2 s) and nginx's proxy_read_timeout (1.5 s)
    fires: nginx retries the POST on B (proxy_next_upstream timeout
    non_idempotent). B finds A's claim in flight and waits; A, whose client
    (nginx) went away, finishes the exchange and completes the record
    (DESIGN §1 item 9); B replays it. The client gets the original
    response, the app executed it once.

    Timing: read timeout T = 1.5 s < delay D = 2 s, and B must answer
    within T of the retry, i.e. D - T + B's wake-up (NOTIFY, at worst the
    500 ms poll) < T. With T = 1 s and D = 2 s (the brief's numbers) B's
    replay could only arrive after nginx timed out on B too."""
    a, b = start_pair(spawn_proxy, pg_db)
    ngx = make_nginx(a, b, {"proxy_read_timeout": "1500ms"})
    key = newkey("tmo")
    target = "/orders?delay_ms=2000"
    t0 = time.monotonic()
    r = npost(ngx.port, key, target)            # the first request: to A
    took = time.monotonic() - t0
    [(status, addrs, ups)] = ngx.wait_access(1)
    assert addrs == [f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"], \
        (addrs, ups)
    assert ups == ["504", "200"], (addrs, ups)    # 504: nginx's own timeout
    assert r.status == 200, r
    echo = upstream_echo(r)
    assert echo["n"] == 1                          # the original execution
    assert replayed(r)                             # B replayed A's response
    assert executions(stub) == 1
    assert 1.9 < took < 3.0, took
    assert outcomes(a)["forwarded"] == 1
    assert outcomes(b)["replayed"] == 1 and outcomes(b)["forwarded"] == 0
    # the record is complete: the same response directly from either
    for p in (a, b):
        with RawConn(p.port) as c:
            d = c.request("POST", target,
                          [("Content-Type", "application/json"),
                           ("Idempotency-Key", key)], ORDER)
        assert d.status == 200 and replayed(d) and d.body == r.body
    assert executions(stub) == 1
    assert pg_db.count("state = 'completed'") == 1


KILL_FLAGS = ("--lease", "4s", "--upstream-timeout", "3s")


def kill_a_mid_request(a, b, stub, ngx, key, target):
    """Send the first request through nginx (to A), SIGKILL A once the
    stub holds it. Returns (future of the client's response, t_claim,
    executor)."""
    ex = cf.ThreadPoolExecutor(1)
    t_claim = time.monotonic()
    fut = ex.submit(npost, ngx.port, key, target, ORDER, None, 30.0)
    wait_executions(stub, 1, timeout=2.0)
    assert outcomes(b)["forwarded"] == 0        # it is A's
    proxy_kill(a)
    return fut, t_claim, ex


def test_retry_after_instance_killed_lease_holds_409(spawn_proxy, pg_db,
                                                     stub, make_nginx):
    """A is SIGKILLed while the app holds A's request (the app executed
    it; its response is lost with A). nginx sees the connection close
    before a response head (`error`) and retries the POST on B. B finds
    the key in flight under A's lease (4 s) and waits --wait-timeout
    (1 s, shorter than the lease, like the defaults 10 s < 30 s); the
    lease still holds, so B answers 409 request-in-progress, Retry-After: 1
    (DESIGN §1 items 6, 10), and nginx passes it on (409 is not a retry
    condition). No second execution while the lease holds. Once the lease
    ran out, the client's retry finds A's outcome unknown (the app may have
    executed it, and did): 502 outcome-unknown, replayed, and never a
    second execution (DESIGN §1 item 10, revised by issue 43)."""
    a, b = start_pair(spawn_proxy, pg_db, *KILL_FLAGS,
                      b_flags=("--wait-timeout", "1s"))
    ngx = make_nginx(a, b)
    key = newkey("kill409")
    target = "/orders?delay_ms=2000"
    fut, t_claim, ex = kill_a_mid_request(a, b, stub, ngx, key, target)
    with ex:
        r = fut.result(timeout=30)
    took = time.monotonic() - t_claim
    assert_problem(r, 409, "request-in-progress")
    assert r.header("Retry-After") == "1"
    assert 0.9 < took < 2.5, took                # B's wait, not the lease
    [(status, addrs, ups)] = ngx.wait_access(1)
    assert addrs == [f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"], \
        (addrs, ups)
    assert ups == ["502", "409"], (addrs, ups)   # 502: A closed, no head
    assert executions(stub) == 1
    assert pg_db.count("state = 'in_flight'") == 1

    # while the lease holds: still 409, still one execution (sent only if
    # B's 1 s wait ends well before the lease does)
    if time.monotonic() - t_claim < 2.4:
        r = npost(ngx.port, key, target)
        assert_problem(r, 409, "request-in-progress")
        assert executions(stub) == 1

    # after the lease: the outcome is unknown, never executed again
    while time.monotonic() - t_claim < 4.3:
        time.sleep(0.05)
    assert executions(stub) == 1
    r2 = npost(ngx.port, key, target)
    assert_problem(r2, 502, "outcome-unknown")
    assert replayed(r2), r2
    r3 = npost(ngx.port, key, target)
    assert replayed(r3) and r3.body == r2.body
    assert executions(stub) == 1
    assert pg_db.count("state = 'unknown'") == 1


def test_retry_after_instance_killed_waits_out_lease(spawn_proxy, pg_db,
                                                     stub, make_nginx):
    """As above, but B's --wait-timeout (8 s) outlasts A's lease (4 s): the
    retry nginx sent to B waits while the lease holds -- no execution --
    and when it runs out finds the outcome unknown (DESIGN §1 item 10,
    revised by issue 43): the client's single request gets 502
    outcome-unknown (the response died with A), and the app never runs
    it twice."""
    a, b = start_pair(spawn_proxy, pg_db, *KILL_FLAGS,
                      b_flags=("--wait-timeout", "8s"))
    ngx = make_nginx(a, b)
    key = newkey("killwait")
    target = "/orders?delay_ms=2000"
    fut, t_claim, ex = kill_a_mid_request(a, b, stub, ngx, key, target)
    with ex:
        while time.monotonic() - t_claim < 3.8:      # the lease holds
            assert executions(stub) == 1, "executed while the lease held"
            assert not fut.done(), fut.result()
            time.sleep(0.05)
        r = fut.result(timeout=30)
    took = time.monotonic() - t_claim
    assert_problem(r, 502, "outcome-unknown")
    assert replayed(r), r
    # lease 4 s + B's poll (<= 0.5 s), ASan slack
    assert 3.9 < took < 7.0, took
    [(status, addrs, ups)] = ngx.wait_access(1)
    assert addrs == [f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"], \
        (addrs, ups)
    assert ups == ["502", "502"], (addrs, ups)
    assert executions(stub) == 1
    d = npost(ngx.port, key, target)
    assert replayed(d) and d.body == r.body
    assert executions(stub) == 1


def test_retry_when_first_instance_is_down(spawn_proxy, pg_db, stub,
                                           make_nginx):
    """A is gone before the request (connection refused): the retry on B
    is the first and only execution."""
    a, b = start_pair(spawn_proxy, pg_db)
    ngx = make_nginx(a, b)
    proxy_kill(a)
    key = newkey("down")
    r = npost(ngx.port, key)
    assert r.status == 200 and not replayed(r), r
    assert upstream_echo(r)["n"] == 1
    [(status, addrs, ups)] = ngx.wait_access(1)
    assert addrs == [f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"], addrs
    assert ups == ["502", "200"], ups
    d = npost(ngx.port, key)
    assert replayed(d) and d.body == r.body
    assert executions(stub) == 1
