"""The idempotency engine through the real binary and the counting stub
(DESIGN.md §1 items 2-10, §5 metrics, §7 edge cases; issue 3 "Tests").

Executions are counted by the stub (GET /__stats "requests": everything that
reached the upstream). The stub's echo carries "n", the execution number, so
two responses with the same body come from the same execution.

Every scenario runs once per store setup (conftest `store_setup`): the
embedded memory store, PostgreSQL, and PostgreSQL with Redis in front
(issue 4 "Tests"): `make_proxy` below adds the setup's flags, so a test
written once checks all three.
"""
import concurrent.futures as cf
import hashlib
import time
import uuid

import pytest

from support.http import (RawConn, assert_problem, build_request, chunked,
                          request, send_together, upstream_echo)
from support.procs import (Stub, free_port, metric_value, pattern_bytes,
                           wait_readyz)

KEY = "Idempotency-Key"
ORDER = b'{"item":"book","amount":100}'


@pytest.fixture
def make_proxy(store_args, make_proxy):
    """conftest's make_proxy with the store setup's flags in front
    (store_args first: its database outlives the proxies), returning once
    /readyz says the store is connected."""
    def make(*flags, **kw):
        p = make_proxy(*store_args, *flags, **kw)
        wait_readyz(p)
        return p
    return make


def newkey(prefix="k"):
    return f"{prefix}-{uuid.uuid4()}"


def kreq(method, target, key, body=None, headers=None, key_header=KEY):
    """Bytes of a keyed request (key None: no key header)."""
    hs = [("Content-Type", "application/json")]
    if key is not None:
        hs.append((key_header, key))
    hs += headers or []
    return build_request(method, target, hs, body)


def post(port, key, target="/orders", body=ORDER, headers=None,
         method="POST", timeout=20.0, key_header=KEY):
    """One keyed request on a fresh connection."""
    with RawConn(port, timeout=timeout) as c:
        c.send(kreq(method, target, key, body, headers, key_header))
        return c.read_response(method)


def burst(port, n, raw, timeout=30.0):
    """n connections send the same request bytes at once (a barrier after
    connecting); returns the n responses in connection order."""
    conns = [RawConn(port, timeout=timeout) for _ in range(n)]
    return send_together(conns, raw, timeout)


def executions(stub):
    return stub.stats()["requests"]


def replayed(r):
    return (r.header("Idempotent-Replayed") or "").lower() == "true"


def assert_identical(responses):
    first = responses[0]
    for r in responses[1:]:
        assert r.status == first.status, (first, r)
        assert r.body == first.body, (first, r)


def assert_one_original(responses):
    """Exactly one response is the original; every other is a replay."""
    originals = [r for r in responses if not replayed(r)]
    assert len(originals) == 1, [r.headers for r in responses]
    assert sum(replayed(r) for r in responses) == len(responses) - 1


def outcomes(p):
    text = p.metrics()
    names = ("passthrough", "forwarded", "replayed", "conflict", "mismatch",
             "missing_key", "invalid_key", "too_large", "store_unavailable",
             "fail_open")
    return {o: metric_value(text, "idemproxy_requests_total",
                            {"outcome": o}) or 0.0 for o in names}


def delta(before, after):
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


def wait_metric(p, name, want, timeout=5.0):
    deadline = time.monotonic() + timeout
    while True:
        v = metric_value(p.metrics(), name)
        if v == want or time.monotonic() > deadline:
            return v
        time.sleep(0.05)


# ------------------------------------------------ the article's experiments

def test_e1_eight_concurrent_clicks_one_execution(proxy, stub):
    """E1: 8 concurrent POSTs with the same key, upstream 10 ms."""
    key = newkey("e1")
    rs = burst(proxy.port, 8, kreq("POST", "/orders?delay_ms=10", key, ORDER))
    assert executions(stub) == 1
    assert stub.stats()["keys"] == {key: 1}
    assert all(r.status == 200 for r in rs), rs
    assert_identical(rs)
    assert upstream_echo(rs[0])["n"] == 1
    assert_one_original(rs)


def test_e2_callback_redelivered_five_times(proxy, stub):
    """E2: at-least-once delivery of one payment callback."""
    body = b"out_trade_no=T20240101&trade_status=SUCCESS&total_amount=100.00"
    key = "T20240101"
    rs = []
    for _ in range(5):
        rs.append(post(proxy.port, key, "/pay/callback", body,
                       [("Content-Type", "application/x-www-form-urlencoded")]))
    assert executions(stub) == 1
    assert all(r.status == 200 for r in rs)
    assert_identical(rs)
    assert not replayed(rs[0])
    assert all(replayed(r) for r in rs[1:])


def test_e3_hundred_retries_then_changed_body(proxy, stub):
    """E3: 100 x the same key -> 1 execution, 99 identical replays; the same
    key with another body -> 422, still 1 execution."""
    key = newkey("e3")
    rs = []
    with RawConn(proxy.port, timeout=20) as c:     # one keep-alive connection
        for _ in range(100):
            c.send(kreq("POST", "/orders", key, ORDER))
            rs.append(c.read_response())
    assert executions(stub) == 1
    assert_identical(rs)
    assert not replayed(rs[0])
    assert sum(replayed(r) for r in rs) == 99
    r = post(proxy.port, key, "/orders", b'{"item":"book","amount":999}')
    assert_problem(r, 422, "idempotency-key-mismatch")
    assert not replayed(r)
    # another target with the same key is another request too
    r = post(proxy.port, key, "/orders?again=1", ORDER)
    assert_problem(r, 422, "idempotency-key-mismatch")
    # and another method (PATCH is protected by default)
    r = post(proxy.port, key, "/orders", ORDER, method="PATCH")
    assert_problem(r, 422, "idempotency-key-mismatch")
    assert executions(stub) == 1


def test_mismatch_never_waits_for_in_flight(proxy, stub):
    """The fingerprint check comes before the in-flight state."""
    key = newkey("mm")
    with RawConn(proxy.port, timeout=10) as a:
        a.send(kreq("POST", "/orders?delay_ms=1500", key, ORDER))
        time.sleep(0.2)
        t0 = time.monotonic()
        r = post(proxy.port, key, "/orders?delay_ms=1500", b"other")
        assert time.monotonic() - t0 < 1.0
        assert_problem(r, 422, "idempotency-key-mismatch")
        assert a.read_response().status == 200
    assert executions(stub) == 1


def test_200_concurrent_duplicates(proxy, stub):
    key = newkey("200")
    rs = burst(proxy.port, 200, kreq("POST", "/orders?delay_ms=200", key,
                                     ORDER))
    assert executions(stub) == 1
    assert all(r.status == 200 for r in rs), [r.status for r in rs]
    assert_identical(rs)
    assert_one_original(rs)
    assert wait_metric(proxy, "idemproxy_in_flight", 0) == 0


def test_1000_distinct_keys_twice_concurrently(proxy, stub):
    keys = [newkey(f"d{i}") for i in range(1000)]

    def pair(key):
        raw = kreq("POST", "/orders", key, ORDER)
        a, b = RawConn(proxy.port, timeout=30), RawConn(proxy.port, timeout=30)
        try:
            a.send(raw)
            b.send(raw)
            return a.read_response(), b.read_response()
        finally:
            a.close()
            b.close()

    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(32) as ex:
        pairs = list(ex.map(pair, keys))
    assert time.monotonic() - t0 < 120
    stats = stub.stats()
    assert stats["requests"] == 1000
    assert len(stats["keys"]) == 1000
    assert all(v == 1 for v in stats["keys"].values())
    for a, b in pairs:
        assert a.status == b.status == 200
        assert a.body == b.body
        assert replayed(a) != replayed(b)


# ------------------------------------------------ framing and keys

def test_chunked_duplicate_of_content_length_original(proxy, stub):
    key = newkey("ch")
    body = b"x" * 5000
    first = post(proxy.port, key, "/orders", body)
    assert first.status == 200
    with RawConn(proxy.port) as c:
        c.send(build_request("POST", "/orders",
                             [("Content-Type", "application/json"),
                              (KEY, key),
                              ("Transfer-Encoding", "chunked")],
                             chunked(body, 1234)))
        dup = c.read_response()
    assert dup.status == 200
    assert replayed(dup)
    assert dup.body == first.body
    assert executions(stub) == 1


def test_quoted_key_is_the_same_key(proxy, stub):
    r1 = post(proxy.port, '"abc-quoted"')
    r2 = post(proxy.port, "abc-quoted")
    r3 = post(proxy.port, ' "abc-quoted" ')
    assert r1.status == r2.status == r3.status == 200
    assert replayed(r2) and replayed(r3)
    assert r1.body == r2.body == r3.body
    assert executions(stub) == 1
    # the header went upstream exactly as the client sent it
    assert upstream_echo(r1)["hdict"]["idempotency-key"] == ['"abc-quoted"']


def test_escaped_quoted_key(proxy, stub):
    r1 = post(proxy.port, r'"a\"b\\c"')
    r2 = post(proxy.port, 'a"b\\c')
    assert r1.status == r2.status == 200
    assert replayed(r2)
    assert executions(stub) == 1


@pytest.mark.parametrize("value", [
    "",
    "k" * 256,
    '""',
    "a b",
    "a\tb",
    '"abc',
    '"a\\nb"',
    '"a"b"',
    '"' + "q" * 256 + '"',
], ids=["empty", "256", "empty-quoted", "space", "tab", "unterminated",
        "bad-escape", "inner-quote", "256-quoted"])
def test_invalid_keys(proxy, stub, value):
    r = post(proxy.port, value)
    assert_problem(r, 400, "invalid-idempotency-key")
    assert executions(stub) == 0


def test_key_limits_255_ok(proxy, stub):
    r = post(proxy.port, "k" * 255)
    assert r.status == 200
    r = post(proxy.port, '"' + "q" * 255 + '"')
    assert r.status == 200
    assert executions(stub) == 2


def test_key_with_control_char_rejected(proxy, stub):
    """0x01 in a header value: a 400 (llhttp may reject the message itself,
    which is bad-request; otherwise invalid-idempotency-key); never
    forwarded."""
    with RawConn(proxy.port) as c:
        c.send(kreq("POST", "/orders", "ab\x01cd", ORDER))
        r = c.read_response()
    assert r.status == 400
    doc = r.json()
    assert doc["type"] in ("urn:idemproxy:problem:invalid-idempotency-key",
                           "urn:idemproxy:problem:bad-request"), doc
    assert executions(stub) == 0


def test_two_key_headers_rejected(proxy, stub):
    r = post(proxy.port, "one", headers=[(KEY, "one")])
    assert_problem(r, 400, "invalid-idempotency-key")
    r = post(proxy.port, "one", headers=[("idempotency-key", "two")])
    assert_problem(r, 400, "invalid-idempotency-key")
    assert executions(stub) == 0


def test_require_key(make_proxy, stub):
    p = make_proxy("--require-key", "true")
    r = post(p.port, None)
    assert_problem(r, 400, "missing-idempotency-key")
    assert executions(stub) == 0
    r = post(p.port, newkey())
    assert r.status == 200
    # unprotected methods need no key
    assert request(p.port, "GET", "/orders").status == 200
    assert executions(stub) == 2


def test_unkeyed_post_passes_through(proxy, stub):
    r1 = post(proxy.port, None)
    r2 = post(proxy.port, None)
    assert r1.status == r2.status == 200
    assert not replayed(r1) and not replayed(r2)
    assert upstream_echo(r2)["n"] == 2
    assert executions(stub) == 2


def test_get_with_key_not_protected(proxy, stub):
    key = newkey("get")
    r1 = post(proxy.port, key, "/orders", None, method="GET")
    r2 = post(proxy.port, key, "/orders", None, method="GET")
    assert r1.status == r2.status == 200
    assert not replayed(r2)
    assert executions(stub) == 2


def test_methods_option(make_proxy, stub):
    p = make_proxy("--methods", "PUT")
    key = newkey("put")
    a = post(p.port, key, method="PUT")
    b = post(p.port, key, method="PUT")
    assert a.body == b.body and replayed(b)
    assert executions(stub) == 1
    key = newkey("post")
    a = post(p.port, key)
    b = post(p.port, key)
    assert not replayed(b)
    assert upstream_echo(b)["n"] == 3
    assert executions(stub) == 3


def test_key_header_option(make_proxy, stub):
    p = make_proxy("--key-header", "X-Request-Id")
    key = newkey("rid")
    a = post(p.port, key, key_header="X-Request-Id")
    b = post(p.port, key, key_header="x-request-id")
    assert a.status == b.status == 200
    assert replayed(b) and a.body == b.body
    assert executions(stub) == 1
    # Idempotency-Key is just another header now
    c = post(p.port, key)
    d = post(p.port, key)
    assert not replayed(c) and not replayed(d)
    assert executions(stub) == 3


def test_expect_100_continue_answered_by_proxy(proxy, stub):
    key = newkey("exp")
    body = b"y" * 3000
    with RawConn(proxy.port) as c:
        c.send(build_request("POST", "/orders",
                             [(KEY, key), ("Expect", "100-continue"),
                              ("Content-Length", str(len(body)))]))
        ver, status, _, _ = c.read_head()
        assert status == 100
        c.send(body)
        r = c.read_response()
    assert r.status == 200
    doc = upstream_echo(r)
    assert "expect" not in doc["hdict"], doc["hdict"]
    assert doc["body_len"] == len(body)
    # the duplicate is answered from the store after the same dance
    with RawConn(proxy.port) as c:
        c.send(build_request("POST", "/orders",
                             [(KEY, key), ("Expect", "100-continue"),
                              ("Content-Length", str(len(body)))]))
        ver, status, _, _ = c.read_head()
        assert status == 100
        c.send(body)
        dup = c.read_response()
    assert replayed(dup) and dup.body == r.body
    assert executions(stub) == 1


# ------------------------------------------------ replay

def test_replay_headers(proxy, stub):
    key = newkey("hdr")
    target = "/orders?header=X-Order:42&header=Set-Cookie:sid%3Dsecret&status=201"
    first = post(proxy.port, key, target)
    assert first.status == 201
    assert first.header("X-Order") == "42"
    assert first.header("Set-Cookie") == "sid=secret"
    assert not replayed(first)
    dup = post(proxy.port, key, target)
    assert dup.status == 201
    assert replayed(dup)
    assert dup.header_all("Idempotent-Replayed") == ["true"]
    assert dup.body == first.body
    assert dup.header("X-Order") == "42"
    assert dup.header("Content-Type") == first.header("Content-Type")
    assert dup.header_all("Content-Length") == [str(len(dup.body))]
    assert dup.header("Transfer-Encoding") is None
    # global scope: a guessed key must never hand out a session
    assert dup.header("Set-Cookie") is None, dup.headers
    assert executions(stub) == 1


def test_chunked_upstream_response_replayed_with_length(proxy, stub):
    key = newkey("chr")
    first = post(proxy.port, key, "/orders?chunked=1")
    dup = post(proxy.port, key, "/orders?chunked=1")
    assert first.status == dup.status == 200
    assert dup.body == first.body and replayed(dup)
    assert dup.header("Transfer-Encoding") is None
    assert dup.header_all("Content-Length") == [str(len(first.body))]
    assert executions(stub) == 1


@pytest.mark.parametrize("status", [400, 404, 409, 422])
def test_4xx_replayed(proxy, stub, status):
    key = newkey(f"s{status}")
    a = post(proxy.port, key, f"/orders?status={status}")
    b = post(proxy.port, key, f"/orders?status={status}")
    assert a.status == b.status == status
    assert replayed(b) and a.body == b.body
    assert executions(stub) == 1


def test_204_replayed(proxy, stub):
    key = newkey("s204")
    a = post(proxy.port, key, "/orders?status=204")
    b = post(proxy.port, key, "/orders?status=204")
    assert a.status == b.status == 204
    assert replayed(b) and b.body == b""
    assert executions(stub) == 1


# ------------------------------------------------ in flight

def test_client_disconnect_then_retry_gets_replay(proxy, stub):
    key = newkey("gone")
    raw = kreq("POST", "/orders?delay_ms=500", key, ORDER)
    c = RawConn(proxy.port)
    c.send(raw)
    time.sleep(0.05)
    c.close()                               # the client gives up at once
    time.sleep(0.1)
    r = post(proxy.port, key, "/orders?delay_ms=500")   # retry while in flight
    assert r.status == 200
    assert replayed(r)
    assert upstream_echo(r)["n"] == 1
    # and after it settled
    r2 = post(proxy.port, key, "/orders?delay_ms=500")
    assert replayed(r2) and r2.body == r.body
    assert executions(stub) == 1
    assert wait_metric(proxy, "idemproxy_in_flight", 0) == 0


def test_client_disconnect_retry_after_completion(proxy, stub):
    key = newkey("gone2")
    c = RawConn(proxy.port)
    c.send(kreq("POST", "/orders?delay_ms=300", key, ORDER))
    c.close()
    time.sleep(0.8)
    assert executions(stub) == 1
    r = post(proxy.port, key, "/orders?delay_ms=300")
    assert r.status == 200 and replayed(r)
    assert upstream_echo(r)["n"] == 1
    assert executions(stub) == 1


def test_in_flight_reject(make_proxy, stub):
    p = make_proxy("--in-flight", "reject")
    key = newkey("rej")
    raw = kreq("POST", "/orders?delay_ms=1000", key, ORDER)
    with RawConn(p.port) as a:
        a.send(raw)
        time.sleep(0.2)
        t0 = time.monotonic()
        r = post(p.port, key, "/orders?delay_ms=1000")
        assert time.monotonic() - t0 < 0.8
        assert_problem(r, 409, "request-in-progress")
        assert r.header("Retry-After") == "1"
        first = a.read_response()
    assert first.status == 200
    dup = post(p.port, key, "/orders?delay_ms=1000")
    assert replayed(dup) and dup.body == first.body
    assert executions(stub) == 1


def test_wait_timeout(make_proxy, stub):
    p = make_proxy("--wait-timeout", "200ms")
    key = newkey("wt")
    with RawConn(p.port) as a:
        a.send(kreq("POST", "/orders?delay_ms=1500", key, ORDER))
        time.sleep(0.1)
        t0 = time.monotonic()
        r = post(p.port, key, "/orders?delay_ms=1500")
        elapsed = time.monotonic() - t0
        assert_problem(r, 409, "request-in-progress")
        assert r.header("Retry-After") == "1"
        assert 0.15 <= elapsed < 1.0, elapsed
        assert a.read_response().status == 200
    assert executions(stub) == 1


def test_waiters_replay_when_winner_completes(proxy, stub):
    key = newkey("w")
    with RawConn(proxy.port) as a:
        a.send(kreq("POST", "/orders?delay_ms=400", key, ORDER))
        time.sleep(0.1)
        t0 = time.monotonic()
        rs = burst(proxy.port, 5, kreq("POST", "/orders?delay_ms=400", key,
                                       ORDER))
        elapsed = time.monotonic() - t0
        first = a.read_response()
    assert all(replayed(r) and r.body == first.body for r in rs)
    # woken by the completion, not by polling or a timeout
    assert elapsed < 1.5, elapsed
    assert executions(stub) == 1


# ------------------------------------------------ completion policy

def test_5xx_released_then_retry_executes(proxy, stub):
    key = newkey("503")
    a = post(proxy.port, key, "/orders?status=503")
    assert a.status == 503 and not replayed(a)
    b = post(proxy.port, key, "/orders?status=503")
    assert b.status == 503 and not replayed(b)
    assert upstream_echo(b)["n"] == 2
    assert executions(stub) == 2


def test_5xx_kept_with_on_upstream_error_keep(make_proxy, stub):
    p = make_proxy("--on-upstream-error", "keep")
    key = newkey("keep")
    a = post(p.port, key, "/orders?status=503")
    b = post(p.port, key, "/orders?status=503")
    assert a.status == b.status == 503
    assert replayed(b) and a.body == b.body
    assert executions(stub) == 1


@pytest.mark.parametrize("status", [401, 408, 425, 429])
def test_retryable_4xx_released(proxy, stub, status):
    key = newkey(f"r{status}")
    a = post(proxy.port, key, f"/orders?status={status}")
    b = post(proxy.port, key, f"/orders?status={status}")
    assert a.status == b.status == status
    assert not replayed(b)
    assert executions(stub) == 2


def test_released_key_waiters_reenter_claim_one_at_a_time(proxy, stub):
    """Every execution answers 503 (released): each waiter re-claims, one
    wins; executions never overlap (each request executes once)."""
    key = newkey("rel")
    t0 = time.monotonic()
    rs = burst(proxy.port, 4, kreq("POST", "/orders?status=503&delay_ms=200",
                                   key, ORDER))
    elapsed = time.monotonic() - t0
    assert all(r.status == 503 for r in rs)
    assert executions(stub) == 4
    assert sorted(upstream_echo(r)["n"] for r in rs) == [1, 2, 3, 4]
    assert elapsed >= 0.75, f"executions overlapped ({elapsed:.2f}s)"


def test_5xx_kept_waiters_replay(make_proxy, stub):
    p = make_proxy("--on-upstream-error", "keep")
    key = newkey("keepw")
    rs = burst(p.port, 4, kreq("POST", "/orders?status=500&delay_ms=200",
                               key, ORDER))
    assert all(r.status == 500 for r in rs)
    assert_identical(rs)
    assert_one_original(rs)
    assert executions(stub) == 1


@pytest.mark.parametrize("mode", ["release", "keep"])
def test_upstream_drop_is_an_unknown_outcome(make_proxy, stub, mode):
    """A connection dropped after the request was sent: the upstream may
    have executed it, so it is never sent again, with either
    --on-upstream-error (issue 43): 502 outcome-unknown, replayed."""
    p = make_proxy("--on-upstream-error", mode)
    key = newkey("drop")
    a = post(p.port, key, "/orders?drop=1")
    assert_problem(a, 502, "outcome-unknown")
    assert not replayed(a)
    b = post(p.port, key, "/orders?drop=1")
    assert_problem(b, 502, "outcome-unknown")
    assert replayed(b)
    assert b.body == a.body
    assert executions(stub) == 1


def test_upstream_drop_released_at_least_once(make_proxy, stub):
    """--unknown-outcome release: the old behaviour, by choice."""
    p = make_proxy("--unknown-outcome", "release")
    key = newkey("dropr")
    a = post(p.port, key, "/orders?drop=1")
    assert_problem(a, 502, "upstream-unavailable")
    b = post(p.port, key, "/orders?drop=1")
    assert_problem(b, 502, "upstream-unavailable")
    assert not replayed(b)
    assert executions(stub) == 2


@pytest.mark.parametrize("mode", ["release", "keep"])
def test_upstream_timeout_keeps_the_late_response(make_proxy, stub, mode):
    """No head within --upstream-timeout: 504 to the client, the exchange
    goes on and its late response is what the retry gets."""
    p = make_proxy("--on-upstream-error", mode, "--upstream-timeout",
                   "300ms", "--lease", "2s")
    key = newkey("tok")
    a = post(p.port, key, "/orders?delay_ms=1000")
    assert_problem(a, 504, "upstream-timeout")
    b = post(p.port, key, "/orders?delay_ms=1000")
    assert b.status == 200 and replayed(b), b
    assert upstream_echo(b)["n"] == 1
    assert executions(stub) == 1


def test_upstream_down_then_up(make_proxy, stub, tmp_path):
    port = free_port()
    p = make_proxy(upstream=f"http://127.0.0.1:{port}")
    key = newkey("down")
    a = post(p.port, key)
    assert_problem(a, 502, "upstream-unavailable")
    late = Stub(tmp_path, port=port, name="late-stub")
    try:
        b = post(p.port, key)
        assert b.status == 200 and not replayed(b)
        c = post(p.port, key)
        assert replayed(c) and c.body == b.body
        assert late.stats()["requests"] == 1
    finally:
        late.check_stopped()


def test_ttl_expiry(make_proxy, stub):
    p = make_proxy("--ttl", "1s")
    key = newkey("ttl")
    a = post(p.port, key)
    b = post(p.port, key)
    assert replayed(b)
    time.sleep(1.3)
    c = post(p.port, key)
    assert c.status == 200 and not replayed(c)
    assert upstream_echo(c)["n"] == 2
    # expired: a changed body is a new request, not a mismatch
    time.sleep(1.3)
    d = post(p.port, key, body=b"changed")
    assert d.status == 200 and not replayed(d)
    assert executions(stub) == 3


# ------------------------------------------------ sizes

def test_body_too_large_content_length(make_proxy, stub):
    p = make_proxy("--max-body", "1KiB")
    ok = post(p.port, newkey("fits"), body=b"a" * 1024)
    assert ok.status == 200
    with RawConn(p.port) as c:
        c.send(kreq("POST", "/orders", newkey("big"), b"a" * 1025))
        r = c.read_response()
        assert_problem(r, 413, "body-too-large")
        assert "close" in r.connection_tokens()
        assert c.wait_closed()
    assert executions(stub) == 1


def test_body_too_large_chunked(make_proxy, stub):
    p = make_proxy("--max-body", "1KiB")
    key = newkey("bigch")
    with RawConn(p.port) as c:
        c.send(build_request("POST", "/orders",
                             [(KEY, key), ("Transfer-Encoding", "chunked")],
                             chunked(b"b" * 3000, 500)))
        r = c.read_response()
    assert_problem(r, 413, "body-too-large")
    assert executions(stub) == 0
    # nothing was claimed: the same key with a small body executes
    r = post(p.port, key, body=b"small")
    assert r.status == 200 and not replayed(r)
    assert executions(stub) == 1


def test_unkeyed_large_body_streams(make_proxy, stub):
    p = make_proxy("--max-body", "1KiB")
    body = b"z" * 100000
    r = post(p.port, None, body=body)
    assert r.status == 200
    assert upstream_echo(r)["body_sha256"] == hashlib.sha256(body).hexdigest()


def test_response_too_large_to_store(make_proxy, stub):
    p = make_proxy("--max-cached-response", "1KiB")
    key = newkey("bigresp")
    a = post(p.port, key, "/orders?bytes=4096")
    assert a.status == 200
    assert a.body == pattern_bytes(0, 4096)
    b = post(p.port, key, "/orders?bytes=4096")
    assert_problem(b, 409, "response-not-stored")
    assert b.header("Retry-After") is None
    assert executions(stub) == 1
    # a small response is stored as usual
    k2 = newkey("smallresp")
    a = post(p.port, k2, "/orders?bytes=1000")
    b = post(p.port, k2, "/orders?bytes=1000")
    assert replayed(b) and b.body == a.body == pattern_bytes(0, 1000)
    assert executions(stub) == 2


def test_response_too_large_waiters(make_proxy, stub):
    p = make_proxy("--max-cached-response", "1KiB")
    key = newkey("bigw")
    raw = kreq("POST", "/orders?bytes=4096&delay_ms=300", key, ORDER)
    rs = burst(p.port, 4, raw)
    full = [r for r in rs if r.status == 200]
    assert len(full) == 1 and full[0].body == pattern_bytes(0, 4096)
    for r in rs:
        if r.status != 200:
            assert_problem(r, 409, "response-not-stored")
    assert executions(stub) == 1


# ------------------------------------------------ workers and metrics

def test_two_workers_share_keys(make_proxy, stub):
    p = make_proxy(workers=2)
    keys = [newkey(f"w2-{i}") for i in range(40)]

    def send(key):
        return post(p.port, key, "/orders?delay_ms=20")

    jobs = [k for k in keys for _ in range(6)]
    with cf.ThreadPoolExecutor(48) as ex:
        rs = list(ex.map(send, jobs))
    assert all(r.status == 200 for r in rs)
    stats = stub.stats()
    assert stats["requests"] == 40
    assert all(v == 1 for v in stats["keys"].values())
    by_key = {}
    for k, r in zip(jobs, rs):
        by_key.setdefault(k, []).append(r)
    for k, group in by_key.items():
        assert_identical(group)
        assert_one_original(group)


def test_metrics_outcomes(make_proxy, stub):
    p = make_proxy("--require-key", "true", "--in-flight", "reject",
                   "--max-body", "1KiB")
    before = outcomes(p)
    key = newkey("m")
    assert post(p.port, key).status == 200                       # forwarded
    assert replayed(post(p.port, key))                           # replayed
    assert replayed(post(p.port, key))                           # replayed
    assert post(p.port, key, body=b"x").status == 422            # mismatch
    assert post(p.port, None).status == 400                      # missing_key
    assert post(p.port, "").status == 400                        # invalid_key
    assert post(p.port, newkey(), body=b"a" * 2000).status == 413  # too_large
    k2 = newkey("m2")
    with RawConn(p.port) as a:
        a.send(kreq("POST", "/orders?delay_ms=600", k2, ORDER))  # forwarded
        time.sleep(0.2)
        assert post(p.port, k2, "/orders?delay_ms=600").status == 409  # conflict
        assert a.read_response().status == 200
    assert request(p.port, "GET", "/x").status == 200            # passthrough
    d = delta(before, outcomes(p))
    assert d == {"forwarded": 2, "replayed": 2, "mismatch": 1,
                 "missing_key": 1, "invalid_key": 1, "too_large": 1,
                 "conflict": 1, "passthrough": 1}, d
    assert wait_metric(p, "idemproxy_in_flight", 0) == 0


def test_metrics_waiters(proxy, stub):
    before = outcomes(proxy)
    w0 = metric_value(proxy.metrics(), "idemproxy_wait_seconds_count") or 0
    key = newkey("mw")
    raw = kreq("POST", "/orders?delay_ms=800", key, ORDER)
    with RawConn(proxy.port) as a:
        a.send(raw)
        # forwarded once its claim is won (a fresh database's first claim
        # also makes the schema): the duplicates come while it runs
        in_flight = wait_metric(proxy, "idemproxy_in_flight", 1)
        rs = burst(proxy.port, 3, raw)
        assert a.read_response().status == 200
    assert all(replayed(r) for r in rs)
    assert in_flight == 1
    w1 = metric_value(proxy.metrics(), "idemproxy_wait_seconds_count") or 0
    assert w1 - w0 == 3
    ws = metric_value(proxy.metrics(), "idemproxy_wait_seconds_sum") or 0
    assert ws >= 3 * 0.1
    d = delta(before, outcomes(proxy))
    assert d == {"forwarded": 1, "replayed": 3}, d
    assert wait_metric(proxy, "idemproxy_in_flight", 0) == 0


# ------------------------------------------------ connections coming and going

def test_pipelined_duplicates_on_one_connection(proxy, stub):
    key = newkey("pipe")
    raw = kreq("POST", "/orders?delay_ms=100", key, ORDER)
    with RawConn(proxy.port) as c:
        c.send(raw + raw + raw)
        rs = [c.read_response() for _ in range(3)]
    assert all(r.status == 200 for r in rs)
    assert_identical(rs)
    assert not replayed(rs[0]) and replayed(rs[1]) and replayed(rs[2])
    assert executions(stub) == 1


def test_waiter_disconnects_while_waiting(proxy, stub):
    key = newkey("wgone")
    raw = kreq("POST", "/orders?delay_ms=500", key, ORDER)
    with RawConn(proxy.port) as a:
        a.send(raw)
        time.sleep(0.1)
        for _ in range(5):
            w = RawConn(proxy.port)
            w.send(raw)
            time.sleep(0.02)
            w.close()
        first = a.read_response()
    assert first.status == 200
    r = post(proxy.port, key, "/orders?delay_ms=500")
    assert replayed(r) and r.body == first.body
    assert executions(stub) == 1
    assert wait_metric(proxy, "idemproxy_in_flight", 0) == 0


def test_winner_disconnects_waiters_still_replay(proxy, stub):
    key = newkey("wingone")
    raw = kreq("POST", "/orders?delay_ms=400", key, ORDER)
    a = RawConn(proxy.port)
    a.send(raw)
    time.sleep(0.1)
    conns = [RawConn(proxy.port) for _ in range(3)]
    for c in conns:
        c.send(raw)
    time.sleep(0.05)
    a.close()
    rs = [c.read_response() for c in conns]
    for c in conns:
        c.close()
    assert all(r.status == 200 and replayed(r) for r in rs)
    assert_identical(rs)
    assert upstream_echo(rs[0])["n"] == 1
    assert executions(stub) == 1


def test_two_workers_waiters_woken_across_threads(make_proxy, stub):
    """Waiters parked on either worker are woken by the winner's completion
    on the other one (not by the wait timeout or the lease)."""
    p = make_proxy("--wait-timeout", "5s", workers=2)
    for round_ in range(3):
        key = newkey(f"x{round_}")
        raw = kreq("POST", "/orders?delay_ms=300", key, ORDER)
        t0 = time.monotonic()
        rs = burst(p.port, 16, raw)
        elapsed = time.monotonic() - t0
        assert all(r.status == 200 for r in rs), [r.status for r in rs]
        assert_identical(rs)
        assert_one_original(rs)
        assert elapsed < 2.0, elapsed
    assert executions(stub) == 3
    before = outcomes(p)
    assert before["forwarded"] == 3 and before["replayed"] == 45, before
