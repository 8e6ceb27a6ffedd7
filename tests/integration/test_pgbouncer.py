"""idemproxy behind a real pgbouncer (docs/ha.md "pgbouncer").

Session pooling (pool_mode = session) is supported: duplicates across two
instances execute once, a purge made on one instance is honoured by the
other within the documented bound, and pgbouncer killed and started again
costs a few refused requests, never a second execution.

Transaction pooling is not: a pooler that hands a session to other clients
between transactions loses LISTEN's notifications for whoever does not
hold the session when they come, so purges go unheard and the response
cache would replay what they deleted, and statements prepared in one
session are missing in the next. idemproxy notices it (a new connection
whose session had its statements prepared already, a statement connection
that hears a notification, a listener whose probe runs in another
backend), says so once as an error that names the fix, and turns its
response cache off for the rest of the process.
"""
import os
import threading
import time

import pytest

from support.procs import metric_value, wait_readyz
from support.stores import PGBOUNCER_BIN, Bouncer
from test_idempotency import (ORDER, burst, executions, kreq, newkey, post,
                              replayed)
from test_keys import TOKEN, admin, token_file  # noqa: F401 (a fixture)

pytestmark = pytest.mark.skipif(not os.access(PGBOUNCER_BIN, os.X_OK),
                                reason=f"pgbouncer missing ({PGBOUNCER_BIN})")

SHARED_HINT = "pool_mode = session"


@pytest.fixture
def bouncer(pg_server):
    """bouncer(mode, pool_size=20) -> a Bouncer in front of the session's
    PostgreSQL; every one started is stopped by PID at teardown."""
    started = []

    def make(mode, pool_size=20):
        b = Bouncer(pg_server, mode, pool_size)
        started.append(b)
        return b
    yield make
    for b in started:
        b.shutdown()


def start(make_proxy, token_file, url, name, workers):
    p = make_proxy("--store", url, "--admin-token-file", token_file,
                   name=name, workers=workers)
    wait_readyz(p, timeout=20)
    return p


def post_until_answered(port, key, timeout=20.0):
    """Retries while the store is out of reach (503), as a client would."""
    deadline = time.monotonic() + timeout
    while True:
        r = post(port, key)
        if r.status != 503 or time.monotonic() > deadline:
            return r
        time.sleep(0.1)


def test_session_pooling(bouncer, make_proxy, stub, pg_db, token_file):
    # every connection the two instances may open (2 x 13), and spare
    b = bouncer("session", pool_size=40)
    url = b.url(pg_db.name)
    one = start(make_proxy, token_file, url, "one", 2)
    two = start(make_proxy, token_file, url, "two", 2)

    key = newkey("bnc")
    first = post(one.port, key)
    assert first.status == 200 and not replayed(first)
    for p in (two, two, one):
        r = post(p.port, key)
        assert replayed(r) and r.body == first.body
    status, _, doc = admin(one, "DELETE", key, token=TOKEN)
    assert status == 200 and "postgres" in doc["found_in"]
    # the instance that purged executes the next request at once; the
    # other hears it through pgbouncer within the bound (docs/operations.md
    # "Purging a key": 3 s), replaying the purged response until then
    deadline = time.monotonic() + 3.0
    while True:
        again = post(two.port, key)
        if not replayed(again):
            break
        assert again.body == first.body
        assert time.monotonic() < deadline, "the purge went unheard"
        time.sleep(0.02)
    assert again.status == 200
    assert replayed(post(one.port, key))
    assert executions(stub) == 2

    # 8 at once on each instance: one execution
    key = newkey("bnc-burst")
    raw = kreq("POST", "/orders", key, ORDER)
    out = []
    threads = [threading.Thread(target=lambda p=p: out.extend(
        burst(p.port, 8, raw))) for p in (one, two)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    answers = out
    assert len(answers) == 16
    assert all(r.status in (200, 409) for r in answers), \
        [r.status for r in answers]
    assert executions(stub) == 3

    # pgbouncer killed: every connection cut; started again on its port
    b.kill()
    time.sleep(0.5)
    b.start()
    keys = [newkey("bnc-after") for _ in range(6)]
    for i, k in enumerate(keys):
        r = post_until_answered((one, two)[i % 2].port, k)
        assert r.status == 200 and not replayed(r)
    for i, k in enumerate(keys):
        assert replayed(post((two, one)[i % 2].port, k))
    assert executions(stub) == 3 + len(keys)
    for p in (one, two):
        assert SHARED_HINT not in p.log()


def test_transaction_pooling_named_and_the_cache_off(bouncer, make_proxy, stub,
                                                      pg_db, token_file):
    """One server connection: the second statement connection made (the
    worker's and the main thread's are made at start) finds the first
    one's statements prepared in its session. The cache turning off is
    test_store.c's (test_cache); here, that the sign is seen and named."""
    b = bouncer("transaction", pool_size=1)
    p = make_proxy("--store", b.url(pg_db.name), "--admin-token-file",
                   token_file, name="tx")
    deadline = time.monotonic() + 20
    while SHARED_HINT not in p.log():
        assert time.monotonic() < deadline, p.log()[-3000:]
        time.sleep(0.1)
    lines = [line for line in p.log().splitlines() if SHARED_HINT in line]
    assert len(lines) == 1, lines       # said once
    assert " error postgres store: " in lines[0]
    assert "The response cache is off" in lines[0]
    assert metric_value(p.metrics(),
                        "idemproxy_response_cache_entries") == 0
