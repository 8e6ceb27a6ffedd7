"""Upgrades through the proxy (issue 46 item 1): a request with Connection:
upgrade and an Upgrade field is forwarded with both; a 101 turns the client
connection and the upstream connection into one byte tunnel.

A real WebSocket client and server (Debian's python3-websockets) check the
protocol end to end - echo, 1 MiB messages, ping/pong, either side closing,
TLS on both legs. Raw sockets check what a WebSocket library hides: a slow
reader holding the upstream back (bounded memory), half-close passed on,
the client vanishing, the idle timeout, SIGTERM's drain, h2c still dropped,
an upgrade with a key refused.
"""
import asyncio
import os
import socket
import ssl
import threading
import time

import pytest
import websockets
import websockets.client
import websockets.server

from support.http import RawConn, build_request
from support.procs import metric_value, pattern_bytes, rss_kib
from support.tls import Pki

MIB = 1 << 20
BOUND = 15.0	# seconds anything here may take before the test fails


# ------------------------------------------------------------ upstreams

class WsUpstream:
    """A python3-websockets server on 127.0.0.1 (TLS with `ssl_ctx`), in a
    thread with its own event loop. Paths: /echo echoes every message;
    /close/<code> closes with that code after one message; /push/<n>
    sends n messages of 64 KiB and closes. Records every handshake's
    request headers in .heads."""

    def __init__(self, ssl_ctx=None):
        self.heads = []
        self.closed = []	# (path, code) of connections that ended
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.ssl_ctx = ssl_ctx
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.ready.wait(BOUND)

    def _run(self):
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(websockets.server.serve(
            self._handler, "127.0.0.1", 0, ssl=self.ssl_ctx,
            max_size=4 * MIB, compression=None))
        self.port = self.server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()

    async def _handler(self, ws, path):
        self.heads.append(dict(ws.request_headers.raw_items()))
        try:
            if path == "/echo":
                async for m in ws:
                    await ws.send(m)
            elif path.startswith("/close/"):
                await ws.recv()
                await ws.close(code=int(path.rsplit("/", 1)[1]), reason="bye")
            elif path.startswith("/push/"):
                for i in range(int(path.rsplit("/", 1)[1])):
                    await ws.send(bytes([i % 256]) * 65536)
                await ws.close()
        except websockets.ConnectionClosed:
            pass
        self.closed.append((path, ws.close_code))

    def stop(self):
        async def down():
            self.server.close()
            await self.server.wait_closed()
        asyncio.run_coroutine_threadsafe(down(), self.loop).result(BOUND)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(BOUND)


class RawUpgradeUpstream:
    """An upstream that answers each request head with `answer` (default: a
    101 to protocol "test") and then runs `after(sock)` in the connection's
    thread. Records each request head (bytes) in .heads."""

    def __init__(self, after=None, answer=None):
        self.after = after
        self.answer = answer or (b"HTTP/1.1 101 Switching Protocols\r\n"
                                 b"Upgrade: test\r\nConnection: Upgrade\r\n\r\n")
        self.heads = []
        self.socks = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.socks.append(c)
            threading.Thread(target=self._one, args=(c,), daemon=True).start()

    def _one(self, c):
        head = b""
        try:
            while b"\r\n\r\n" not in head:
                d = c.recv(65536)
                if not d:
                    return
                head += d
            first, rest = head.split(b"\r\n\r\n", 1)
            self.heads.append(first)
            c.sendall(self.answer)
            if self.after is not None:
                self.after(c, rest)
        except OSError:
            pass

    def stop(self):
        self.sock.close()
        for s in self.socks:
            try:
                s.close()
            except OSError:
                pass


def upgrade_request(target="/t", proto=b"test", extra=b""):
    return (b"GET " + target.encode() + b" HTTP/1.1\r\nHost: x\r\n"
            b"Connection: Upgrade\r\nUpgrade: " + proto + b"\r\n" + extra +
            b"\r\n")


def read_head(s):
    """The response head from socket s, and the bytes after it."""
    buf = b""
    deadline = time.monotonic() + BOUND
    while b"\r\n\r\n" not in buf:
        assert time.monotonic() < deadline, buf
        d = s.recv(65536)
        assert d, f"closed before a head: {buf!r}"
        buf += d
    head, rest = buf.split(b"\r\n\r\n", 1)
    return head, rest


def recv_exactly(s, n):
    out = bytearray()
    while len(out) < n:
        d = s.recv(min(1 << 20, n - len(out)))
        assert d, f"closed after {len(out)} of {n} bytes"
        out += d
    return bytes(out)


def recv_eof(s):
    """Read until the peer's end of stream; returns what came before."""
    out = b""
    while True:
        d = s.recv(65536)
        if not d:
            return out
        out += d


def wait_for(cond, what, bound=BOUND):
    deadline = time.monotonic() + bound
    while not cond():
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.02)


def tunnel_metrics(p):
    text = p.metrics()
    return {n: metric_value(text, "idemproxy_" + n) for n in
            ("tunnels_open", "tunnels_total", "tunnel_client_bytes_total",
             "tunnel_upstream_bytes_total")}


@pytest.fixture
def ws_up():
    u = WsUpstream()
    yield u
    u.stop()


@pytest.fixture
def raw_factory():
    made = []

    def make(**kw):
        u = RawUpgradeUpstream(**kw)
        made.append(u)
        return u
    yield make
    for u in made:
        u.stop()


def ws_url(p, path, scheme="ws"):
    return f"{scheme}://127.0.0.1:{p.port}{path}"


# ------------------------------------------------------------ WebSocket

@pytest.mark.stores("memory", "postgres")
def test_echo_text_and_binary(make_proxy, store_args, ws_up):
    p = make_proxy(*store_args, upstream=f"http://127.0.0.1:{ws_up.port}")

    async def run():
        async with websockets.client.connect(ws_url(p, "/echo"),
                                             compression=None) as ws:
            await ws.send("hello")
            assert await ws.recv() == "hello"
            await ws.send(b"\x00\x01\xfe\xff")
            assert await ws.recv() == b"\x00\x01\xfe\xff"
            for i in range(50):
                await ws.send(f"m{i}")
            assert [await ws.recv() for _ in range(50)] == \
                [f"m{i}" for i in range(50)]
    asyncio.run(asyncio.wait_for(run(), BOUND))
    # what the upstream saw: the handshake's fields went on, ours too
    h = {k.lower(): v for k, v in ws_up.heads[0].items()}
    assert h["upgrade"].lower() == "websocket"
    assert "upgrade" in h["connection"].lower()
    assert "sec-websocket-key" in h and "x-forwarded-for" in h
    m = tunnel_metrics(p)
    assert m["tunnels_total"] == 1
    assert m["tunnel_client_bytes_total"] > 0 and m["tunnel_upstream_bytes_total"] > 0
    wait_for(lambda: tunnel_metrics(p)["tunnels_open"] == 0, "tunnel gone")


def test_one_mib_messages_and_ping(make_proxy, ws_up):
    p = make_proxy(upstream=f"http://127.0.0.1:{ws_up.port}")
    big = [os.urandom(MIB) for _ in range(4)]

    async def run():
        async with websockets.client.connect(ws_url(p, "/echo"), max_size=4 * MIB,
                                             compression=None) as ws:
            for b in big:
                await ws.send(b)
            for b in big:
                assert await ws.recv() == b
            pong = await ws.ping(b"are-you-there")
            await asyncio.wait_for(pong, BOUND)
            await ws.send("after the ping")
            assert await ws.recv() == "after the ping"
    asyncio.run(asyncio.wait_for(run(), 4 * BOUND))
    m = tunnel_metrics(p)
    assert m["tunnel_client_bytes_total"] >= 4 * MIB
    assert m["tunnel_upstream_bytes_total"] >= 4 * MIB


def test_upstream_closes_with_a_code(make_proxy, ws_up):
    p = make_proxy(upstream=f"http://127.0.0.1:{ws_up.port}")

    async def run():
        async with websockets.client.connect(ws_url(p, "/close/4001")) as ws:
            await ws.send("one")
            with pytest.raises(websockets.ConnectionClosed):
                await ws.recv()
            return ws.close_code, ws.close_reason
    assert asyncio.run(asyncio.wait_for(run(), BOUND)) == (4001, "bye")
    wait_for(lambda: tunnel_metrics(p)["tunnels_open"] == 0, "tunnel gone")


def test_server_push_reaches_the_client(make_proxy, ws_up):
    p = make_proxy(upstream=f"http://127.0.0.1:{ws_up.port}")

    async def run():
        got = []
        async with websockets.client.connect(ws_url(p, "/push/200")) as ws:
            async for m in ws:
                got.append(m)
        return got
    got = asyncio.run(asyncio.wait_for(run(), 4 * BOUND))
    assert len(got) == 200
    assert all(m == bytes([i % 256]) * 65536 for i, m in enumerate(got))


def test_client_vanishes(make_proxy, ws_up):
    """A client that disappears (reset, no close frame): the proxy closes
    the upstream side, which sees its connection end."""
    p = make_proxy(upstream=f"http://127.0.0.1:{ws_up.port}")
    s = socket.create_connection(("127.0.0.1", p.port))
    s.sendall(b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
              b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
              b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
    head, _ = read_head(s)
    assert head.startswith(b"HTTP/1.1 101 ")
    assert b"sec-websocket-accept: s3pplmbkjrhmxxwx" in head.lower() or \
        b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" in head
    wait_for(lambda: tunnel_metrics(p)["tunnels_open"] == 1, "tunnel open")
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    s.close()	# RST
    wait_for(lambda: ws_up.closed, "the upstream saw the end")
    wait_for(lambda: tunnel_metrics(p)["tunnels_open"] == 0, "tunnel gone")


# ------------------------------------------------------------ TLS

@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return Pki(tmp_path_factory.mktemp("wspki"))


def test_tls_listener_and_https_upstream(make_proxy, pki):
    up_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    up_ctx.load_cert_chain(pki.cert("server"), pki.key("server"))
    up = WsUpstream(ssl_ctx=up_ctx)
    try:
        p = make_proxy("--tls-cert", pki.cert("server"), "--tls-key",
                       pki.key("server"), "--upstream-ca", pki.ca,
                       upstream=f"https://localhost:{up.port}")
        cli = ssl.create_default_context(cafile=pki.ca)
        blob = os.urandom(MIB)

        async def run():
            async with websockets.client.connect(
                    f"wss://localhost:{p.port}/echo", ssl=cli, max_size=4 * MIB,
                    compression=None) as ws:
                await ws.send("over tls")
                assert await ws.recv() == "over tls"
                await ws.send(blob)
                assert await ws.recv() == blob
                await asyncio.wait_for(await ws.ping(), BOUND)
        asyncio.run(asyncio.wait_for(run(), 2 * BOUND))
        wait_for(lambda: up.closed, "the upstream saw the close")
        assert up.closed[0] == ("/echo", 1000)
        h = {k.lower(): v for k, v in up.heads[0].items()}
        assert h["x-forwarded-proto"] == "https"
    finally:
        up.stop()


# ------------------------------------------------------------ raw tunnels

def test_slow_reader_holds_the_upstream_back(make_proxy, raw_factory):
    """The upstream pushes 256 MiB to a client that does not read: the
    proxy stops reading the upstream (its sends stall well short of it, its
    memory stays flat); once the client reads, every byte arrives in
    order."""
    total = 256 * MIB
    sent = [0]

    def push(c, rest):
        chunk = 1 << 20
        for off in range(0, total, chunk):
            c.sendall(pattern_bytes(off, chunk))
            sent[0] = off + chunk
        c.shutdown(socket.SHUT_WR)

    up = raw_factory(after=push)
    p = make_proxy(upstream=f"http://127.0.0.1:{up.port}")
    base = rss_kib(p.pid)
    s = socket.create_connection(("127.0.0.1", p.port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 * 1024)
    s.sendall(upgrade_request())
    head, rest = read_head(s)
    assert head.startswith(b"HTTP/1.1 101 ")
    # wait until the upstream's sends have stalled
    last, still = -1, 0
    deadline = time.monotonic() + BOUND
    while still < 10:
        assert time.monotonic() < deadline, "the upstream never stalled"
        time.sleep(0.05)
        still = still + 1 if sent[0] == last else 0
        last = sent[0]
    assert sent[0] < 64 * MIB, f"{sent[0]} bytes left the upstream unread"
    grown = rss_kib(p.pid) - base
    assert grown < 16 * 1024, f"RSS grew {grown} KiB behind a slow reader"
    s.settimeout(BOUND)
    got = len(rest)
    view = bytearray(rest)
    while got < total:
        d = s.recv(1 << 20)
        assert d, f"closed after {got} bytes"
        view += d
        got += len(d)
        if len(view) >= 8 * MIB:	# compare as it comes, bounded memory
            n = len(view)
            assert bytes(view) == pattern_bytes(got - n, n)
            view = bytearray()
    assert bytes(view) == pattern_bytes(got - len(view), len(view))
    assert got == total
    assert s.recv(1) == b""	# the upstream's end of stream passed on
    s.close()


def test_half_close_is_passed_on(make_proxy, raw_factory):
    """The client shuts its write side: the upstream reads its end of stream
    and can still answer; then it closes and the client sees the end."""
    seen = {}

    def after(c, rest):
        data = rest + recv_eof(c)	# until the client's FIN
        seen["data"] = data
        c.sendall(b"reply after your FIN: " + data)
        c.shutdown(socket.SHUT_WR)

    up = raw_factory(after=after)
    p = make_proxy(upstream=f"http://127.0.0.1:{up.port}")
    s = socket.create_connection(("127.0.0.1", p.port))
    s.settimeout(BOUND)
    s.sendall(upgrade_request() + b"early bytes;")	# before the 101
    head, rest = read_head(s)
    assert head.startswith(b"HTTP/1.1 101 ")
    assert b"\r\nupgrade: test" in head.lower()
    assert b"\r\nconnection: upgrade" in head.lower()
    s.sendall(b"late bytes")
    s.shutdown(socket.SHUT_WR)
    tail = rest + recv_eof(s)
    assert seen["data"] == b"early bytes;late bytes"
    assert tail == b"reply after your FIN: early bytes;late bytes"
    s.close()
    wait_for(lambda: tunnel_metrics(p)["tunnels_open"] == 0, "tunnel gone")


def test_idle_timeout(make_proxy, raw_factory):
    """--tunnel-idle-timeout closes a tunnel quiet both ways; one that
    carries a byte every 100 ms outlives it several times over."""
    def echo(c, rest):
        if rest:
            c.sendall(rest)
        while True:
            d = c.recv(65536)
            if not d:
                return
            c.sendall(d)

    up = raw_factory(after=echo)
    p = make_proxy("--tunnel-idle-timeout", "1s",
                   upstream=f"http://127.0.0.1:{up.port}")
    busy = socket.create_connection(("127.0.0.1", p.port))
    quiet = socket.create_connection(("127.0.0.1", p.port))
    for s in (busy, quiet):
        s.settimeout(BOUND)
        s.sendall(upgrade_request())
        assert read_head(s)[0].startswith(b"HTTP/1.1 101 ")
    for i in range(30):		# 3 s of traffic, the timeout is 1 s
        busy.sendall(b"x")
        assert recv_exactly(busy, 1) == b"x"
        time.sleep(0.1)
    assert recv_eof(quiet) == b""	# closed by the proxy meanwhile
    busy.close()
    quiet.close()
    wait_for(lambda: tunnel_metrics(p)["tunnels_open"] == 0, "tunnels gone")
    assert tunnel_metrics(p)["tunnels_total"] == 2


def test_sigterm_closes_tunnels_after_the_drain_timeout(make_proxy, raw_factory):
    """SIGTERM: a tunnel goes on until --drain-timeout, then both sides get
    their end of stream and the proxy exits 0."""
    def echo(c, rest):
        while True:
            d = c.recv(65536)
            if not d:
                c.close()
                return
            c.sendall(d)

    up = raw_factory(after=echo)
    p = make_proxy("--drain-timeout", "1s", upstream=f"http://127.0.0.1:{up.port}")
    s = socket.create_connection(("127.0.0.1", p.port))
    s.settimeout(BOUND)
    s.sendall(upgrade_request())
    assert read_head(s)[0].startswith(b"HTTP/1.1 101 ")
    p.proc.send_signal(15)
    time.sleep(0.2)
    s.sendall(b"still open")	# the drain lets it go on
    assert recv_exactly(s, 10) == b"still open"
    assert recv_eof(s) == b""	# the drain timeout ended it
    assert p.stop() == 0


def test_upgrade_refused_by_the_upstream_closes(make_proxy, raw_factory):
    """An upstream that answers without switching: the client gets that
    answer, then the connection closes (what follows may be the protocol
    it hoped for, not a request)."""
    up = raw_factory(answer=b"HTTP/1.1 426 Upgrade Required\r\n"
                     b"Content-Length: 2\r\n\r\nno")
    p = make_proxy(upstream=f"http://127.0.0.1:{up.port}")
    s = socket.create_connection(("127.0.0.1", p.port))
    s.settimeout(BOUND)
    s.sendall(upgrade_request())
    data = recv_eof(s)
    assert data.startswith(b"HTTP/1.1 426 ")
    assert b"connection: close" in data.lower()
    assert data.endswith(b"\r\n\r\nno")
    assert tunnel_metrics(p)["tunnels_total"] == 0


def test_101_without_being_asked_is_a_502(make_proxy, raw_factory):
    up = raw_factory()
    p = make_proxy(upstream=f"http://127.0.0.1:{up.port}")
    with RawConn(p.port) as c:
        c.send(build_request("GET", "/t"))
        r = c.read_response()
    assert r.status == 502
    assert tunnel_metrics(p)["tunnels_total"] == 0


def test_h2c_is_still_dropped(make_proxy, raw_factory):
    up = raw_factory(answer=b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    p = make_proxy(upstream=f"http://127.0.0.1:{up.port}")
    with RawConn(p.port) as c:
        c.send(b"GET /t HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
               b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n")
        r = c.read_response()
    assert r.status == 200 and r.body == b"ok"
    head = up.heads[0].lower()
    assert b"upgrade" not in head.replace(b"connection: upgrade", b"")
    assert b"http2-settings" not in head
    assert b"connection:" not in head


def test_upgrade_on_http10_is_not_one(make_proxy, raw_factory):
    up = raw_factory(answer=b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    p = make_proxy(upstream=f"http://127.0.0.1:{up.port}")
    s = socket.create_connection(("127.0.0.1", p.port))
    s.settimeout(BOUND)
    s.sendall(b"GET /t HTTP/1.0\r\nConnection: Upgrade\r\nUpgrade: test\r\n\r\n")
    assert recv_eof(s).startswith(b"HTTP/1.1 200 ")
    assert b"upgrade" not in up.heads[0].lower()


def test_upgrade_with_a_key_is_refused(make_proxy, raw_factory):
    """A protected request that asks to switch protocols with a key: a
    tunnel can be neither stored nor replayed, so it is refused, and the
    upstream never sees it. Without a key (and no key required) it is
    forwarded like any unkeyed request."""
    up = raw_factory()
    p = make_proxy(upstream=f"http://127.0.0.1:{up.port}")
    s = socket.create_connection(("127.0.0.1", p.port))
    s.settimeout(BOUND)
    s.sendall(b"POST /t HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
              b"Upgrade: test\r\nIdempotency-Key: up-1\r\nContent-Length: 0\r\n\r\n")
    data = recv_eof(s)
    assert data.startswith(b"HTTP/1.1 400 ")
    assert b"invalid-idempotency-key" in data and b"Upgrade" in data
    assert up.heads == []
    s = socket.create_connection(("127.0.0.1", p.port))
    s.settimeout(BOUND)
    s.sendall(b"POST /t HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
              b"Upgrade: test\r\nContent-Length: 0\r\n\r\n")
    assert read_head(s)[0].startswith(b"HTTP/1.1 101 ")
    s.close()


def test_access_log_line_of_a_tunnel(make_proxy, raw_factory, tmp_path):
    def after(c, rest):
        c.sendall(b"12345")
        recv_eof(c)
        c.shutdown(socket.SHUT_WR)

    up = raw_factory(after=after)
    log = tmp_path / "access.log"
    p = make_proxy("--access-log", str(log), "--access-log-format", "json",
                   upstream=f"http://127.0.0.1:{up.port}")
    s = socket.create_connection(("127.0.0.1", p.port))
    s.settimeout(BOUND)
    s.sendall(upgrade_request("/ws"))
    head, rest = read_head(s)
    assert rest + recv_exactly(s, 5 - len(rest)) == b"12345"
    s.sendall(b"abc")
    s.shutdown(socket.SHUT_WR)
    assert recv_eof(s) == b""
    s.close()
    import json
    wait_for(lambda: log.exists() and log.read_text().strip(), "the line")
    line = json.loads(log.read_text().strip().splitlines()[-1])
    assert line["status"] == 101 and line["path"] == "/ws"
    assert line["outcome"] == "passthrough"
    assert "error" not in line or line["error"] in (None, "")
