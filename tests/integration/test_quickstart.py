"""The quickstart on the real store (issue 13): `./deploy/quickstart.sh
postgres` starts a private PostgreSQL and Redis, two instances sharing
them, shows the article's E1 split across both (8 clicks, 4 to each -> one
order, eight identical answers) and a key inspected on an admin listener;
`./deploy/quickstart.sh stop` stops everything it started.

It builds the repository's own release build (build/), as a newcomer's
first command does, on ports of its own and with its own run directory, so
that a quickstart a user left running is not touched.
"""
import json
import os
import re
import subprocess

from support.procs import ROOT, clean_env, free_port

QUICKSTART = os.path.join(ROOT, "deploy", "quickstart.sh")


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def test_quickstart_postgres_then_stop(tmp_path):
    ports = {name: str(free_port()) for name in (
        "IDEMPROXY_PORT", "IDEMPROXY2_PORT", "ADMIN_PORT", "ADMIN2_PORT",
        "UPSTREAM_PORT", "PG_PORT", "REDIS_PORT")}
    env = clean_env({**ports, "QUICKSTART_DIR": str(tmp_path / "run")})
    run = tmp_path / "run"
    pids, pgdir = {}, None
    try:
        r = subprocess.run([QUICKSTART, "postgres"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=900)
        out = r.stdout
        assert r.returncode == 0, out + r.stderr
        clicks = re.findall(r"click \d -> instance (\d) \(:\d+\): (\d+)  "
                            r"(replayed|executed)", out)
        assert len(clicks) == 8, out
        assert sorted(c[0] for c in clicks) == ["1"] * 4 + ["2"] * 4
        assert all(c[1] == "200" for c in clicks), out
        assert [c[2] for c in clicks].count("executed") == 1, out
        assert ("orders created at the upstream: 1; distinct answers: 1 of 8"
                in out), out
        doc = json.loads(out[out.index("{", out.index("/keys/")):
                             out.index("\n}\n") + 2])
        assert doc["state"] == "completed" and doc["status"] == 200
        assert {"postgres", "redis"} <= set(doc["found_in"])
        pids = {p.name: int(p.read_text()) for p in run.glob("*.pid")}
        assert set(pids) == {"idemproxy.pid", "idemproxy2.pid",
                             "upstream.pid", "redis.pid"}, pids
        pgdir = (run / "pg.dir").read_text().strip()
        with open(os.path.join(pgdir, "data", "postmaster.pid")) as f:
            pids["postgres"] = int(f.readline())
        assert all(alive(p) for p in pids.values())
    finally:
        s = subprocess.run([QUICKSTART, "stop"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
    assert s.returncode == 0, s.stdout + s.stderr
    assert "stopped postgresql" in s.stdout, s.stdout
    assert not [n for n, p in pids.items() if alive(p)], s.stdout
    assert pgdir is not None and not os.path.exists(pgdir)
    assert not list(run.glob("*.pid"))
