"""Redis copies that arrive late or outlive a failover (issue 21 item 2,
issue 19 item 4): no copy outlives its PostgreSQL record or survives a
purge, however late its write reaches Redis, and a replica promoted
without the purge's tombstone replays nothing purged.

Instance A reaches Redis through a relay that can hold its bytes (a stalled
path: the write-through leaves A, then waits); instance B talks to Redis
directly and purges. The in-process response cache is off, so every
duplicate asks Redis first.
"""
import os
import signal
import threading
import time

import pytest

from support.procs import wait_readyz
from support.relay import Relay
from support.stores import REDIS_BIN
from test_idempotency import newkey, post, replayed
from test_keys import TOKEN, admin, token_file  # noqa: F401 (fixture)
from test_pg_outcomes import execs
from test_redis import rkey, warm
from test_redis_sentinel import (sentinel_setup,  # noqa: F401 (fixture)
                                 text, wait_for)

pytestmark = pytest.mark.skipif(not os.access(REDIS_BIN, os.X_OK),
                                reason="redis-server not installed")


@pytest.fixture
def relay(redis):
    r = Relay(redis.port)
    yield r
    r.close()


def start(make_proxy, pg_db, redis_url, token_file, *flags, name):
    p = make_proxy("--store", pg_db.url, "--redis", redis_url,
                   "--response-cache", "0", "--admin-token-file", token_file,
                   *flags, name=name)
    wait_readyz(p)
    return p


def held_completion(p, relay, key, delay_ms=1500):
    """POST key to p with an upstream that takes delay_ms; hold p's Redis
    bytes once the claim was answered, so that the completion commits in
    PostgreSQL while its write-through waits in the relay."""
    out = {}
    t = threading.Thread(target=lambda: out.setdefault(
        "r", post(p.port, key, f"/orders?delay_ms={delay_ms}")))
    t.start()
    time.sleep(delay_ms / 3000)
    relay.hold()
    t.join()
    r = out["r"]
    assert r.status == 200 and not replayed(r), r
    return r


def test_a_late_write_cannot_bring_back_a_purged_response(
        make_proxy, pg_db, redis, relay, stub, token_file):
    a = start(make_proxy, pg_db, f"redis://127.0.0.1:{relay.port}",
              token_file, name="a")
    b = start(make_proxy, pg_db, redis.url, token_file, name="b")
    warm(a, b)
    key = newkey("late-purge")
    first = held_completion(a, relay, key)
    assert redis.cmd("GET", rkey(key)) is None
    status, _, doc = admin(b, "DELETE", key, token=TOKEN)
    assert status == 200 and "postgres" in doc["found_in"], doc
    assert redis.cmd("GET", rkey(key)).startswith(b"idemproxy:purged")
    # longer than any tombstone used to live (10 s)
    time.sleep(11)
    relay.release()
    time.sleep(0.5)
    assert relay.held > 0
    assert redis.cmd("GET", rkey(key)).startswith(b"idemproxy:purged"), \
        "the late write replaced the tombstone"
    again = post(b.port, key)
    assert again.status == 200 and not replayed(again), again
    assert again.body != first.body
    assert execs(stub, key) == 2
    # the new record's copy passes the tombstone (learned after it)
    assert post(a.port, key).body == again.body
    wait_for(lambda: not (redis.cmd("GET", rkey(key)) or b"idemproxy:purged")
             .startswith(b"idemproxy:purged"), 5,
             "the new record's copy")


def test_b_a_late_write_cannot_outlive_its_record(
        make_proxy, pg_db, redis, relay, stub, token_file):
    a = start(make_proxy, pg_db, f"redis://127.0.0.1:{relay.port}",
              token_file, "--ttl", "4s", name="a")
    warm(a)
    key = newkey("late-ttl")
    held_completion(a, relay, key)
    time.sleep(4.5)             # the record expired meanwhile
    relay.release()
    time.sleep(0.5)
    assert relay.held > 0
    assert redis.cmd("GET", rkey(key)) is None, \
        "a copy written after its record expired"
    r = post(a.port, key)
    assert r.status == 200 and not replayed(r)
    assert execs(stub, key) == 2


def test_c_a_replica_promoted_without_the_purge_replays_nothing(
        make_proxy, pg_db, stub, token_file, sentinel_setup):
    master, replica, sentinel = sentinel_setup
    url = f"redis-sentinel://127.0.0.1:{sentinel.port}/m"
    p = start(make_proxy, pg_db, url, token_file, name="p")
    warm(p)
    key = newkey("promoted")
    first = post(p.port, key)
    assert first.status == 200
    wait_for(lambda: replica.cmd("GET", rkey(key)) is not None, 10,
             "the copy on the replica")
    assert replayed(post(p.port, key))
    # the replica stops hearing (stopped, its link cut by the master, so
    # nothing more reaches even its socket): the purge's tombstone stays on
    # the master, which then dies
    os.kill(replica.proc.pid, signal.SIGSTOP)
    try:
        master.cmd("CLIENT", "KILL", "TYPE", "replica")
        status, _, doc = admin(p, "DELETE", key, token=TOKEN)
        assert status == 200 and "redis" in doc["found_in"], doc
        master.proc.kill()
        master.proc.wait()
    finally:
        os.kill(replica.proc.pid, signal.SIGCONT)
    wait_for(lambda: sentinel.master_port() == replica.port, 30,
             "the sentinel to promote the replica")
    wait_for(lambda: "role:master" in text(replica.cmd("INFO",
                                                        "replication")),
             20, "the replica to be master")
    # the promoted master still holds the purged copy ...
    old = replica.cmd("GET", rkey(key))
    assert old is not None and not old.startswith(b"idemproxy:purged")

    # ... which is never served once the proxy writes to it: the key
    # executes again
    def follows():
        fresh = newkey("after")
        post(p.port, fresh)
        return replica.cmd("GET", rkey(fresh)) is not None
    wait_for(follows, 20, "the proxy to write to the promoted master")
    r = post(p.port, key)
    assert r.status == 200 and not replayed(r), r
    assert r.body != first.body
    assert execs(stub, key) == 2
    # its copy replaces the old one
    wait_for(lambda: replica.cmd("GET", rkey(key)) != old, 10, "a new copy")
    again = post(p.port, key)
    assert replayed(again) and again.body == r.body
    assert execs(stub, key) == 2
