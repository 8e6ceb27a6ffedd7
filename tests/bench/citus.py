#!/usr/bin/python3
"""idemproxy on Citus beside one PostgreSQL node, in one run (issue 47,
docs/scale.md "Measured").

Two stores, both alive for the whole run, every node a private PostgreSQL
15 on this machine with fsync on: "one" (a single node) and "citus" (a
coordinator and two workers, Citus 13.2 built by deploy/build-citus.sh,
the table distributed by `idemproxy migrate --distributed`). One
idemproxy (release build, --workers 1, --response-cache 0 so that every
replay is a claim in the store) in front of the stub upstream for each.

Rows, interleaved round by round, median of ROUNDS:
  new      a new Idempotency-Key per request (keyed_unique.lua)
  replay   KEYED_CYCLE keys sent in turn after a warm-up that made them
           (keyed_cycle.lua): replays of keys spread over every worker
For each: req/s, and CPU ms per request of idemproxy and of each node
(its postmaster and every backend, from /proc); for "new", WAL bytes per
key on each node (pg_stat_wal) and, at the end, each node's database size
per key written.

Not a test: prints figures. Everything on 127.0.0.1, stopped by PID.

    /usr/bin/python3 tests/bench/citus.py     # ROUNDS=3 DURATION=5 CONNS=32
"""
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(ROOT / "tests" / "ha"))

BUILD = Path(os.environ.get("BUILD_DIR", ROOT / "build-bench"))
BIN = BUILD / "proxy" / "idemproxy"
STUB = BUILD / "tests" / "support" / "stub_upstream"
ROUNDS = int(os.environ.get("ROUNDS", "3"))
DURATION = int(os.environ.get("DURATION", "5"))
CONNS = int(os.environ.get("CONNS", "32"))
CYCLE = int(os.environ.get("KEYED_CYCLE", "1000"))

from cluster import descendants, process_tree  # noqa: E402
from support.citus import CitusCluster  # noqa: E402
from support.procs import free_port  # noqa: E402
from support.stores import PgServer  # noqa: E402


def build():
    if not (BUILD / "build.ninja").exists():
        subprocess.run(["meson", "setup", str(BUILD), str(ROOT),
                        "-Dbuildtype=release", "-Dintegration_tests=disabled"],
                       check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["meson", "compile", "-C", str(BUILD)], check=True,
                   stdout=subprocess.DEVNULL)


def durable(node):
    """fsync and full page writes on, as production runs."""
    node.psql("ALTER SYSTEM SET fsync = on")
    node.psql("ALTER SYSTEM SET full_page_writes = on")
    node.stop()
    node.start()


def cpu_ms(pid):
    """CPU time (user + system) so far of pid and its descendants."""
    tree = process_tree()
    total = 0
    for p in [pid, *descendants(pid, tree)]:
        try:
            with open(f"/proc/{p}/stat") as f:
                st = f.read()
            rest = st[st.rindex(")") + 2:].split()
            total += int(rest[11]) + int(rest[12])
        except (OSError, ValueError, IndexError):
            continue
    return total * 1000 / os.sysconf("SC_CLK_TCK")


def wrk(port, script, seconds, env=None):
    out = subprocess.run(
        ["wrk", "-t1", f"-c{CONNS}", f"-d{seconds}s", "-s",
         str(HERE / script), f"http://127.0.0.1:{port}/orders"],
        capture_output=True, text=True, check=True,
        env={**os.environ, **(env or {})}).stdout
    reqs = int(re.search(r"(\d+) requests in", out).group(1))
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return reqs, int(bad.group(1)) if bad else 0


class Setup:
    def __init__(self, name, nodes, url, tmp):
        self.name = name
        self.nodes = nodes          # [(label, PgServer)]
        self.url = url
        self.stub_port, self.port = free_port(), free_port()
        self.log = open(os.path.join(tmp, f"{name}.log"), "wb")
        self.stub = subprocess.Popen(
            [str(STUB), "--listen", f"127.0.0.1:{self.stub_port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.proxy = subprocess.Popen(
            [str(BIN), "--upstream", f"http://127.0.0.1:{self.stub_port}",
             "--listen", f"127.0.0.1:{self.port}", "--admin-listen",
             f"127.0.0.1:{free_port()}", "--workers", "1",
             "--response-cache", "0", "--store", url],
            stdout=self.log, stderr=self.log)
        time.sleep(3)

    def pids(self):
        return [("idemproxy", self.proxy.pid)] + [
            (label, n.postmaster_pid()) for label, n in self.nodes]

    def wal(self):
        return {label: int(n.psql("SELECT wal_bytes FROM pg_stat_wal"))
                for label, n in self.nodes}

    def run(self, script, seconds, env=None):
        cpu0 = {label: cpu_ms(pid) for label, pid in self.pids()}
        wal0 = self.wal()
        t0 = time.monotonic()
        reqs, bad = wrk(self.port, script, seconds, env)
        wall = time.monotonic() - t0
        cpu = {label: cpu_ms(pid) - cpu0[label] for label, pid in self.pids()}
        wal = {label: b - wal0[label] for label, b in self.wal().items()}
        return {"rps": reqs / wall, "reqs": reqs, "bad": bad,
                "cpu": {k: v / max(reqs, 1) for k, v in cpu.items()},
                "wal": {k: v / max(reqs, 1) for k, v in wal.items()}}

    def db_bytes(self):
        return {label: int(n.psql("SELECT pg_database_size('bench')"))
                for label, n in self.nodes}

    def stop(self):
        for p in (self.proxy, self.stub):
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def migrate(url, *flags):
    subprocess.run([str(BIN), "migrate", "--store", url, *flags], check=True,
                   stdout=subprocess.DEVNULL)


def main():
    build()
    tmp = tempfile.mkdtemp(prefix="icitus")
    one = PgServer()
    cl = None
    setups = []
    try:
        durable(one)
        one.psql("CREATE DATABASE bench")
        migrate(one.url("bench"))
        cl = CitusCluster(workers=2)
        for n in cl.nodes:
            durable(n)
        curl = cl.create_db("bench")
        migrate(curl, "--distributed")
        setups = [
            Setup("one", [("node", one)], one.url("bench"), tmp),
            Setup("citus", [("coord", cl.coordinator)] +
                  [(f"w{i + 1}", w) for i, w in enumerate(cl.workers)],
                  curl, tmp),
        ]
        size0 = {s.name: s.db_bytes() for s in setups}
        written = {s.name: 0 for s in setups}
        for s in setups:        # warm-up: connections, plans, the cycle's keys
            s.run("keyed_unique.lua", 2)
            s.run("keyed_cycle.lua", 2, {"KEYED_CYCLE": str(CYCLE)})
        rows = {(s.name, r): [] for s in setups for r in ("new", "replay")}
        for rnd in range(ROUNDS):
            for s in setups:
                res = s.run("keyed_unique.lua", DURATION)
                written[s.name] += res["reqs"]
                rows[(s.name, "new")].append(res)
                rows[(s.name, "replay")].append(
                    s.run("keyed_cycle.lua", DURATION,
                          {"KEYED_CYCLE": str(CYCLE)}))
            print(f"# round {rnd + 1}/{ROUNDS} done", file=sys.stderr)
        print(f"c={CONNS}, {DURATION} s x {ROUNDS} rounds, medians; CPU in "
              f"ms per request, WAL in bytes per request")
        med = {}
        for (name, row), rs in rows.items():
            rps = statistics.median(r["rps"] for r in rs)
            med[(name, row)] = rps
            bad = sum(r["bad"] for r in rs)
            cpu = {k: statistics.median(r["cpu"][k] for r in rs)
                   for k in rs[0]["cpu"]}
            wal = {k: statistics.median(r["wal"][k] for r in rs)
                   for k in rs[0]["wal"]}
            print(f"{name:6} {row:7} {rps:8.0f} req/s  non-2xx {bad:3}  cpu "
                  + " ".join(f"{k} {v:.3f}" for k, v in cpu.items())
                  + "  wal " + " ".join(f"{k} {v:.0f}" for k, v in wal.items()))
        for row in ("new", "replay"):
            print(f"citus/one {row}: {med[('citus', row)] / med[('one', row)]:.2f}x")
        for s in setups:
            end = s.db_bytes()
            print(f"{s.name}: database growth per new key: " + " ".join(
                f"{k} {(end[k] - size0[s.name][k]) / max(written[s.name], 1):.0f} B"
                for k in end))
    finally:
        for s in setups:
            s.stop()
        if cl is not None:
            cl.shutdown()
        one.shutdown()


if __name__ == "__main__":
    main()
