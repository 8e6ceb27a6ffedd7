"""Outcomes count only once PostgreSQL committed them (DESIGN.md §7: "An
outcome is what the store committed"; "The completion write is retried ...
for as long as the owner's lease lasts"; §1 item 10).

The commit window of one statement is widened deterministically: before
the proxy starts (test_postgres.ddl_alone: DDL against a running proxy can
deadlock with its statements), the test adds a DEFERRABLE INITIALLY
DEFERRED constraint trigger that sleeps in pg_sleep() at COMMIT, for the
first matching row only (a sequence is not transactional, so a re-sent
statement does not sleep again). The statement's result has been produced
by then; the transaction has not committed. The sleeping backend is found in
pg_stat_activity (wait_event 'PgSleep') and, where a test says so, killed
from another session with pg_terminate_backend(): its transaction is rolled
back, and the proxy sees the connection die with the outcome unknown.

  A  claim killed at commit         (slowclaim-*, 3 s, killed)  pg, pg+redis
  B  completion killed at commit    (slowdone-*, 3 s, killed)   pg, pg+redis
  C  crash (immediate stop) during a burst of 100 keys x 2 clients   LONG
  D  8 s PostgreSQL outage during a 2 s request, lease 20 s          LONG
  E  client reset while its claim is with PostgreSQL (1.5 s, no kill)
  F  phantom claim: commit sleeps 7 s (> the 5 s statement timeout)
  G2 a failed lease extension (outage around half the lease), the
     exchange outliving the first lease, a second outage at its end   LONG
  H  the proxy stopped (SIGSTOP) past the statement timeout while its
     claim commits: the committed claim is read, not given up
  I  an abandoned claim whose takeover of a lapsed record committed late:
     the record keeps its fingerprint (another body gets 422)
  J  a claim whose commit took longer than the lease: won, but the lease
     it won has already run out, and a duplicate took the key over

Executions are counted by the stub per Idempotency-Key. Every test is
bounded (socket timeouts, deadlines) and a test that stops PostgreSQL
starts it again in a finally.
"""
import concurrent.futures as cf
import os
import signal
import socket
import struct
import threading
import time

import pytest

from support.http import RawConn, assert_problem
from support.procs import metric_value, wait_readyz
from test_idempotency import ORDER, kreq, newkey, post, replayed
from test_postgres import ddl_alone, start_pg_proxy

# a short drain: a test may leave an engine waiting on a slow upstream
BASE_FLAGS = ("--drain-timeout", "3s")


# ------------------------------------------------------------- helpers

def sleep_until(t):
    left = t - time.monotonic()
    if left > 0:
        time.sleep(left)


def start(make_proxy, db, *flags, redis=None, **kw):
    """A proxy on `db` (and `redis`, a RedisServer, when given), ready."""
    extra = ("--redis", redis.url) if redis is not None else ()
    return start_pg_proxy(make_proxy, db, *BASE_FLAGS, *extra, *flags, **kw)


def slow_commit(db, name, secs, event, when):
    """A constraint trigger that sleeps `secs` at COMMIT for the first row
    matching `when` (AFTER `event` ON idempotency_keys); made before any
    proxy runs on `db` (ddl_alone)."""
    ddl_alone(db, f"""
        CREATE SEQUENCE {name}_once;
        CREATE FUNCTION {name}_fn() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF nextval('{name}_once') = 1 THEN
            PERFORM pg_sleep({secs});
          END IF;
          RETURN NULL;
        END $$;
        CREATE CONSTRAINT TRIGGER {name} AFTER {event} ON idempotency_keys
          DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
          WHEN ({when}) EXECUTE FUNCTION {name}_fn();
    """)


def slow_claims(db, secs):
    """The first claim (INSERT) of a key named slowclaim-* sleeps at commit."""
    slow_commit(db, "slowclaim", secs, "INSERT",
                "NEW.key LIKE 'slowclaim-%'")


def slow_completions(db, secs):
    """The first completion of a key named slowdone-* sleeps at commit."""
    slow_commit(db, "slowdone", secs, "UPDATE",
                "NEW.state = 'completed' AND NEW.key LIKE 'slowdone-%'")


def sleepers(db):
    out = db.psql("select pid from pg_stat_activity where datname = "
                  "current_database() and wait_event = 'PgSleep'")
    return [int(x) for x in out.split()]


def wait_sleeper(db, timeout=5.0):
    """The pid of the backend sleeping at commit (polls)."""
    deadline = time.monotonic() + timeout
    while True:
        pids = sleepers(db)
        if pids:
            assert len(pids) == 1, pids
            return pids[0]
        assert time.monotonic() < deadline, \
            f"no backend sleeping at commit after {timeout}s"
        time.sleep(0.02)


def wait_no_sleeper(db, timeout):
    deadline = time.monotonic() + timeout
    while sleepers(db):
        assert time.monotonic() < deadline, "a backend still sleeps"
        time.sleep(0.1)


def terminate(db, pid):
    assert db.psql(f"select pg_terminate_backend({pid})") == "t"


class Row:
    def __init__(self, state, status, body):
        self.state, self.status, self.body = state, status, body

    def __repr__(self):
        return f"<Row {self.state} {self.status} body={self.body[:120]!r}>" \
            if self.body is not None else f"<Row {self.state} {self.status}>"


def row(db, key):
    """The record of (default scope, key), or None."""
    out = db.psql("select state, coalesce(status::text, ''), body is null, "
                  "coalesce(encode(body, 'hex'), '') from idempotency_keys "
                  f"where scope = '' and key = '{key}'")
    if not out:
        return None
    state, status, isnull, hexbody = out.split("|")
    return Row(state, int(status) if status else None,
               None if isnull == "t" else bytes.fromhex(hexbody))


def wait_row(db, key, state, timeout):
    deadline = time.monotonic() + timeout
    while True:
        r = row(db, key)
        if r is not None and r.state == state:
            return r
        if time.monotonic() > deadline:
            return r
        time.sleep(0.1)


def execs(stub, key):
    """How often the request with this key reached the upstream."""
    return stub.stats()["keys"].get(key, 0)


def redis_get(redis, key):
    return redis.cmd("GET", f"idemproxy::{key}")


def redis_body(value):
    """The stored body in a Redis value (store_redis_encode: magic, 32-byte
    fingerprint, status u16, body_stored u8, head u32+bytes, body
    u32+bytes; big-endian), or None when the layout is not that one."""
    if len(value) < 47:
        return None
    head_len = struct.unpack(">I", value[39:43])[0]
    off = 43 + head_len
    if off + 4 > len(value):
        return None
    body_len = struct.unpack(">I", value[off:off + 4])[0]
    body = value[off + 4:]
    return body if len(body) == body_len else None


def redis_holds(value, body):
    """Does the Redis value carry exactly this body?"""
    got = redis_body(value)
    if got is not None:
        return got == body
    return body in value        # an unknown layout: the bytes, verbatim


def post_until(port, key, target="/orders", *, deadline, retry_on=(503,),
               timeout=20.0, pause=0.2):
    """post() again while the status is one of retry_on, until deadline;
    returns (last response, [every response])."""
    seen = []
    while True:
        r = post(port, key, target,
                 timeout=max(1.0, min(timeout, deadline - time.monotonic()
                                      + 5.0)))
        seen.append(r)
        if r.status not in retry_on or time.monotonic() > deadline:
            return r, seen
        time.sleep(pause)


def redis_param(request, with_redis):
    return request.getfixturevalue("redis") if with_redis else None


# ------------------------------------------------- A: claim killed at commit

@pytest.mark.parametrize("with_redis", [False, True], ids=["pg", "pg+redis"])
def test_a_claim_killed_at_commit(make_proxy, pg_db, stub, request,
                                  with_redis):
    """The claim's statement returned 'won', but its backend is killed while
    committing: the outcome is unknown (the row was rolled back). The store
    re-sends the claim with the same owner token on a fresh connection, so
    the request either executes once (200) or gets 503 store-unavailable
    and has not executed. A retry gets 200 (a replay if the first
    executed); the key executed exactly once; the record is completed."""
    redis = redis_param(request, with_redis)
    slow_claims(pg_db, 3)
    p = start(make_proxy, pg_db, redis=redis, name="a")
    key = newkey("slowclaim")
    with cf.ThreadPoolExecutor(1) as ex:
        fut = ex.submit(post, p.port, key, timeout=20)
        pid = wait_sleeper(pg_db, timeout=5)
        terminate(pg_db, pid)
        first = fut.result(timeout=30)
    print(f"first: {first!r}")
    assert first.status in (200, 503), first
    if first.status == 503:
        assert_problem(first, 503, "store-unavailable")
        assert execs(stub, key) == 0, "a 503 answer, yet it was executed"
    else:
        assert not replayed(first), first
        assert execs(stub, key) == 1
    retry, seen = post_until(p.port, key, deadline=time.monotonic() + 8)
    n = execs(stub, key)
    assert n == 1, f"executed {n} times; retry: {[x.status for x in seen]}"
    assert retry.status == 200, seen
    if first.status == 200:
        assert replayed(retry), retry
        assert retry.body == first.body
    rec = row(pg_db, key)
    assert rec is not None and rec.state == "completed", rec
    assert rec.body == retry.body, rec
    if redis is not None:
        value = redis_get(redis, key)
        if value is not None:
            assert redis_holds(value, rec.body), (value[:200], rec)


# -------------------------------------------- B: completion killed at commit

@pytest.mark.parametrize("with_redis", [False, True], ids=["pg", "pg+redis"])
def test_b_completion_killed_at_commit(make_proxy, pg_db, stub, request,
                                       with_redis):
    """The client gets its 200 at once; the completion's backend is killed
    while committing (rolled back). The engine must not take the returned
    row for a commit: it writes the completion again, and within ~10 s the
    record is completed with the body the client got. A duplicate replays
    it; one execution. With Redis: Redis never holds a value that
    PostgreSQL does not, and at the end it holds PostgreSQL's body."""
    redis = redis_param(request, with_redis)
    slow_completions(pg_db, 3)
    p = start(make_proxy, pg_db, redis=redis, name="b")
    key = newkey("slowdone")
    t0 = time.monotonic()
    first = post(p.port, key, timeout=20)
    took = time.monotonic() - t0
    assert first.status == 200 and not replayed(first), first
    assert took < 2.5, f"the response waited for the completion ({took:.2f}s)"
    pid = wait_sleeper(pg_db, timeout=5)
    terminate(pg_db, pid)
    t_kill = time.monotonic()
    if redis is not None:
        # Redis first, PostgreSQL after: a value in Redis while the record
        # (completion is final) is still not completed was never committed
        bad = []
        while time.monotonic() < t_kill + 1.5:
            value = redis_get(redis, key)
            if value is not None:
                rec = row(pg_db, key)
                if rec is None or rec.state != "completed" or \
                        not redis_holds(value, rec.body):
                    bad.append((round(time.monotonic() - t_kill, 2), rec))
                    break
            time.sleep(0.05)
        assert not bad, f"Redis holds a response PostgreSQL does not: {bad}"
    rec = wait_row(pg_db, key, "completed", timeout=10)
    assert rec is not None and rec.state == "completed", \
        f"completion not written again within 10 s of the kill: {rec}"
    assert rec.body == first.body and rec.status == 200, rec
    dup = post(p.port, key, timeout=15)
    assert dup.status == 200 and replayed(dup), dup
    assert dup.body == first.body
    assert execs(stub, key) == 1, stub.stats()["keys"]
    if redis is not None:
        deadline = time.monotonic() + 3
        while (value := redis_get(redis, key)) is None:
            assert time.monotonic() < deadline, "Redis never got the response"
            time.sleep(0.05)
        assert redis_holds(value, rec.body), (value[:200], rec)


# ------------------------------------------- C: crash during a burst (LONG)

def test_c_crash_during_burst(make_proxy, pg_db, pg_server, stub):
    """LONG (up to ~25 s; ~4 s when no claim is left behind). 100 keys,
    each sent by 2 concurrent clients, spread over 2 s (300 ms upstream);
    PostgreSQL is stopped immediately (a crash) at 0.7 s and started again
    1 s later. Then every key is retried until the answer is neither 409
    nor 503 (up to lease + 10 s): each key executed at most once at any
    time and exactly once at the end, and every 200 seen for a key carries
    the same body."""
    p = start(make_proxy, pg_db, "--lease", "10s", "--upstream-timeout",
              "5s", "--wait-timeout", "3s", workers=2, name="c")
    keys = [newkey(f"burst{i}") for i in range(100)]
    target = "/orders?delay_ms=300"
    lock = threading.Lock()
    seen = {k: [] for k in keys}        # (phase, status, replayed, body)
    errors = []
    over = []                           # (time, key, count) with count > 1
    stop_ev = threading.Event()

    def sampler():
        # counts only grow: a key over 1 at any time stays over 1, this
        # says when
        while not stop_ev.wait(0.2):
            try:
                counts = stub.stats()["keys"]
            except OSError:
                continue
            for k, n in counts.items():
                if n > 1:
                    with lock:
                        over.append((time.monotonic(), k, n))

    def record(phase, key, r):
        with lock:
            seen[key].append((phase, r.status, replayed(r), r.body))

    def client(key, delay, barrier):
        time.sleep(delay)
        try:
            barrier.wait(5)
            r = post(p.port, key, target, timeout=30)
        except Exception as e:            # connection-level failure
            with lock:
                errors.append((key, repr(e)))
            return
        record("burst", key, r)

    mon = threading.Thread(target=sampler, daemon=True)
    mon.start()
    try:
        with cf.ThreadPoolExecutor(2 * len(keys)) as ex:
            futs = []
            t0 = time.monotonic()
            for i, k in enumerate(keys):
                b = threading.Barrier(2)
                futs += [ex.submit(client, k, i * 0.02, b) for _ in range(2)]
            sleep_until(t0 + 0.7)
            try:
                pg_server.crash()
                t_crash = time.monotonic()
                sleep_until(t_crash + 1.0)
                pg_server.start()
            finally:
                pg_server.ensure_running()
            t_up = time.monotonic()
            print(f"crash at {t_crash - t0:.2f}s, up at {t_up - t0:.2f}s")
            for f in futs:
                f.result(timeout=60)
        burst = {}
        for k in keys:
            for ph, st, rp, _ in seen[k]:
                burst[(st, rp)] = burst.get((st, rp), 0) + 1
        print(f"burst outcomes (status, replayed): {burst}")

        # every key again until it is settled (lease 10 s + 10 s)
        deadline = t_up + 20
        final = {}

        def settle_key(key):
            while True:
                left = deadline - time.monotonic()
                try:
                    r = post(p.port, key, target,
                             timeout=max(5.0, left + 5.0))
                except Exception as e:
                    with lock:
                        errors.append((key, repr(e)))
                    if left <= 0:
                        return
                    time.sleep(0.3)
                    continue
                record("retry", key, r)
                if r.status not in (409, 503) or left <= 0:
                    final[key] = r
                    return
                time.sleep(0.3)

        with cf.ThreadPoolExecutor(25) as ex:
            list(ex.map(settle_key, keys, timeout=60))
    finally:
        stop_ev.set()
        mon.join(5)
    counts = stub.stats()["keys"]
    assert not errors, errors[:10]
    assert not over, f"executed more than once: {over[:10]}"
    assert all(counts.get(k, 0) <= 1 for k in keys), \
        {k: counts[k] for k in keys if counts.get(k, 0) > 1}
    unsettled = {k: (final[k].status if k in final else None) for k in keys
                 if k not in final or final[k].status != 200}
    assert not unsettled, f"{len(unsettled)} keys not settled with 200: " \
        f"{list(unsettled.items())[:10]}"
    never = [k for k in keys if counts.get(k, 0) != 1]
    assert not never, f"{len(never)} keys did not execute exactly once: " \
        f"{[(k, counts.get(k, 0)) for k in never[:10]]}"
    for k in keys:
        bodies = {body for _, st, _, body in seen[k] if st == 200}
        assert len(bodies) == 1, (k, [(ph, st, rp) for ph, st, rp, _ in
                                      seen[k]])
    assert pg_db.count("state = 'completed'") == len(keys)


# --------------------------------- D: outage shorter than the lease (LONG)

def test_d_outage_during_request(make_proxy, pg_db, pg_server, stub):
    """LONG (~25 s). A 2 s request; at ~0.5 s PostgreSQL stops (fast) for
    ~8 s. The client gets its 200 at ~2 s regardless; the completion is
    retried while the lease (20 s) lasts, so once PostgreSQL is back it
    lands: after the lease a duplicate is a replay, never a second
    execution."""
    p = start(make_proxy, pg_db, "--lease", "20s", "--upstream-timeout",
              "10s", name="d")
    key = newkey("outage")
    target = "/orders?delay_ms=2000"
    try:
        with RawConn(p.port, timeout=15) as c:
            c.send(kreq("POST", target, key, ORDER))
            t0 = time.monotonic()
            deadline = t0 + 1.0
            while execs(stub, key) < 1:          # claimed and forwarded
                assert time.monotonic() < deadline, "never reached upstream"
                time.sleep(0.02)
            sleep_until(t0 + 0.5)
            pg_server.stop("fast")
            t_stop = time.monotonic() - t0
            first = c.read_response()
            t_first = time.monotonic() - t0
        print(f"stopped at {t_stop:.2f}s, response at {t_first:.2f}s")
        assert first.status == 200 and not replayed(first), first
        assert t_first < 4.0, t_first
        sleep_until(t0 + 8.5)
        pg_server.start()
    finally:
        pg_server.ensure_running()
    print(f"PostgreSQL back at {time.monotonic() - t0:.2f}s")
    wait_readyz(p, timeout=10)
    rec = wait_row(pg_db, key, "completed", timeout=8)
    print(f"record at {time.monotonic() - t0:.2f}s: {rec}")
    sleep_until(t0 + 21)                      # the lease is over
    dup, seen = post_until(p.port, key, target,
                           deadline=time.monotonic() + 8)
    n = execs(stub, key)
    assert n == 1, f"executed {n} times (the duplicate after the lease: " \
        f"{[x.status for x in seen]}, replayed {replayed(dup)}); " \
        f"record before it: {rec}"
    assert dup.status == 200 and replayed(dup), (dup, seen)
    assert dup.body == first.body
    rec = row(pg_db, key)
    assert rec is not None and rec.state == "completed", rec
    assert rec.body == first.body
    retries = metric_value(p.metrics(), "idemproxy_completion_retries_total")
    if retries is not None:
        assert retries >= 1, retries


# ------------------------------ E: the client resets while its claim is out

def test_e_client_reset_during_claim(make_proxy, pg_db, stub):
    """The client resets its connection while its (winning) claim is with
    PostgreSQL (the commit takes 1.5 s). Nobody will execute that claim: it
    is given back, so the same request 2.5 s later executes at once (200,
    not a replay, not a 409 until the default 30 s lease runs out), and the
    upstream saw the key once."""
    slow_claims(pg_db, 1.5)
    p = start(make_proxy, pg_db, name="e")
    key = newkey("slowclaim")
    s = socket.create_connection(("127.0.0.1", p.port), timeout=5)
    try:
        s.sendall(kreq("POST", "/orders", key, ORDER))
        t0 = time.monotonic()
        wait_sleeper(pg_db, timeout=3)            # the claim is out
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                     struct.pack("ii", 1, 0))
    finally:
        s.close()                                 # RST
    sleep_until(t0 + 2.5)
    wait_no_sleeper(pg_db, timeout=5)
    assert p.proc.poll() is None, \
        f"idemproxy died after the client reset:\n{p.log()[-6000:]}"
    before = row(pg_db, key)
    t1 = time.monotonic()
    r = post(p.port, key, timeout=15)
    took = time.monotonic() - t1
    print(f"record before: {before}; again after {t1 - t0:.2f}s: "
          f"{r.status} (replayed {replayed(r)}) in {took:.2f}s")
    assert r.status != 409, r
    assert r.status == 200 and not replayed(r), r
    assert took < 5.0, took
    assert execs(stub, key) == 1, stub.stats()["keys"]
    rec = row(pg_db, key)
    assert rec is not None and rec.state == "completed", rec
    assert rec.body == r.body


# -------------------------------------------------- F: a phantom claim

def test_f_phantom_claim(make_proxy, pg_db, stub):
    """(~10-20 s) The claim's commit takes 7 s, longer than the store's 5 s
    statement timeout: the request ends with 503 store-unavailable (or
    200), and the transaction commits after the proxy gave up on it. That
    committed claim must not hold the key until the lease (30 s) ends: once
    the transaction is over (~8 s), a retry gets 200 (or a replay) within a
    few seconds, and the key executes once."""
    slow_claims(pg_db, 7)
    p = start(make_proxy, pg_db, name="f")
    key = newkey("slowclaim")
    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(1) as ex:
        fut = ex.submit(post, p.port, key, timeout=20)
        wait_sleeper(pg_db, timeout=3)
        first = fut.result(timeout=25)
    t_first = time.monotonic() - t0
    print(f"first after {t_first:.2f}s: {first!r}")
    assert first.status in (200, 503), first
    if first.status == 503:
        assert_problem(first, 503, "store-unavailable")
        assert execs(stub, key) == 0, "a 503 answer, yet it was executed"
    wait_no_sleeper(pg_db, timeout=max(1.0, t0 + 12 - time.monotonic()))
    sleep_until(t0 + 8)
    print(f"record at {time.monotonic() - t0:.2f}s: {row(pg_db, key)}")
    t1 = time.monotonic()
    r, seen = post_until(p.port, key, deadline=t1 + 5, timeout=15)
    took = time.monotonic() - t1
    print(f"retry: {[x.status for x in seen]} in {took:.2f}s")
    assert r.status == 200, (r, [x.status for x in seen])
    if first.status == 200:
        assert replayed(r) and r.body == first.body, r
    assert took < 5.0, f"the retry waited {took:.2f}s (stuck until the lease?)"
    assert execs(stub, key) == 1, stub.stats()["keys"]
    rec = row(pg_db, key)
    assert rec is not None and rec.state == "completed", rec
    assert rec.body == r.body


# ------------------- I: an abandoned claim that took a lapsed record over

def test_i_abandoned_takeover_keeps_the_fingerprint(make_proxy, pg_db, stub):
    """(~12 s) On an at-least-once route (--unknown-outcome release: the
    only one whose retries take a lapsed claim over; by default the retry
    records an unknown outcome instead, test_unknown_outcomes.py): a
    request executed, but its completion was never written
    and its lease ran out (the test writes the record that way). A retry
    takes the record over, and that takeover's commit sleeps 7 s, past the
    5 s statement timeout: the retry gets 503 and its claim goes on
    abandoned. The abandoned claim finds the takeover committed and gives
    the key back - but the record was the executed request's: it must
    stay, bound to its body, so that another body gets 422 (not an
    execution) and a retry of the same body takes over at once."""
    # only the takeover matches: the first request inserts its record and
    # completes it, the test's own rewrite names the owner 'gone'
    slow_commit(pg_db, "slowtake", 7, "UPDATE",
                "NEW.state = 'in_flight' AND NEW.owner <> 'gone' AND "
                "NEW.key LIKE 'slowtake-%'")
    p = start(make_proxy, pg_db, "--response-cache", "0",
              "--unknown-outcome", "release", name="i")
    key = newkey("slowtake")
    first = post(p.port, key)
    assert first.status == 200, first
    assert execs(stub, key) == 1
    assert pg_db.psql(
        "update idempotency_keys set state = 'in_flight', status = null, "
        "headers = null, body = null, owner = 'gone', "
        "lease_until = now() - interval '1 second' "
        f"where scope = '' and key = '{key}'") == "", "record rewritten"
    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(1) as ex:
        fut = ex.submit(post, p.port, key, timeout=20)
        wait_sleeper(pg_db, timeout=3)
        retry = fut.result(timeout=25)
    print(f"retry after {time.monotonic() - t0:.2f}s: {retry!r}")
    assert retry.status in (200, 503), retry
    # the takeover commits at ~7 s; the abandoned claim then finds it its
    # own and gives the key back
    wait_no_sleeper(pg_db, timeout=max(1.0, t0 + 12 - time.monotonic()))
    deadline = time.monotonic() + 5
    while True:
        out = pg_db.psql("select owner, lease_until <= now() from "
                         "idempotency_keys where scope = '' and "
                         f"key = '{key}'")
        if out == "" or (not out.startswith("gone|") and out.endswith("|t")):
            break
        assert time.monotonic() < deadline, f"the takeover stays: {out!r}"
        time.sleep(0.1)
    print(f"record after the abandoned claim: {out!r}")
    assert out != "", "the executed request's record was deleted"
    other = post(p.port, key, body=b'{"item":"pen","amount":1}')
    assert_problem(other, 422, "idempotency-key-mismatch")
    assert execs(stub, key) == (2 if retry.status == 200 else 1)
    again = post(p.port, key)
    assert again.status == 200 and not replayed(again), again
    assert execs(stub, key) == (3 if retry.status == 200 else 2)


# ------------------------------- J: won after the lease ran out (~7 s)

@pytest.mark.parametrize("race", ["extension-first", "lapse-first"])
def test_j_claim_won_after_its_lease(make_proxy, pg_db, stub, race):
    """(~7 s) A's claim inserts the record, with a lease of 2 s counted
    from when its transaction began, and its commit then sleeps 3 s: the
    lease has run out when A hears it won. B's claim of the same body
    begins after that lease's end, waits for A's commit and finds the
    record lapsed. Only one of them may execute. A must not forward on a
    lease it knows is over: it extends it first (fenced by its owner
    token). extension-first: A's extension and B's claim both wait for A's
    commit and race: either A's extension lands first, and B waits for A
    and replays, or B's claim does, as in lapse-first. lapse-first: A is
    stopped (SIGSTOP) until B found the lease run out and recorded the
    outcome as unknown (B cannot know A sent nothing: its client gets 502
    outcome-unknown); A's extension is fenced, A - which surely sent
    nothing - gives its record back with its token, claims again, wins and
    executes; later duplicates replay it. Either way: one execution."""
    lease = ("--lease", "2s", "--upstream-timeout", "1500ms")
    slow_claims(pg_db, 3.0)
    a = start(make_proxy, pg_db, *lease, name="a")
    b = start(make_proxy, pg_db, *lease, name="b")
    key = newkey("slowclaim")
    with cf.ThreadPoolExecutor(2) as ex:
        fa = ex.submit(post, a.port, key)
        pid = wait_sleeper(pg_db, timeout=3)
        began = float(pg_db.psql("select extract(epoch from xact_start) "
                                 f"from pg_stat_activity where pid = {pid}"))
        # past the end of A's lease (2 s from when its transaction began),
        # before its commit ends (3 s)
        time.sleep(max(0.0, began + 2.3 - time.time()))
        if race == "lapse-first":
            os.kill(a.proc.pid, signal.SIGSTOP)
        try:
            fb = ex.submit(post, b.port, key)
            if race == "lapse-first":
                wait_row(pg_db, key, "unknown", timeout=5)
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        ra, rb = fa.result(timeout=20), fb.result(timeout=20)
    print(f"A: {ra!r}\nB: {rb!r}")
    assert execs(stub, key) == 1
    if race == "lapse-first" or rb.status == 502:
        assert_problem(rb, 502, "outcome-unknown")
        assert replayed(rb)
        assert ra.status == 200 and not replayed(ra), ra
        assert "giving the key back and claiming again" in a.log()
        r = wait_row(pg_db, key, "completed", timeout=5)
        assert r is not None and r.state == "completed", r
        again = post(b.port, key)
        assert again.status == 200 and replayed(again), again
        assert again.body == ra.body
        assert execs(stub, key) == 1
        return
    assert ra.status == 200 and rb.status == 200, (ra, rb)
    assert replayed(ra) != replayed(rb), "one execution, one replay"
    assert ra.body == rb.body
    r = wait_row(pg_db, key, "completed", timeout=5)
    assert r is not None and r.state == "completed", r


# ----------------------------- H: stalled past the statement timeout (~8 s)

def test_h_stall_reads_the_committed_claim(make_proxy, pg_db, stub):
    """(~8 s) The claim's commit takes 1.5 s; meanwhile the proxy is
    stopped (SIGSTOP) and stays stopped until 6.5 s after the claim was
    sent, past the store's 5 s statement timeout. When it resumes, the
    claim's committed result is waiting in its socket, and its batch's
    deadline has passed: it must read the result - the request is
    executed once and answered 200 - not drop the connection and answer
    503 for a claim PostgreSQL committed."""
    slow_claims(pg_db, 1.5)
    p = start(make_proxy, pg_db, name="h")
    key = newkey("slowclaim")
    with cf.ThreadPoolExecutor(1) as ex:
        fut = ex.submit(post, p.port, key, timeout=20)
        wait_sleeper(pg_db, timeout=3)
        t0 = time.monotonic()
        os.kill(p.proc.pid, signal.SIGSTOP)
        try:
            wait_no_sleeper(pg_db, timeout=5)
            sleep_until(t0 + 6.5)
        finally:
            os.kill(p.proc.pid, signal.SIGCONT)
        r = fut.result(timeout=20)
    print(f"after the stall: {r!r}; record {row(pg_db, key)}")
    assert r.status == 200, r
    assert not replayed(r), r
    assert execs(stub, key) == 1, stub.stats()["keys"]
    rec = wait_row(pg_db, key, "completed", timeout=5)
    assert rec is not None and rec.state == "completed", rec
    assert rec.body == r.body


# ---------------------------------------- G: a failed lease extension (LONG)

G_FLAGS = ("--lease", "10s", "--upstream-timeout", "9s", "--in-flight",
           "reject")


def lease_span(db, key):
    """(state, seconds from the claim to lease_until) of the record."""
    out = db.psql("select state, coalesce(extract(epoch from lease_until - "
                  "created_at)::numeric(10,2)::text, '') from "
                  f"idempotency_keys where scope = '' and key = '{key}'")
    return out


def test_g2_failed_extension_retried_before_lease_end(make_proxy, pg_db,
                                                      pg_server, stub):
    """LONG (~20 s). Lease 10 s; the exchange takes ~17 s (head at 8.5 s, the
    body's second half 8.5 s later), and PostgreSQL is down twice: around
    the first extension (4.5 s - 5.5 s) and around the first lease's end
    (9 s - 10.5 s). The failed extension must be retried soon - while
    PostgreSQL is back, before the lease runs out at 10 s - not half a
    lease later (when PostgreSQL is down again and the lease is over).
    A duplicate at ~11 s gets 409, never an execution; at the end a
    duplicate replays; one execution."""
    p = start(make_proxy, pg_db, *G_FLAGS, name="g2")
    key = newkey("ext2")
    target = "/orders?delay_ms=8500&body_delay_ms=8500&bytes=2000"
    trace = []

    def watch_lease(until):
        while time.monotonic() < until:
            trace.append((round(time.monotonic() - t0, 1),
                          lease_span(pg_db, key)))
            time.sleep(0.5)

    c = RawConn(p.port, timeout=25)
    try:
        c.send(kreq("POST", target, key, ORDER))
        t0 = time.monotonic()
        deadline = t0 + 1.0
        while execs(stub, key) < 1:
            assert time.monotonic() < deadline, "never reached upstream"
            time.sleep(0.02)
        try:
            sleep_until(t0 + 4.5)
            pg_server.stop("fast")
            sleep_until(t0 + 5.5)
            pg_server.start()
            watch_lease(t0 + 9.0)
            pg_server.stop("fast")
            sleep_until(t0 + 10.5)
            pg_server.start()
        finally:
            pg_server.ensure_running()
        print(f"lease (state|lease_until - created_at): {trace}")
        sleep_until(t0 + 11)
        try:
            dup, seen = post_until(p.port, key, target, deadline=t0 + 15,
                                   timeout=4)
            statuses = [x.status for x in seen]
        except socket.timeout:
            dup, statuses = None, "no prompt answer (forwarded?)"
        print(f"duplicate at ~11 s: {statuses}; lease now "
              f"{lease_span(pg_db, key)}")
        assert execs(stub, key) == 1, \
            f"the duplicate executed again ({statuses})"
        assert dup is not None, statuses
        assert_problem(dup, 409, "request-in-progress")
        first = c.read_response()
        t_first = time.monotonic() - t0
    finally:
        c.close()
    print(f"winner's response done at {t_first:.2f}s")
    assert first.status == 200 and not replayed(first), first
    assert len(first.body) == 2000
    last, seen = post_until(p.port, key, target,
                            deadline=time.monotonic() + 6,
                            retry_on=(409, 503), timeout=6)
    assert last.status == 200 and replayed(last), \
        (last, [x.status for x in seen])
    assert last.body == first.body
    assert execs(stub, key) == 1, stub.stats()["keys"]
