"""Following the primary, and commits PostgreSQL did not acknowledge
(issue 19), on single PostgreSQL servers standing in for a cluster's
parts (tests/ha/ runs the real Patroni cluster):

  - a host that accepts TCP and never answers (a frozen primary) at the
    head of a multi-host --store does not stop the proxy from using the
    next host;
  - a server that turns read-only under live connections (a demoted
    primary, a VIP or pooler pointing at a standby) is dropped: /readyz
    says 503 while no writable server is reachable, and the proxy is back
    as soon as one is;
  - a claim whose commit's wait for the synchronous standby was cancelled
    (PostgreSQL: "canceling wait for synchronous replication ... committed
    locally, but might not have been replicated") is never forwarded;
  - a stale primary (still writable, its commits waiting for a standby
    that was promoted) never answers an owner "not ours".
"""
import concurrent.futures
import os
import shutil
import subprocess
import threading
import time

import pytest

from support.http import RawConn, assert_problem
from support.relay import Relay
from support.procs import (IDEMPROXY_BIN, clean_env, metric_value, read_text,
                           readyz, wait_readyz)
from support.silent import SilentServer
from support.stores import PG_BINDIR, PgServer
from test_keys import TOKEN, admin, token_file  # noqa: F401 (fixture)


@pytest.fixture
def private_pg():
    if not os.access(os.path.join(PG_BINDIR, "initdb"), os.X_OK):
        pytest.skip("PostgreSQL 15 is not installed")
    server = PgServer()
    server.psql("create database idem")
    yield server
    log = [x for x in read_text(server.log_path).splitlines()
           if x[:2] == "20"]
    print("--- private postgresql log ---\n" + "\n".join(log[-40:]))
    server.shutdown()


def keyed_post(port, key, body=b"{}", target="/orders"):
    with RawConn(port, timeout=30) as c:
        return c.request("POST", target, headers=[("Idempotency-Key", key)],
                         body=body)


def test_frozen_first_host_is_skipped(make_proxy, stub, pg_db):
    silent = SilentServer()
    try:
        conninfo = (f"postgres://postgres@127.0.0.1:{silent.port},"
                    f"127.0.0.1:{pg_db.server.port}/{pg_db.name}")
        p = make_proxy("--store", conninfo)
        wait_readyz(p, 200, timeout=10)
        r = keyed_post(p.port, "frozen-1")
        assert r.status == 200, r
        r = keyed_post(p.port, "frozen-1")
        assert r.status == 200 and r.header("Idempotent-Replayed") == "true"
        assert stub.stats()["keys"].get("frozen-1") == 1
        assert len(silent.held) >= 1     # it was tried, in parallel
        assert "the primary is 127.0.0.1:" in p.log()
    finally:
        silent.stop()


def set_read_only(pg, on):
    pg.psql(f"alter system set default_transaction_read_only = "
            f"{'on' if on else 'off'}")
    pg.psql("select pg_reload_conf()")


def test_read_only_server_is_left(make_proxy, stub, private_pg):
    url = private_pg.url("idem")
    p = make_proxy("--store", url)
    wait_readyz(p, 200)
    assert keyed_post(p.port, "ro-1").status == 200
    set_read_only(private_pg, True)
    try:
        # the live connection's next claim hits 25006: dropped; a new one
        # is refused (read-write is asked for): not ready, 503, nothing
        # executed
        statuses = set()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            r = keyed_post(p.port, f"ro-wait-{len(statuses)}-{time.monotonic()}")
            statuses.add(r.status)
            if r.status == 503 and readyz(p) == 503:
                break
            time.sleep(0.2)
        assert readyz(p) == 503, p.log()
        r = keyed_post(p.port, "ro-2")
        assert_problem(r, 503, "store-unavailable")
        assert "ro-2" not in stub.stats()["keys"]
    finally:
        set_read_only(private_pg, False)
    wait_readyz(p, 200, timeout=5)
    # /readyz is the process's; the worker's own connection may come back
    # a back-off later (at most 500 ms) than the sweeper's
    deadline = time.monotonic() + 5
    while True:
        r = keyed_post(p.port, "ro-3")
        if r.status != 503 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert r.status == 200, r
    assert stub.stats()["keys"].get("ro-3") == 1
    assert "read-only" in p.log()


def cancel_sync_waits(pg, stop):
    """Cancel every backend waiting for the synchronous standby, until
    stop is set; returns how many cancels were sent."""
    n = 0
    while not stop.is_set():
        out = pg.psql("select count(pg_cancel_backend(pid)) from "
                      "pg_stat_activity where wait_event = 'SyncRep'",
                      db="idem")
        n += int(out or 0)
        time.sleep(0.05)
    return n


def test_cancelled_sync_wait_is_not_a_won_claim(make_proxy, stub,
                                                private_pg):
    """No standby is connected, so every writing commit waits for one; the
    test cancels each wait. Each commit is then local only: the claim is
    written again (and cancelled again) until its deadline, and the
    request is refused, never forwarded. Once commits are acknowledged
    again, the key executes exactly once."""
    url = private_pg.url("idem")
    p = make_proxy("--store", url, "--lease", "3s", "--upstream-timeout", "2s")
    wait_readyz(p, 200)
    private_pg.psql("alter system set synchronous_standby_names = 'ghost'")
    private_pg.psql("select pg_reload_conf()")
    stop = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        canceller = ex.submit(cancel_sync_waits, private_pg, stop)
        try:
            r = keyed_post(p.port, "sync-1")
        finally:
            stop.set()
        cancels = canceller.result()
    assert cancels >= 1
    assert r.status == 503, r
    assert "sync-1" not in stub.stats()["keys"], stub.stats()
    unacked = metric_value(p.metrics(),
                           "idemproxy_store_unacknowledged_commits_total")
    assert unacked >= 1
    assert "not acknowledged by the synchronous standby" in p.log()

    private_pg.psql("alter system reset synchronous_standby_names")
    private_pg.psql("select pg_reload_conf()")
    # the abandoned claim is released in the background; then the key
    # executes, once. A retry after its lease ran out and before the
    # release landed gets the outcome as unknown (issue 43: nobody can tell
    # it was never sent), and the release deletes that record too: it is
    # the abandoned claim's
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        r = keyed_post(p.port, "sync-1")
        if r.status == 200:
            break
        assert r.status in (409, 503) or (
            r.status == 502 and b"outcome-unknown" in r.body), r
        time.sleep(0.3)
    assert r.status == 200, (r, p.log())
    assert keyed_post(p.port, "sync-1").header("Idempotent-Replayed") == "true"
    assert stub.stats()["keys"].get("sync-1") == 1


def test_migrate_finds_the_primary(pg_db, private_pg):
    """`idemproxy migrate` with a host list whose first server is
    read-only (a standby) creates the table on the writable one."""
    private_pg.psql(f"create database {pg_db.name}")
    set_read_only(private_pg, True)
    url = (f"postgres://postgres@127.0.0.1:{private_pg.port},"
           f"127.0.0.1:{pg_db.server.port}/{pg_db.name}")
    r = subprocess.run([IDEMPROXY_BIN, "migrate", "--store", url],
                       capture_output=True, timeout=60, env=clean_env())
    assert r.returncode == 0, r
    assert pg_db.table_exists()


def test_two_writable_hosts_do_not_chase_each_other(make_proxy, stub, pg_db):
    """One server listed under two names (as two poolers in front of one
    primary would be): every host accepts writes, so none is dropped for
    the other - no store error under concurrent new keys."""
    url = (f"postgres://postgres@127.0.0.1:{pg_db.server.port},"
           f"localhost:{pg_db.server.port}/{pg_db.name}")
    p = make_proxy("--store", url, "--store-connections", "4", workers=2)
    wait_readyz(p, 200)
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        rs = list(ex.map(lambda i: keyed_post(p.port, f"two-{i}"), range(300)))
    assert [r.status for r in rs] == [200] * 300
    assert metric_value(p.metrics(), "idemproxy_store_errors_total",
                        {"store": "postgres"}) == 0, p.log()
    assert all(n == 1 for n in stub.stats()["keys"].values())


def test_purge_rewritten_after_a_cancelled_wait_reports_the_record(
        make_proxy, stub, private_pg, token_file):
    """A purge whose commit's wait was cancelled is written again; the
    re-send finds the row already gone (the first attempt deleted it
    locally) and must still report the record it purged, not 404."""
    p = make_proxy("--store", private_pg.url("idem"), "--admin-token-file",
                   token_file)
    wait_readyz(p, 200)
    assert keyed_post(p.port, "purge-1").status == 200
    private_pg.psql("alter system set synchronous_standby_names = 'ghost'")
    private_pg.psql("select pg_reload_conf()")
    # the postmaster passes SIGHUP on to the backends asynchronously: a
    # command read before a backend got it would not wait
    time.sleep(1)
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        purge = ex.submit(admin, p, "DELETE", "purge-1", token=TOKEN)
        deadline = time.monotonic() + 10
        cancelled = 0
        while not cancelled and time.monotonic() < deadline:
            cancelled = int(private_pg.psql(
                "select count(pg_cancel_backend(pid)) from pg_stat_activity"
                " where wait_event = 'SyncRep'", db="idem") or 0)
            time.sleep(0.02)
        assert cancelled, "no commit waited for the standby"
        time.sleep(0.3)     # the re-send waits in its turn
        private_pg.psql("alter system reset synchronous_standby_names")
        private_pg.psql("select pg_reload_conf()")
        status, _, doc = purge.result(timeout=15)
    assert "not acknowledged by the synchronous standby" in p.log()
    assert status == 200 and doc.get("purged") is True, (status, doc)
    assert doc["state"] == "completed" and "postgres" in doc["found_in"]
    r = keyed_post(p.port, "purge-1")
    assert r.status == 200 and r.header("Idempotent-Replayed") != "true"
    assert stub.stats()["keys"].get("purge-1") == 2


def test_asynchronous_replication_is_warned(make_proxy, stub, private_pg):
    """A primary that streams WAL to a standby it does not wait for can
    lose acknowledged claims and completions in a failover (docs/ha.md):
    the proxy says so when it connects. pg_receivewal stands in for the
    standby. Once that standby is synchronous, a proxy says nothing."""
    wal = os.path.join(private_pg.base, "wal")
    os.makedirs(wal)
    if private_pg.as_pg:
        shutil.chown(wal, "postgres", "postgres")
    rx = subprocess.Popen(
        private_pg.as_pg + [os.path.join(PG_BINDIR, "pg_receivewal"),
                            "-h", "127.0.0.1", "-p", str(private_pg.port),
                            "-U", "postgres", "-D", wal, "--synchronous",
                            "--no-loop"],
        cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 15
        while private_pg.psql("select count(*) from pg_stat_replication "
                              "where state = 'streaming'") != "1":
            assert rx.poll() is None, rx.stderr.read()
            assert time.monotonic() < deadline, "pg_receivewal never streamed"
            time.sleep(0.1)

        url = private_pg.url("idem")
        p = make_proxy("--store", url)
        wait_readyz(p, 200)
        r = keyed_post(p.port, "async-1")
        assert r.status == 200, r
        log = p.log()
        assert "streams WAL to 1 sender(s) but synchronous_standby_names " \
               "is empty" in log, log
        assert log.count("streams WAL to") == 1, log    # once per store

        private_pg.psql("alter system set synchronous_standby_names = "
                        "'pg_receivewal'")
        private_pg.psql("select pg_reload_conf()")
        deadline = time.monotonic() + 15
        while private_pg.psql("select sync_state from pg_stat_replication") \
                != "sync":
            assert time.monotonic() < deadline, "no synchronous standby"
            time.sleep(0.1)
        q = make_proxy("--store", url)
        wait_readyz(q, 200)
        r = keyed_post(q.port, "async-2")     # waits for the standby
        assert r.status == 200, r
        assert "streams WAL to" not in q.log(), q.log()
    finally:
        rx.terminate()
        try:
            rx.wait(10)
        except subprocess.TimeoutExpired:
            rx.kill()
            rx.wait()
        private_pg.psql("alter system reset synchronous_standby_names")
        private_pg.psql("select pg_reload_conf()")


def stale_beside(pg_db, private_pg):
    """private_pg becomes a stale primary beside pg_db: the same table
    (both migrated), and a synchronous standby that never connects, so a
    writing commit there never returns."""
    private_pg.psql(f"create database {pg_db.name}")
    for db_url in (pg_db.url, private_pg.url(pg_db.name)):
        r = subprocess.run([IDEMPROXY_BIN, "migrate", "--store", db_url],
                           capture_output=True, timeout=60, env=clean_env())
        assert r.returncode == 0, r
    private_pg.psql("alter system set synchronous_standby_names = 'ghost'")
    private_pg.psql("select pg_reload_conf()")


def through(make_proxy, relay, pg_db, *flags):
    """A proxy whose store is pg_db reached through relay, once ready."""
    p = make_proxy("--store", f"postgres://postgres@127.0.0.1:{relay.port}/"
                   f"{pg_db.name}", *flags)
    wait_readyz(p, 200)
    return p


def test_stale_primary_never_answers_not_ours(make_proxy, stub, pg_db,
                                              private_pg):
    """A stale primary: a node whose Patroni died keeps running as a
    primary after the cluster promoted its standby. It accepts connections
    and writes, but a writing commit waits for its synchronous standby for
    good. The proxy may connect to it (it accepts writes) while it owns a
    key claimed on the real primary; there the row is missing. A
    completion that found no row answered "not ours any more" at once,
    the key stayed in flight on the real primary, and a retry after the
    lease executed it again. An owner's statement must commit a write
    even when it finds nothing, so that its answer waits for the standby
    like every outcome does.

    A relay stands for the moving address: the claim commits on the real
    primary, then every store connection is cut and the relay points at
    the stale one (a second server with the table and a synchronous
    standby that never connects) while the request is upstream, and back
    once the completion had time to be answered there."""
    stale_beside(pg_db, private_pg)
    relay = Relay(pg_db.server.port)
    try:
        p = through(make_proxy, relay, pg_db, "--lease", "3s",
                    "--upstream-timeout", "2s")
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            first = ex.submit(keyed_post, p.port, "stale-1", b"{}",
                              "/orders?delay_ms=1500")
            deadline = time.monotonic() + 10
            while "stale-1" not in stub.stats()["keys"]:
                assert time.monotonic() < deadline, p.log()
                time.sleep(0.02)
            relay.retarget(private_pg.port)
            assert relay.reset() >= 1
            time.sleep(2.5)             # the completion meets the stale one
            relay.retarget(pg_db.server.port)
            relay.reset()
            r = first.result(timeout=30)
        assert r.status == 200, r
        # the outcome lands on the primary; past the lease a key left in
        # flight would be taken over by a retry
        deadline = time.monotonic() + 15
        while pg_db.count("key = 'stale-1' and state = 'completed'") == 0:
            assert time.monotonic() < deadline, p.log()
            time.sleep(0.2)
        time.sleep(3.5)
        r = keyed_post(p.port, "stale-1", b"{}", "/orders?delay_ms=1500")
        assert r.status == 200 and r.header("Idempotent-Replayed") == "true", r
        assert stub.stats()["keys"]["stale-1"] == 1
        assert "not ours any more" not in p.log()
    finally:
        relay.close()


def test_partition_maintenance_outlives_a_statement_that_never_ends(
        make_proxy, stub, pg_db):
    """Partition maintenance runs on a connection of its own, whose lock
    waits end at 5 s. A statement can still hang where no timeout reaches:
    a commit waiting for a synchronous standby that never comes (a primary
    that lost its role without knowing it, docs/ha.md), or a flow a NAT
    dropped without a reset, which TCP keepalives do not notice behind a
    proxy that answers them. Maintenance then hung for good: no partition
    dropped again, the table growing. It now gives a statement 30 s, then
    connects again.

    2-s partitions (--ttl 1s): one is dropped every few seconds. The relay
    turns maintenance's connection into a black hole; the statement
    connections are left alone."""
    relay = Relay(pg_db.server.port)
    try:
        p = through(make_proxy, relay, pg_db, "--ttl", "1s",
                    "--response-cache", "0")

        def dropped():
            return metric_value(
                p.metrics(), "idemproxy_sweep_partitions_dropped_total") or 0

        def wait_dropped(more_than, timeout):
            deadline = time.monotonic() + timeout
            while dropped() <= more_than:
                assert time.monotonic() < deadline, p.log()[-3000:]
                r = keyed_post(p.port, f"part-{time.monotonic()}", b"{}",
                               "/orders")
                assert r.status == 200, r
                time.sleep(0.5)

        wait_dropped(0, 30)
        plan = b"; SELECT action, part, n FROM idemproxy_parts_plan("
        assert relay.cut(plan) == 1
        before = dropped()
        wait_dropped(before, 60)
        assert "partition maintenance: a statement did not end in 30 s" \
            in p.log()
    finally:
        relay.close()


def test_host_that_timed_out_loses_ties(make_proxy, stub, pg_db, private_pg):
    """Two hosts accept writes, and commits on one of them never return (a
    stale primary beside the promoted one). Once a statement timed out
    there, a new connection that reaches both takes the other. Before,
    the first to answer won, and the stale one answers sooner here: the
    real primary sits behind a relay that delays every piece by 20 ms, and
    holds its bytes while the proxy starts so that every connection
    begins on the stale one."""
    stale_beside(pg_db, private_pg)
    relay = Relay(pg_db.server.port, delay=0.02)
    relay.hold()
    try:
        p = make_proxy("--store", f"postgres://postgres@127.0.0.1:"
                       f"{private_pg.port},127.0.0.1:{relay.port}/"
                       f"{pg_db.name}", "--store-connections", "2")
        wait_readyz(p, 200)
        relay.release()
        first = keyed_post(p.port, "tie-0")
        assert first.status == 503, first      # held by the stale one
        statuses = [keyed_post(p.port, f"tie-{i}").status
                    for i in range(1, 21)]
        assert statuses == [200] * 20, (statuses, p.log())
        # a completion is written after its response went out
        deadline = time.monotonic() + 5
        while pg_db.count("state = 'completed'") < 20 and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        assert pg_db.count("state = 'completed'") == 20
    finally:
        relay.close()
