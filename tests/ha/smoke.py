#!/usr/bin/python3
"""Smoke test of tests/ha/cluster.py: a 3-node Patroni cluster, then
kill -9 of the leader's postmaster, a switchover, a frozen leader (SIGSTOP
past the ttl, then SIGCONT: it must rejoin as a replica), and a killed
leader host brought back (it must rejoin as a replica, via pg_rewind).
Run as root: /usr/bin/python3 tests/ha/smoke.py [-v]. Exits 0 on success.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))

from tests.ha.cluster import Cluster, ClusterError, PROBE_TABLE  # noqa: E402


def step(msg):
    print(msg, flush=True)


def check_probe(c, leader):
    """The last probe committed before the fault is on the new leader."""
    pid, node = c.last_probe
    got = c.psql(leader, f"SELECT count(*) FROM {PROBE_TABLE} "
                         f"WHERE id = {pid}")
    if got != "1":
        raise ClusterError(f"probe {pid} committed on {node} is missing "
                           f"on {leader}")


def role_of(c, name):
    for m in c.members():
        if m["name"] == name:
            return m.get("role"), m.get("state")
    return None, None


def main():
    verbose = "-v" in sys.argv
    t_all = time.monotonic()
    t = time.monotonic()
    c = Cluster(n=3, synchronous=True, strict=True, verbose=verbose)
    try:
        leader = c.leader()
        step(f"cluster up in {time.monotonic() - t:.1f}s: leader {leader}, "
             f"sync standby {c.sync_standby()}, nodes "
             + ", ".join(f"{n.name}(pg {n.pg_port}, api {n.api_port})"
                         for n in c.nodes))
        step(f"dsn: {c.dsn()}")
        c.psql(leader, "CREATE TABLE smoke (x int)", db="idem", user="idem")

        # 1. kill -9 of the leader's postmaster
        assert c.wait_leader(timeout=10) == leader
        t = time.monotonic()
        pid = c.kill_postgres(leader)
        new = c.wait_leader(timeout=60)
        dt = time.monotonic() - t
        how = "restarted in place" if new == leader else "failed over"
        step(f"kill -9 postmaster {pid} of {leader}: writable leader {new} "
             f"after {dt:.2f}s ({how})")
        check_probe(c, new)
        t = time.monotonic()
        c.wait_healthy(timeout=60)
        roles = [(m["name"], m["role"]) for m in c.members()]
        step(f"  all replicas streaming again after "
             f"{time.monotonic() - t:.2f}s more; roles {roles}")
        leader = new

        # 2. switchover
        t = time.monotonic()
        new = c.switchover()
        dt = time.monotonic() - t
        step(f"switchover {leader} -> {new}: writable after {dt:.2f}s")
        check_probe(c, new)
        t = time.monotonic()
        c.wait_healthy(timeout=60)
        step(f"  {leader} rejoined as {role_of(c, leader)[0]} after "
             f"{time.monotonic() - t:.2f}s more")
        leader = new

        # 3. frozen leader (SIGSTOP), past the ttl
        c.psql(leader, "INSERT INTO smoke VALUES (1)", db="idem", user="idem")
        assert c.try_write(leader)
        t = time.monotonic()
        c.freeze(leader)
        new = c.wait_leader(exclude=leader, timeout=c.ttl * 3 + 30)
        dt = time.monotonic() - t
        step(f"freeze {leader}: {new} accepts writes after {dt:.2f}s "
             f"(ttl {c.ttl}s)")
        check_probe(c, new)
        if c.psql(new, "SELECT count(*) FROM smoke", db="idem") != "1":
            raise ClusterError("row committed before the freeze is missing")
        t = time.monotonic()
        c.thaw(leader)
        c.wait_healthy(timeout=60)
        role, state = role_of(c, leader)
        step(f"thaw {leader}: rejoined as {role} ({state}) after "
             f"{time.monotonic() - t:.2f}s; leader {c.leader()}")
        if role not in ("replica", "sync_standby"):
            raise ClusterError(f"{leader} is {role} after thaw")
        if c.psql(leader, "SELECT pg_is_in_recovery()") != "t":
            raise ClusterError(f"{leader} is not in recovery after thaw")
        leader = c.leader()

        # 4. a dead host (SIGKILL of patroni + postgres), then back
        c.wait_replicated()
        t = time.monotonic()
        c.kill_node(leader)
        new = c.wait_leader(exclude=leader, timeout=c.ttl * 3 + 30)
        step(f"kill -9 node {leader}: {new} accepts writes after "
             f"{time.monotonic() - t:.2f}s")
        check_probe(c, new)
        rewinds = c.logs(leader, 10**7).count("running pg_rewind from")
        t = time.monotonic()
        c.start_node(leader, timeout=60)
        role, state = role_of(c, leader)
        rewound = c.logs(leader, 10**7).count("running pg_rewind from") \
            > rewinds
        step(f"start {leader}: rejoined as {role} ({state}) after "
             f"{time.monotonic() - t:.2f}s"
             f"{' (pg_rewind ran)' if rewound else ''}")
        if role not in ("replica", "sync_standby"):
            raise ClusterError(f"{leader} is {role} after start_node")
    finally:
        t = time.monotonic()
        c.stop()
        step(f"stopped in {time.monotonic() - t:.2f}s")
    step(f"smoke OK in {time.monotonic() - t_all:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
