"""Upstream failures: refused (502), slow (504), dropped, stale pooled
connections, and recovery."""
import time

from support.http import (RawConn, assert_problem, build_request, http_get,
                          request, upstream_echo)
from support.procs import Stub, free_port


def test_upstream_refusing_connections_502(make_proxy, stub):
    dead = free_port()
    p = make_proxy(upstream=f"http://127.0.0.1:{dead}")
    with RawConn(p.port) as c:
        r = c.request("POST", "/pay", body=b"x")
        assert_problem(r, 502, "upstream-unavailable")
        # a keep-alive connection survives a proxy-made 502
        r = c.request("GET", "/again")
        assert_problem(r, 502, "upstream-unavailable")
    assert http_get(p.admin_port, "/healthz")[0] == 200


def test_upstream_comes_back(make_proxy, stub, tmp_path):
    port = free_port()
    p = make_proxy(upstream=f"http://127.0.0.1:{port}")
    assert_problem(request(p.port, "GET", "/x"), 502, "upstream-unavailable")
    late = Stub(tmp_path, port=port, name="late-stub")
    try:
        r = request(p.port, "GET", "/x")
        assert r.status == 200
        assert upstream_echo(r)["target"] == "/x"
    finally:
        late.check_stopped()


def test_upstream_slow_504(make_proxy, stub):
    p = make_proxy("--upstream-timeout", "300ms", "--lease", "1s")
    t0 = time.monotonic()
    with RawConn(p.port) as c:
        r = c.request("POST", "/slow?delay_ms=3000", body=b"x")
        elapsed = time.monotonic() - t0
        assert_problem(r, 504, "upstream-timeout")
        assert 0.25 <= elapsed < 2.0, elapsed
        # the client connection stays usable
        r = c.request("GET", "/fast")
        assert upstream_echo(r)["target"] == "/fast"


def test_upstream_fast_enough_passes_under_timeout(make_proxy):
    p = make_proxy("--upstream-timeout", "1s", "--lease", "2s")
    r = request(p.port, "GET", "/ok?delay_ms=300")
    assert r.status == 200


def test_upstream_idle_gap_in_body_aborts_response(make_proxy):
    """The upstream timeout bounds every idle gap while reading the
    response: a stall mid-body cuts the client's response short (the head is
    already sent), never a silently complete-looking truncated body."""
    p = make_proxy("--upstream-timeout", "300ms", "--lease", "1s")
    n = 100000
    with RawConn(p.port, timeout=10) as c:
        t0 = time.monotonic()
        c.send(build_request("GET", f"/d?bytes={n}&body_delay_ms=3000"))
        r = c.read_response(allow_truncated=True)
        assert r.status == 200
        assert not r.complete, "truncated body looked complete"
        assert r.body_len < n
        assert time.monotonic() - t0 < 2.5


def test_upstream_drops_connection_502_and_no_retry_of_post(make_proxy, stub):
    p = make_proxy()
    r = request(p.port, "POST", "/drop?drop=1", body=b"once")
    assert_problem(r, 502, "upstream-unavailable")
    # a POST that may have executed is never sent twice
    assert stub.stats()["requests"] == 1


def test_upstream_closes_pooled_connection(make_proxy, stub):
    p = make_proxy()
    with RawConn(p.port) as c:
        for i in range(5):
            r = c.request("POST", f"/c/{i}?close=1", body=b"x")
            assert r.status == 200
            assert upstream_echo(r)["target"] == f"/c/{i}?close=1"
    assert stub.stats()["requests"] == 5


def test_upstream_restart_stale_pool(make_proxy, stub, tmp_path):
    """Pooled connections to a restarted upstream are dead; the proxy notices
    instead of failing the next requests."""
    port = free_port()
    first = Stub(tmp_path, port=port, name="first-stub")
    p = make_proxy(upstream=f"http://127.0.0.1:{port}")
    try:
        conns = [RawConn(p.port) for _ in range(4)]
        for c in conns:       # open several pooled upstream connections
            c.send(build_request("GET", "/warm?delay_ms=100"))
        for c in conns:
            assert c.read_response().status == 200
            c.close()
    finally:
        first.check_stopped()
    second = Stub(tmp_path, port=port, name="second-stub")
    try:
        time.sleep(0.2)
        for i in range(4):
            r = request(p.port, "POST", f"/after/{i}", body=b"y")
            assert r.status == 200, r
        assert second.stats()["requests"] == 4
    finally:
        second.check_stopped()


def test_upstream_error_statuses_are_passed_not_replaced(proxy):
    for status in (500, 502, 503, 504):
        r = request(proxy.port, "GET", f"/e?status={status}")
        assert r.status == status
        # the upstream's own body, not a proxy problem document
        assert r.header("Content-Type") == "application/json"
        assert upstream_echo(r)["target"] == f"/e?status={status}"


def test_upstream_response_with_conflicting_framing_is_502(proxy):
    """A response llhttp rejects (two different Content-Length) is never
    relayed: the client gets a proxy-made 502."""
    with RawConn(proxy.port) as c:
        r = c.request("GET", "/bad?header=Content-Length:3")
        assert r.status == 502, r
        assert (r.header("Content-Type") or "").startswith(
            "application/problem+json")


def test_client_aborts_upload(proxy, stub):
    with RawConn(proxy.port) as c:
        c.send(build_request("POST", "/abort", [("Content-Length",
                                                 str(50 * 1024 * 1024))])
               + b"x" * (1024 * 1024))
        time.sleep(0.2)
    time.sleep(0.3)
    assert stub.stats()["requests"] == 0
    assert request(proxy.port, "GET", "/").body == b"ok\n"


def test_client_aborts_download(proxy, stub):
    for _ in range(3):
        with RawConn(proxy.port) as c:
            c.send(build_request("GET", "/abort?bytes=1000000000"))
            c.read_head()
            c._fill()
    time.sleep(0.3)
    assert request(proxy.port, "GET", "/").body == b"ok\n"
    # the proxy is not still pulling a gigabyte per aborted client
    with RawConn(proxy.port) as c:
        r = c.request("GET", "/d?bytes=1000")
        assert r.body_len == 1000
