"""Pass-through proxying: methods, status, headers and bodies (issue 2)."""
import hashlib
import time

import pytest

from support.http import (RawConn, build_request, chunked, request,
                          upstream_echo)
from support.procs import pattern_bytes

HOP_BY_HOP = ("connection", "keep-alive", "proxy-connection", "te", "trailer",
              "upgrade")


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "PATCH", "DELETE",
                                    "OPTIONS"])
def test_methods_pass_through(proxy, stub, method):
    body = b"" if method in ("GET", "DELETE", "OPTIONS") else \
        b'{"amount": 42, "currency": "EUR"}'
    r = request(proxy.port, method, "/orders/7?expand=items&x=%2F",
                [("Content-Type", "application/json")], body)
    assert r.status == 200, r
    doc = upstream_echo(r)
    assert doc["method"] == method
    assert doc["target"] == "/orders/7?expand=items&x=%2F"
    assert doc["body_len"] == len(body)
    assert doc["body_sha256"] == hashlib.sha256(body).hexdigest()
    assert doc["hdict"]["content-type"] == ["application/json"]
    assert stub.stats()["requests"] == 1


def test_keyed_request_passes_through_unchanged(proxy, stub):
    """No idempotency engine yet: the key header reaches the upstream as sent."""
    r = request(proxy.port, "POST", "/pay", [("Idempotency-Key", '"k-1"')],
                b"x=1")
    assert r.status == 200
    doc = upstream_echo(r)
    assert doc["hdict"]["idempotency-key"] == ['"k-1"']
    assert doc["body"] == "x=1"
    assert stub.stats()["keys"] == {'"k-1"': 1}


def test_raw_target_preserved(proxy):
    target = "/a%20b/%7Euser/./c//d?q=%E2%82%AC&q=2&empty="
    r = request(proxy.port, "GET", target)
    assert upstream_echo(r)["target"] == target


@pytest.mark.parametrize("status", [200, 201, 202, 299, 301, 400, 404, 409,
                                    418, 500, 503])
def test_status_and_body_pass_through(proxy, status):
    r = request(proxy.port, "POST", f"/s?status={status}", body=b"abc")
    assert r.status == status, r
    doc = upstream_echo(r)
    assert doc["body"] == "abc"
    assert r.header("Content-Type") == "application/json"


def test_end_to_end_response_headers_kept_in_order(proxy):
    r = request(proxy.port, "GET",
                "/h?header=Set-Cookie:a%3D1&header=X-Custom:one"
                "&header=Set-Cookie:b%3D2&header=Cache-Control:no-store"
                "&header=ETag:%22v1%22")
    assert r.status == 200
    assert r.header_all("Set-Cookie") == ["a=1", "b=2"]
    assert r.header("X-Custom") == "one"
    assert r.header("Cache-Control") == "no-store"
    assert r.header("ETag") == '"v1"'


def test_request_headers_forwarded_and_hop_by_hop_removed(proxy):
    headers = [
        ("Connection", "keep-alive, X-Private"),
        ("X-Private", "secret"),
        ("Keep-Alive", "timeout=5"),
        ("Proxy-Connection", "keep-alive"),
        ("TE", "trailers"),
        ("Trailer", "X-Checksum"),
        ("Upgrade", "foo/1"),
        ("X-End-To-End", "kept"),
        ("Authorization", "Bearer t0ken"),
        ("Accept", "application/json"),
        ("X-Dup", "1"),
        ("X-Dup", "2"),
    ]
    r = request(proxy.port, "POST", "/h", headers, b"body")
    doc = upstream_echo(r)
    seen = doc["hdict"]
    for name in HOP_BY_HOP + ("x-private",):
        assert name not in seen, (name, doc["headers"])
    assert seen["x-end-to-end"] == ["kept"]
    assert seen["authorization"] == ["Bearer t0ken"]
    assert seen["accept"] == ["application/json"]
    assert seen["x-dup"] == ["1", "2"]
    assert doc["body"] == "body"


def test_host_preserved_and_forwarded_headers_added(proxy):
    r = request(proxy.port, "GET", "/f", host="shop.example:8443")
    seen = upstream_echo(r)["hdict"]
    assert seen["host"] == ["shop.example:8443"]
    assert seen["x-forwarded-for"] == ["127.0.0.1"]
    assert seen["x-forwarded-proto"] == ["http"]
    assert seen["x-forwarded-host"] == ["shop.example:8443"]


def test_forwarded_headers_appended_or_kept(proxy):
    r = request(proxy.port, "GET", "/f", [
        ("X-Forwarded-For", "203.0.113.7, 10.0.0.1"),
        ("X-Forwarded-Proto", "https"),
        ("X-Forwarded-Host", "public.example"),
    ], host="internal:8080")
    seen = upstream_echo(r)["hdict"]
    xff = ",".join(seen["x-forwarded-for"])
    assert [p.strip() for p in xff.split(",")] == \
        ["203.0.113.7", "10.0.0.1", "127.0.0.1"]
    assert seen["x-forwarded-proto"] == ["https"]
    assert seen["x-forwarded-host"] == ["public.example"]
    assert seen["host"] == ["internal:8080"]


def test_response_hop_by_hop_removed(proxy):
    r = request(proxy.port, "GET",
                "/h?header=Keep-Alive:timeout%3D5&header=Connection:X-Foo"
                "&header=X-Foo:bar&header=Proxy-Connection:keep-alive"
                "&header=Upgrade:foo&header=X-Kept:yes")
    assert r.status == 200
    assert r.header("Keep-Alive") is None
    assert r.header("X-Foo") is None
    assert r.header("Proxy-Connection") is None
    assert r.header("Upgrade") is None
    assert "x-foo" not in r.connection_tokens()
    assert r.header("X-Kept") == "yes"
    upstream_echo(r)


def test_binary_bodies_byte_identical(proxy):
    body = bytes(range(256)) * 64 + b"\r\n\r\n0\r\n\r\n"
    r = request(proxy.port, "POST", "/bin",
                [("Content-Type", "application/octet-stream")], body)
    doc = upstream_echo(r)
    assert doc["body"].encode("latin-1") == body
    assert doc["body_sha256"] == hashlib.sha256(body).hexdigest()


def test_chunked_request_body(proxy):
    body = b"0123456789" * 10000
    r = request(proxy.port, "POST", "/c", [("Transfer-Encoding", "chunked")],
                chunked(body, 777))
    doc = upstream_echo(r)
    assert doc["body_len"] == len(body)
    assert doc["body_sha256"] == hashlib.sha256(body).hexdigest()
    assert "transfer-encoding" not in doc["hdict"] or \
        doc["hdict"]["transfer-encoding"] == ["chunked"]


def test_chunked_request_with_trailers(proxy):
    body = b"hello world"
    wire = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n"
    r = request(proxy.port, "POST", "/c", [("Transfer-Encoding", "chunked")],
                wire)
    doc = upstream_echo(r)
    assert doc["body_len"] == len(body)
    assert doc["body_sha256"] == hashlib.sha256(body).hexdigest()


def test_empty_bodies(proxy):
    r = request(proxy.port, "POST", "/e", body=b"")
    doc = upstream_echo(r)
    assert doc["body_len"] == 0
    r = request(proxy.port, "POST", "/e", [("Transfer-Encoding", "chunked")],
                b"0\r\n\r\n")
    assert upstream_echo(r)["body_len"] == 0


@pytest.mark.parametrize("query", ["bytes=100000", "bytes=100000&chunked=1",
                                   "bytes=0", "bytes=0&chunked=1",
                                   "bytes=3000000&chunked=1"])
def test_response_bodies_content_length_and_chunked(proxy, query):
    n = int(query.split("&")[0].split("=")[1])
    with RawConn(proxy.port) as c:
        r = c.request("GET", f"/d?{query}")
        assert r.status == 200
        assert r.body == pattern_bytes(0, n)
        assert r.header("Content-Type") == "application/octet-stream"
        if "chunked" not in query:
            assert r.header("Content-Length") == str(n)
        # the connection is still usable: the body was framed correctly
        assert c.request("GET", "/").body == b"ok\n"


def test_head_has_headers_but_no_body(proxy):
    with RawConn(proxy.port) as c:
        r = c.request("HEAD", "/d?bytes=12345")
        assert r.status == 200
        assert r.header("Content-Length") == "12345"
        c.send(build_request("GET", "/"))
        r2 = c.read_response()
        # had the proxy sent a body after the HEAD response, this read would
        # have parsed it as the status line
        assert r2.status == 200 and r2.body == b"ok\n"
        assert c.request("HEAD", "/d?bytes=10&chunked=1").status == 200
        assert c.request("GET", "/").body == b"ok\n"


@pytest.mark.parametrize("status", [204, 304])
def test_no_body_statuses(proxy, stub, status):
    with RawConn(proxy.port) as c:
        r = c.request("GET", f"/n?status={status}&header=ETag:%22x%22")
        assert r.status == status
        assert r.header("ETag") == '"x"'
        assert r.header("Transfer-Encoding") is None
        r2 = c.request("GET", "/")
        assert r2.status == 200 and r2.body == b"ok\n"
    assert stub.stats()["requests"] == 2


def test_close_delimited_upstream_response_is_chunked_to_http11(proxy):
    with RawConn(proxy.port) as c:
        r = c.request("GET", "/d?bytes=50000&noclen=1")
        assert r.status == 200
        assert r.framing == "chunked", r
        assert r.body == pattern_bytes(0, 50000)
        assert c.request("GET", "/").body == b"ok\n"


def test_close_delimited_upstream_response_to_http10(proxy):
    with RawConn(proxy.port) as c:
        r = c.request("GET", "/d?bytes=5000&noclen=1", version="HTTP/1.0")
        assert r.status == 200
        assert r.framing in ("close", "length")
        assert r.framing != "chunked"
        assert r.body == pattern_bytes(0, 5000)


def test_upstream_connection_close_does_not_close_client(proxy, stub):
    with RawConn(proxy.port) as c:
        r = c.request("GET", "/x?close=1")
        assert r.status == 200
        upstream_echo(r)
        r2 = c.request("GET", "/y")
        assert upstream_echo(r2)["target"] == "/y"
    assert stub.stats()["requests"] == 2


def test_response_streams_before_upstream_finishes(proxy):
    """The first half of a slow body reaches the client before the second
    half exists (no whole-response buffering)."""
    with RawConn(proxy.port) as c:
        c.send(build_request("GET", "/d?bytes=200000&body_delay_ms=1500"))
        t0 = time.monotonic()
        c.read_head()
        while len(c.buf) < 100000:
            assert c._fill(), "connection closed"
        assert time.monotonic() - t0 < 1.2, "first half arrived late"


def test_many_and_large_headers(proxy):
    headers = [(f"X-H{i}", f"value-{i}") for i in range(100)]
    headers.append(("X-Big", "v" * 8000))
    r = request(proxy.port, "GET", "/many", headers)
    assert r.status == 200
    got = [(k, v) for k, v in upstream_echo(r)["headers"]
           if k.lower().startswith("x-h") or k.lower() == "x-big"]
    assert [(k.lower(), v) for k, v in got] == \
        [(k.lower(), v) for k, v in headers]


def test_request_dribbled_byte_by_byte(proxy):
    """Names and values split across reads are reassembled."""
    wire = build_request("POST", "/slow?a=1", [
        ("X-Long-Header-Name-For-Splitting", "a value that spans reads"),
        ("Content-Type", "text/plain")], b"dribbled body")
    with RawConn(proxy.port) as c:
        for i in range(len(wire)):
            c.send(wire[i:i + 1])
            time.sleep(0.001)
        r = c.read_response()
    doc = upstream_echo(r)
    assert doc["target"] == "/slow?a=1"
    assert doc["hdict"]["x-long-header-name-for-splitting"] == \
        ["a value that spans reads"]
    assert doc["body"] == "dribbled body"


def test_upstream_path_prefix(make_proxy, stub):
    p = make_proxy(upstream=stub.url + "/api/v1")
    r = request(p.port, "POST", "/orders?id=3", body=b"x")
    assert upstream_echo(r)["target"] == "/api/v1/orders?id=3"


def test_many_sequential_connections(proxy, stub):
    for i in range(200):
        r = request(proxy.port, "POST", f"/n/{i}", body=str(i).encode())
        assert r.status == 200
        assert upstream_echo(r)["body"] == str(i)
    assert stub.stats()["requests"] == 200


def test_two_workers(make_proxy, stub):
    p = make_proxy(workers=2)
    conns = [RawConn(p.port) for _ in range(8)]
    try:
        for rnd in range(3):
            for i, c in enumerate(conns):
                r = c.request("POST", f"/w/{i}/{rnd}", body=b"w")
                assert upstream_echo(r)["target"] == f"/w/{i}/{rnd}"
    finally:
        for c in conns:
            c.close()
    assert stub.stats()["requests"] == 24
