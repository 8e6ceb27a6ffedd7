"""The in-process response cache in front of PostgreSQL (and Redis)
(issue 9 "Speed"): replays from memory, never past the record's expiry,
a purge announced by NOTIFY reaches every instance, and --response-cache 0
turns it off.

To prove that an answer came from the cache, a test deletes the record from
PostgreSQL (and Redis) first: without the cache, the same request would
execute again.
"""
import time

import pytest

from support.http import assert_problem
from support.procs import metric_value, wait_readyz
from support.relay import Relay
from test_idempotency import executions, newkey, post, replayed


def start(make_proxy, pg_db, *flags, **kw):
    p = make_proxy("--store", pg_db.url, *flags, **kw)
    wait_readyz(p)
    return p


def cache_hits(p):
    return metric_value(p.metrics(),
                        "idemproxy_response_cache_hits_total") or 0


def wait_listening(p, pg_db, n=1, timeout=10.0):
    """The cache serves only while a listener hears purges: wait until the
    proxy's LISTEN connections are in pg_stat_activity (their setup and
    their probes name the column idemproxy_listener)."""
    deadline = time.monotonic() + timeout
    while True:
        got = int(pg_db.psql(
            "select count(*) from pg_stat_activity where datname = "
            "current_database() and query like '%AS idemproxy_listener'"))
        if got >= n:
            return
        assert time.monotonic() < deadline, "no LISTEN connection"
        time.sleep(0.05)


def purge(pg_db, key, scope=""):
    pg_db.psql(f"delete from idempotency_keys where key = '{key}'")
    pg_db.psql(f"select pg_notify('idemproxy', 'purge:{scope}:{key}')")


@pytest.mark.parametrize("with_redis", [False, True])
def test_replay_from_memory_then_purge(make_proxy, pg_db, request,
                                       with_redis, stub):
    flags = []
    if with_redis:
        flags = ["--redis", request.getfixturevalue("redis").url]
    p = start(make_proxy, pg_db, *flags)
    wait_listening(p, pg_db)
    key = newkey("rc")
    first = post(p.port, key)
    assert first.status == 200
    dup = post(p.port, key)
    assert replayed(dup) and dup.body == first.body
    # the row gone behind the proxy's back (no NOTIFY): still a replay,
    # from memory - completed records are immutable until they expire
    pg_db.psql(f"delete from idempotency_keys where key = '{key}'")
    if with_redis:
        request.getfixturevalue("redis").cmd("FLUSHALL")
    h0 = cache_hits(p)
    dup = post(p.port, key)
    assert replayed(dup) and dup.body == first.body
    assert cache_hits(p) == h0 + 1
    assert executions(stub) == 1
    m = p.metrics()
    assert metric_value(m, "idemproxy_response_cache_entries") >= 1
    assert metric_value(m, "idemproxy_response_cache_bytes") > len(first.body)
    # an explicit purge is heard: the key executes again
    pg_db.psql(f"select pg_notify('idemproxy', 'purge::{key}')")
    deadline = time.monotonic() + 5
    while True:
        r = post(p.port, key)
        if not replayed(r):
            break
        assert time.monotonic() < deadline, "purge not heard"
        time.sleep(0.1)
    assert r.status == 200
    assert executions(stub) == 2


def test_purge_reaches_every_instance(make_proxy, pg_db, stub):
    a = start(make_proxy, pg_db, name="a", workers=2)
    b = start(make_proxy, pg_db, name="b", workers=2)
    wait_listening(a, pg_db, n=2)
    key = newkey("rc2")
    first = post(a.port, key)
    assert first.status == 200
    for p in (a, b):
        r = post(p.port, key)
        assert replayed(r) and r.body == first.body
        r = post(p.port, key)
        assert replayed(r) and r.body == first.body
    assert cache_hits(a) + cache_hits(b) >= 2
    purge(pg_db, key)
    time.sleep(0.5)
    # each instance forgot it: the first duplicate executes (once, in the
    # store's claim), the second on the other instance replays that one
    ra = post(a.port, key)
    rb = post(b.port, key)
    assert ra.status == 200 and not replayed(ra)
    assert replayed(rb) and rb.body == ra.body
    assert executions(stub) == 2


def test_purge_heard_or_cache_off_when_listener_cut(make_proxy, pg_db,
                                                     stub):
    """(~8 s) Instance a reaches PostgreSQL through a relay that turns a's
    LISTEN connection into a black hole (no reset, no byte: a flow a NAT
    dropped), its statement connections untouched; the purge, made on
    instance b's side, is never delivered to a. a must stop serving the
    purged response from memory within the documented 3 s (its listener's
    probe goes unanswered): 4 s after the purge a's duplicate executes
    again instead of replaying it."""
    relay = Relay(pg_db.server.port)
    try:
        a = make_proxy("--store", pg_db.url.replace(
            f":{pg_db.server.port}/", f":{relay.port}/"), name="a")
        wait_readyz(a)
        b = start(make_proxy, pg_db, name="b")
        wait_listening(a, pg_db, n=2)
        key = newkey("rccut")
        first = post(a.port, key)
        assert first.status == 200
        r = post(a.port, key)       # read from PostgreSQL, kept
        assert replayed(r) and r.body == first.body
        h0 = cache_hits(a)
        r = post(a.port, key)
        assert replayed(r) and r.body == first.body
        assert cache_hits(a) == h0 + 1, "not served from a's memory"
        assert relay.cut(b"LISTEN idemproxy") >= 1
        purge(pg_db, key)
        time.sleep(4)
        r = post(a.port, key)
        assert r.status == 200 and not replayed(r), \
            f"a replayed a response purged 4 s ago: {r!r}"
        assert executions(stub) == 2
        rb = post(b.port, key)
        assert replayed(rb) and rb.body == r.body
    finally:
        relay.close()


def test_purge_all(make_proxy, pg_db, stub):
    p = start(make_proxy, pg_db)
    wait_listening(p, pg_db)
    keys = [newkey("rcall") for _ in range(3)]
    for k in keys:
        assert post(p.port, k).status == 200
        assert replayed(post(p.port, k))
    pg_db.psql("delete from idempotency_keys")
    pg_db.psql("select pg_notify('idemproxy', 'purge:*')")
    time.sleep(0.5)
    for k in keys:
        r = post(p.port, k)
        assert r.status == 200 and not replayed(r)
    assert executions(stub) == 6


def test_never_past_expiry(make_proxy, pg_db, stub):
    p = start(make_proxy, pg_db, "--ttl", "2s")
    wait_listening(p, pg_db)
    key = newkey("rcttl")
    first = post(p.port, key)
    t_done = time.monotonic()
    assert first.status == 200
    dup = post(p.port, key)
    assert replayed(dup)
    time.sleep(max(0.0, 2.3 - (time.monotonic() - t_done)))
    r = post(p.port, key)
    assert r.status == 200 and not replayed(r)     # expired: executes again
    assert executions(stub) == 2


def test_mismatch_from_cache(make_proxy, pg_db, stub):
    p = start(make_proxy, pg_db)
    wait_listening(p, pg_db)
    key = newkey("rcmm")
    assert post(p.port, key).status == 200
    assert replayed(post(p.port, key))
    pg_db.psql(f"delete from idempotency_keys where key = '{key}'")
    r = post(p.port, key, body=b'{"item":"book","amount":999}')
    assert_problem(r, 422, "idempotency-key-mismatch")
    assert executions(stub) == 1


def test_cache_off(make_proxy, pg_db, stub):
    p = start(make_proxy, pg_db, "--response-cache", "0")
    key = newkey("rcoff")
    assert post(p.port, key).status == 200
    assert replayed(post(p.port, key))
    pg_db.psql(f"delete from idempotency_keys where key = '{key}'")
    r = post(p.port, key)
    assert r.status == 200 and not replayed(r)
    assert executions(stub) == 2
    assert cache_hits(p) == 0


def test_cache_bounded_by_bytes(make_proxy, pg_db, stub):
    """1 MiB of cache and 2 KiB responses: entries stay within the bound
    and the oldest go first."""
    p = start(make_proxy, pg_db, "--response-cache", "1MiB")
    wait_listening(p, pg_db)
    body = b"x" * 2000
    keys = [newkey("rcb") for _ in range(700)]
    for k in keys:
        assert post(p.port, k, target="/orders?bytes=2000",
                    body=body).status == 200
    m = p.metrics()
    assert metric_value(m, "idemproxy_response_cache_bytes") <= 1024 * 1024
    n = metric_value(m, "idemproxy_response_cache_entries")
    assert 100 < n < 700, n
    pg_db.psql("delete from idempotency_keys")
    # the newest are still replayed from memory, the oldest are gone
    r = post(p.port, keys[-1], target="/orders?bytes=2000", body=body)
    assert replayed(r)
    r = post(p.port, keys[0], target="/orders?bytes=2000", body=body)
    assert r.status == 200 and not replayed(r)
