"""The stub upstream itself: the other tests trust what it reports."""
import hashlib
import time

from support.http import (RawConn, build_request, chunked, request,
                          upstream_echo)
from support.procs import pattern_bytes


def test_fast_path_and_counting(stub):
    r = request(stub.port, "GET", "/")
    assert r.status == 200 and r.body == b"ok\n"
    assert r.header("Content-Length") == "3"
    r = request(stub.port, "POST", "/x?y=1", [("Idempotency-Key", "k1")], b"hi")
    doc = upstream_echo(r)
    assert doc["n"] == 2
    assert doc["method"] == "POST" and doc["target"] == "/x?y=1"
    assert doc["version"] == "1.1"
    assert doc["hdict"]["idempotency-key"] == ["k1"]
    assert doc["body_len"] == 2 and doc["body"] == "hi"
    assert doc["body_sha256"] == hashlib.sha256(b"hi").hexdigest()
    request(stub.port, "PUT", "/y", [("Idempotency-Key", "k1")], b"")
    request(stub.port, "PUT", "/y", [("Idempotency-Key", "k2")], b"")
    assert stub.stats() == {"requests": 4, "keys": {"k1": 2, "k2": 1}}
    stub.reset()
    assert stub.stats() == {"requests": 0, "keys": {}}
    r = request(stub.port, "GET", "/z")
    assert upstream_echo(r)["n"] == 1


def test_binary_body_and_chunked_upload(stub):
    body = bytes(range(256)) * 1000
    r = request(stub.port, "POST", "/b",
                [("Transfer-Encoding", "chunked")], chunked(body, 1000))
    doc = upstream_echo(r)
    assert doc["body_len"] == len(body)
    assert doc["body_sha256"] == hashlib.sha256(body).hexdigest()
    assert doc["body"].encode("latin-1") == body[:65536]


def test_pipelining_keepalive_http10(stub):
    with RawConn(stub.port) as c:
        c.send(build_request("GET", "/1?delay_ms=200")
               + build_request("POST", "/2", body=b"abc")
               + build_request("GET", "/3"))
        targets = [upstream_echo(c.read_response())["target"] for _ in range(3)]
        assert targets == ["/1?delay_ms=200", "/2", "/3"]
    with RawConn(stub.port) as c:
        r = c.request("GET", "/a", version="HTTP/1.0")
        assert "close" in r.connection_tokens()
        assert c.wait_closed(2)
    with RawConn(stub.port) as c:
        r = c.request("GET", "/a", [("Connection", "keep-alive")],
                      version="HTTP/1.0")
        assert "keep-alive" in r.connection_tokens()
        assert c.request("GET", "/b").status == 200


def test_response_options(stub):
    r = request(stub.port, "GET", "/a?bytes=100000&chunked=1")
    assert r.framing == "chunked" and r.body == pattern_bytes(0, 100000)
    r = request(stub.port, "GET", "/a?bytes=10&noclen=1")
    assert r.framing == "close" and r.body == b"abcdefghij"
    r = request(stub.port, "HEAD", "/a?bytes=10")
    assert r.header("Content-Length") == "10" and r.body == b""
    r = request(stub.port, "GET", "/a?status=204")
    assert r.status == 204 and not r.has("Content-Length")
    r = request(stub.port, "GET", "/a?status=418&header=X-A:b%3Dc&header=X-B:d")
    assert r.status == 418
    assert r.header("X-A") == "b=c" and r.header("X-B") == "d"
    t0 = time.monotonic()
    r = request(stub.port, "GET", "/a?delay_ms=300&body_delay_ms=300&bytes=10")
    assert time.monotonic() - t0 >= 0.55 and r.body == b"abcdefghij"
    with RawConn(stub.port) as c:
        c.send(build_request("GET", "/a?drop=1"))
        assert c.wait_closed(2) and c.buf == b""
    with RawConn(stub.port) as c:
        r = c.request("GET", "/a?close=1")
        assert "close" in r.connection_tokens() and c.wait_closed(2)
    assert stub.stats()["requests"] == 8


def test_expect_continue(stub):
    with RawConn(stub.port) as c:
        c.send(build_request("POST", "/e", [("Expect", "100-continue"),
                                           ("Content-Length", "3")]))
        assert c.read_head()[1] == 100
        c.send(b"abc")
        r = c.read_response()
        assert upstream_echo(r)["body"] == "abc"


def test_bad_request(stub):
    with RawConn(stub.port) as c:
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
        assert c.read_response().status == 400
        assert c.wait_closed(2)
    assert stub.stats()["requests"] == 0
