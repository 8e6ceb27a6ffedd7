"""Redis as the fast path in front of PostgreSQL (DESIGN.md §1 item 11, §2,
§7; issue 4 "Tests"): hits replay without PostgreSQL, a mismatch answers
422 from Redis, and Redis down, slow or flushed is never an error and never
a duplicate execution.

To prove that an answer came from Redis, a test deletes the record from
PostgreSQL first: without the cache, the same request would execute again.
The in-process response cache (in front of Redis) is off here, so that
every duplicate reaches Redis; test_response_cache.py covers it.
"""
import concurrent.futures as cf
import time

from support.http import RawConn, assert_problem
from support.procs import metric_value, readyz, wait_readyz
from test_idempotency import (ORDER, assert_identical, assert_one_original,
                              executions, kreq, newkey, post, replayed)
from test_postgres import burst_split

TTL_S = 60


def start(make_proxy, pg_db, redis, *flags, **kw):
    p = make_proxy("--store", pg_db.url, "--redis", redis.url,
                   "--ttl", f"{TTL_S}s", "--response-cache", "0", *flags,
                   **kw)
    wait_readyz(p)
    return p


def hits(p):
    return metric_value(p.metrics(), "idemproxy_redis_hits_total") or 0


def redis_errors(p):
    return metric_value(p.metrics(), "idemproxy_store_errors_total",
                        {"store": "redis"}) or 0


def warm(*proxies):
    """The Redis connection of a loop is made by its first claim: one keyed
    request per proxy (one worker each), then a moment to connect."""
    for p in proxies:
        assert post(p.port, newkey("warm")).status == 200
    time.sleep(0.3)


def rkey(key, scope=""):
    return f"idemproxy:{scope}:{key}"


def wait_cached(redis, key, timeout=3.0):
    """Write-through is fire and forget: wait until the value is there."""
    deadline = time.monotonic() + timeout
    while True:
        v = redis.cmd("GET", rkey(key))
        if v is not None or time.monotonic() > deadline:
            return v
        time.sleep(0.02)


def test_hit_path(make_proxy, pg_db, redis, stub):
    a = start(make_proxy, pg_db, redis, name="a")
    b = start(make_proxy, pg_db, redis, name="b")
    warm(a, b)
    key = newkey("hit")
    target = "/orders?status=201&header=X-Order:9"
    first = post(a.port, key, target)
    assert first.status == 201 and not replayed(first)
    value = wait_cached(redis, key)
    assert value is not None, redis.cmd("KEYS", "*")
    assert value[:4] == b"IPR2"
    pttl = redis.cmd("PTTL", rkey(key))
    assert (TTL_S - 10) * 1000 < pttl <= TTL_S * 1000, pttl
    h0 = hits(b)
    dup = post(b.port, key, target)
    assert dup.status == 201 and replayed(dup)
    assert dup.body == first.body and dup.header("X-Order") == "9"
    assert hits(b) == h0 + 1
    # served without PostgreSQL: the record is gone there, Redis answers
    pg_db.psql(f"delete from idempotency_keys where key = '{key}'")
    dup2 = post(b.port, key, target)
    assert dup2.status == 201 and replayed(dup2) and dup2.body == first.body
    assert hits(b) == h0 + 2
    assert executions(stub) == 3            # 2 warm-ups + 1


def test_mismatch_from_redis(make_proxy, pg_db, redis, stub):
    a = start(make_proxy, pg_db, redis, name="a")
    b = start(make_proxy, pg_db, redis, name="b")
    warm(a, b)
    key = newkey("mm")
    first = post(a.port, key)
    assert first.status == 200
    assert wait_cached(redis, key) is not None
    pg_db.psql(f"delete from idempotency_keys where key = '{key}'")
    r = post(b.port, key, body=b'{"item":"book","amount":999}')
    assert_problem(r, 422, "idempotency-key-mismatch")
    r = post(b.port, key, "/orders?other=1")
    assert_problem(r, 422, "idempotency-key-mismatch")
    r = post(b.port, key)
    assert replayed(r) and r.body == first.body
    assert executions(stub) == 3


def test_response_not_stored_from_redis(make_proxy, pg_db, redis, stub):
    a = start(make_proxy, pg_db, redis, "--max-cached-response", "1KiB",
              name="a")
    warm(a)
    key = newkey("big")
    first = post(a.port, key, "/orders?bytes=4096")
    assert first.status == 200 and len(first.body) == 4096
    assert wait_cached(redis, key) is not None
    pg_db.psql(f"delete from idempotency_keys where key = '{key}'")
    r = post(a.port, key, "/orders?bytes=4096")
    assert_problem(r, 409, "response-not-stored")
    assert executions(stub) == 2


def test_redis_killed_then_restarted(make_proxy, pg_db, redis, stub):
    a = start(make_proxy, pg_db, redis, name="a")
    b = start(make_proxy, pg_db, redis, name="b")
    warm(a, b)
    k1 = newkey("k1")
    first = post(a.port, k1)
    assert wait_cached(redis, k1) is not None
    redis.kill()
    # everything goes to PostgreSQL; no error reaches a client
    t0 = time.monotonic()
    r = post(b.port, k1)
    assert r.status == 200 and replayed(r) and r.body == first.body
    for p in (a, b):
        k = newkey("down")
        x = post(p.port, k)
        y = post((b if p is a else a).port, k)
        assert x.status == y.status == 200
        assert replayed(y) and y.body == x.body
    k3 = newkey("burst")
    rs = burst_split([a.port, b.port], 20,
                     kreq("POST", "/orders?delay_ms=200", k3, ORDER))
    assert all(r.status == 200 for r in rs), [r.status for r in rs]
    assert_identical(rs)
    assert_one_original(rs)
    assert time.monotonic() - t0 < 5.0
    assert readyz(a) == readyz(b) == 200          # Redis never affects it
    assert a.proc.poll() is None and b.proc.poll() is None
    stats = stub.stats()["keys"]
    assert all(v == 1 for v in stats.values()), stats
    # back (empty, same port): hits again after the reconnect back-off
    redis.start()
    deadline = time.monotonic() + 10
    h0 = hits(b)
    while True:
        k = newkey("back")
        x = post(a.port, k)
        y = post(b.port, k)
        assert x.status == y.status == 200 and replayed(y)
        if hits(b) > h0:
            break
        assert time.monotonic() < deadline, "no Redis hit after restart"
        time.sleep(0.3)
    assert redis.cmd("EXISTS", rkey(k)) == 1
    r = post(b.port, k1)                    # not in Redis any more: PG
    assert replayed(r) and r.body == first.body
    stats = stub.stats()["keys"]
    assert all(v == 1 for v in stats.values()), stats


def test_redis_down_at_start(make_proxy, pg_db, redis, stub):
    redis.stop()
    a = start(make_proxy, pg_db, redis, name="a")
    assert readyz(a) == 200
    key = newkey("nr")
    x = post(a.port, key)
    y = post(a.port, key)
    assert x.status == 200 and replayed(y) and y.body == x.body
    redis.start()
    deadline = time.monotonic() + 10
    h0 = hits(a)
    while hits(a) == h0:
        assert time.monotonic() < deadline, "no Redis hit after it started"
        k = newkey("later")
        post(a.port, k)
        post(a.port, k)
        time.sleep(0.3)
    assert executions(stub) == len(stub.stats()["keys"])


def test_flushall_never_duplicates(make_proxy, pg_db, redis, stub):
    a = start(make_proxy, pg_db, redis, name="a")
    b = start(make_proxy, pg_db, redis, name="b")
    warm(a, b)
    key = newkey("flush")
    first = post(a.port, key)
    assert wait_cached(redis, key) is not None
    redis.cmd("FLUSHALL")
    h0 = hits(b)
    r = post(b.port, key)
    assert r.status == 200 and replayed(r) and r.body == first.body
    assert hits(b) == h0                    # served by PostgreSQL
    # flushed again and again while duplicates are in flight
    k2 = newkey("flush2")
    raw = kreq("POST", "/orders?delay_ms=300", k2, ORDER)
    with cf.ThreadPoolExecutor(1) as ex:
        fut = ex.submit(burst_split, [a.port, b.port], 20, raw)
        for _ in range(10):
            redis.cmd("FLUSHALL")
            time.sleep(0.05)
        rs = fut.result(30)
    assert all(x.status == 200 for x in rs), [x.status for x in rs]
    assert_identical(rs)
    assert_one_original(rs)
    redis.cmd("FLUSHALL")
    r = post(a.port, k2, "/orders?delay_ms=300")
    assert replayed(r) and r.body == rs[0].body
    stats = stub.stats()["keys"]
    assert stats[key] == 1 and stats[k2] == 1, stats


def test_redis_paused_is_bounded(make_proxy, pg_db, redis, stub):
    """A Redis that stops answering (SIGSTOP) only costs the lookup bound:
    replays and new keys go to PostgreSQL."""
    a = start(make_proxy, pg_db, redis, name="a")
    b = start(make_proxy, pg_db, redis, name="b")
    warm(a, b)
    key = newkey("slow")
    first = post(a.port, key)
    assert wait_cached(redis, key) is not None
    redis.pause()
    try:
        t0 = time.monotonic()
        r = post(b.port, key, timeout=10)
        took = time.monotonic() - t0
        assert r.status == 200 and replayed(r) and r.body == first.body
        assert took < 2.0, took
        for i in range(5):
            k = newkey(f"slow{i}")
            t0 = time.monotonic()
            x = post(a.port, k, timeout=10)
            y = post(b.port, k, timeout=10)
            assert time.monotonic() - t0 < 3.0
            assert x.status == y.status == 200 and replayed(y)
        assert readyz(a) == readyz(b) == 200
    finally:
        redis.resume()
    stats = stub.stats()["keys"]
    assert all(v == 1 for v in stats.values()), stats


def test_in_flight_duplicates_across_instances_with_redis(make_proxy, pg_db,
                                                          redis, stub):
    """PostgreSQL alone decides claims: 50 concurrent duplicates over two
    instances with the cache in front, 1 execution."""
    a = start(make_proxy, pg_db, redis, workers=2, name="a")
    b = start(make_proxy, pg_db, redis, workers=2, name="b")
    key = newkey("two")
    rs = burst_split([a.port, b.port], 50,
                     kreq("POST", "/orders?delay_ms=300", key, ORDER))
    assert all(r.status == 200 for r in rs), [r.status for r in rs]
    assert_identical(rs)
    assert_one_original(rs)
    assert executions(stub) == 1
    with RawConn(b.port) as c:              # and the cached replay matches
        c.send(kreq("POST", "/orders?delay_ms=300", key, ORDER))
        r = c.read_response()
    assert replayed(r) and r.body == rs[0].body


def test_read_through_after_flush(make_proxy, pg_db, redis, stub):
    """A replay PostgreSQL had to serve (Redis flushed) is cached again for
    the record's remaining life: the next duplicate is a Redis hit, and is
    served even with the PostgreSQL row gone."""
    a = start(make_proxy, pg_db, redis, name="a")
    warm(a)
    key = newkey("rt")
    first = post(a.port, key)
    assert first.status == 200
    assert wait_cached(redis, key) is not None
    redis.cmd("FLUSHALL")
    h0 = hits(a)
    dup = post(a.port, key)                  # from PostgreSQL, cached again
    assert replayed(dup) and dup.body == first.body
    assert hits(a) == h0
    assert wait_cached(redis, key) is not None
    pttl = redis.cmd("PTTL", rkey(key))
    assert 0 < pttl <= TTL_S * 1000, pttl
    pg_db.psql(f"delete from idempotency_keys where key = '{key}'")
    dup2 = post(a.port, key)                 # Redis alone
    assert replayed(dup2) and dup2.body == first.body
    assert hits(a) == h0 + 1
    assert executions(stub) == 2             # the warm-up and the original
