#!/usr/bin/python3
"""The long HA soak (docs/ha.md): the cluster and instances of
test_failover.py under random faults for a few minutes, then the same
history check: no key executed twice, one 200 body per key, and every
instance back within RECOVERY_BOUND_S of the cluster after each fault
(a fault's own `bound` where it has one: kill_patroni).

    /usr/bin/python3 tests/ha/soak.py [MINUTES] [SEED] [async]

FAULTS="etcd_freeze restart ..." (names without "fault_") limits the run
to those faults.

With "async" the cluster replicates asynchronously (Patroni's default) and
the only fault is the leader's host killed: what such a failover loses
(docs/ha.md). Double executions are then expected and reported as FAIL.

IDEMPROXY_BIN and STUB_UPSTREAM_BIN name the binaries (default: the test
build, build-test/). Everything listens on 127.0.0.1 and is stopped by PID
at the end. Exit 0 on PASS.
"""
import os
import random
import sys
import tempfile
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
os.environ.setdefault("IDEMPROXY_BIN",
                      os.path.join(ROOT, "build-test/proxy/idemproxy"))
os.environ.setdefault("STUB_UPSTREAM_BIN",
                      os.path.join(ROOT, "build-test/tests/support/stub_upstream"))

from cluster import ClusterError, http_json  # noqa: E402
from test_failover import (RECOVERY_BOUND_S, STALE_BOUND_S, Cluster,  # noqa
                           Load, Proxy, Stub, check_history, recovery)


def fault_freeze(c, head):
    leader = c.leader()
    c.freeze(leader)
    try:
        c.wait_leader(exclude=leader, timeout=90)
        return f"froze {leader}{' (head)' if leader == head else ''}"
    finally:
        c.thaw(leader)


def fault_switchover(c, head):
    return f"switchover to {c.switchover()}"


def fault_kill_node(c, head):
    leader = c.leader()
    c.kill_node(leader)
    c.wait_leader(exclude=leader)
    c.start_node(leader, wait=False)
    return f"killed host {leader}"


def fault_kill_postgres(c, head):
    leader = c.leader()
    c.kill_postgres(leader)
    c.wait_leader()
    return f"kill -9 postmaster of {leader}"


def fault_cancel_waits(c, head):
    leader = c.leader()
    n = c.cancel_sync_waits(leader, 2.0)
    c.kill_node(leader)
    c.wait_leader(exclude=leader)
    c.start_node(leader, wait=False)
    return f"{n} sync waits cancelled on {leader}, then its host killed"


def fault_etcd_freeze(c, head):
    """The DCS gone past the ttl: Patroni 3.0 (no failsafe_mode) demotes
    the leader to a read-only standby; a leader again once etcd is back."""
    leader = c.leader()
    c.freeze_etcd()
    try:
        time.sleep(c.ttl + 3)
        demoted = c.psql(leader, "select pg_is_in_recovery()", check=False,
                         timeout=3)
    finally:
        c.thaw_etcd()
    c.wait_leader(timeout=90)
    healed = heal(c)
    return f"etcd frozen {c.ttl + 3} s (old leader {leader} in " \
        f"recovery: {demoted}){healed}"


def heal(c):
    """Patroni 3.0.2, after losing the DCS, may leave a replica with no
    primary_conninfo ("following a different leader because i am not the
    healthiest node", then "no action" for ever). Restart the patroni of
    any replica that does not stream within 60 s; "" when none needed it.
    """
    try:
        c.wait_healthy(timeout=60)
        return ""
    except ClusterError:
        pass
    leader = c.leader()
    out = c.psql(leader, "select application_name from pg_stat_replication "
                 "where state = 'streaming'", check=False, timeout=3) or ""
    stuck = [n.name for n in c.nodes if n.name != leader and
             n.name not in out.split()]
    for name in stuck:
        c.stop_node(name)
        c.start_node(name, wait=False)
    return f", patroni restarted on {stuck}"


def fault_pg_immediate(c, head):
    """pg_ctl stop -m immediate on the leader; Patroni restarts it in
    place or fails over."""
    leader = c.leader()
    c.stop_postgres_immediate(leader)
    c.wait_leader(timeout=90)
    return f"pg_ctl stop -m immediate on {leader}"


def fault_terminate_backends(c, head):
    """idemproxy's backends on the leader terminated again and again for
    2 s: commits cut at every point, mid-commit among them."""
    leader = c.leader()
    n = c.terminate_backends(leader, "idem", 2.0)
    c.wait_leader(timeout=60)
    return f"{n} backends terminated on {leader}"


def fault_restart(c, head):
    """A restart of the leader's PostgreSQL through Patroni's API."""
    leader = c.leader()
    st, msg = http_json(c.node(leader).api_url + "/restart", method="POST",
                        body={}, timeout=60)
    c.wait_leader(timeout=90)
    return f"patroni restart of {leader}: {st}"


def fault_failover(c, head):
    """A manual failover (POST /failover, no leader named) to the sync
    standby."""
    leader = c.leader()
    to = c.sync_standby()
    st, msg = http_json(c.node(to).api_url + "/failover", method="POST",
                        body={"candidate": to}, timeout=60)
    new = c.wait_leader(exclude=leader, timeout=90)
    return f"manual failover {leader} -> {new}: {st}"


def fault_kill_patroni(c, head):
    """The leader's Patroni killed alone: its PostgreSQL stays a writable
    primary whose commits wait for a standby that gets promoted (docs/ha.md
    "A primary that lost its role without knowing it"). The node comes
    back (host restart) after the instances recovered."""
    leader = c.leader()
    c.kill_patroni(leader)
    new = c.wait_leader(exclude=leader, timeout=90)
    AFTER_RECOVERY.append(lambda: (c.kill_node(leader),
                                   c.start_node(leader, wait=False)))
    return f"killed patroni of {leader} (postgres left running), {new} " \
        f"promoted"


# what a fault leaves to do once the instances' recovery was measured
AFTER_RECOVERY = []

fault_kill_patroni.bound = STALE_BOUND_S

FAULTS = [fault_freeze, fault_switchover, fault_kill_node,
          fault_kill_postgres, fault_cancel_waits, fault_etcd_freeze,
          fault_pg_immediate, fault_terminate_backends, fault_restart,
          fault_failover, fault_kill_patroni]


def main():
    minutes = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else int(time.time())
    sync = not (len(sys.argv) > 3 and sys.argv[3] == "async")
    faults = FAULTS if sync else [fault_kill_node]
    only = os.environ.get("FAULTS")
    if only:
        faults = [f for f in faults if f.__name__[6:] in only.split()]
        if not faults:
            sys.exit(f"ha soak: no fault named in FAULTS={only!r}; kinds: " +
                     " ".join(f.__name__[6:] for f in FAULTS))
    rnd = random.Random(seed)
    print(f"ha soak: {minutes} min, seed {seed}, "
          f"{'synchronous strict' if sync else 'asynchronous'}")
    tmp = Path(tempfile.mkdtemp(prefix="idem-ha-soak-"))
    c = Cluster(tmpdir=str(tmp), n=3, synchronous=sync, strict=sync)
    stub = proxies = load = None
    lags = []
    try:
        stub = Stub(tmp)
        head = c.leader()
        order = [head] + [n.name for n in c.nodes if n.name != head]
        hosts = ",".join(f"127.0.0.1:{c.node(x).pg_port}" for x in order)
        url = f"postgres://idem:idem@{hosts}/idem"
        proxies = [Proxy(tmp, stub.url, "--store", url, "--lease", "30s",
                         name=f"idemproxy{i}") for i in range(3)]
        load = Load(proxies)
        t_end = time.monotonic() + minutes * 60
        while time.monotonic() < t_end:
            c.wait_healthy(timeout=120)
            time.sleep(rnd.uniform(1, 5))
            fault = rnd.choice(faults)
            what = fault(c, head)
            lag = recovery(proxies, time.monotonic(), f"f{len(lags)}")
            lags.append((what, lag, getattr(fault, "bound",
                                            RECOVERY_BOUND_S)))
            while AFTER_RECOVERY:
                AFTER_RECOVERY.pop()()
            print(f"  {what}: " + ", ".join(
                "none" if x is None else f"{x:.2f}s" for x in lag))
    except BaseException:
        if load is not None:
            load.stop()
        for p in proxies or []:
            p.stop()
        if stub is not None:
            stub.stop()
        c.stop()
        raise
    load.stop()
    ok = True
    try:
        check_history(stub, load, proxies)
    except AssertionError as e:
        print(f"ha soak: FAIL: {e}")
        ok = False
    slow = [(w, x, b) for w, v, b in lags for x in v
            if x is None or x > b]
    if slow:
        print(f"ha soak: FAIL: slower than the bound (what, s, bound s): "
              f"{slow}")
        ok = False
    for p in proxies or []:
        p.stop()
    if stub is not None:
        stub.stop()
    c.stop()
    print(f"ha soak: {'PASS' if ok else 'FAIL'} (seed {seed}; logs in {tmp})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
