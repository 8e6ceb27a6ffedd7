"""The PostgreSQL store across instances, restarts, crashes and outages
(DESIGN.md §1 items 10-11, §2, §7; issue 4 "Tests").

A private PostgreSQL 15 (conftest `pg_server`) and a fresh database per test
(`pg_db`). Executions are counted by the stub (GET /__stats). Proxies a test
SIGKILLs are started with `spawn_proxy` and ended with `proxy_kill`.
"""
import concurrent.futures as cf
import subprocess
import re
import threading
import time

import pytest

from support.http import (RawConn, assert_problem, request, send_together,
                          upstream_echo)
from support.procs import (IDEMPROXY_BIN, clean_env, free_port, metric_value,
                           proxy_kill, readyz, wait_readyz)
from support.stores import PSQL_BIN
from test_idempotency import (ORDER, assert_identical, assert_one_original,
                              executions, kreq, newkey, outcomes, post,
                              replayed)

# Bound on recovery after PostgreSQL returns: reconnect back-off is at most
# 5 s (docs/architecture.md "PostgreSQL"), /readyz reflects the last second.
RECOVERY_S = 8.0


def pg_flags(db, *flags):
    return ("--store", db.url) + flags


def start_pg_proxy(factory, db, *flags, **kw):
    p = factory(*pg_flags(db, *flags), **kw)
    wait_readyz(p)
    return p


def log_problems(text):
    """Log lines at warning level or worse."""
    bad = []
    for line in text.splitlines():
        words = line.split()
        if len(words) > 1 and words[1].lower() in ("warn", "warning", "error",
                                                   "fatal", "crit"):
            bad.append(line)
    return bad


def burst_split(ports, n, raw, timeout=30.0):
    """n connections, spread over `ports` round-robin, send the same bytes at
    once (a barrier after connecting)."""
    conns = [RawConn(ports[i % len(ports)], timeout=timeout)
             for i in range(n)]
    return send_together(conns, raw, timeout)


def migrate(url, *flags, timeout=60):
    return subprocess.run([IDEMPROXY_BIN, "migrate", "--store", url, *flags],
                          capture_output=True, timeout=timeout,
                          env=clean_env())


def ddl_alone(db, sql, *migrate_flags):
    """Run `sql` - DDL on idempotency_keys: a trigger, a partition - while
    no other session is on the database, that is before any proxy starts
    (the table made by `idemproxy migrate` with `migrate_flags` if there is
    none yet). Against a running proxy such DDL deadlocks. The proxy's
    statements lock the table (ROW EXCLUSIVE) and then its partitions.
    DROP TRIGGER (PostgreSQL 15) locks the table in ACCESS SHARE mode,
    which lets them in, then each partition in ACCESS EXCLUSIVE mode, and
    only then the table in ACCESS EXCLUSIVE mode: a claim that holds the
    table and waits for a partition waits for the DROP, which waits for
    the claim (11 deadlocks in 71 create/drop rounds against a proxy under
    load). CREATE TRIGGER takes the table first (SHARE ROW EXCLUSIVE), as
    the proxy does, and ATTACH PARTITION takes it in two steps (ACCESS
    SHARE for the LIKE copy, SHARE UPDATE EXCLUSIVE to attach) while
    partition maintenance attaches and detaches; neither was seen to
    deadlock, and no test should depend on which DDL happens to be safe."""
    if not db.table_exists():
        r = migrate(db.url, *migrate_flags)
        assert r.returncode == 0, r.stderr
    others = db.psql("select count(*) from pg_stat_activity where datname "
                     "= current_database() and pid <> pg_backend_pid() "
                     "and backend_type = 'client backend'")
    assert others == "0", f"{others} other sessions: DDL could deadlock"
    db.psql(sql)


# ------------------------------------------------ readiness

def test_ready_means_keyed_requests_succeed(make_proxy, pg_db, stub):
    """/readyz 200 is the signal to send traffic (DESIGN §5): right after
    it, a keyed request must not get 503 store-unavailable (the worker's
    own connections must be up, not only the sweeper's)."""
    bad = []
    for round_ in range(30):
        p = make_proxy(*pg_flags(pg_db), workers=1 + round_ % 2,
                       name=f"r{round_}")
        wait_readyz(p)
        keys = [newkey(f"rd{round_}-{i}") for i in range(4)]
        with cf.ThreadPoolExecutor(4) as ex:
            rs = list(ex.map(lambda k: post(p.port, k), keys))
        bad += [(round_, r.status) for r in rs if r.status != 200]
        p.check_stopped()
    assert not bad, bad


def test_response_received_means_completed(make_proxy, pg_db, stub):
    """A client that got the response and sends the duplicate at once (on
    the same keep-alive connection) must get the replay: with --in-flight
    reject a still-uncommitted completion shows up as a spurious 409
    request-in-progress for a request that is over."""
    p = start_pg_proxy(make_proxy, pg_db, "--in-flight", "reject",
                       workers=2, name="a")
    bad = []
    with RawConn(p.port) as c:
        for i in range(100):
            key = newkey(f"seq{i}")
            c.send(kreq("POST", "/orders", key, ORDER))
            first = c.read_response()
            c.send(kreq("POST", "/orders", key, ORDER))
            dup = c.read_response()
            if first.status != 200 or not replayed(dup) \
                    or dup.body != first.body:
                bad.append((i, first.status, dup.status))
    assert not bad, f"{len(bad)} of 100: {bad[:10]}"
    assert executions(stub) == 100


# ------------------------------------------------ two instances, one store

def test_two_instances_50_concurrent_duplicates(make_proxy, pg_db, stub):
    a = start_pg_proxy(make_proxy, pg_db, workers=2, name="a")
    b = start_pg_proxy(make_proxy, pg_db, workers=2, name="b")
    for round_ in range(3):
        key = newkey(f"two{round_}")
        raw = kreq("POST", "/orders?delay_ms=300", key, ORDER)
        t0 = time.monotonic()
        rs = burst_split([a.port, b.port], 50, raw)
        elapsed = time.monotonic() - t0
        assert all(r.status == 200 for r in rs), [r.status for r in rs]
        assert_identical(rs)
        assert_one_original(rs)
        assert upstream_echo(rs[0])["n"] == round_ + 1
        # waiters on the other instance are woken by NOTIFY (or the 500 ms
        # poll), not by the wait timeout
        assert elapsed < 3.0, elapsed
    assert executions(stub) == 3
    assert all(v == 1 for v in stub.stats()["keys"].values())
    assert pg_db.count("state = 'completed'") == 3
    assert pg_db.count("state = 'in_flight'") == 0


def test_two_instances_each_replays_the_other(make_proxy, pg_db, stub):
    a = start_pg_proxy(make_proxy, pg_db, name="a")
    b = start_pg_proxy(make_proxy, pg_db, name="b")
    key = newkey("x")
    target = "/orders?status=201&header=X-Order:7"
    first = post(a.port, key, target)
    assert first.status == 201 and not replayed(first)
    dup = post(b.port, key, target)
    assert dup.status == 201 and replayed(dup)
    assert dup.body == first.body and dup.header("X-Order") == "7"
    assert_problem(post(b.port, key, target, body=b"other"), 422,
                   "idempotency-key-mismatch")
    assert executions(stub) == 1


def test_cross_instance_in_flight_reject_and_wait(make_proxy, pg_db, stub):
    """A holds the key: B (reject) answers 409 at once, C (wait) holds the
    duplicate and replays when A completes (woken across instances)."""
    a = start_pg_proxy(make_proxy, pg_db, name="a")
    rej = start_pg_proxy(make_proxy, pg_db, "--in-flight", "reject",
                         name="b-reject")
    wait = start_pg_proxy(make_proxy, pg_db, name="c-wait")
    key = newkey("xi")
    raw = kreq("POST", "/orders?delay_ms=800", key, ORDER)
    with RawConn(a.port) as c:
        t0 = time.monotonic()
        c.send(raw)
        time.sleep(0.2)
        r = post(rej.port, key, "/orders?delay_ms=800")
        assert_problem(r, 409, "request-in-progress")
        assert r.header("Retry-After") == "1"
        w = post(wait.port, key, "/orders?delay_ms=800")
        t_woken = time.monotonic() - t0
        first = c.read_response()
    assert first.status == 200 and not replayed(first)
    assert replayed(w) and w.body == first.body
    # A completes at ~0.8 s; C is woken by its NOTIFY, at worst by the
    # 500 ms poll
    assert t_woken < 1.5, t_woken
    assert executions(stub) == 1


def notifications_heard(pg_db, action, settle_s=1.0):
    """Run action() while a psql session LISTENs on channel idemproxy;
    return the payloads it heard, in order (psql prints them after each
    command: a few commands over settle_s after action returned)."""
    srv = pg_db.server
    ps = subprocess.Popen(
        [PSQL_BIN, "-h", "127.0.0.1", "-p", str(srv.port), "-U", "postgres",
         "-d", pg_db.name, "-Atq"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=clean_env({"PGCONNECT_TIMEOUT": "5"}))
    try:
        ps.stdin.write("LISTEN idemproxy;\nSELECT 'listening';\n")
        ps.stdin.flush()
        assert ps.stdout.readline().strip() == "listening"
        action()
        ps.stdin.write(f"SELECT pg_sleep({settle_s / 5});\n" * 5 + "\\q\n")
        out, _ = ps.communicate(timeout=30)
    finally:
        if ps.poll() is None:
            ps.kill()
            ps.wait()
    return re.findall(r'notification "idemproxy" with payload "(.*)" '
                      r'received', out)


def test_completions_wake_waiters_after_commit(make_proxy, pg_db, stub):
    """A duplicate waiting on another instance marks the record it waits
    for, and the completion of that record announces "<scope>:<key>" on
    channel idemproxy once it committed (a transaction of its own after
    the batch's): one notification per waited-for completion, keys with
    quotes, backslashes, commas and braces included (the wake-up's array
    literal), every key it names completed when it is heard, the waiter
    replayed. A completion nobody waited for announces nothing."""
    a = start_pg_proxy(make_proxy, pg_db, name="a")
    b = start_pg_proxy(make_proxy, pg_db, "--wait-timeout", "10s", name="b")
    waited = [newkey("wake"), 'w"q\\b,c{d}' + newkey("")]
    alone = newkey("alone")

    def quoted(k):
        return '"' + k.replace("\\", "\\\\").replace('"', '\\"') + '"'

    def complete_them():
        for k in waited:
            raw = kreq("POST", "/orders?delay_ms=600", quoted(k), ORDER)
            with RawConn(a.port) as c:
                c.send(raw)
                time.sleep(0.2)
                dup = post(b.port, quoted(k), "/orders?delay_ms=600")
                first = c.read_response()
            assert first.status == 200 and not replayed(first), first
            assert dup.status == 200 and replayed(dup), dup
            assert dup.body == first.body
        r = post(a.port, quoted(alone))
        assert r.status == 200 and not replayed(r), r

    heard = notifications_heard(pg_db, complete_them)
    assert sorted(heard) == sorted(":" + k for k in waited), heard
    for k in waited + [alone]:
        assert pg_db.psql("select state from idempotency_keys where key = "
                          "'" + k.replace("'", "''") + "'") == "completed"
    assert executions(stub) == 3


# ------------------------------------------------ durability

def test_restart_persistence(make_proxy, pg_db, stub):
    a = start_pg_proxy(make_proxy, pg_db, name="a")
    key = newkey("persist")
    first = post(a.port, key, "/orders?status=201")
    assert first.status == 201
    a.check_stopped()                               # SIGTERM, exit 0
    assert pg_db.count("state = 'completed'") == 1
    b = start_pg_proxy(make_proxy, pg_db, name="b")
    dup = post(b.port, key, "/orders?status=201")
    assert dup.status == 201 and replayed(dup)
    assert dup.body == first.body
    assert executions(stub) == 1


def test_pg_restart_keeps_records(make_proxy, pg_db, pg_server, stub):
    """A completed record survives a PostgreSQL restart (fast stop) and the
    proxy reconnects without being restarted."""
    a = start_pg_proxy(make_proxy, pg_db, name="a")
    key = newkey("pgr")
    first = post(a.port, key)
    assert first.status == 200
    pg_server.stop()
    pg_server.start()
    wait_readyz(a, timeout=RECOVERY_S)
    deadline = time.monotonic() + RECOVERY_S
    while True:         # /readyz needs one connection; the pool may lag
        dup = post(a.port, key)
        if dup.status != 503 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert dup.status == 200 and replayed(dup), dup
    assert dup.body == first.body
    assert executions(stub) == 1


# ------------------------------------------------ crash of the key's owner

LEASE_FLAGS = ("--lease", "2s", "--upstream-timeout", "1800ms")


@pytest.mark.parametrize("mode", ["keep", "release"])
def test_owner_sigkill_lease_then_unknown(spawn_proxy, pg_db, stub, mode):
    """A's request reaches the upstream, A is SIGKILLed. Before the lease
    (2 s) runs out, a duplicate at B is rejected (409, --in-flight reject)
    and no second execution happens. Once the lease ran out a waiting
    duplicate finds the outcome unknown: 502 outcome-unknown, replayed,
    never a second execution (DESIGN §1 item 10, revised by issue 43).
    --unknown-outcome release (at-least-once): it takes the claim over and
    executes (the stub counts 2: A's request had reached it too)."""
    flags = (*LEASE_FLAGS, "--unknown-outcome", mode)
    a = start_pg_proxy(spawn_proxy, pg_db, *flags, name="a")
    rej = start_pg_proxy(spawn_proxy, pg_db, *flags, "--in-flight",
                         "reject", name="b-reject")
    wait = start_pg_proxy(spawn_proxy, pg_db, *flags, "--wait-timeout",
                          "10s", name="b-wait")
    key = newkey("kill")
    target = "/orders?delay_ms=1200"
    c = RawConn(a.port)
    c.send(kreq("POST", target, key, ORDER))
    t_claim = time.monotonic()
    deadline = t_claim + 1.0
    while executions(stub) < 1:
        assert time.monotonic() < deadline, "A's request never arrived"
        time.sleep(0.01)
    proxy_kill(a)
    c.close()
    assert pg_db.count("state = 'in_flight'") == 1

    # while the lease holds: 409 at once with reject
    r = post(rej.port, key, target)
    assert_problem(r, 409, "request-in-progress")
    assert r.header("Retry-After") == "1"
    assert time.monotonic() - t_claim < 1.5

    # a waiting duplicate: nothing executes until the lease ran out
    with cf.ThreadPoolExecutor(1) as ex:
        fut = ex.submit(post, wait.port, key, target)
        while time.monotonic() - t_claim < 1.8:
            assert executions(stub) == 1, "executed while the lease held"
            assert not fut.done(), fut.result()
            time.sleep(0.05)
        r = fut.result(timeout=10)
    took = time.monotonic() - t_claim
    if mode == "keep":
        assert_problem(r, 502, "outcome-unknown")
        assert replayed(r)
        assert took < 4.5, took         # lease 2 s + poll 0.5 s, ASan slack
        for p in (rej, wait):
            d = post(p.port, key, target)
            assert_problem(d, 502, "outcome-unknown")
            assert replayed(d) and d.body == r.body
        assert executions(stub) == 1
        assert pg_db.count("state = 'unknown'") == 1
        return
    assert r.status == 200 and not replayed(r), r
    assert upstream_echo(r)["n"] == 2
    assert executions(stub) == 2
    # lease 2 s + poll 0.5 s + execution 1.2 s, with slack for ASan
    assert took < 5.5, took
    # the taken-over record is complete: both instances replay it (the
    # response may reach its client just before the completion commits:
    # a 409 for a moment, as in test_live_owner_extends_lease)
    for p in (rej, wait):
        deadline = time.monotonic() + 3
        d = post(p.port, key, target)
        while d.status == 409 and time.monotonic() < deadline:
            time.sleep(0.05)
            d = post(p.port, key, target)
        assert replayed(d) and d.body == r.body
    assert executions(stub) == 2
    assert pg_db.count("state = 'completed'") == 1


def test_owner_sigkill_takeover_needs_same_fingerprint(spawn_proxy, pg_db,
                                                       stub):
    """After the lease ran out, a different body is still 422 (DESIGN §7)."""
    a = start_pg_proxy(spawn_proxy, pg_db, *LEASE_FLAGS, name="a")
    b = start_pg_proxy(spawn_proxy, pg_db, *LEASE_FLAGS, name="b")
    key = newkey("killfp")
    c = RawConn(a.port)
    c.send(kreq("POST", "/orders?delay_ms=1200", key, ORDER))
    deadline = time.monotonic() + 1.0
    while executions(stub) < 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    proxy_kill(a)
    c.close()
    time.sleep(2.2)                                     # lease ran out
    r = post(b.port, key, "/orders?delay_ms=1200", body=b"changed")
    assert_problem(r, 422, "idempotency-key-mismatch")
    assert executions(stub) == 1


def test_live_owner_extends_lease(make_proxy, pg_db, stub):
    """An exchange running past half its lease extends it (DESIGN §7): the
    exchange takes 1.6 s with a 1 s lease (head after 0.8 s, the body's
    second half 0.8 s later: no gap reaches the 900 ms upstream timeout); a
    duplicate at B at 1.3 s still finds the key in flight (409), and no
    second execution happens."""
    flags = ("--lease", "1s", "--upstream-timeout", "900ms")
    a = start_pg_proxy(make_proxy, pg_db, *flags, name="a")
    b = start_pg_proxy(make_proxy, pg_db, *flags, "--in-flight", "reject",
                       name="b")
    key = newkey("ext")
    target = "/orders?delay_ms=800&body_delay_ms=800&bytes=200"
    with RawConn(a.port) as c:
        c.send(kreq("POST", target, key, ORDER))
        time.sleep(1.3)                       # past the first lease's end
        r = post(b.port, key, target)
        first = c.read_response()
    assert first.status == 200 and len(first.body) == 200
    assert_problem(r, 409, "request-in-progress")
    assert executions(stub) == 1
    # the client has its response before the completion commits: a
    # duplicate right after may still find the key in flight (409 here)
    deadline = time.monotonic() + 3
    dup = post(b.port, key, target)
    while dup.status == 409 and time.monotonic() < deadline:
        time.sleep(0.05)
        dup = post(b.port, key, target)
    assert replayed(dup) and dup.body == first.body
    assert executions(stub) == 1


# ------------------------------------------------ PostgreSQL outages

# What a keyed request may get while PostgreSQL goes away and comes back:
# success, 503 store-unavailable, or 409 request-in-progress for the
# duplicate of a claim that committed while its connection died (the
# record then waits for its lease; DESIGN §1 item 10).
OUTAGE_OK = {(200, None), (503, "store-unavailable"),
             (409, "request-in-progress")}


class Load:
    """Threads sending keyed POSTs (a new key each, 50 ms upstream) and a
    duplicate of each until stopped; records every outcome."""

    def __init__(self, port, threads=4):
        self.port = port
        self.stop_ev = threading.Event()
        self.results = []           # (time, status, problem slug or None)
        self.errors = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, daemon=True)
                        for _ in range(threads)]

    def _run(self):
        while not self.stop_ev.is_set():
            key = newkey("load")
            for _ in range(2):
                try:
                    r = post(self.port, key, "/orders?delay_ms=50",
                             timeout=15)
                except Exception as e:        # connection-level failure
                    with self.lock:
                        self.errors.append(repr(e))
                    time.sleep(0.05)
                    continue
                slug = None
                if r.status >= 400:
                    try:
                        slug = r.json().get("type", "").rsplit(":", 1)[-1]
                    except ValueError:
                        slug = "?"
                    if r.status == 503 and r.header("Retry-After") is None:
                        slug += " (no Retry-After)"
                with self.lock:
                    self.results.append((time.monotonic(), r.status, slug))
                if r.status == 503:
                    time.sleep(0.02)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop_ev.set()
        for t in self.threads:
            t.join(30)

    def since(self, t0):
        with self.lock:
            return [x for x in self.results if x[0] >= t0]


def test_pg_stopped_and_started_under_load(make_proxy, pg_db, pg_server,
                                           stub):
    p = start_pg_proxy(make_proxy, pg_db, workers=2, name="a")
    done_key = newkey("before")
    before = post(p.port, done_key)
    assert before.status == 200
    with Load(p.port) as load:
        time.sleep(0.5)
        t_stop = time.monotonic()
        pg_server.stop("fast")
        # /readyz reflects the store within about a second
        wait_readyz(p, want=503, timeout=3)
        t_down = time.monotonic()
        # the load's threads may all be held until PostgreSQL is back
        # (a claim or completion on the wire when it stopped has an outcome
        # to learn): requests begun during the outage show how it answers
        with Load(p.port, threads=2) as outage_load:
            time.sleep(1.0)
        # while down: keyed requests are 503 store-unavailable, Retry-After
        r = post(p.port, newkey("down"))
        assert_problem(r, 503, "store-unavailable")
        assert r.header("Retry-After") == "1"
        r = post(p.port, done_key)              # even a completed key
        assert_problem(r, 503, "store-unavailable")
        # not keyed: proxied as usual; the process is alive
        assert request(p.port, "GET", "/plain").status == 200
        assert request(p.port, "POST", "/plain", body=b"x").status == 200
        assert p.proc.poll() is None
        t_start = time.monotonic()
        pg_server.start()
        waited = wait_readyz(p, timeout=RECOVERY_S)
        t_up = time.monotonic()
        time.sleep(1.0)
        t_ok = time.monotonic()
        time.sleep(1.0)
    assert not load.errors, load.errors[:5]
    statuses = {}
    for _, st, slug in load.results:
        statuses[(st, slug)] = statuses.get((st, slug), 0) + 1
    assert set(statuses) <= OUTAGE_OK, statuses
    # no key executed twice
    counts = stub.stats()["keys"]
    assert max(counts.values()) == 1, \
        {k: v for k, v in counts.items() if v > 1}
    assert not outage_load.errors, outage_load.errors[:5]
    down = load.since(t_down) + outage_load.results
    down = [x for x in down if x[0] < t_start]
    assert outage_load.results and all(st == 503 for _, st, _ in down), \
        down[:10]
    after = load.since(t_ok)
    assert after and all(st == 200 for _, st, _ in after), \
        (waited, after[:10])
    print(f"stop->503 {t_down - t_stop:.2f}s, start->ready {waited:.2f}s, "
          f"{statuses}")
    # recovered: keys are protected again, the old record is still there
    key = newkey("after")
    a = post(p.port, key)
    b = post(p.port, key)
    assert a.status == 200 and replayed(b) and a.body == b.body
    r = post(p.port, done_key)
    assert replayed(r) and r.body == before.body
    m = p.metrics()
    assert (metric_value(m, "idemproxy_requests_total",
                         {"outcome": "store_unavailable"}) or 0) >= 3
    assert (metric_value(m, "idemproxy_store_errors_total") or 0) >= 1
    assert readyz(p) == 200


def siphash24(key, msg):
    """SipHash-2-4 of msg under a 16-byte key (common/siphash.c)."""
    mask = (1 << 64) - 1

    def rotl(x, b):
        return ((x << b) | (x >> (64 - b))) & mask

    k0 = int.from_bytes(key[:8], "little")
    k1 = int.from_bytes(key[8:16], "little")
    v = [k0 ^ 0x736f6d6570736575, k1 ^ 0x646f72616e646f6d,
         k0 ^ 0x6c7967656e657261, k1 ^ 0x7465646279746573]

    def rounds(n):
        for _ in range(n):
            v[0] = (v[0] + v[1]) & mask
            v[1] = rotl(v[1], 13) ^ v[0]
            v[0] = rotl(v[0], 32)
            v[2] = (v[2] + v[3]) & mask
            v[3] = rotl(v[3], 16) ^ v[2]
            v[0] = (v[0] + v[3]) & mask
            v[3] = rotl(v[3], 21) ^ v[0]
            v[2] = (v[2] + v[1]) & mask
            v[1] = rotl(v[1], 17) ^ v[2]
            v[2] = rotl(v[2], 32)

    whole = len(msg) - len(msg) % 8
    blocks = [int.from_bytes(msg[i:i + 8], "little")
              for i in range(0, whole, 8)]
    blocks.append(((len(msg) & 0xff) << 56) |
                  int.from_bytes(msg[whole:], "little"))
    for m in blocks:
        v[3] ^= m
        rounds(2)
        v[0] ^= m
    v[2] ^= 0xff
    rounds(4)
    return v[0] ^ v[1] ^ v[2] ^ v[3]


def pg_lock_id(scope, key):
    """A key's advisory lock, as pg_lock_id() in store_pg.c computes it."""
    h = siphash24(b"idemproxy-lock-1", scope.encode() + b"\0" + key.encode())
    return h - (1 << 64) if h >= 1 << 63 else h


def lock_waiters(db):
    """(pid, query_start) of the backends waiting for an advisory lock."""
    out = db.psql("select pid, query_start from pg_stat_activity"
                  " where wait_event_type = 'Lock'"
                  " and wait_event = 'advisory'")
    return sorted(tuple(line.split("|")) for line in out.splitlines())


def test_a_batch_waiting_for_a_lock_holds_up_no_other_key(make_proxy, pg_db,
                                                          stub):
    """A claim whose batch waits for a lock - the key's advisory lock, held
    by another session as another instance's claim of that key holds it -
    does not hold up the other keys of its worker: they are answered while
    that very statement still waits (the queue waits for a batch in flight
    only briefly, then goes to another statement connection). Then the
    lock goes and the waiting key executes once."""
    p = start_pg_proxy(make_proxy, pg_db, workers=1)
    stuck_key = newkey("stuck")
    holder = subprocess.Popen(
        [PSQL_BIN, "-h", "127.0.0.1", "-p", str(pg_db.server.port), "-U",
         "postgres", "-d", f"dbname={pg_db.name} application_name=holder",
         "-X", "-q"],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, text=True)
    try:
        holder.stdin.write(
            f"select pg_advisory_lock({pg_lock_id('', stuck_key)});\n")
        holder.stdin.flush()
        deadline = time.monotonic() + 10
        while pg_db.psql("select count(*) from pg_locks l"
                         " join pg_stat_activity a using (pid)"
                         " where l.locktype = 'advisory' and l.granted"
                         " and a.application_name = 'holder'") != "1":
            assert time.monotonic() < deadline, "the lock was not taken"
            time.sleep(0.05)
        with cf.ThreadPoolExecutor(1) as one:
            stuck = one.submit(post, p.port, stuck_key, timeout=30)
            deadline = time.monotonic() + 10
            while not lock_waiters(pg_db):
                assert time.monotonic() < deadline, "the claim never waited"
                time.sleep(0.05)
            waiting = lock_waiters(pg_db)
            with cf.ThreadPoolExecutor(4) as four:
                rs = list(four.map(lambda i: post(p.port, newkey(f"free{i}")),
                                   range(24)))
            assert [r.status for r in rs] == [200] * 24
            # the same statement still waits: nothing needed it to end
            assert lock_waiters(pg_db) == waiting
            assert not stuck.done()
            holder.stdin.write("select pg_advisory_unlock_all();\n")
            holder.stdin.flush()
            r = stuck.result(timeout=30)
    finally:
        holder.kill()
        holder.wait()
    assert r.status == 200 and not replayed(r)
    assert stub.stats()["keys"].get(stuck_key) == 1


@pytest.mark.parametrize("outage", ["stop", "pause"])
def test_outage_past_the_lease_still_completes(make_proxy, pg_db, pg_server,
                                               stub, outage):
    """PostgreSQL goes away (stopped, or every process SIGSTOPped) while the
    winner's request is at the upstream, and comes back 7 s later: past the
    3 s lease and past the 5 s a store operation waits for a connection.
    The client gets its response at once; the completion is retried past
    the lease (fenced by the owner token) and lands once PostgreSQL is
    back, so the duplicate that comes next replays instead of taking the
    lapsed key over and executing a second time."""
    p = start_pg_proxy(make_proxy, pg_db, "--lease", "3s",
                       "--upstream-timeout", "2s", workers=1, name="a")
    key = newkey("overdue")
    target = "/orders?delay_ms=1000"
    c = RawConn(p.port, timeout=10)
    c.send(kreq("POST", target, key, ORDER))
    deadline = time.monotonic() + 2.0
    while executions(stub) < 1:
        assert time.monotonic() < deadline, "the request never arrived"
        time.sleep(0.01)
    try:
        if outage == "stop":
            pg_server.stop("fast")
        else:
            pg_server.pause()
        first = c.read_response()   # at once, not after the outage
        c.close()
        assert first.status == 200 and not replayed(first)
        time.sleep(7.0)
    finally:
        if outage == "stop":
            pg_server.start()
        else:
            pg_server.resume()
    deadline = time.monotonic() + RECOVERY_S + 5.0
    while pg_db.count("state = 'completed'") == 0:
        assert time.monotonic() < deadline, \
            "never completed:\n" + p.log()[-3000:]
        time.sleep(0.1)
    r = post(p.port, key, target)
    assert replayed(r) and r.body == first.body, r
    assert executions(stub) == 1
    assert "outcome written after the lease ran out" in p.log() or \
        outage == "pause"   # a paused server may commit the first attempt


# A trigger that refuses completions while idem_test_switch says so: it
# is made before the proxy starts (ddl_alone), and completions are let
# through again with an UPDATE of the switch - no DDL against the running
# proxy (a DROP TRIGGER then deadlocks with its completions, ddl_alone).
FAIL_COMPLETIONS = """
create table idem_test_switch (refuse boolean not null);
insert into idem_test_switch values (true);
create function idem_test_refuse() returns trigger language plpgsql as $$
begin
  if new.state = 'completed' and (select refuse from idem_test_switch) then
    raise exception 'idemproxy test: completions refused';
  end if;
  return new;
end $$;
create trigger idem_test_refuse before update on idempotency_keys
  for each row execute function idem_test_refuse();
"""


def test_overdue_completions_are_bounded(make_proxy, pg_db, stub):
    """A store that takes claims but refuses every completion (here a
    trigger): each completion is retried past the lease, but at most 1,024
    per worker, so such a store cannot grow the process without end. Once
    completions are taken again, those 1,024 land and replay; the keys
    over the bound stay in flight. Every one of them counts as a
    completion failure when its lease runs out."""
    n = 1040
    flags = ("--lease", "1s", "--upstream-timeout", "800ms", "--ttl", "120s")
    ddl_alone(pg_db, FAIL_COMPLETIONS, "--ttl", "120s")
    p = start_pg_proxy(make_proxy, pg_db, *flags, workers=1, name="a")
    keys = [newkey(f"refused{i}") for i in range(n)]

    def send(part):
        out = []
        with RawConn(p.port, timeout=30) as c:
            for k in part:
                c.send(kreq("POST", "/orders", k, ORDER))
                out.append(c.read_response().status)
        return out

    with cf.ThreadPoolExecutor(8) as ex:
        statuses = [st for part in ex.map(send, [keys[i::8] for i in range(8)])
                    for st in part]
    assert statuses == [200] * n        # the clients never wait for it
    assert executions(stub) == n
    deadline = time.monotonic() + 30
    while (metric_value(p.metrics(), "idemproxy_completion_failures_total")
           or 0) < n:
        assert time.monotonic() < deadline, \
            metric_value(p.metrics(), "idemproxy_completion_failures_total")
        time.sleep(0.2)
    given_up = p.log().count("1024 others are still being retried; "
                             "given up")
    assert given_up == n - 1024, given_up
    pg_db.psql("update idem_test_switch set refuse = false")
    deadline = time.monotonic() + 30
    while pg_db.count("state = 'completed'") < 1024:
        assert time.monotonic() < deadline, pg_db.count("state = 'completed'")
        time.sleep(0.2)
    time.sleep(1.0)
    assert pg_db.count("state = 'completed'") == 1024
    assert pg_db.count("state = 'in_flight'") == n - 1024
    assert p.log().count("outcome written after the lease ran out") == 1024
    done = pg_db.psql("select key from idempotency_keys "
                      "where state = 'completed' limit 1")
    r = post(p.port, done)
    assert replayed(r), r
    assert executions(stub) == n


def test_pg_crash_under_load_recovers(make_proxy, pg_db, pg_server, stub):
    """An immediate stop (a crash: connections reset, crash recovery at
    start): the proxy survives and recovers, no duplicate execution of a
    completed key."""
    p = start_pg_proxy(make_proxy, pg_db, name="a")
    key = newkey("crash")
    first = post(p.port, key)
    assert first.status == 200
    with Load(p.port, threads=3) as load:
        time.sleep(0.3)
        pg_server.crash()
        wait_readyz(p, want=503, timeout=3)
        pg_server.start()
        wait_readyz(p, timeout=RECOVERY_S)
        time.sleep(1.0)
        t_ok = time.monotonic()
        time.sleep(0.5)
    assert not load.errors, load.errors[:5]
    assert {(st, s) for _, st, s in load.results} <= OUTAGE_OK, \
        load.results
    counts = stub.stats()["keys"]
    assert max(counts.values()) == 1, \
        {k: v for k, v in counts.items() if v > 1}
    after = load.since(t_ok)
    assert after and all(st == 200 for _, st, _ in after), after[:10]
    r = post(p.port, key)
    assert replayed(r) and r.body == first.body
    assert stub.stats()["keys"][key] == 1


def test_fail_open_while_pg_down(make_proxy, pg_db, pg_server, stub):
    p = start_pg_proxy(make_proxy, pg_db, "--store-down", "fail-open",
                       name="a")
    before = outcomes(p)
    pg_server.stop()
    wait_readyz(p, want=503, timeout=3)
    key = newkey("open")
    r1 = post(p.port, key)
    r2 = post(p.port, key)
    # forwarded unprotected: both executed, neither is a replay
    assert r1.status == r2.status == 200
    assert not replayed(r1) and not replayed(r2)
    assert upstream_echo(r2)["n"] == upstream_echo(r1)["n"] + 1
    assert executions(stub) == 2
    d = {k: v - before[k] for k, v in outcomes(p).items() if v != before[k]}
    assert d == {"fail_open": 2}, d
    pg_server.start()
    wait_readyz(p, timeout=RECOVERY_S)
    deadline = time.monotonic() + RECOVERY_S
    k2 = newkey("closed")
    while True:
        a = post(p.port, k2)
        if a.status == 200 and outcomes(p)["forwarded"] > before["forwarded"]:
            break
        assert time.monotonic() < deadline, (a, outcomes(p))
        k2 = newkey("closed")
        time.sleep(0.2)
    b = post(p.port, k2)
    assert replayed(b) and b.body == a.body


def test_pg_unreachable_at_start(make_proxy, pg_db, pg_server, stub):
    """DESIGN §7: the proxy starts without PostgreSQL, /readyz 503, keyed
    requests 503; PostgreSQL starts -> ready (the table is created then)."""
    pg_server.stop()
    p = make_proxy(*pg_flags(pg_db), name="a")
    try:
        assert request(p.port, "GET", "/x").status == 200     # it serves
        time.sleep(0.5)
        assert readyz(p) == 503
        r = post(p.port, newkey("early"))
        assert_problem(r, 503, "store-unavailable")
        assert r.header("Retry-After") == "1"
        assert executions(stub) == 1
    finally:
        pg_server.start()
    took = wait_readyz(p, timeout=RECOVERY_S)
    print(f"ready {took:.2f}s after PostgreSQL started")
    deadline = time.monotonic() + RECOVERY_S
    key = newkey("late")
    while True:
        a = post(p.port, key)
        if a.status != 503 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert a.status == 200 and not replayed(a), a
    b = post(p.port, key)
    assert replayed(b) and b.body == a.body
    assert pg_db.table_exists()


# ------------------------------------------------ sweeper

def test_sweeper_removes_expired_rows(make_proxy, pg_db, stub):
    p = start_pg_proxy(make_proxy, pg_db, "--ttl", "1s", "--sweep-interval",
                       "200ms", name="a")
    keys = [newkey(f"sw{i}") for i in range(20)]
    for k in keys:
        assert post(p.port, k).status == 200
    assert pg_db.count() == 20
    # whole partitions go: a 1 s ttl gives 2 s partitions, each dropped
    # one or two maintenance ticks (1 s) after it ended
    deadline = time.monotonic() + 8
    while pg_db.count() > 0:
        assert time.monotonic() < deadline, pg_db.count()
        time.sleep(0.1)
    m = p.metrics()
    assert (metric_value(m, "idemproxy_sweep_partitions_dropped_total")
            or 0) >= 1
    assert metric_value(m, "idemproxy_store_partitions") >= 2
    assert metric_value(m, "idemproxy_sweep_lag_seconds") is not None
    # a swept key is a new request
    r = post(p.port, keys[0])
    assert r.status == 200 and not replayed(r)
    assert executions(stub) == 21


def test_sweeper_never_removes_live_claim(make_proxy, pg_db, stub):
    """In-flight rows expire max(ttl, lease) after the claim (DESIGN §7)."""
    p = start_pg_proxy(make_proxy, pg_db, "--ttl", "1s", "--sweep-interval",
                       "200ms", name="a")
    key = newkey("live")
    with RawConn(p.port) as c:
        c.send(kreq("POST", "/orders?delay_ms=1800", key, ORDER))
        time.sleep(1.5)                 # ttl over, sweeper ran several times
        assert pg_db.count(f"key = '{key}' and state = 'in_flight'") == 1
        first = c.read_response()
    assert first.status == 200
    dup = post(p.port, key, "/orders?delay_ms=1800")
    assert replayed(dup) and dup.body == first.body
    assert executions(stub) == 1


def test_one_sweeper_across_instances(make_proxy, pg_db, stub):
    """Two instances keeping the same table drop each partition once."""
    flags = ("--ttl", "1s", "--sweep-interval", "100ms")
    a = start_pg_proxy(make_proxy, pg_db, *flags, name="a")
    b = start_pg_proxy(make_proxy, pg_db, *flags, name="b")
    for i in range(30):
        assert post((a, b)[i % 2].port, newkey(f"s{i}")).status == 200
    deadline = time.monotonic() + 8
    while pg_db.count() > 0:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(1.5)                     # the last drops are counted
    total = sum(metric_value(p.metrics(),
                             "idemproxy_sweep_partitions_dropped_total")
                or 0 for p in (a, b))
    names = re.findall(r"partition (\S+) dropped", a.log() + b.log())
    assert total >= 1 and total == len(names) == len(set(names)), names
    # what is left is what the bookkeeping knows: both counts in one
    # statement (one snapshot: maintenance goes on creating partitions
    # meanwhile), again while a step of a drop is under way (a detached
    # table is tracked until it is dropped, a few ms later)
    deadline = time.monotonic() + 3
    while True:
        tracked, attached = pg_db.psql(
            "select (select count(*) from idempotency_keys_parts), "
            "(select count(*) from pg_inherits where "
            "inhparent = 'idempotency_keys'::regclass)").split("|")
        if tracked == attached or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert tracked == attached, (tracked, attached)


# ------------------------------------------------ schema and migrate

SCHEMA = {
    "scope": ("text", "NO"), "key": ("text", "NO"),
    "fingerprint": ("bytea", "NO"), "state": ("text", "NO"),
    "owner": ("text", "YES"),
    "lease_until": ("timestamp with time zone", "YES"),
    "status": ("integer", "YES"), "headers": ("bytea", "YES"),
    "body": ("bytea", "YES"),
    "created_at": ("timestamp with time zone", "NO"),
    "expires_at": ("timestamp with time zone", "NO"),
    "part_at": ("timestamp with time zone", "NO"),
}


def check_schema(db):
    rows = db.psql("select column_name, data_type, is_nullable from "
                   "information_schema.columns where table_name = "
                   "'idempotency_keys'").splitlines()
    cols = {r.split("|")[0]: tuple(r.split("|")[1:]) for r in rows}
    for name, want in SCHEMA.items():
        assert cols.get(name) == want, (name, cols)
    # partitioned by the time of the last write that made a record live;
    # each partition keeps a key unique and is indexed by expiry
    assert db.psql("select relkind from pg_class where oid = "
                   "'idempotency_keys'::regclass") == "p"
    assert db.psql("select pg_get_partkeydef('idempotency_keys'::regclass)"
                   ) == "RANGE (part_at)"
    parts = db.psql("select inhrelid::regclass from pg_inherits where "
                    "inhparent = 'idempotency_keys'::regclass").split()
    assert len(parts) >= 1, parts
    # ahead of the clock by a maintenance round and more (the next one
    # is made a round and 3 s before it is needed: 13 s with the default
    # 6-h partitions)
    ahead = float(db.psql("select extract(epoch from max(hi) - now()) "
                          "from idempotency_keys_parts"))
    assert ahead >= 2, ahead
    for part in parts:
        idx = db.psql("select indexdef from pg_indexes where tablename = "
                      f"'{part}'")
        assert "UNIQUE INDEX" in idx and "(scope, key)" in idx, idx
        assert "(expires_at)" in idx, idx


def test_migrate_empty_then_migrated(pg_db):
    assert not pg_db.table_exists()
    r = migrate(pg_db.url)
    assert r.returncode == 0, r
    assert pg_db.table_exists()
    check_schema(pg_db)
    pg_db.psql("insert into idempotency_keys (scope, key, fingerprint, "
               "state, expires_at) values ('', 'keep', '\\x00', "
               "'completed', now() + interval '1 hour')")
    r = migrate(pg_db.url)
    assert r.returncode == 0, r
    assert pg_db.count() == 1               # data kept
    check_schema(pg_db)


def test_migrate_memory_is_usage_error():
    r = migrate("memory")
    assert r.returncode == 2, r
    assert r.stderr, r


def test_migrate_unreachable_fails():
    r = migrate(f"postgres://postgres@127.0.0.1:{free_port()}/x",
                timeout=60)
    assert r.returncode != 0, r
    assert r.stderr, r


def test_proxy_creates_schema_at_start(make_proxy, pg_db, stub):
    assert not pg_db.table_exists()
    p = start_pg_proxy(make_proxy, pg_db, name="a")
    assert pg_db.table_exists()
    check_schema(pg_db)
    assert post(p.port, newkey()).status == 200


def test_instances_start_at_once_on_empty_database(spawn_proxy, pg_db, stub):
    ps = [spawn_proxy(*pg_flags(pg_db), workers=2, name=f"p{i}",
                      wait_ready=False) for i in range(4)]
    for p in ps:
        p.wait_healthy()
    for p in ps:
        wait_readyz(p)
    assert pg_db.table_exists()
    check_schema(pg_db)
    key = newkey("many")
    rs = burst_split([p.port for p in ps], 8,
                     kreq("POST", "/orders?delay_ms=100", key, ORDER))
    assert all(r.status == 200 for r in rs)
    assert_one_original(rs)
    assert executions(stub) == 1
    for p in ps:
        assert not log_problems(p.log()), p.log()


# the table as versions before partitioning created it
OLD_TABLE = """
CREATE TABLE idempotency_keys (
  scope text NOT NULL, key text NOT NULL, fingerprint bytea NOT NULL,
  state text NOT NULL, owner text, lease_until timestamptz, status int,
  headers bytea, body bytea,
  created_at timestamptz NOT NULL DEFAULT now(),
  expires_at timestamptz NOT NULL,
  PRIMARY KEY (scope, key));
CREATE INDEX idempotency_keys_expires_at_idx ON idempotency_keys (expires_at);
"""


def test_migrate_partitions_a_table_of_an_earlier_version(make_proxy, pg_db,
                                                          stub):
    """An earlier version's table: the new version works on it as it is
    (swept row by row), then `idemproxy migrate` makes it the first
    partition without copying a row. A completed record written before is
    still replayed, a key in flight before is still protected, new keys
    go to the new partitions, and the old table is dropped once nothing in
    it lives."""
    pg_db.psql(OLD_TABLE)
    p = start_pg_proxy(make_proxy, pg_db, "--response-cache", "0", name="a")
    done = newkey("before")
    first = post(p.port, done)
    assert first.status == 200
    assert pg_db.psql("select relkind from pg_class where oid = "
                      "'idempotency_keys'::regclass") == "r"
    # a request in flight across the migration
    slow = newkey("inflight")
    with cf.ThreadPoolExecutor(1) as ex:
        running = ex.submit(post, p.port, slow, "/orders?delay_ms=3000")
        time.sleep(0.5)
        r = migrate(pg_db.url)
        assert r.returncode == 0, r
        check_schema(pg_db)
        assert pg_db.psql("select count(*) from pg_inherits where inhrelid "
                          "= 'idempotency_keys_legacy'::regclass") == "1"
        # the running instance follows the renamed table at once
        again = post(p.port, done)
        assert replayed(again) and again.body == first.body
        # a duplicate waits for it (or is told 409), never executes
        target = "/orders?delay_ms=3000"
        q = start_pg_proxy(make_proxy, pg_db, "--response-cache", "0",
                           name="b")
        dups = [post(p.port, slow, target), post(q.port, slow, target)]
        orig = running.result()
        assert orig.status == 200
    for d in dups:
        assert d.status == 409 or (replayed(d) and d.body == orig.body), d
    assert replayed(post(q.port, slow, target))
    assert replayed(post(q.port, done))
    fresh = newkey("after")
    assert post(q.port, fresh).status == 200
    assert replayed(post(p.port, fresh))
    assert executions(stub) == 3
    assert pg_db.psql("select tableoid::regclass from idempotency_keys "
                      f"where key = '{fresh}'").startswith(
                          "idempotency_keys_p2")
    # migrate again: nothing to do
    r = migrate(pg_db.url)
    assert r.returncode == 0, r
    assert pg_db.count() == 3


def test_table_of_an_earlier_version_swept_row_by_row(make_proxy, pg_db,
                                                      stub):
    """Until it is migrated, an earlier version's table is kept as before:
    expired rows deleted by the sweeper."""
    pg_db.psql(OLD_TABLE)
    p = start_pg_proxy(make_proxy, pg_db, "--ttl", "1s", "--sweep-interval",
                       "200ms", name="a")
    for i in range(10):
        assert post(p.port, newkey(f"old{i}")).status == 200
    deadline = time.monotonic() + 6
    while pg_db.count() > 0:
        assert time.monotonic() < deadline, pg_db.count()
        time.sleep(0.1)
    assert metric_value(p.metrics(), "idemproxy_sweep_deleted_total") >= 10
    assert pg_db.psql("select relkind from pg_class where oid = "
                      "'idempotency_keys'::regclass") == "r"
