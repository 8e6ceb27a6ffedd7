#!/usr/bin/python3
"""New keys on a replicated PostgreSQL beside a single node (issue 19,
docs/ha.md, docs/benchmarks.md "A synchronous standby").

For each setup - one Patroni node (no replica), then three nodes with
synchronous_mode strict (every commit waits for the standby's flush) -
start it with tests/ha/cluster.py (fsync on), one idemproxy (release build)
in front of the stub upstream with --store listing every node, and run
wrk with a unique Idempotency-Key per request (keyed_unique.lua, 1 KiB
POST) at each concurrency. Prints req/s and p99 per setup and the ratio.
Not a test; everything on 127.0.0.1, stopped by PID.

    /usr/bin/python3 tests/bench/ha.py            # CONNS="8 32" DURATION=5s
"""
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "tests" / "ha"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))

BUILD = Path(os.environ.get("BUILD_DIR", ROOT / "build-bench"))
os.environ.setdefault("IDEMPROXY_BIN", str(BUILD / "proxy" / "idemproxy"))
os.environ.setdefault("STUB_UPSTREAM_BIN",
                      str(BUILD / "tests" / "support" / "stub_upstream"))

from cluster import Cluster  # noqa: E402
from support.procs import Proxy, Stub  # noqa: E402

CONNS = [int(x) for x in os.environ.get("CONNS", "8 32").split()]
DURATION = os.environ.get("DURATION", "5s")
WARMUP = os.environ.get("WARMUP", "2s")


def build():
    if not (BUILD / "build.ninja").exists():
        subprocess.run(["meson", "setup", str(BUILD), str(ROOT),
                        "-Dbuildtype=release"], check=True,
                       stdout=subprocess.DEVNULL)
    subprocess.run(["meson", "compile", "-C", str(BUILD)], check=True,
                   stdout=subprocess.DEVNULL)


def wrk(port, conns, duration):
    out = subprocess.run(
        ["wrk", "-t1", f"-c{conns}", f"-d{duration}", "--latency", "-s",
         str(HERE / "keyed_unique.lua"), f"http://127.0.0.1:{port}/orders"],
        capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    m = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    p99 = float(m.group(1)) * {"us": 0.001, "ms": 1, "s": 1000}[m.group(2)]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return rps, p99, int(bad.group(1)) if bad else 0


def measure(label, n, synchronous):
    tmp = Path(tempfile.mkdtemp(prefix="idem-bench-ha-"))
    c = Cluster(tmpdir=str(tmp), n=n, synchronous=synchronous,
                strict=synchronous)
    stub = p = None
    rows = []
    try:
        stub = Stub(tmp)
        hosts = ",".join(f"127.0.0.1:{x.pg_port}" for x in c.nodes)
        p = Proxy(tmp, stub.url, "--store", f"postgres://idem:idem@{hosts}/idem")
        for conns in CONNS:
            wrk(p.port, conns, WARMUP)
            rps, p99, bad = wrk(p.port, conns, DURATION)
            rows.append((label, conns, rps, p99, bad))
            print(f"{label:<28} c={conns:<3} {rps:9.0f} req/s  p99 "
                  f"{p99:7.2f} ms  non-2xx {bad}", flush=True)
    finally:
        if p is not None:
            p.stop()
        if stub is not None:
            stub.stop()
        c.stop()
    return rows


def main():
    build()
    print(f"new keys through idemproxy (release, --workers 1), wrk -t1 "
          f"-d{DURATION}, 1 KiB POST, unique keys; PostgreSQL 15, fsync on")
    single = measure("1 node", 1, False)
    sync = measure("3 nodes, sync strict", 3, True)
    for (_, conns, r1, p1, _), (_, _, r3, p3, _) in zip(single, sync):
        print(f"c={conns}: sync / single = {r3 / r1:.2f}x req/s, "
              f"p99 {p3:.2f} vs {p1:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
