#!/usr/bin/env python3
"""A day of keys in minutes (issue 20): unique keys at full speed through
idemproxy into PostgreSQL 15 (fsync on, synchronous_commit on), --ttl 15s,
every other setting at its default, for DURATION seconds; every 10 s it
prints req/s, the table's size with its indexes, live and dead rows and
partitions. Then WAL bytes and commits per key over the steady part.

    tests/bench/retention.py [partitioned|legacy ...]

  partitioned  the table as idemproxy creates it now (retention by
               dropping partitions)
  legacy       the table of earlier versions (created by hand first), kept
               by the row-by-row sweeper, for comparison
  old          the previous version itself (OLD_BIN: its idemproxy binary)
               on the fresh table it creates: the figure to beat
  citus        a Citus coordinator and two workers (fsync on each), the
               table distributed by `idemproxy migrate --distributed`:
               size, rows, WAL and commits summed over the workers
               ("parts" then counts the shards of the partitions), CPU
               over the three nodes (issue 47)

Environment: DURATION=180 (s), CONNS=32 (wrk -c), TTL=15s, WORKERS=1,
PRELOAD=0: live records (a day long, 200-byte bodies) loaded before the
run with generate_series, for the big-table figure. PSS=1: PostgreSQL
with pg_stat_statements (nested statements too), and at the end the
statements that took the most time, per key.
Not a test: prints figures and the goals' checks (size at the end <= 1.2x
the size at ttl + 30 s; req/s over the last third >= 0.95x the first 10 s).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "ha"))

from support.citus import CitusCluster  # noqa: E402
from support.procs import free_port  # noqa: E402
from support.stores import PgServer  # noqa: E402
from cluster import descendants, process_tree  # noqa: E402
from test_postgres import OLD_TABLE  # noqa: E402

ROOT = os.path.join(HERE, "..", "..")
BIN = os.environ.get("IDEMPROXY_BIN",
                     os.path.join(ROOT, "build", "proxy", "idemproxy"))
STUB = os.environ.get("STUB_UPSTREAM_BIN",
                      os.path.join(ROOT, "build", "tests", "support",
                                   "stub_upstream"))
DURATION = int(os.environ.get("DURATION", "180"))
CONNS = int(os.environ.get("CONNS", "32"))
TTL = os.environ.get("TTL", "15s")
WORKERS = os.environ.get("WORKERS", "1")
PRELOAD = int(os.environ.get("PRELOAD", "0"))
PSS = os.environ.get("PSS", "") == "1"
SLICE = 10


SIZE = """
SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0),
       coalesce(sum(s.n_live_tup), 0), coalesce(sum(s.n_dead_tup), 0),
       count(*) FILTER (WHERE c.relkind = 'r' AND c.relispartition)
  FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
 WHERE c.relkind = 'r' AND c.relname LIKE 'idempotency\\_keys%'
   AND c.relname NOT LIKE 'idempotency\\_keys\\_parts%'
"""
COUNTERS = """
SELECT (SELECT wal_bytes FROM pg_stat_wal),
       (SELECT xact_commit FROM pg_stat_database WHERE datname = 'bench')
"""


def cpu_ms(pids):
    """CPU time (user + system) so far of pids and their descendants still
    running, in ms (PostgreSQL's backends are its children)."""
    tree = process_tree()
    total = 0
    for pid in [*pids, *(d for p in pids for d in descendants(p, tree))]:
        try:
            with open(f"/proc/{pid}/stat") as f:
                st = f.read()
            rest = st[st.rindex(")") + 2:].split()
            total += int(rest[11]) + int(rest[12])     # utime, stime
        except (OSError, ValueError, IndexError):
            continue                                # ended meanwhile
    return total * 1000 / os.sysconf("SC_CLK_TCK")


def wrk(port, seconds):
    out = subprocess.run(
        ["wrk", "-t1", f"-c{CONNS}", f"-d{seconds}s", "--latency", "-s",
         os.path.join(HERE, "keyed_unique.lua"),
         f"http://127.0.0.1:{port}/orders"],
        capture_output=True, text=True, check=True).stdout
    reqs = int(re.search(r"(\d+) requests in", out).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    m = re.search(r"^\s*99%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
    p99 = float(m.group(1)) * {"us": 0.001, "ms": 1, "s": 1000}[m.group(2)]
    return reqs, int(non2xx.group(1)) if non2xx else 0, p99


def summed(nodes, sql):
    """sql's one row ("a|b|..."), each column summed over nodes."""
    total = None
    for n in nodes:
        vals = [float(x or 0) for x in n.psql(
            "SET citus.override_table_visibility = off; " + sql
            if len(nodes) > 1 else sql, db="bench").split("|")]
        total = vals if total is None else [a + b for a, b in zip(total, vals)]
    return total


def durable(node):
    node.psql("ALTER SYSTEM SET fsync = on")
    node.psql("ALTER SYSTEM SET full_page_writes = on")


def run(layout):
    cluster = CitusCluster(workers=2) if layout == "citus" else None
    pg = cluster.coordinator if cluster else PgServer()
    data_nodes = cluster.workers if cluster else [pg]
    tmp = tempfile.mkdtemp(prefix="iret")
    procs = []
    try:
        # a benchmark pays for durability: fsync on
        for n in cluster.nodes if cluster else [pg]:
            durable(n)
        if PSS:
            with open(os.path.join(pg.data, "postgresql.conf"), "a") as f:
                f.write("shared_preload_libraries = 'pg_stat_statements'\n"
                        "pg_stat_statements.track = 'all'\n")
        for n in cluster.nodes if cluster else [pg]:
            n.stop()
            n.start()
        if cluster:
            url = cluster.create_db("bench")
            subprocess.run([BIN, "migrate", "--store", url, "--distributed",
                            "--ttl", TTL], check=True,
                           stdout=subprocess.DEVNULL)
        else:
            pg.psql("CREATE DATABASE bench")
            url = pg.url("bench")
        if PSS:
            pg.psql("CREATE EXTENSION pg_stat_statements", db="bench")
        if layout == "legacy":
            pg.psql(OLD_TABLE, db="bench")
        binary = BIN
        if layout == "old":
            binary = os.environ["OLD_BIN"]
        stub_port, port = free_port(), free_port()
        procs.append(subprocess.Popen(
            [STUB, "--listen", f"127.0.0.1:{stub_port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        log = open(os.path.join(tmp, "idemproxy.log"), "wb")
        procs.append(subprocess.Popen(
            [binary, "--upstream", f"http://127.0.0.1:{stub_port}",
             "--listen", f"127.0.0.1:{port}", "--admin-listen",
             f"127.0.0.1:{free_port()}", "--workers", WORKERS,
             "--store", url, "--ttl", TTL],
            stdout=log, stderr=log))
        time.sleep(2)
        if PRELOAD:
            t0 = time.monotonic()
            # one part_at for all: the load outlasts the partitions made
            # ahead, and the records live a day (their partition stays)
            pg.psql("INSERT INTO idempotency_keys (scope, key, fingerprint, "
                    "state, status, headers, body, expires_at, part_at) "
                    "SELECT '', 'pre-' || g, '\\x00', 'completed', 200, '', "
                    "convert_to(repeat('x', 200), 'UTF8'), now() + "
                    "interval '1 day', t0 FROM (SELECT clock_timestamp() "
                    f"AS t0) t, generate_series(1, {PRELOAD}) g",
                    db="bench", timeout=3600)
            print(f"preloaded {PRELOAD} live records in "
                  f"{time.monotonic() - t0:.0f} s")
            # settle what the load left behind, as a day of writes would
            # have: the insert-triggered vacuum of the loaded partition and
            # the checkpoint of its 17 GB would otherwise run during the
            # measurement (not a cost of new keys)
            t0 = time.monotonic()
            pg.psql("VACUUM (ANALYZE) idempotency_keys", db="bench",
                    timeout=3600)
            pg.psql("CHECKPOINT", timeout=3600)
            print(f"vacuumed and checkpointed in "
                  f"{time.monotonic() - t0:.0f} s")
        print(f"== {layout}: --ttl {TTL}, wrk -c{CONNS}, {DURATION} s")
        print(f"{'t':>5} {'req/s':>8} {'p99 ms':>7} {'MiB':>8} {'live':>9} "
              f"{'dead':>9} {'parts':>5} {'pg µs':>6} {'px µs':>6}")
        print("      (pg µs, px µs: CPU time per key of PostgreSQL and of "
              "idemproxy)")
        rows = []
        base = None
        t = 0
        while t < DURATION:
            pms = [n.postmaster_pid() for n in
                   (cluster.nodes if cluster else [pg])]
            cpu0 = (cpu_ms(pms), cpu_ms([procs[1].pid]))
            reqs, bad, p99 = wrk(port, SLICE)
            cpu1 = (cpu_ms(pms), cpu_ms([procs[1].pid]))
            t += SLICE
            size, live, dead, parts = (int(x) for x in summed(data_nodes,
                                                              SIZE))
            wal, commits = (int(x) for x in summed(data_nodes, COUNTERS))
            pg_us = (cpu1[0] - cpu0[0]) * 1000 / max(reqs, 1)
            px_us = (cpu1[1] - cpu0[1]) * 1000 / max(reqs, 1)
            rows.append((t, reqs / SLICE, size, live, dead, parts, wal,
                         commits, reqs, p99, pg_us, px_us))
            print(f"{t:5d} {reqs / SLICE:8.0f} {p99:7.1f} "
                  f"{size / 2**20:8.1f} {live:9d} {dead:9d} {parts:5d} "
                  f"{pg_us:6.0f} {px_us:6.0f}"
                  + (f"  ({bad} non-2xx)" if bad else ""), flush=True)
            if base is None and t >= 30:
                base = rows[-1]
        first = rows[0][1]
        third = rows[len(rows) * 2 // 3:]
        last = sum(r[1] for r in third) / len(third)
        ttl_s = int(re.match(r"(\d+)", TTL).group(1))
        at = next((r for r in rows if r[0] >= ttl_s + 30), rows[-1])
        end = rows[-1]
        base = base or rows[0]
        keys = sum(r[8] for r in rows if r[0] > base[0])
        wal_per = (end[6] - base[6]) / keys if keys else 0
        commits_per = (end[7] - base[7]) / keys if keys else 0
        print(f"throughput: first 10 s {first:.0f} req/s, last third "
              f"{last:.0f} req/s: {last / first:.2f}x (goal >= 0.95x); "
              f"p99 over the last third {max(r[9] for r in third):.1f} ms "
              "(the worst 10 s)")
        print(f"size: at {at[0]} s {at[2] / 2**20:.1f} MiB, at the end "
              f"{end[2] / 2**20:.1f} MiB: {end[2] / at[2]:.2f}x "
              f"(goal <= 1.2x)")
        # partitions go whole: the size is a saw (a partition's worth); its
        # peaks show a trend that two points may not
        early = [r[2] for r in rows if ttl_s <= r[0] <= ttl_s + 30]
        if early:
            print(f"size peaks: last third {max(r[2] for r in third) / 2**20:.1f}"
                  f" MiB, ttl to ttl + 30 s {max(early) / 2**20:.1f} MiB: "
                  f"{max(r[2] for r in third) / max(early):.2f}x")
        print(f"per key after {base[0]} s: {wal_per:.0f} WAL bytes, "
              f"{commits_per:.2f} commits; CPU over the last third: "
              f"PostgreSQL {sum(r[10] for r in third) / len(third):.0f} µs, "
              f"idemproxy {sum(r[11] for r in third) / len(third):.0f} µs")
        if PSS:
            total = sum(r[8] for r in rows)
            print(f"statements by time, per key ({total} keys): "
                  "us/key calls/key us/call")
            print(pg.psql(
                "SELECT round(total_exec_time * 1000 / %d), "
                "round(calls::numeric / %d, 2), "
                "round((total_exec_time * 1000 / calls)::numeric, 1), "
                "left(regexp_replace(query, '\\s+', ' ', 'g'), 90) "
                "FROM pg_stat_statements ORDER BY total_exec_time DESC "
                "LIMIT 14" % (total, total), db="bench"))
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait()
        if cluster:
            cluster.shutdown()
        else:
            pg.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    for layout in sys.argv[1:] or ["partitioned", "legacy"]:
        run(layout)


if __name__ == "__main__":
    main()
