"""idemproxy on Citus (issue 47): a coordinator and two workers, each a
private PostgreSQL 15 with Citus 13.2 (support/citus.py; Citus is built
from its tarball by deploy/build-citus.sh when it is not installed, and a
machine that cannot build it fails these tests rather than skipping them).

`idemproxy migrate --distributed` distributes the table by key; the
instances, pointed at the coordinator, send each key's statements straight
to the worker that holds its shard (common/store/store_citus.c). A claim
sent to the wrong node is refused there (SQLSTATE IP001), so every test
that gets its answers also shows that routing is right.
"""
import itertools
import subprocess
import threading
import time

import pytest

from support.citus import CITUS_CONF, CitusCluster
from support.http import assert_problem, http_get
from support.procs import (IDEMPROXY_BIN, clean_env, metric_value, readyz,
                           wait_readyz)
from support.stores import PgServer
from test_idempotency import (ORDER, assert_identical, assert_one_original,
                              executions, kreq, newkey, post, replayed)
from test_keys import TOKEN, admin
from test_postgres import burst_split, migrate


@pytest.fixture(scope="module")
def citus():
    c = CitusCluster(workers=2)
    try:
        yield c
    finally:
        c.shutdown()


_numbers = itertools.count(1)
_to_drop = []


class CitusDb:
    def __init__(self, cluster, name, url):
        self.cluster = cluster
        self.name = name
        self.url = url

    def psql(self, sql, node=None, **kw):
        node = node if node is not None else self.cluster.coordinator
        return node.psql(sql, db=self.name, **kw)

    def worker_of(self, key):
        """The port of the worker whose shard holds key."""
        return int(self.psql(
            "select n.nodeport from pg_dist_placement p join pg_dist_node n "
            "using (groupid) where p.shardid = "
            "get_shard_id_for_distribution_column('idempotency_keys', "
            f"'{key}') and n.noderole = 'primary'"))

    def rows_by_worker(self):
        out = self.psql(
            "select n.nodeport, count(*) from idempotency_keys k "
            "join pg_dist_placement p on p.shardid = "
            "get_shard_id_for_distribution_column('idempotency_keys', k.key) "
            "join pg_dist_node n using (groupid) where n.noderole = "
            "'primary' group by 1")
        got = {}
        for line in out.splitlines():
            port, n = line.split("|")
            got[int(port)] = int(n)
        return got


def fresh_db(citus, *migrate_flags):
    """A fresh database on every node, the table distributed by
    `idemproxy migrate --distributed`. Dropped when the next test asks for
    one (by then every proxy that used it has stopped)."""
    for n in citus.nodes:
        n.ensure_running()
    while _to_drop:
        citus.drop_db(_to_drop.pop())
    name = f"c_{next(_numbers)}"
    url = citus.create_db(name)
    _to_drop.append(name)
    r = migrate(url, "--distributed", *migrate_flags)
    assert r.returncode == 0, r.stderr
    return CitusDb(citus, name, url)


@pytest.fixture
def cdb(citus):
    return fresh_db(citus)


@pytest.fixture
def cdb_short(citus):
    """The table made for --ttl 1s: 2 s partitions from the start."""
    return fresh_db(citus, "--ttl", "1s")


def keys_on_each_worker(db, prefix, per_worker):
    """per_worker keys for each worker, by asking the coordinator."""
    want = {w.port: [] for w in db.cluster.workers}
    i = 0
    while any(len(v) < per_worker for v in want.values()):
        k = f"{prefix}-{i}"
        i += 1
        port = db.worker_of(k)
        if len(want[port]) < per_worker:
            want[port].append(k)
    return want


def start(make_proxy, db, *flags, **kw):
    p = make_proxy("--store", db.url, *flags, **kw)
    wait_readyz(p)
    return p


def test_migrate_distributed_refused_on_plain_postgres(pg_db):
    r = migrate(pg_db.url, "--distributed")
    assert r.returncode == 1, r
    assert b"needs a Citus coordinator" in r.stderr, r.stderr
    assert not pg_db.table_exists()


def test_migrate_distributed_is_idempotent(cdb):
    assert cdb.psql("select partmethod from pg_dist_partition where "
                    "logicalrelid = 'idempotency_keys'::regclass") == "h"
    assert cdb.psql("select partmethod from pg_dist_partition where "
                    "logicalrelid = 'idempotency_keys_parts'::regclass") == "n"
    # the claim delegated by its key, colocated with the table
    assert cdb.psql(
        "select distribution_argument_index from pg_dist_object where objid "
        "= to_regprocedure('idemproxy_claim6(text,text,bytea,text,bigint,"
        "bigint,bigint,boolean,boolean)')") == "1"
    r = migrate(cdb.url, "--distributed")
    assert r.returncode == 0, r.stderr
    assert b"distributed by key" in r.stdout


def test_migrate_distributed_refused_on_a_worker(cdb):
    w = cdb.cluster.workers[0]
    r = migrate(w.url(cdb.name), "--distributed")
    assert r.returncode == 1
    assert b"coordinator" in r.stderr, r.stderr


def test_e1_e2_e3_through_two_instances(make_proxy, cdb, stub):
    a = start(make_proxy, cdb, name="a", workers=2)
    b = start(make_proxy, cdb, name="b", workers=2)
    keys = keys_on_each_worker(cdb, newkey("e"), 3)
    n = 0
    # E1: 8 concurrent clicks, split over the instances, for keys on
    # both workers
    for port, ks in keys.items():
        for k in ks:
            rs = burst_split([a.port, b.port], 8,
                             kreq("POST", "/orders?delay_ms=50", k, ORDER))
            n += 1
            assert all(r.status == 200 for r in rs), [r.status for r in rs]
            assert_identical(rs)
            assert_one_original(rs)
            assert executions(stub) == n
    # E2: a callback redelivered 5 times, alternately to each instance
    body = b"out_trade_no=T1&trade_status=SUCCESS&total_amount=100.00"
    for port, ks in keys.items():
        k = ks[0] + "-cb"
        rs = [post((a, b)[i % 2].port, k, "/pay/callback", body)
              for i in range(5)]
        n += 1
        assert executions(stub) == n
        assert_identical(rs)
        assert not replayed(rs[0]) and all(replayed(r) for r in rs[1:])
    # E3: 100 retries, then the key with another body
    k = keys[cdb.cluster.workers[1].port][1] + "-e3"
    rs = [post((a, b)[i % 2].port, k) for i in range(100)]
    n += 1
    assert executions(stub) == n
    assert_identical(rs)
    assert sum(replayed(r) for r in rs) == 99
    r = post(b.port, k, body=b'{"item":"book","amount":999}')
    assert_problem(r, 422, "idempotency-key-mismatch")
    assert executions(stub) == n
    # the rows are on both workers, each where Citus says it belongs
    by = cdb.rows_by_worker()
    assert set(by) == {w.port for w in cdb.cluster.workers}, by
    assert sum(by.values()) == n
    for p in (a, b):
        assert "IP001" not in p.log() and "not on this node" not in p.log()


def test_many_keys_spread_and_routed(make_proxy, cdb, stub):
    """200 keys, each claimed once: none refused as misplaced (the proxy's
    hash of the key is Citus' own), both workers used."""
    p = start(make_proxy, cdb, workers=2)
    ks = [newkey("spread") for _ in range(200)]
    for k in ks:
        r = post(p.port, k)
        assert r.status == 200, r
    assert executions(stub) == 200
    by = cdb.rows_by_worker()
    assert len(by) == 2 and min(by.values()) > 40, by
    for k in ks[:20]:
        assert replayed(post(p.port, k))
    assert executions(stub) == 200


def run_keys(*args, timeout=30):
    r = subprocess.run([IDEMPROXY_BIN, "keys", *args], capture_output=True,
                       text=True, timeout=timeout, env=clean_env())
    return r.returncode, r.stdout, r.stderr


def test_purge_heard_by_every_instance(make_proxy, cdb, stub):
    """Both instances replay from their response cache; `idemproxy keys
    delete` purges the record on its worker, whose NOTIFY both hear: the
    key executes again, once."""
    a = start(make_proxy, cdb, "--response-cache", "4MiB", name="a")
    b = start(make_proxy, cdb, "--response-cache", "4MiB", name="b")
    for w in cdb.cluster.workers:
        deadline = time.monotonic() + 10
        while int(cdb.psql("select count(*) from pg_stat_activity where "
                           "datname = current_database() and query like "
                           "'%AS idemproxy_listener'", node=w)) < 2:
            assert time.monotonic() < deadline, f"no listeners on {w.port}"
            time.sleep(0.05)
    keys = keys_on_each_worker(cdb, newkey("pu"), 1)
    for ks in keys.values():
        k = ks[0]
        first = post(a.port, k)
        assert first.status == 200
        for p in (a, b, a, b):
            r = post(p.port, k)
            assert replayed(r) and r.body == first.body
    before = executions(stub)
    for ks in keys.values():
        rc, out, err = run_keys("delete", ks[0], "--store", cdb.url)
        assert rc == 0, err
    time.sleep(0.5)
    for ks in keys.values():
        ra = post(a.port, ks[0])
        rb = post(b.port, ks[0])
        assert ra.status == 200 and not replayed(ra), ra
        assert replayed(rb) and rb.body == ra.body
    assert executions(stub) == before + 2


def test_inspect_through_the_cli(make_proxy, cdb, stub):
    p = start(make_proxy, cdb)
    keys = keys_on_each_worker(cdb, newkey("in"), 1)
    for ks in keys.values():
        assert post(p.port, ks[0]).status == 200
        rc, out, err = run_keys("get", ks[0], "--store", cdb.url)
        assert rc == 0, err
        assert '"completed"' in out


def test_admin_api_many_times_on_one_connection(make_proxy, cdb, stub,
                                                tmp_path):
    """GET and DELETE /keys/{key} a dozen times each through one worker
    thread: past the executions after which PostgreSQL may switch a
    prepared statement to a generic plan, which Citus must still run."""
    tok = tmp_path / "admin.token"
    tok.write_text(TOKEN + "\n")
    tok.chmod(0o600)
    p = start(make_proxy, cdb, "--admin-token-file", str(tok), workers=1)
    keys = keys_on_each_worker(cdb, newkey("adm"), 12)
    for ks in keys.values():
        for k in ks:
            assert post(p.port, k).status == 200
            deadline = time.monotonic() + 5
            while True:     # the completion is written after the answer
                st, _, doc = admin(p, "GET", k, token=TOKEN)
                assert st == 200, doc
                if doc["state"] == "completed":
                    break
                assert time.monotonic() < deadline, doc
                time.sleep(0.02)
        for k in ks:
            st, _, doc = admin(p, "DELETE", k, token=TOKEN)
            assert st == 200, doc
            st, _, _ = admin(p, "GET", k, token=TOKEN)
            assert st == 404
    assert executions(stub) == 24
    assert cdb.rows_by_worker() == {}


def test_worker_killed_mid_burst(spawn_proxy, cdb, stub):
    """A worker crashes while requests for keys on both workers are under
    way: no key executes twice; keys of the healthy worker keep working
    while it is down; once it is back every key is answered."""
    a = start(spawn_proxy, cdb, name="a", workers=2)
    b = start(spawn_proxy, cdb, name="b", workers=2)
    victim, healthy = cdb.cluster.workers
    keys = keys_on_each_worker(cdb, newkey("kill"), 40)
    during = keys_on_each_worker(cdb, newkey("during"), 5)[healthy.port]
    order = [k for pair in zip(keys[victim.port], keys[healthy.port])
             for k in pair]
    got = {}

    def client(ks, port):
        for k in ks:
            try:
                got[k] = post(port, k, "/orders?delay_ms=100", timeout=30)
            except OSError as e:
                got[k] = e

    ts = [threading.Thread(target=client, args=(order[i::4],
                                                (a, b)[i % 2].port))
          for i in range(4)]
    for t in ts:
        t.start()
    time.sleep(0.5)
    victim.crash()
    for t in ts:
        t.join(120)
    # new keys of the healthy worker: answered while the other is down
    for k in during:
        r = post(a.port, k)
        assert r.status == 200 and not replayed(r), r
    st, body = http_get(a.admin_port, "/readyz")
    assert st == 200, "one worker down: ready (the other's keys work)"
    assert body.decode() == \
        f"ready, degraded: workers down: 127.0.0.1:{victim.port}\n", body
    victim.start()
    deadline = time.monotonic() + 30
    while http_get(a.admin_port, "/readyz")[1] != b"ready\n":
        assert time.monotonic() < deadline, "still degraded"
        time.sleep(0.1)
    for k in order:
        while True:
            r = post((a, b)[hash(k) % 2].port, k, "/orders?delay_ms=100")
            if r.status in (200, 502, 409) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert r.status in (200, 502), (k, r)
    counts = stub.stats()["keys"]
    twice = {k: n for k, n in counts.items() if n > 1}
    assert not twice, twice
    for k in keys[healthy.port]:
        assert counts.get(k) == 1, k


def test_coordinator_down_keys_still_served(make_proxy, cdb, stub):
    """The coordinator only says where the shards are: while it is down
    the instances route by its last answer."""
    p = start(make_proxy, cdb, workers=2)
    keys = keys_on_each_worker(cdb, newkey("co"), 2)
    cdb.cluster.coordinator.stop()
    try:
        for ks in keys.values():
            for k in ks:
                r = post(p.port, k)
                assert r.status == 200 and not replayed(r), r
                assert replayed(post(p.port, k))
        assert readyz(p) == 200
    finally:
        cdb.cluster.coordinator.start()
    assert executions(stub) == 4


def test_partitions_dropped_on_every_worker(make_proxy, cdb_short, stub):
    """Retention on Citus: 2 s partitions (--ttl 1s) are made ahead on the
    coordinator, distributed to both workers, and dropped there once past
    and empty; a key stays answered across the partition boundaries."""
    db = cdb_short
    # a partition of long ago, detached already, as by a maintenance cut
    # between its detach and its drop: only dropped (and forgotten) then
    second = "idempotency_keys_p20200101t000000000"
    db.psql(f"create table {second} (like idempotency_keys including "
            "defaults)")
    db.psql(f"alter table idempotency_keys attach partition {second} for "
            "values from ('2020-01-01') to ('2020-01-01 00:00:02')")
    db.psql("insert into idempotency_keys_parts (name, lo, hi) values "
            f"('{second}', '2020-01-01', '2020-01-01 00:00:02')")
    db.psql(f"alter table idempotency_keys detach partition {second}")
    first = db.psql("select name from idempotency_keys_parts where lo > "
                    "'2021-01-01' order by lo limit 1")
    for w in db.cluster.workers:
        for part in (first, second):
            assert int(db.psql("select count(*) from pg_class where relname "
                               f"like '{part}%'", node=w)) > 0, \
                "the partition's shards are on every worker"
    a = start(make_proxy, db, "--ttl", "1s", name="a")
    b = start(make_proxy, db, "--ttl", "1s", name="b")
    deadline = time.monotonic() + 40
    n = 0
    while True:
        k = newkey("ret")
        r = post((a, b)[n % 2].port, k)
        assert r.status == 200 and not replayed(r), r
        assert replayed(post((a, b)[(n + 1) % 2].port, k))
        n += 1
        gone = db.psql(f"select count(*) from idempotency_keys_parts where "
                       f"name in ('{first}', '{second}')") == "0"
        if gone:
            break
        assert time.monotonic() < deadline, "the first partitions stayed"
        time.sleep(0.2)
    assert executions(stub) == n
    for node in db.cluster.nodes:
        for part in (first, second):
            assert db.psql("select count(*) from pg_class where relname "
                           f"like '{part}%'", node=node) == "0", node.port
    left = db.psql("select count(*) from idempotency_keys_parts")
    assert 0 < int(left) < 12, left
    dropped = sum(metric_value(p.metrics(),
                               "idemproxy_sweep_partitions_dropped_total") or 0
                  for p in (a, b))
    assert dropped >= 1
    for p in (a, b):
        # both instances may take the same partition in one round: the
        # second finds it gone already (logged, harmless); nothing else
        bad = [ln for ln in p.log().splitlines()
               if "partition maintenance" in ln and "does not exist" not in
               ln and "is not a partition" not in ln]
        assert not bad, p.log()


def test_worker_frozen(make_proxy, cdb, stub):
    """A worker that stops answering (SIGSTOP: connections open, nothing
    answers): the other worker's keys are served at once all along; the
    frozen one's get 503, none executes twice, and they work once it is
    back."""
    p = start(make_proxy, cdb, workers=2)
    frozen, healthy = cdb.cluster.workers
    keys = keys_on_each_worker(cdb, newkey("fz"), 6)
    for k in keys[frozen.port][:2] + keys[healthy.port][:2]:
        assert post(p.port, k).status == 200
    frozen.pause()
    try:
        for k in keys[healthy.port][2:]:
            t0 = time.monotonic()
            r = post(p.port, k)
            assert r.status == 200 and not replayed(r), r
            # (a hold-up would last the 5 s statement timeout)
            assert time.monotonic() - t0 < 4.0, "held up by the frozen worker"
        r = post(p.port, keys[frozen.port][2], timeout=30)
        assert r.status == 503, r
        assert readyz(p) == 200
    finally:
        frozen.resume()
    deadline = time.monotonic() + 30
    for k in keys[frozen.port][2:]:
        while True:
            r = post(p.port, k)
            if r.status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert r.status == 200, r
    for k in keys[frozen.port][:2]:
        assert replayed(post(p.port, k))
    counts = stub.stats()["keys"]
    assert all(n == 1 for n in counts.values()), counts
    assert len(counts) == 12


def test_shard_moved_while_keys_are_in_flight(spawn_proxy, cdb, stub):
    """A shard moves to the other worker (citus_move_shard_placement,
    block_writes) while its keys are claimed, completed and retried from
    two instances: no key executes twice, and once the instances' maps
    catch up (2 s) every key is answered from its new worker."""
    a = start(spawn_proxy, cdb, name="a", workers=2)
    b = start(spawn_proxy, cdb, name="b", workers=2)
    src, dst = cdb.cluster.workers
    keys = keys_on_each_worker(cdb, newkey("mv"), 1)[src.port]
    shard = int(cdb.psql("select get_shard_id_for_distribution_column("
                         f"'idempotency_keys', '{keys[0]}')"))
    # keys of that shard, some answered before the move
    ks, i = [], 0
    while len(ks) < 16:
        k = f"{keys[0]}-{i}"
        i += 1
        if int(cdb.psql("select get_shard_id_for_distribution_column("
                        f"'idempotency_keys', '{k}')")) == shard:
            ks.append(k)
    target = "/orders?delay_ms=20"
    for k in ks[:8]:
        assert post(a.port, k, target).status == 200
    stop = threading.Event()
    seen = []

    def client(port, mine):
        while not stop.is_set():
            for k in mine:
                try:
                    r = post(port, k, target, timeout=30)
                    seen.append((k, r.status))
                except OSError:
                    pass

    ts = [threading.Thread(target=client, args=(p.port, ks[j::2]))
          for j, p in enumerate((a, b))]
    for t in ts:
        t.start()
    try:
        time.sleep(0.5)
        cdb.psql(f"select citus_move_shard_placement({shard}, '127.0.0.1', "
                 f"{src.port}, '127.0.0.1', {dst.port}, "
                 "shard_transfer_mode := 'block_writes')", timeout=60)
        time.sleep(3)       # the maps follow within 2 s
    finally:
        stop.set()
        for t in ts:
            t.join(60)
    assert cdb.worker_of(ks[0]) == dst.port
    for k in ks:
        r = post((a, b)[hash(k) % 2].port, k, target)
        assert r.status == 200 and replayed(r), (k, r)
    counts = stub.stats()["keys"]
    assert {k: n for k, n in counts.items() if n > 1} == {}
    assert set(counts) == set(ks)
    assert any(s == 200 for _, s in seen)


def test_worker_standby_promoted(spawn_proxy, stub):
    """A worker with a synchronous streaming standby, registered as its
    secondary (citus_add_secondary_node): the instances connect to the
    group's nodes as to any list of hosts, so when the worker crashes and
    its standby is promoted - pg_dist_node not even updated - its keys are
    served there: completed ones replayed, new ones executed once."""
    cl = CitusCluster(workers=2)
    standby = None
    try:
        url = cl.create_db("sb")
        r = migrate(url, "--distributed")
        assert r.returncode == 0, r.stderr
        db = CitusDb(cl, "sb", url)
        primary = cl.workers[0]
        standby = PgServer(standby_of=primary)
        # commits wait for the standby, as a production primary's do
        primary.psql("alter system set synchronous_standby_names = '*'")
        primary.psql("select pg_reload_conf()")
        cl.coordinator.psql(
            f"select citus_add_secondary_node('127.0.0.1', {standby.port}, "
            f"'127.0.0.1', {primary.port})", db="sb")
        a = start(spawn_proxy, db, name="a", workers=2)
        deadline = time.monotonic() + 10
        while f"127.0.0.1:{primary.port},127.0.0.1:{standby.port}" \
                not in a.log():
            assert time.monotonic() < deadline, a.log()
            time.sleep(0.1)
        keys = keys_on_each_worker(db, newkey("sb"), 6)
        mine = keys[primary.port]
        firsts = {}
        for k in mine[:3]:
            r = post(a.port, k)
            assert r.status == 200, r
            firsts[k] = r.body
        # the completions are written after the answers: wait for them
        deadline = time.monotonic() + 10
        while db.psql("select count(*) from idempotency_keys where state "
                      "= 'completed'") != "3":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        primary.crash()
        standby.promote()
        deadline = time.monotonic() + 30
        for k in mine[:3]:
            while True:
                r = post(a.port, k)
                if r.status != 503 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert r.status == 200 and replayed(r), (k, r)
            assert r.body == firsts[k]
        for k in mine[3:] + keys[cl.workers[1].port]:
            r = post(a.port, k)
            assert r.status == 200 and not replayed(r), (k, r)
        counts = stub.stats()["keys"]
        assert {k: n for k, n in counts.items() if n > 1} == {}
        assert len(counts) == 12
    finally:
        if standby is not None:
            standby.shutdown()
        cl.shutdown()


def test_worker_added_and_heard(make_proxy, stub):
    """A worker added while an instance runs (citus_add_node, a shard
    moved to it): the instance routes that shard's keys there, and its
    response cache hears the purges made there, like every other node's."""
    cl = CitusCluster(workers=1)
    new = None
    try:
        url = cl.create_db("add")
        assert migrate(url, "--distributed").returncode == 0
        db = CitusDb(cl, "add", url)
        p = start(make_proxy, db, "--response-cache", "4MiB", workers=2)
        new = PgServer(extra_conf=CITUS_CONF)
        new.psql("create database add")
        new.psql("create extension citus", db="add")
        cl.coordinator.psql(f"select citus_add_node('127.0.0.1', {new.port})",
                            db="add")
        # idempotency_keys_parts, a reference table, goes to every node
        db.psql("select replicate_reference_tables('block_writes')")
        k0 = newkey("add")
        shard = int(db.psql("select get_shard_id_for_distribution_column("
                            f"'idempotency_keys', '{k0}')"))
        db.psql(f"select citus_move_shard_placement({shard}, '127.0.0.1', "
                f"{cl.workers[0].port}, '127.0.0.1', {new.port}, "
                "shard_transfer_mode := 'block_writes')", timeout=60)
        assert db.worker_of(k0) == new.port
        deadline = time.monotonic() + 15
        while f"worker 127.0.0.1:{new.port}" not in p.log():
            assert time.monotonic() < deadline, p.log()
            time.sleep(0.1)
        # the new node's listeners (the cache serves again once they are up)
        while int(new.psql("select count(*) from pg_stat_activity where "
                           "query like '%AS idemproxy_listener'")) < 1:
            assert time.monotonic() < deadline, "no listener on the new node"
            time.sleep(0.1)
        while True:
            r = post(p.port, k0)
            if r.status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert r.status == 200 and not replayed(r), r
        first = r.body
        hits = metric_value(p.metrics(),
                            "idemproxy_response_cache_hits_total") or 0
        for _ in range(3):
            r = post(p.port, k0)
            assert replayed(r) and r.body == first
        assert (metric_value(p.metrics(),
                             "idemproxy_response_cache_hits_total") or 0) > hits
        rc, _, err = run_keys("delete", k0, "--store", url)
        assert rc == 0, err
        time.sleep(0.5)
        r = post(p.port, k0)
        assert r.status == 200 and not replayed(r), \
            "the purge on the new worker was not heard"
        assert stub.stats()["keys"] == {k0: 2}
    finally:
        if new is not None:
            new.shutdown()
        cl.shutdown()
