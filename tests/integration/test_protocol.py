"""HTTP/1.1 client-side protocol: keep-alive, pipelining, 100-continue,
HTTP/1.0, and malformed or smuggling requests (400, connection closed)."""
import hashlib
import time

import pytest

from support.http import (RawConn, assert_problem, build_request, request,
                          upstream_echo)


def test_keep_alive_many_requests_one_connection(proxy, stub):
    with RawConn(proxy.port) as c:
        for i in range(20):
            body = f"req-{i}".encode()
            r = c.request("POST", f"/k/{i}", body=body)
            assert r.status == 200
            assert "close" not in r.connection_tokens()
            doc = upstream_echo(r)
            assert doc["target"] == f"/k/{i}" and doc["body"] == f"req-{i}"
    assert stub.stats()["requests"] == 20


def test_pipelined_requests_answered_in_order(proxy, stub):
    with RawConn(proxy.port) as c:
        c.send(build_request("GET", "/p/1?delay_ms=300")
               + build_request("POST", "/p/2", body=b"second")
               + build_request("GET", "/p/3?bytes=10000&chunked=1"))
        r1 = c.read_response()
        r2 = c.read_response()
        r3 = c.read_response()
    assert upstream_echo(r1)["target"] == "/p/1?delay_ms=300"
    doc2 = upstream_echo(r2)
    assert doc2["target"] == "/p/2" and doc2["body"] == "second"
    assert r3.body_len == 10000
    assert stub.stats()["requests"] == 3


def test_pipelined_burst(proxy, stub):
    n = 50
    wire = b"".join(build_request("POST", f"/b/{i}", body=b"x" * i)
                    for i in range(n))
    with RawConn(proxy.port) as c:
        c.send(wire)
        for i in range(n):
            doc = upstream_echo(c.read_response())
            assert doc["target"] == f"/b/{i}" and doc["body_len"] == i
    assert stub.stats()["requests"] == n


def test_pipelined_after_head_and_204(proxy):
    with RawConn(proxy.port) as c:
        c.send(build_request("HEAD", "/d?bytes=100")
               + build_request("GET", "/d?status=204")
               + build_request("GET", "/"))
        assert c.read_response("HEAD").header("Content-Length") == "100"
        assert c.read_response().status == 204
        assert c.read_response().body == b"ok\n"


def test_client_connection_close(proxy):
    with RawConn(proxy.port) as c:
        r = c.request("GET", "/x", [("Connection", "close")])
        assert r.status == 200
        assert "close" in r.connection_tokens()
        assert c.wait_closed(3)


def test_http10_client(proxy, stub):
    with RawConn(proxy.port) as c:
        r = c.request("POST", "/old", body=b"ten", version="HTTP/1.0")
        assert r.status == 200
        assert r.framing != "chunked"
        assert upstream_echo(r)["body"] == "ten"
        assert c.wait_closed(3)


def test_http10_chunked_upstream_response(proxy):
    with RawConn(proxy.port) as c:
        r = c.request("GET", "/d?bytes=3000&chunked=1", version="HTTP/1.0")
        assert r.status == 200
        assert r.framing != "chunked", "HTTP/1.0 client got chunked"
        assert r.body == (b"abcdefghijklmnopqrstuvwxyz" * 200)[:3000]


def test_expect_100_continue_relayed(proxy, stub):
    body = b"z" * 5000
    with RawConn(proxy.port) as c:
        c.send(build_request("POST", "/upload", [
            ("Expect", "100-continue"), ("Content-Length", str(len(body)))]))
        ver, status, _, _ = c.read_head()
        assert status == 100
        c.send(body)
        r = c.read_response()
    assert r.status == 200
    doc = upstream_echo(r)
    assert doc["hdict"].get("expect") == ["100-continue"]
    assert doc["body_sha256"] == hashlib.sha256(body).hexdigest()


def test_expect_100_continue_upstream_never_answers(proxy):
    """The upstream ignores Expect; a client that sends the body anyway after
    a short wait still gets the final response."""
    body = b"y" * 100
    with RawConn(proxy.port) as c:
        c.send(build_request("POST", "/upload?expect=ignore", [
            ("Expect", "100-continue"), ("Content-Length", str(len(body)))]))
        time.sleep(0.3)
        c.send(body)
        r = c.read_response()
    assert r.status == 200
    assert upstream_echo(r)["body_len"] == len(body)


def test_expect_with_interim_and_final_on_keepalive(proxy):
    with RawConn(proxy.port) as c:
        c.send(build_request("PUT", "/e1", [
            ("Expect", "100-continue"), ("Content-Length", "3")]))
        assert c.read_head()[1] == 100
        c.send(b"abc")
        r = c.read_response()
        assert upstream_echo(r)["body"] == "abc"
        r = c.request("GET", "/after")
        assert upstream_echo(r)["target"] == "/after"


SMUGGLING = {
    "cl_and_te": b"POST /s HTTP/1.1\r\nHost: a\r\nContent-Length: 6\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n",
    "te_and_cl": b"POST /s HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
                 b"Content-Length: 6\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n",
    "two_content_lengths": b"POST /s HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n"
                           b"Content-Length: 41\r\n\r\nhelloGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n",
    "content_length_list": b"POST /s HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 41\r\n\r\n"
                           b"helloGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n",
    "chunked_identity": b"POST /s HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n"
                        b"5\r\nhello\r\n0\r\n\r\n",
    "te_not_chunked_last": b"POST /s HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n"
                           b"5\r\nhello\r\n0\r\n\r\n",
    "bare_lf": b"POST /s HTTP/1.1\nHost: a\nContent-Length: 5\n\nhello",
    "bare_lf_in_header": b"GET /s HTTP/1.1\r\nHost: a\nX-A: b\r\n\r\n",
    "space_before_colon": b"GET /s HTTP/1.1\r\nHost : a\r\n\r\n",
    "space_before_colon_te": b"POST /s HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n"
                             b"Content-Length: 5\r\n\r\nhello",
    "bad_chunk_size": b"POST /s HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                      b"zz\r\nhello\r\n0\r\n\r\n",
    "negative_content_length": b"POST /s HTTP/1.1\r\nHost: a\r\nContent-Length: -5\r\n\r\nhello",
    "garbage_request_line": b"HELLO\r\n\r\n",
    "bad_version": b"GET /s HTTP/9.9\r\nHost: a\r\n\r\n",
    "nul_in_header": b"GET /s HTTP/1.1\r\nHost: a\r\nX-A: b\x00c\r\n\r\n",
}


@pytest.mark.parametrize("name", sorted(SMUGGLING))
def test_malformed_requests_rejected(proxy, stub, name):
    with RawConn(proxy.port) as c:
        c.send(SMUGGLING[name])
        r = c.read_response()
        assert_problem(r, 400, "bad-request")
        assert "close" in r.connection_tokens(), r
        assert c.wait_closed(3), "connection not closed after 400"
    stats = stub.stats()
    assert stats["requests"] == 0, f"{name} reached the upstream: {stats}"


def test_obs_fold_rejected_or_unfolded(proxy, stub):
    """RFC 9112 §5.2: reject obs-fold with 400, or replace it with SP before
    forwarding; never forward the CRLF."""
    with RawConn(proxy.port) as c:
        c.send(b"GET /s HTTP/1.1\r\nHost: a\r\nX-A: b\r\n c\r\n\r\n")
        r = c.read_response()
    if r.status == 400:
        assert_problem(r, 400, "bad-request")
        assert stub.stats()["requests"] == 0
    else:
        value = upstream_echo(r)["hdict"]["x-a"][0]
        assert "\r" not in value and "\n" not in value
        assert value.split() == ["b", "c"]


def test_bad_request_after_good_one_on_same_connection(proxy, stub):
    with RawConn(proxy.port) as c:
        assert c.request("GET", "/ok").status == 200
        c.send(SMUGGLING["cl_and_te"])
        assert_problem(c.read_response(), 400, "bad-request")
        assert c.wait_closed(3)
    assert stub.stats()["requests"] == 1


def test_proxy_stays_healthy_after_garbage(proxy):
    for junk in (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,
                 b"\r\n\r\n\r\n", b"GET / HTTP/1.1\r\n" + b"X" * 100 + b"\r\n\r\n"):
        with RawConn(proxy.port, timeout=5) as c:
            c.send(junk)
            c.wait_closed(3)
    assert request(proxy.port, "GET", "/").body == b"ok\n"


def test_missing_host_rejected(proxy, stub):
    """RFC 9112 §3.2: an HTTP/1.1 request without Host is a 400."""
    with RawConn(proxy.port) as c:
        c.send(b"GET /nohost HTTP/1.1\r\nX-A: b\r\n\r\n")
        assert_problem(c.read_response(), 400, "bad-request")
    assert stub.stats()["requests"] == 0


def test_two_host_headers_rejected(proxy, stub):
    """RFC 9112 §3.2: more than one Host field is a 400."""
    with RawConn(proxy.port) as c:
        c.send(b"GET /twohosts HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n")
        assert_problem(c.read_response(), 400, "bad-request")
    assert stub.stats()["requests"] == 0


def test_pipelined_request_behind_large_download(proxy, stub):
    n = 5 * 1024 * 1024
    with RawConn(proxy.port, timeout=30) as c:
        c.send(build_request("GET", f"/big?bytes={n}")
               + build_request("POST", "/next", body=b"after"))
        time.sleep(0.5)         # let back-pressure build up
        r1 = c.read_response()
        assert r1.body_len == n
        assert r1.body[:26] == b"abcdefghijklmnopqrstuvwxyz"
        doc = upstream_echo(c.read_response())
        assert doc["target"] == "/next" and doc["body"] == "after"


def test_431_delivered_even_with_unread_body(make_proxy, stub):
    """The proxy's error response reaches the client even when the client
    has already sent more than the proxy reads (lingering close)."""
    p = make_proxy("--max-header-size", "4KiB")
    with RawConn(p.port) as c:
        c.send(build_request("POST", "/big", [("X-Big", "v" * 8000),
                                              ("Content-Length", "300000")])
               + b"b" * 300000)
        assert_problem(c.read_response(), 431, "headers-too-large")
    assert stub.stats()["requests"] == 0
