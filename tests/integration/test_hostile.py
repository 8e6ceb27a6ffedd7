"""Hostile input and broken upstreams (issue 11, DESIGN.md §7): a keyed
request is never sent twice by the proxy, a response cut after its status
is never a release, routes cannot be bypassed by spelling the path another
way, no smuggling through transfer codings or trailers, the proxy's own
fields stay its own, keys of different routes never meet, a half-closed
client gets its whole replay, a HEAD replay keeps its Content-Length.

Executions are counted by the stub (GET /__stats) or by a tiny broken
upstream written here.
"""
import hashlib
import hmac
import socket
import threading
import time
import uuid

import pytest

from support.http import (RawConn, assert_problem, build_request, chunked,
                          request, upstream_echo)
from support.procs import RssSampler, wait_readyz
from support.silent import SilentServer
from test_streaming import SMALL_QUARANTINE

GH_SECRET = "hostile-secret"
HOOK_INI = """
[route hook]
match = POST /hooks/github
key = header:X-GitHub-Delivery
verify = hmac-sha256
verify_secret_env = HOOK_SECRET
[route pay]
match = POST /pay
key = json:/id
key_prefix = pay:
"""


def newkey(p="h"):
    return f"{p}-{uuid.uuid4()}"


def kpost(port, target, key, body=b'{"a":1}', headers=None, method="POST"):
    hs = [("Content-Type", "application/json")]
    if key is not None:
        hs.append(("Idempotency-Key", key))
    return request(port, method, target, headers=hs + (headers or []),
                   body=body)


def executions(stub, key=None):
    st = stub.stats()
    return st["requests"] if key is None else st["keys"].get(key, 0)


@pytest.fixture
def hooked(tmp_path, make_proxy):
    path = tmp_path / "hook.ini"
    path.write_text(HOOK_INI)
    return make_proxy("--config", str(path), env={"HOOK_SECRET": GH_SECRET})


# ---- 1. never sent twice ------------------------------------------------

def test_keyed_request_never_resent_after_upstream_drop(proxy, stub):
    """The upstream reads the request on a pooled connection and closes
    without answering: 502 outcome-unknown, and the request reached the
    upstream once; a retry is never forwarded (issue 43)."""
    assert kpost(proxy.port, "/warm", newkey()).status == 200  # a pooled conn
    key = newkey("drop")
    r = kpost(proxy.port, "/orders?drop=1", key)
    assert_problem(r, 502, "outcome-unknown")
    assert_problem(kpost(proxy.port, "/orders?drop=1", key), 502,
                   "outcome-unknown")
    time.sleep(0.3)
    assert executions(stub, key) == 1


class CutUpstream:
    """Answers every request with a 200 head promising 100 bytes, sends 10
    and closes; counts what it received."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.hits = 0
        self.stop = False
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def run(self):
        self.sock.settimeout(0.2)
        while not self.stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            with c:
                c.settimeout(2)
                data = b""
                try:
                    while b"\r\n\r\n" not in data:
                        chunk = c.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                    head, _, rest = data.partition(b"\r\n\r\n")
                    n = 0
                    for line in head.split(b"\r\n"):
                        if line.lower().startswith(b"content-length:"):
                            n = int(line.split(b":")[1])
                    while len(rest) < n:
                        chunk = c.recv(65536)
                        if not chunk:
                            break
                        rest += chunk
                    self.hits += 1
                    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n"
                              b"\r\n0123456789")
                except OSError:
                    pass

    def close(self):
        self.stop = True
        self.t.join(2)
        self.sock.close()


def test_response_cut_after_status_is_never_released(make_proxy):
    up = CutUpstream()
    try:
        p = make_proxy(upstream=up.url)
        key = newkey("cut")
        with RawConn(p.port, timeout=10) as c:
            c.send(build_request("POST", "/o", [("Idempotency-Key", key)],
                                 b"x"))
            try:        # a cut response, or the connection cut at once
                r = c.read_response(allow_truncated=True)
                assert r.status == 200 and len(r.body) < 100
            except EOFError:
                pass
        time.sleep(0.5)
        again = request(p.port, "POST", "/o",
                        headers=[("Idempotency-Key", key)], body=b"x")
        assert up.hits == 1, "executed again after a cut response"
        assert again.header("Idempotent-Replayed") == "true"
        assert_problem(again, 502, "upstream-unavailable")
        assert "cut short" in again.json()["detail"]
    finally:
        up.close()


# ---- 3. routes match the path that is forwarded ---------------------------

def forged(port, target):
    body = b'{"action":"paid"}'
    return request(port, "POST", target, headers=[
        ("X-GitHub-Delivery", newkey("d")),
        ("X-Hub-Signature-256", "sha256=" + "0" * 64),
        ("Content-Type", "application/json")], body=body)


@pytest.mark.parametrize("target", [
    "http://example.test/hooks/github",
    "//hooks/github", "/hooks//github", "/hooks/github/",
    "/hooks;v=1/github", "/hooks/github;x", "/%68ooks/github",
    "/hooks/git%68ub?x=1"])
def test_route_cannot_be_bypassed(hooked, stub, target):
    before = executions(stub)
    r = forged(hooked.port, target)
    assert_problem(r, 401, "signature-invalid")
    assert executions(stub) == before


@pytest.mark.parametrize("target", [
    "/hooks/./github", "/x/../hooks/github", "/hooks/%2e%2e/hooks/github",
    "/hooks%2fgithub", "/hooks%5Cgithub"])
def test_ambiguous_paths_refused_where_routes_apply(hooked, stub, target):
    before = executions(stub)
    r = forged(hooked.port, target)
    assert_problem(r, 400, "bad-request")
    assert executions(stub) == before


def test_good_signature_through_absolute_form(hooked, stub):
    body = b'{"action":"paid"}'
    sig = hmac.new(GH_SECRET.encode(), body, hashlib.sha256).hexdigest()
    r = request(hooked.port, "POST", "http://example.test/hooks/github",
                headers=[("X-GitHub-Delivery", newkey("d")),
                         ("X-Hub-Signature-256", "sha256=" + sig),
                         ("Content-Type", "application/json")], body=body)
    assert r.status == 200
    assert upstream_echo(r)["target"] == "/hooks/github"


# ---- 4. transfer codings ---------------------------------------------------

@pytest.mark.parametrize("te", ["gzip", "x", "gzip, chunked", "chunked, gzip",
                                "chunked, chunked"])
def test_transfer_coding_other_than_chunked_refused(proxy, stub, te):
    before = executions(stub)
    smuggled = b"POST /smuggled HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
    with RawConn(proxy.port) as c:
        c.send(b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
               + te.encode() + b"\r\n\r\n" + smuggled)
        r = c.read_response()
        assert_problem(r, 400, "bad-request")
        assert "close" in r.connection_tokens()
        c.wait_closed()
    assert executions(stub) == before


def test_http10_chunked_request_closes_after(proxy):
    with RawConn(proxy.port) as c:
        c.send(b"POST /a HTTP/1.0\r\nConnection: keep-alive\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
        r = c.read_response()
        assert r.status == 200
        assert upstream_echo(r)["body"] == "abc"
        c.wait_closed()


# ---- 5. trailers never become fields ----------------------------------------

@pytest.mark.parametrize("keyed", [True, False])
def test_trailers_never_become_headers(proxy, keyed):
    hs = [("Transfer-Encoding", "chunked")]
    if keyed:
        hs.append(("Idempotency-Key", newkey("tr")))
    raw = build_request("POST", "/t", hs, None)
    raw += (b"5\r\nhello\r\n0\r\nX-User-Id: admin\r\nHost: evil.example\r\n"
            b"Idempotency-Key: other\r\n\r\n")
    with RawConn(proxy.port) as c:
        c.send(raw)
        r = c.read_response()
    assert r.status == 200
    doc = upstream_echo(r)
    assert doc["body"] == "hello"
    assert "x-user-id" not in doc["hdict"]
    assert doc["hdict"]["host"] != ["evil.example"]
    assert len(doc["hdict"].get("idempotency-key", [])) == (1 if keyed else 0)


# ---- 6. the proxy's own fields ----------------------------------------------

def test_connection_cannot_remove_host_or_forwarded_fields(proxy):
    r = request(proxy.port, "GET", "/c", headers=[
        ("Host", "app.example"), ("X-Forwarded-Proto", "https"),
        ("Connection", "host, x-forwarded-proto, x-forwarded-for, x-drop"),
        ("X-Drop", "1")])
    h = upstream_echo(r)["hdict"]
    assert h["host"] == ["app.example"]
    assert h["x-forwarded-proto"] == ["https"]
    assert h["x-forwarded-for"] == ["127.0.0.1"]
    assert "x-drop" not in h


# ---- 7. namespaces -------------------------------------------------------------

def test_plain_key_cannot_preoccupy_a_callback_key(hooked, stub):
    n = uuid.uuid4().hex
    squat = kpost(hooked.port, "/orders", f"pay:{n}", body=b'{"x":1}')
    assert squat.status == 200
    cb = request(hooked.port, "POST", "/pay", headers=[
        ("Content-Type", "application/json")],
        body=b'{"id":"' + n.encode() + b'","paid":true}')
    assert cb.status == 200 and cb.header("Idempotent-Replayed") is None
    assert executions(stub, f"pay:{n}") == 1     # the squatter's only
    again = request(hooked.port, "POST", "/pay", headers=[
        ("Content-Type", "application/json")],
        body=b'{"id":"' + n.encode() + b'","paid":true}')
    assert again.header("Idempotent-Replayed") == "true"


# ---- 11. half-close -------------------------------------------------------------

def test_half_closed_client_gets_whole_replay(proxy):
    key = newkey("big")
    target = "/big?bytes=3000000"
    first = kpost(proxy.port, target, key)
    assert first.status == 200 and len(first.body) == 3000000
    with RawConn(proxy.port, timeout=20) as c:
        c.send(build_request("POST", target, [
            ("Idempotency-Key", key), ("Content-Type", "application/json")],
            b'{"a":1}'))
        c.sock.shutdown(socket.SHUT_WR)
        r = c.read_response()
    assert r.header("Idempotent-Replayed") == "true"
    assert r.body == first.body


# ---- 13. HEAD replays ---------------------------------------------------------

def test_head_replay_keeps_content_length(make_proxy):
    p = make_proxy("--methods", "POST,HEAD")
    key = newkey("head")
    a = kpost(p.port, "/h?bytes=1234", key, body=None, method="HEAD")
    b = kpost(p.port, "/h?bytes=1234", key, body=None, method="HEAD")
    assert a.status == 200 and a.header("Content-Length") == "1234"
    assert b.header("Idempotent-Replayed") == "true"
    assert b.header("Content-Length") == "1234"


# ---- 8. key issuing only where configured, bounded -----------------------------

def test_issue_endpoint_only_where_a_route_issues_keys(proxy, stub):
    before = executions(stub)
    r = request(proxy.port, "GET", "/.well-known/idempotency-key")
    assert r.status == 200
    assert upstream_echo(r)["target"] == "/.well-known/idempotency-key"
    assert executions(stub) == before + 1        # an ordinary request


def test_issue_endpoint_bounded(tmp_path, make_proxy):
    path = tmp_path / "issue.ini"
    path.write_text("[route orders]\nmatch = POST /orders\n"
                    "require_issued_key = yes\n")
    p = make_proxy("--config", str(path))
    statuses = []
    with RawConn(p.port) as c:
        for _ in range(120):
            c.send(b"GET /.well-known/idempotency-key HTTP/1.1\r\nHost: x\r\n\r\n")
            statuses.append(c.read_response().status)
    assert statuses.count(200) >= 50
    assert 429 in statuses, statuses
    r = request(p.port, "GET", "/.well-known/idempotency-key")
    assert r.status in (200, 429)
    if r.status == 429:
        assert r.header("Retry-After") == "1"


# ---- 9. a process-wide budget for buffered bodies ------------------------------

def keyed_head(n, key=None):
    """The head of a keyed POST declaring an n-byte body."""
    key = key or uuid.uuid4().hex
    return (b"POST /o HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\n"
            b"Content-Length: %d\r\n\r\n" % (key.encode(), n))


def test_buffered_bodies_have_a_global_budget(make_proxy, stub):
    """Bytes that arrived count, not what heads declare: three bodies of
    400 KiB, 350 KiB of each sent, pass a 1 MiB budget with the third,
    which gets 503; the first completes; the budget comes back."""
    p = make_proxy("--max-buffered", "1MiB")
    held = []
    try:
        for i in range(3):
            c = RawConn(p.port)
            c.send(keyed_head(409600))
            held.append(c)
        time.sleep(0.2)
        for c in held:          # declared, nothing sent: nothing charged
            c.sock.settimeout(0.2)
            with pytest.raises(OSError):
                c.sock.recv(1)
            c.sock.settimeout(10)
        for c in held:
            c.send(b"x" * 358400)
            time.sleep(0.2)
        r = held[2].read_response()
        assert_problem(r, 503, "server-busy")
        assert r.header("Retry-After") == "1"
        held[0].send(b"x" * (409600 - 358400))
        assert held[0].read_response().status == 200
    finally:
        for c in held:
            c.close()
    time.sleep(0.2)
    # the budget is given back: a new request fits
    r = kpost(p.port, "/o", newkey(), body=b"y" * 409600)
    assert r.status == 200


def test_declared_bodies_trickling_do_not_starve_others(make_proxy, stub):
    """(issue 21 item 3) Eight keyed heads declaring 1 MiB - 1 byte, each
    then sending a byte: with a 1 MiB budget an honest keyed POST still
    gets through (the budget held the trickles' declared lengths: 503)."""
    p = make_proxy("--max-buffered", "1MiB")
    held = []
    try:
        for _ in range(8):
            c = RawConn(p.port)
            c.send(keyed_head((1 << 20) - 1) + b"x")
            held.append(c)
        time.sleep(0.3)
        r = kpost(p.port, "/o", newkey(), body=b"y" * 65536)
        assert r.status == 200, r
    finally:
        for c in held:
            c.close()


def test_trickled_body_has_an_end(make_proxy, stub):
    """(issue 21 item 3) A keyed body sent a byte every 0.5 s (each gap
    well inside --client-timeout) is cut off with 408 once its whole-body
    deadline passes: --client-timeout (1 s) plus its length (16 KiB) at
    8 KiB/s, 3 s; not executed."""
    p = make_proxy("--client-timeout", "1s")
    with RawConn(p.port, timeout=10) as c:
        c.send(keyed_head(16384))
        t0 = time.monotonic()
        got = b""
        while time.monotonic() - t0 < 8:
            try:
                c.send(b"x")
            except OSError:
                break
            c.sock.settimeout(0.5)
            try:
                got = c.sock.recv(4096)
            except socket.timeout:
                continue
            except OSError:
                break
            break
        took = time.monotonic() - t0
    assert got.startswith(b"HTTP/1.1 408"), got[:200]
    assert 2.5 < took < 5, took
    assert executions(stub) == 0


def test_budget_follows_the_body_past_its_client(make_proxy):
    """(issue 21 item 4) A client sends a 7 MiB keyed body and resets; the
    engine still holds the bytes (the upstream takes none). They stay
    charged: the next 7 MiB body gets 503 (8 MiB budget) and RSS does not
    grow by another body. Once the exchange ends (--upstream-timeout 3 s)
    the budget is back and a body fits again."""
    up = SilentServer(rcvbuf=4096)     # takes (almost) nothing
    try:
        p = make_proxy("--max-buffered", "8MiB", "--max-body", "8MiB",
                       "--upstream-timeout", "3s", "--lease", "10s",
                       upstream=up.url, env=SMALL_QUARANTINE)
        body = b"z" * (7 << 20)
        with RssSampler(p.pid) as rss:
            c = RawConn(p.port)
            c.send(keyed_head(len(body)) + body)
            time.sleep(0.5)     # buffered, claimed, being sent upstream
            c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                              b"\x01\x00\x00\x00\x00\x00\x00\x00")
            c.close()           # a reset
            time.sleep(0.3)
            t0 = time.monotonic()
            with RawConn(p.port) as c2:
                try:
                    c2.send(keyed_head(len(body)) + body)
                except OSError:
                    pass
                r = c2.read_response()
            assert_problem(r, 503, "server-busy")
            assert time.monotonic() - t0 < 2.5, "answered after the exchange"
        assert rss.growth_mib < 7 * 1.25 + 4, \
            f"RSS grew {rss.growth_mib:.1f} MiB"
        deadline = time.monotonic() + 8
        while True:
            with RawConn(p.port) as c3:
                c3.send(keyed_head(1 << 20) + b"q" * (1 << 20))
                r = c3.read_response()
            if r.status != 503 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert r.status == 504, r   # taken, forwarded; the upstream is deaf
    finally:
        up.stop()


def test_budget_bounds_memory(make_proxy, stub):
    """(issue 21 item 5) 40 connections, each 1 byte short of a 1 MiB
    keyed body, against a 16 MiB budget: 16 wait for their last byte, the
    others get 503, and RSS grows by at most 1.25 x the budget + 4 MiB
    (the budget counts what is allocated, not what was declared)."""
    p = make_proxy("--max-buffered", "16MiB", env=SMALL_QUARANTINE)
    wait_readyz(p)
    n = (1 << 20) - 1
    held, busy = [], 0
    with RssSampler(p.pid) as rss:
        try:
            for _ in range(40):
                c = RawConn(p.port)
                try:
                    c.send(keyed_head(1 << 20) + b"w" * n)
                except OSError:
                    pass
                held.append(c)
            time.sleep(1)
            for c in held:
                c.sock.settimeout(0.05)
                try:
                    busy += c.sock.recv(64).startswith(b"HTTP/1.1 503")
                except (socket.timeout, OSError):
                    pass
        finally:
            for c in held:
                c.close()
    print(f"503: {busy}, RSS +{rss.growth_mib:.1f} MiB")
    assert 20 <= busy <= 25, busy
    assert rss.growth_mib <= 1.25 * 16 + 4, \
        f"RSS grew {rss.growth_mib:.1f} MiB"
