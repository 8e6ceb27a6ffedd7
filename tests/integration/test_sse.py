"""Streamed responses reach the client as each piece arrives (issue 46 item
4): server-sent events, a chunked long poll, a keyed response streamed while
it is captured for replay.

The upstream here sends a piece, then waits until the client has read it
through the proxy before it sends the next: a proxy that held a piece back
until the next one (or the end) came would never see the next one, and the
test fails at its bound instead of passing slowly. So these tests assert
what users rely on — promptness — without timing anything.
"""
import socket
import threading

import pytest

from support.http import RawConn, build_request
from support.procs import wait_readyz

EVENTS = 5
BOUND = 10.0	# seconds a piece may take through the proxy before the test fails


class LockstepUpstream:
    """An HTTP/1.1 upstream on 127.0.0.1 that answers every request with
    EVENTS pieces of a chunked body, each only after the test said (got())
    that the one before reached the client. mode: "sse" (text/event-stream
    events), "poll" (application/json lines), "keyed" (the same for a
    POST)."""

    def __init__(self, mode):
        self.mode = mode
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.received = threading.Semaphore(0)
        self.requests = 0
        self.errors = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def piece(self, i):
        if self.mode == "sse":
            return f"id: {i}\nevent: tick\ndata: {{\"n\": {i}}}\n\n".encode()
        return f'{{"n": {i}}}\n'.encode()

    def got(self):
        self.received.release()

    def _serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(c,), daemon=True).start()

    def _one(self, c):
        try:
            head = b""
            while b"\r\n\r\n" not in head:
                data = c.recv(65536)
                if not data:
                    return
                head += data
            first, rest = head.split(b"\r\n\r\n", 1)
            length = 0
            for line in first.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            while len(rest) < length:
                rest += c.recv(65536)
            self.requests += 1
            ctype = b"text/event-stream" if self.mode == "sse" else b"application/json"
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: " + ctype +
                      b"\r\nCache-Control: no-cache\r\n"
                      b"Transfer-Encoding: chunked\r\n\r\n")
            for i in range(EVENTS):
                p = self.piece(i)
                c.sendall(b"%x\r\n%s\r\n" % (len(p), p))
                if not self.received.acquire(timeout=BOUND):
                    self.errors.append(f"piece {i} never reached the client")
                    return
            c.sendall(b"0\r\n\r\n")
        except OSError as e:
            self.errors.append(str(e))
        finally:
            c.close()

    def close(self):
        self.sock.close()


def read_pieces(conn, up):
    """Read the response head, then each piece as it comes, telling the
    upstream after each; returns the body read."""
    conn.sock.settimeout(BOUND)
    buf = b""
    while b"\r\n\r\n" not in buf:
        data = conn.sock.recv(65536)
        assert data, "the connection closed before the response head"
        buf += data
    head, body = buf.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200"), head
    for i in range(EVENTS):
        piece = up.piece(i)
        while piece not in body:
            try:
                data = conn.sock.recv(65536)
            except socket.timeout:
                pytest.fail(f"piece {i} did not reach the client within "
                            f"{BOUND} s: the proxy held it back")
            assert data, f"closed before piece {i}"
            body += data
        up.got()
    return head, body


@pytest.mark.parametrize("mode", ["sse", "poll"])
def test_each_piece_arrives_before_the_next_is_sent(make_proxy, mode):
    up = LockstepUpstream(mode)
    try:
        p = make_proxy(upstream=f"http://127.0.0.1:{up.port}")
        with RawConn(p.port) as c:
            c.send(build_request("GET", "/events", [("Accept",
                                 "text/event-stream")], None))
            head, body = read_pieces(c, up)
        assert b"text/event-stream" in head or mode != "sse"
        assert up.errors == [], up.errors
    finally:
        up.close()


@pytest.mark.stores("memory", "postgres")
def test_a_keyed_response_streams_while_it_is_captured(store_args, make_proxy):
    """A keyed POST whose answer streams (an LLM completion): the client
    gets each piece at once, and a retry replays the whole body."""
    up = LockstepUpstream("keyed")
    try:
        p = make_proxy(*store_args, upstream=f"http://127.0.0.1:{up.port}")
        wait_readyz(p)
        req = build_request("POST", "/v1/completions",
                            [("Idempotency-Key", "stream-1"),
                             ("Content-Type", "application/json")], b'{"q":1}')
        with RawConn(p.port) as c:
            c.send(req)
            read_pieces(c, up)
        assert up.errors == [], up.errors
        with RawConn(p.port) as c:
            c.send(req)
            r = c.read_response()
        assert r.status == 200
        assert r.header("Idempotent-Replayed") == "true"
        assert r.body == b"".join(up.piece(i) for i in range(EVENTS))
        assert up.requests == 1
    finally:
        up.close()
