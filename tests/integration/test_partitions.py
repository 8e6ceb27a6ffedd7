"""Retention by partition (issue 20): claims, completions, takeovers and
purges racing partitions being created and dropped, records of different
lifetimes sharing the table, and a crash in the middle of maintenance.

The shortest partitions there are (2 s: --ttl 1s) make every race here
happen within seconds: a partition is created ahead every 2 s, and one is
dropped about as often.
"""
import concurrent.futures as cf
import subprocess
import time

from support.procs import IDEMPROXY_BIN, clean_env, metric_value, wait_readyz
from support.stores import PSQL_BIN
from test_idempotency import ORDER, kreq, newkey, post, replayed
from test_keys import TOKEN, admin, token_file  # noqa: F401 (fixture)
from test_pg_outcomes import execs
from test_postgres import burst_split, ddl_alone


def start(make_proxy, db, *flags, name):
    p = make_proxy("--store", db.url, "--response-cache", "0", *flags,
                   name=name)
    wait_readyz(p)
    return p


def dropped(*proxies):
    return sum(metric_value(p.metrics(),
                            "idemproxy_sweep_partitions_dropped_total") or 0
               for p in proxies)


def hold_open(server, db, sql):
    """A psql session that runs sql and then stays, its transaction open,
    until killed."""
    p = subprocess.Popen(
        [PSQL_BIN, "-h", "127.0.0.1", "-p", str(server.port), "-U",
         "postgres", "-d", db.name, "-X", "-q"],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, text=True)
    p.stdin.write(sql + "\n")
    p.stdin.flush()
    return p


def duplicate_rows(db):
    return db.psql("select key from idempotency_keys group by scope, key "
                   "having count(*) > 1")


def test_duplicates_across_partition_boundaries(make_proxy, pg_db, stub):
    """Bursts of one key from 8 connections on two instances, one burst
    every 250 ms for 7 s: several partitions begin and end meanwhile, and
    each key still executes once and has one row."""
    a = start(make_proxy, pg_db, "--ttl", "1s", name="a")
    b = start(make_proxy, pg_db, "--ttl", "1s", name="b")
    keys = []
    deadline = time.monotonic() + 7
    while time.monotonic() < deadline:
        key = newkey("edge")
        keys.append(key)
        rs = burst_split([a.port, b.port], 8,
                         kreq("POST", "/orders?delay_ms=50", key, ORDER))
        assert all(r.status in (200, 409) for r in rs), rs
        assert duplicate_rows(pg_db) == ""
        time.sleep(0.25)
    assert len(keys) >= 15
    assert [k for k in keys if execs(stub, k) != 1] == []
    assert dropped(a, b) >= 1


def where(db, key):
    return db.psql("select tableoid::regclass from idempotency_keys "
                   f"where key = '{key}'")


def test_lifetimes_share_the_table(make_proxy, pg_db, stub, token_file):
    """Instance a makes 2 s partitions (--ttl 1s); b's records live 60 s
    and one of its requests takes 5 s. While partitions come and go, b's
    completed record is replayed from PostgreSQL all along, and is moved
    forward when the partition it was written in goes (its last live
    record, eight widths on); b's request in flight is protected; a purge
    is honoured; nothing executes twice and no key has two rows."""
    a = start(make_proxy, pg_db, "--ttl", "1s", name="a")
    b = start(make_proxy, pg_db, "--ttl", "60s", "--admin-token-file",
              token_file, name="b")
    done = newkey("long")
    first = post(b.port, done)
    assert first.status == 200
    born = where(pg_db, done)
    slow = newkey("slow")
    target = "/orders?delay_ms=5000"
    with cf.ThreadPoolExecutor(2) as ex:
        running = ex.submit(post, b.port, slow, target)
        t0 = time.monotonic()
        dup = None
        while pg_db.psql("select count(*) from pg_class where relname = "
                         f"'{born}'") == "1":
            assert time.monotonic() - t0 < 60, (born, a.log())
            r = post(b.port, done)
            assert replayed(r) and r.body == first.body, r
            r = post(a.port, done)
            assert replayed(r) and r.body == first.body, r
            if dup is None and time.monotonic() - t0 > 2.5:
                # after a partition or two ended: still in flight
                dup = ex.submit(post, a.port, slow, target)
            time.sleep(0.5)
        orig = running.result()
        d = dup.result()
    assert orig.status == 200
    assert d.status == 409 or (replayed(d) and d.body == orig.body), d
    moved = where(pg_db, done)
    assert moved and moved != born, (born, moved)
    r = post(a.port, done)
    assert replayed(r) and r.body == first.body
    assert replayed(post(a.port, slow, target))
    assert execs(stub, done) == 1 and execs(stub, slow) == 1
    # a purge is honoured: the next request executes again, once
    status, _, doc = admin(b, "DELETE", done, token=TOKEN)
    assert status == 200, doc
    again = post(a.port, done)
    assert again.status == 200 and not replayed(again)
    assert execs(stub, done) == 2
    assert duplicate_rows(pg_db) == ""


def test_crash_in_the_middle_of_a_detach(make_proxy, pg_db, pg_server,
                                         stub):
    """A query that started before a detach keeps it waiting (DETACH ...
    CONCURRENTLY waits for every query that may still see the partition);
    PostgreSQL crashes meanwhile. The partition stays marked as being
    detached; after the restart maintenance finishes it (FINALIZE) and
    drops it, and every record written before still replays."""
    a = start(make_proxy, pg_db, "--ttl", "1s", name="a")
    keep = newkey("keep")
    b = start(make_proxy, pg_db, "--ttl", "60s", name="b")
    first = post(b.port, keep)
    assert first.status == 200
    # an open transaction that has seen the table holds back every detach
    holder = hold_open(pg_server, pg_db,
                       "begin; select count(*) from idempotency_keys;")
    try:
        deadline = time.monotonic() + 20
        pending = "0"
        while pending == "0" and time.monotonic() < deadline:
            pending = pg_db.psql("select count(*) from pg_inherits where "
                                 "inhdetachpending")
            time.sleep(0.2)
        assert pending != "0", a.log()
        # the held detach delays retention, never a claim
        for i in range(5):
            r = post(b.port, newkey(f"during-{i}"))
            assert r.status == 200 and not replayed(r), r
        pg_server.crash()
    finally:
        holder.kill()
        holder.wait()
    pg_server.start()
    # maintenance finishes what the crash cut
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if pg_db.psql("select count(*) from pg_inherits where "
                      "inhdetachpending") == "0":
            break
        time.sleep(0.2)
    assert pg_db.psql("select count(*) from pg_inherits where "
                      "inhdetachpending") == "0", a.log()
    tracked = pg_db.psql("select count(*) from idempotency_keys_parts")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        r = post(b.port, keep)
        if r.status == 200:
            break
        time.sleep(0.2)
    assert replayed(r) and r.body == first.body, r
    assert execs(stub, keep) == 1
    attached = pg_db.psql("select count(*) from pg_inherits where "
                          "inhparent = 'idempotency_keys'::regclass")
    assert int(tracked) >= int(attached) - 1, (tracked, attached)


PAST_PARTS = """
DO $$
DECLARE t0 timestamptz := (SELECT min(lo) FROM idempotency_keys_parts);
        lo timestamptz; name text;
BEGIN
  FOR i IN 1..%d LOOP
    lo := t0 - i * interval '2 seconds';
    name := 'idempotency_keys_old' || i;
    EXECUTE format('CREATE TABLE %%I (LIKE idempotency_keys INCLUDING DEFAULTS)', name);
    EXECUTE format('CREATE UNIQUE INDEX ON %%I (scope, key)', name);
    EXECUTE format('CREATE INDEX ON %%I (expires_at)', name);
    EXECUTE format('ALTER TABLE idempotency_keys ATTACH PARTITION %%I '
                   'FOR VALUES FROM (%%L) TO (%%L)', name, lo, lo + interval '2 seconds');
    INSERT INTO idempotency_keys_parts (name, lo, hi)
    VALUES (name, lo, lo + interval '2 seconds');
  END LOOP;
END $$;
"""


def wait_open_transaction(db, timeout=10.0):
    """Until a session of db (hold_open's) sits in a transaction that has
    its id."""
    deadline = time.monotonic() + timeout
    while db.psql("select count(*) from pg_stat_activity where datname = "
                  "current_database() and state = 'idle in transaction' "
                  "and backend_xid is not null") != "1":
        assert time.monotonic() < deadline, "the transaction did not open"
        time.sleep(0.05)


def test_partitions_pile_up_bounded(make_proxy, pg_db, pg_server, stub):
    """A transaction left open holds back every drop; with 2-s partitions
    a new one would follow every 2 s, and every claim reads them all. Once
    24 are there, each new one spans as long as all the others: in 12 s
    at most one more is made, and claims go on. (The 30 past partitions
    and the open transaction are there before the proxy starts: no DDL
    against a running proxy, ddl_alone.)"""
    ddl_alone(pg_db, PAST_PARTS % 30, "--ttl", "1s")
    holder = hold_open(pg_server, pg_db, "begin; select txid_current(), "
                       "count(*) from idempotency_keys;")
    try:
        wait_open_transaction(pg_db)
        a = start(make_proxy, pg_db, "--ttl", "1s", name="a")
        time.sleep(1)
        before = int(pg_db.psql("select count(*) from idempotency_keys_parts"))
        assert before >= 30
        keys = []
        deadline = time.monotonic() + 12
        while time.monotonic() < deadline:
            keys.append(newkey("pile"))
            r = post(a.port, keys[-1])
            assert r.status == 200 and not replayed(r), r
            time.sleep(0.2)
        after = int(pg_db.psql("select count(*) from idempotency_keys_parts"))
        widest = float(pg_db.psql("select extract(epoch from max(hi - lo)) "
                                  "from idempotency_keys_parts"))
        assert after <= before + 1, (before, after, pg_db.psql(
            "select name, lo, hi from idempotency_keys_parts order by lo"))
        assert widest >= 60, widest
        assert [k for k in keys if execs(stub, k) != 1] == []
    finally:
        holder.kill()
        holder.wait()


def test_writer_without_xid_holds_its_partition(make_proxy, pg_db, pg_server,
                                                stub):
    """A writer that took its snapshot and its part_at before a partition
    ended, but has no transaction id yet (a backend stopped between the
    two, or a long INSERT ... SELECT still reading), writes into that
    partition after maintenance first looked at it. The partition must not
    be detached under it: the record it commits stays where claims read,
    and is never dropped with the partition."""
    a = start(make_proxy, pg_db, "--ttl", "1s", name="a")
    first = post(a.port, newkey("warm"))
    assert first.status == 200
    late = newkey("late")
    # the row's part_at is taken now, its insert comes 8 s later (two
    # partitions and more): pg_sleep runs after clock_timestamp()
    writer = hold_open(pg_server, pg_db, (
        "INSERT INTO idempotency_keys (scope, key, fingerprint, state, "
        "status, headers, body, expires_at, part_at) SELECT '', "
        f"'{late}', '\\x00', 'completed', 200, '', 'x', "
        "now() + interval '1 day', t0 FROM (SELECT clock_timestamp() AS t0, "
        "pg_sleep(8)) s; \\q"))
    try:
        writer.wait(timeout=30)
    finally:
        writer.kill()
    assert pg_db.psql(f"select count(*) from idempotency_keys "
                      f"where key = '{late}'") == "1"
    # maintenance goes on: the row stays where readers find it
    time.sleep(6)
    assert pg_db.psql(f"select count(*) from idempotency_keys "
                      f"where key = '{late}'") == "1", a.log()


def test_claim_plan_made_on_empty_partitions(pg_db, pg_server):
    """A session's generic plan of the claim's read, made while every
    partition is empty (a new deployment, or many partitions just added),
    lives on while the current partition fills. The read must find a key
    through each partition's (scope, key) index: a plan that walks the
    expires_at index backwards (a Merge Append under its LIMIT: cheap on
    paper while the partitions are empty) reads every row of the current
    partition for every claim - 3-7 ms a claim at 30,000 rows, and growing
    with the partition. Counted by the rows the claims read through the
    expires_at indexes: none."""
    r = subprocess.run([IDEMPROXY_BIN, "migrate", "--store", pg_db.url,
                        "--ttl", "1s"], capture_output=True, timeout=60,
                       env=clean_env())
    assert r.returncode == 0, r.stderr
    for _ in range(8):                  # many short, empty partitions
        pg_db.psql("select idemproxy_parts_ensure(1000)")
        time.sleep(0.6)
    pg_db.psql("select idemproxy_parts_ensure(60000)")  # then a long one
    time.sleep(2.5)                     # ... which is now the current one
    s = subprocess.Popen(
        [PSQL_BIN, "-h", "127.0.0.1", "-p", str(pg_server.port), "-U",
         "postgres", "-d", pg_db.name, "-X", "-Atq"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=clean_env({"PGCONNECT_TIMEOUT": "5"}))

    def claim(key, lock):
        return (f"SELECT state FROM idemproxy_claim6('', '{key}', '\\x00', "
                f"'o', 600000, 600000, {lock}, false, false);\n")
    try:
        # the session settings of the store (store_pg.c), then a claim:
        # the plan is made now, on empty partitions
        s.stdin.write("SET plan_cache_mode = force_generic_plan;\n"
                      "SET enable_seqscan = off;\n"
                      "SET enable_bitmapscan = off;\n"
                      "SET jit = off;\n" + claim("plan", 1))
        s.stdin.flush()
        assert s.stdout.readline().strip() == "won"
        pg_db.psql(
            "insert into idempotency_keys (scope, key, fingerprint, state, "
            "owner, lease_until, expires_at) select '', 'fill-' || g, "
            "'\\x00', 'in_flight', 'o', now() + interval '10 min', "
            "now() + interval '10 min' + g * interval '1 ms' "
            "from generate_series(1, 30000) g")
        before = pg_db.psql(
            "select coalesce(sum(idx_tup_read), 0) from pg_stat_user_indexes "
            "where indexrelname like '%expires_at%'")
        for i in range(5):
            s.stdin.write(claim(f"after{i}", 10 + i))
        s.stdin.write("SELECT pg_stat_force_next_flush();\n\\q\n")
        out, _ = s.communicate(timeout=60)
    finally:
        if s.poll() is None:
            s.kill()
            s.wait()
    assert out.split().count("won") == 5, out
    read = pg_db.psql(
        "select coalesce(sum(idx_tup_read), 0) from pg_stat_user_indexes "
        "where indexrelname like '%expires_at%'")
    assert int(read) - int(before) == 0, (before, read)
