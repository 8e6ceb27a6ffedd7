#!/usr/bin/python3
"""A soak of idemproxy with a history checker (issue 11, "Keep it hardened").

    soak.py [--duration 60] [--seed N] [--instances 3] [--clients 8]
            [--faults KIND,...] [--no-redis] [--pgbouncer] [--citus]
            [--keep] [--negative-control] [--lenient]

Starts, all on 127.0.0.1 with free ports, in a temp dir:
  - a private PostgreSQL 15 and a Redis (tests/integration/support/stores.py;
    --no-redis: PostgreSQL alone, and no Redis faults; --pgbouncer: the
    instances reach it through a pgbouncer in session mode, which the
    faults also SIGKILL and SIGSTOP; --citus: a Citus coordinator and two
    workers instead, the table distributed, each PostgreSQL fault on one
    node of the three)
  - the recording upstream (upstream.py): one line per execution
  - N idemproxy instances (IDEMPROXY_BIN, default build-test/proxy/idemproxy)
    sharing the PostgreSQL database and the Redis, with a short --lease (3s),
    --upstream-timeout (2s) and --ttl (10s) so that takeovers, timeouts and
    expiry all happen within the run
and then, for --duration seconds:
  - client threads hammer a pool of 50 key slots: sequential retries (also
    after 409/5xx/errors), bursts of concurrent duplicates on several
    instances at once, changed bodies under a used key, fresh keys; the
    upstream behaviour of each request (status 200/201/404 and 502/504, all
    stored; 401/408/425/429/500/503, released; delays short, past half the
    lease, past the upstream timeout; a connection dropped after the
    request was read, at once or past the upstream timeout; a response cut
    after its head; large bodies) is chosen by headers that idemproxy does
    not fingerprint, so duplicates of one key may meet different behaviours;
  - a fault schedule (from the seed, printed at the start) cycles through:
    SIGKILL of an instance (restarted 1 s later), SIGSTOP of an instance
    past its lease (SIGCONT after lease + 1.5 s), pg_ctl stop -m immediate
    (1 s down; and once per cycle for lease + 1 s), pg_ctl stop -m fast,
    pg_terminate_backend of every proxy backend, Redis SIGKILL (restarted
    1 s later), Redis FLUSHALL.
The checker's rules are strict (docs/reliability.md): a second execution
of a key follows a releasing status (config.json "release_statuses", the
proxies' default 500,503,401,408,425,429) or an expiry, nothing else.
--lenient runs the proxies at-least-once (--unknown-outcome release) and
checks with the former rules (a release after a drop, a 502/504 or a
timeout; a takeover after a kill, stop or store outage).
At the end every instance must stop on SIGTERM with exit 0 and no sanitizer
report (killed incarnations: no sanitizer report), the final table is read,
and check.py proves the properties from the histories. Exit 0 when all
holds, 1 otherwise. Every process it started is stopped by PID; the temp
dir is removed unless the run failed or --keep (its path is printed: the
histories, the logs and report.json).

--negative-control runs every instance with its own --store memory: there
is no shared store, so the checker must find duplicate executions (a check
of the checker; the run then exits 0 only if it did).

Reproducing a run: the seed fixes the fault schedule, the client
operations, keys and behaviours; the interleaving is the machine's.
--faults narrows the cycle to some kinds (kill, stop, pg-immediate,
pg-fast, pg-terminate, redis-kill, redis-flush, pg-long, pg-pause: every
PostgreSQL process SIGSTOPped for 6 s, redis-pause: Redis SIGSTOPped for
3 s; with --pgbouncer, bouncer-kill: pgbouncer SIGKILLed, started again
1 s later, and bouncer-pause: SIGSTOPped for 6 s). A finding that
depends on timing gets a deterministic reproduction of its own
(stall_repro.py).
"""
import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
sys.path.insert(0, HERE)

from support.http import RawConn, build_request, http_get  # noqa: E402
from support.procs import (clean_env, free_port,  # noqa: E402
                           metric_value, read_text, sanitizer_report)
from support.citus import CitusCluster  # noqa: E402
from support.stores import Bouncer, PgServer, RedisServer  # noqa: E402

import check  # noqa: E402
from upstream import fingerprint  # noqa: E402

IDEMPROXY_BIN = os.environ.get(
    "IDEMPROXY_BIN", os.path.join(ROOT, "build-test", "proxy", "idemproxy"))

LEASE_S = 3.0
UPSTREAM_TIMEOUT_S = 2.0
TTL_S = 10.0
RELEASE_STATUSES = check.DEFAULT_RELEASE_STATUSES    # the proxies' default
WAIT_TIMEOUT_S = 10.0
CLIENT_TIMEOUT_S = 20.0
SLOTS = 50
FAULT_INTERVAL_S = 6.5
WARMUP_S = 3.0
MIN_ANSWERED = 0.5      # of the requests, or the run fails (a dead proxy)


def log(msg):
    sys.stdout.write(f"soak: {msg}\n")
    sys.stdout.flush()


# ---------------------------------------------------------------- processes

class Instance:
    """One idemproxy process on fixed ports, restartable after a kill."""

    def __init__(self, name, workdir, flags):
        self.name = name
        self.workdir = workdir
        self.port = free_port()
        self.admin_port = free_port()
        self.flags = flags
        self.proc = None
        self.incarnation = 0
        self.logs = []          # (path, how it ended)
        self.stopped = False    # SIGSTOPped

    def start(self, timeout=30.0):
        self.incarnation += 1
        path = os.path.join(self.workdir,
                            f"{self.name}.{self.incarnation}.log")
        self._log = open(path, "wb")
        self.logs.append([path, "running"])
        self.proc = subprocess.Popen(
            [IDEMPROXY_BIN, "--listen", f"127.0.0.1:{self.port}",
             "--admin-listen", f"127.0.0.1:{self.admin_port}", *self.flags],
            stdout=self._log, stderr=subprocess.STDOUT, env=clean_env())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited "
                                   f"{self.proc.returncode} at start:\n"
                                   f"{read_text(path)[-3000:]}")
            try:
                if http_get(self.admin_port, "/healthz", timeout=1)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} not healthy in {timeout}s")

    def wait_ready(self, timeout=30.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if http_get(self.admin_port, "/readyz", timeout=1)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} not ready in {timeout}s")

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        if self.alive():
            if self.stopped:
                self.cont()
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(15)
        self._log.close()
        self.logs[-1][1] = "SIGKILL"

    def stop_signal(self):
        self.proc.send_signal(signal.SIGSTOP)
        self.stopped = True

    def cont(self):
        self.proc.send_signal(signal.SIGCONT)
        self.stopped = False

    def metrics(self):
        try:
            st, body = http_get(self.admin_port, "/metrics", timeout=5)
            return body.decode() if st == 200 else ""
        except OSError:
            return ""

    def terminate(self, timeout=30.0):
        """SIGTERM and wait; the exit status (None if it had to be
        killed)."""
        if not self.alive():
            return self.proc.returncode if self.proc else None
        if self.stopped:
            self.cont()
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            rc = None
        self._log.close()
        self.logs[-1][1] = f"SIGTERM, exit {rc}"
        return rc

    def force_stop(self):
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGCONT)
                self.proc.send_signal(signal.SIGKILL)
                self.proc.wait(15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass


class Upstream:
    def __init__(self, workdir):
        self.log_path = os.path.join(workdir, "upstream.jsonl")
        self.err_path = os.path.join(workdir, "upstream.stderr")
        self._err = open(self.err_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "upstream.py"),
             "--listen", "127.0.0.1:0", "--log", self.log_path],
            stdout=subprocess.PIPE, stderr=self._err, env=clean_env())
        line = self.proc.stdout.readline().decode()
        if not line.startswith("listening "):
            raise RuntimeError(f"upstream did not start: {line!r} "
                               f"{read_text(self.err_path)}")
        self.port = int(line.split(":")[-1])
        self.url = f"http://127.0.0.1:{self.port}"

    def stats(self):
        st, body = http_get(self.port, "/__stats", timeout=5)
        return json.loads(body)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self._err.close()
        return rc


# ---------------------------------------------------------------- clients

def behaviour(rng):
    """Request headers that decide what the upstream does (not part of the
    fingerprint)."""
    x = rng.random()
    if x < 0.04:
        return {"X-Soak-Status": "503"}
    if x < 0.06:
        return {"X-Soak-Status": "500"}
    if x < 0.07:
        return {"X-Soak-Status": "429"}
    if x < 0.09:
        return {"X-Soak-Status": "404"}             # stored and replayed
    if x < 0.13:
        return {"X-Soak-Delay-Ms": "1700"}          # past lease/2: extended
    if x < 0.16:
        return {"X-Soak-Delay-Ms": "2600"}          # past the upstream timeout
    if x < 0.17:
        return {"X-Soak-Drop": "1"}                 # unknown outcome
    if x < 0.20:
        return {"X-Soak-Size": "100000"}
    if x < 0.21:
        return {"X-Soak-Status": "502"}             # a gateway's: stored
    if x < 0.22:
        return {"X-Soak-Status": "504"}             # a gateway's: stored
    if x < 0.23:
        return {"X-Soak-Status": rng.choice(["401", "408", "425"])}
    if x < 0.235:                                   # 504 to the client,
        return {"X-Soak-Delay-Ms": "2600",          # then no answer
                "X-Soak-Drop": "1"}
    if x < 0.24:
        return {"X-Soak-Cut": "1"}                  # cut after the head
    return {"X-Soak-Status": rng.choice(["200", "200", "201"]),
            "X-Soak-Delay-Ms": str(rng.choice([0, 0, 10, 50, 150, 400]))}


def canonical_body(key, slot):
    n = int(hashlib.sha256(key.encode()).hexdigest()[:4], 16) % 3
    pad = ("x" * (20, 600, 6000)[n])
    return json.dumps({"slot": slot, "key": key, "amount": slot * 7 + 1,
                       "note": pad}, separators=(",", ":")).encode()


class Soak:
    def __init__(self, args, workdir):
        self.args = args
        self.workdir = workdir
        self.stop = threading.Event()
        self.instances = []
        self.available = []             # routable: not killed, not stopped
        self.gens = [0] * SLOTS
        self.gen_lock = threading.Lock()
        self.ops = 0

    def routable(self):
        idx = [i for i, ok in enumerate(self.available) if ok]
        return idx or list(range(len(self.instances)))

    def key_of(self, slot):
        return f"s{slot}g{self.gens[slot]}"

    def bump(self, slot):
        with self.gen_lock:
            self.gens[slot] += 1
            return self.key_of(slot)


class Client(threading.Thread):
    def __init__(self, soak, n, seed):
        super().__init__(name=f"client{n}", daemon=True)
        self.soak = soak
        self.n = n
        self.rng = random.Random(seed)
        self.seq = 0
        self.ops = 0
        self.idle = {}                  # inst index -> [RawConn]
        self.out = open(os.path.join(soak.workdir, f"clients{n}.jsonl"),
                        "w", encoding="utf-8")
        self.crash = None

    def conn(self, i):
        pool = self.idle.setdefault(i, [])
        if pool:
            return pool.pop()
        return RawConn(self.soak.instances[i].port, timeout=CLIENT_TIMEOUT_S)

    def put(self, i, c):
        self.idle.setdefault(i, []).append(c)

    def record(self, rec):
        self.out.write(json.dumps(rec, separators=(",", ":")) + "\n")

    def exchange(self, kind, op, slot, key, body, targets):
        """Send one request per instance in `targets` at once (separate
        connections), then read every response. Returns the records."""
        target = f"/soak/orders/{slot}"
        fp = fingerprint(b"POST", target.encode(), body)
        body_sha = hashlib.sha256(body).hexdigest()
        sent = []
        for i in targets:
            self.seq += 1
            rid = f"c{self.n}-{self.seq}"
            beh = behaviour(self.rng)
            hdrs = [("Idempotency-Key", key), ("X-Soak-Req", rid),
                    ("Content-Type", "application/json")] + list(beh.items())
            rec = {"id": rid, "op": op, "kind": kind, "key": key,
                   "slot": slot, "target": target, "fp": fp,
                   "body_sha": body_sha, "inst": self.soak.instances[i].name,
                   "beh": beh, "t0": None, "t1": None, "status": None,
                   "replayed": False, "exec": None, "exec_hdr": None,
                   "resp_sha": None, "resp_len": None, "ptype": None,
                   "err": None}
            c = None
            try:
                c = self.conn(i)
                rec["t0"] = time.time()
                c.send(build_request("POST", target, hdrs, body))
            except (OSError, EOFError) as e:
                if rec["t0"] is None:
                    rec["t0"] = time.time()
                rec["t1"] = time.time()
                rec["err"] = f"send: {type(e).__name__}: {e}"[:200]
                if c is not None:
                    c.close()
                c = None
            sent.append((i, c, rec))
        out = []
        for i, c, rec in sent:
            if c is not None:
                try:
                    resp = c.read_response("POST")
                    rec["t1"] = time.time()
                    self.parse(rec, resp)
                    if "close" in resp.connection_tokens():
                        c.close()
                    else:
                        self.put(i, c)
                except (OSError, EOFError, ValueError) as e:
                    rec["t1"] = time.time()
                    rec["err"] = f"read: {type(e).__name__}: {e}"[:200]
                    c.close()
            self.record(rec)
            out.append(rec)
        return out

    @staticmethod
    def parse(rec, resp):
        rec["status"] = resp.status
        rec["replayed"] = (resp.header("Idempotent-Replayed") or "").lower() \
            == "true"
        rec["exec_hdr"] = resp.header("X-Soak-Exec")
        rec["resp_sha"] = hashlib.sha256(resp.body).hexdigest()
        rec["resp_len"] = len(resp.body)
        ctype = (resp.header("Content-Type") or "").lower()
        try:
            doc = json.loads(resp.body)
        except ValueError:
            doc = None
        if ctype.startswith("application/problem+json"):
            t = (doc or {}).get("type", "") if isinstance(doc, dict) else ""
            rec["ptype"] = t.rsplit(":", 1)[-1] or "problem"
        elif isinstance(doc, dict) and "exec" in doc:
            rec["exec"] = doc["exec"]
        else:
            rec["ptype"] = "unexpected body"

    def pick(self):
        return self.rng.choice(self.soak.routable())

    def retry_wanted(self, rec):
        """A failure worth a back-off and a retry. Not a replay (a stored
        502/504, an unknown outcome): the key's settled answer, the same
        until it expires or a late completion replaces it; sending it
        again without a pause is the other branch of op_seq."""
        st = rec["status"]
        if rec["replayed"]:
            return False
        return st is None or st in (408, 409, 425, 429) or st >= 500

    def op_seq(self, op, slot, key, body, kind="seq"):
        """Sequential: send; after a failure (408, 409, 425, 429, 5xx, no
        answer) retry with back-off (0.2 s doubling, ~8 s in all, so that
        retries outlast a fault); after a success sometimes send again (a
        client that did not see the answer)."""
        pause = 0.2
        for _ in range(7):
            if self.soak.stop.is_set():
                return
            rec = self.exchange(kind, op, slot, key, body, [self.pick()])[0]
            if self.retry_wanted(rec):
                time.sleep(pause * self.rng.uniform(0.5, 1.5))
                pause = min(pause * 2, 2.0)
                continue
            if self.rng.random() < 0.5:
                break

    def run(self):
        try:
            while not self.soak.stop.is_set():
                self.ops += 1
                op = f"c{self.n}-o{self.ops}"
                slot = self.rng.randrange(SLOTS)
                x = self.rng.random()
                if x < 0.25:
                    key = self.soak.bump(slot)
                    self.op_seq(op, slot, key, canonical_body(key, slot),
                                "fresh")
                    continue
                key = self.soak.key_of(slot)
                body = canonical_body(key, slot)
                if x < 0.6:
                    self.op_seq(op, slot, key, body)
                elif x < 0.85:
                    n = self.rng.randint(2, 4)
                    self.exchange("burst", op, slot, key, body,
                                  [self.pick() for _ in range(n)])
                else:
                    changed = body[:-1] + b',"changed":"%d"}' % \
                        self.rng.randrange(1 << 30)
                    self.exchange("changed", op, slot, key, changed,
                                  [self.pick()])
        except Exception as e:      # a bug of the soak itself: fail the run
            self.crash = repr(e)
            raise
        finally:
            for pool in self.idle.values():
                for c in pool:
                    c.close()
            self.out.close()


# ---------------------------------------------------------------- faults

FAULT_CYCLE = ("kill", "stop", "pg-immediate", "pg-fast", "pg-terminate",
               "redis-kill", "redis-flush", "pg-long", "pg-pause",
               "redis-pause")
BOUNCER_FAULTS = ("bouncer-kill", "bouncer-pause")     # with --pgbouncer
PG_PAUSE_S = 6.0        # past a request's 5 s store deadline and the lease
REDIS_PAUSE_S = 3.0
BOUNCER_POOL = 60       # server connections: every instance's, and spare


def schedule(duration, n_instances, rng, kinds=FAULT_CYCLE, n_nodes=1):
    """[(offset s, kind, instance index or None)]: every fault kind once per
    cycle in a shuffled order, one every FAULT_INTERVAL_S, the last one
    over well before the end. With n_nodes > 1 (--citus) a PostgreSQL
    fault's index is the node's (0: the coordinator)."""
    out = []
    t = WARMUP_S
    cycle = []
    while t + 6.0 <= duration - 3.0:
        if not cycle:
            cycle = list(kinds)
            rng.shuffle(cycle)
        kind = cycle.pop()
        inst = rng.randrange(n_instances) if kind in ("kill", "stop") \
            else None
        if kind.startswith("pg-") and n_nodes > 1:
            inst = rng.randrange(n_nodes)
        out.append((round(t, 2), kind, inst))
        t += FAULT_INTERVAL_S
    return out


class Faults(threading.Thread):
    def __init__(self, soak, plan, pg, redis, bouncer, t_start, nodes=None):
        super().__init__(name="faults", daemon=True)
        self.soak = soak
        self.plan = plan
        self.pg = pg
        self.nodes = nodes or [pg]      # --citus: coordinator, workers
        self.redis = redis
        self.bouncer = bouncer
        self.t_start = t_start
        self.out = open(os.path.join(soak.workdir, "faults.jsonl"), "w",
                        encoding="utf-8")
        self.error = None

    def note(self, kind, inst, t, t_end, **extra):
        rec = {"kind": kind, "inst": inst, "t": t, "t_end": t_end, **extra}
        self.out.write(json.dumps(rec) + "\n")
        self.out.flush()
        log(f"fault {kind}{' ' + inst if inst else ''} at "
            f"+{t - self.t_start:.1f}s, over after {t_end - t:.1f}s")

    def run(self):
        try:
            for offset, kind, idx in self.plan:
                while time.time() < self.t_start + offset:
                    if self.soak.stop.wait(0.05):
                        return
                self.inject(kind, idx)
        except Exception as e:
            self.error = repr(e)
            log(f"fault thread failed: {e!r}")
        finally:
            self.out.close()

    def inject(self, kind, idx):
        s = self.soak
        on_node = kind.startswith("pg-")
        inst = s.instances[idx] if idx is not None and not on_node else None
        node = self.nodes[idx] if on_node and idx is not None else self.pg
        name = inst.name if inst else \
            f"node{idx}" if on_node and idx is not None else None
        t = time.time()
        if kind == "kill":
            s.available[idx] = False
            inst.kill()
            time.sleep(1.0)
            inst.start()
            s.available[idx] = True
        elif kind == "stop":
            inst.stop_signal()
            time.sleep(0.3)
            s.available[idx] = False    # a balancer notices, a bit later
            time.sleep(LEASE_S + 1.5 - 0.3)
            inst.cont()
            s.available[idx] = True
        elif kind in ("pg-immediate", "pg-fast", "pg-long"):
            node.stop("fast" if kind == "pg-fast" else "immediate")
            time.sleep(LEASE_S + 1.0 if kind == "pg-long" else
                       0.5 if kind == "pg-fast" else 1.0)
            node.start()
        elif kind == "pg-terminate":
            n = node.psql(
                "select count(pg_terminate_backend(pid)) from "
                "pg_stat_activity where datname = 'soak' "
                "and pid <> pg_backend_pid()")
            self.note(kind, name, t, time.time(), backends=int(n or 0))
            return
        elif kind == "redis-kill":
            self.redis.kill()
            time.sleep(1.0)
            self.redis.start()
        elif kind == "redis-flush":
            self.redis.cmd("FLUSHALL")
        elif kind == "bouncer-kill":
            self.bouncer.kill()
            time.sleep(1.0)
            self.bouncer.start()
        elif kind in ("pg-pause", "redis-pause", "bouncer-pause"):
            server = {"pg-pause": node, "redis-pause": self.redis,
                      "bouncer-pause": self.bouncer}[kind]
            server.pause()
            try:
                time.sleep(REDIS_PAUSE_S if kind == "redis-pause" else
                           PG_PAUSE_S)
            finally:
                server.resume()
        self.note(kind, name, t, time.time())


# ---------------------------------------------------------------- the run

def binary_knows(flag):
    """Whether IDEMPROXY_BIN's --help names the option."""
    try:
        out = subprocess.run([IDEMPROXY_BIN, "--help"], capture_output=True,
                             timeout=10, env=clean_env())
    except (OSError, subprocess.TimeoutExpired):
        return False
    return flag.encode() in out.stdout + out.stderr


METRICS = ("idemproxy_redis_hits_total",
           "idemproxy_response_cache_hits_total",
           "idemproxy_completion_retries_total",
           "idemproxy_completion_failures_total",
           "idemproxy_store_errors_total")

STORE_DUMP = """
select json_build_object(
  'key', key, 'state', state, 'fp', encode(fingerprint, 'hex'),
  'status', status, 'owner', owner,
  'body_sha', case when body is null then null
                   else encode(sha256(body), 'hex') end,
  'exec', substring(convert_from(coalesce(body, ''::bytea), 'UTF8')
                    from '"exec":"(E[0-9]+)"'),
  'expires_at', extract(epoch from expires_at))
from idempotency_keys order by key
"""


def run(args):
    if not os.access(IDEMPROXY_BIN, os.X_OK):
        log(f"IDEMPROXY_BIN {IDEMPROXY_BIN} is not an executable: build "
            f"first (tests/run.sh builds build-test)")
        return 2
    seed = args.seed if args.seed is not None else \
        random.SystemRandom().randrange(1 << 31)
    rng = random.Random(seed)
    cycle = tuple(k for k in FAULT_CYCLE
                  if not (args.no_redis and k.startswith("redis-")))
    cycle += BOUNCER_FAULTS if args.pgbouncer else ()
    kinds = tuple(args.faults.split(",")) if args.faults else cycle
    for k in kinds:
        if k not in cycle:
            why = " (--no-redis)" if k in FAULT_CYCLE else \
                " (without --pgbouncer)" if k in BOUNCER_FAULTS else ""
            log(f"--faults: unknown fault {k!r}{why}; known: "
                f"{','.join(cycle)}")
            return 2
    plan = schedule(args.duration, args.instances, rng, kinds,
                    3 if args.citus else 1)
    workdir = tempfile.mkdtemp(prefix="idemproxy-soak-", dir="/tmp")
    rules = "lenient (--unknown-outcome release)" if args.lenient else \
        "strict"
    log(f"seed {seed}, {args.duration:g} s, {args.instances} instances, "
        f"{args.clients} clients, lease {LEASE_S:g}s, upstream timeout "
        f"{UPSTREAM_TIMEOUT_S:g}s, ttl {TTL_S:g}s, "
        f"{'PostgreSQL only' if args.no_redis else 'PostgreSQL + Redis'}"
        f"{' behind pgbouncer' if args.pgbouncer else ''}"
        f"{' on Citus (a coordinator, 2 workers)' if args.citus else ''}; "
        f"{rules} rules, release statuses "
        f"{','.join(map(str, RELEASE_STATUSES))}; history in {workdir}")
    log("fault schedule: " + ", ".join(
        f"+{o:g}s {k}{'' if i is None else ' i%d' % i}" for o, k, i in plan))
    extra = ([f"--faults={args.faults}"] if args.faults else []) + \
        (["--no-redis"] if args.no_redis else []) + \
        (["--pgbouncer"] if args.pgbouncer else []) + \
        (["--citus"] if args.citus else []) + \
        (["--lenient"] if args.lenient else [])
    env = f"SOAK_ARGS='{' '.join(extra)}' " if extra else ""
    log(f"reproduce: {env}tests/soak/run.sh {args.duration:g} {seed}")
    config = {"seed": seed, "duration_s": args.duration,
              "instances": args.instances, "clients": args.clients,
              "lease_s": LEASE_S, "upstream_timeout_s": UPSTREAM_TIMEOUT_S,
              "ttl_s": TTL_S, "wait_timeout_s": WAIT_TIMEOUT_S,
              "slots": SLOTS, "negative_control": args.negative_control,
              "redis": not args.no_redis, "pgbouncer": args.pgbouncer,
              "citus": args.citus,
              "binary": IDEMPROXY_BIN, "faults": list(kinds),
              "plan": plan, "release_statuses": list(RELEASE_STATUSES),
              "lenient": args.lenient,
              "unknown_outcome": "release" if args.lenient else "keep"}
    with open(os.path.join(workdir, "config.json"), "w") as f:
        json.dump(config, f, indent=1)

    pg = redis = up = bouncer = cluster = None
    nodes = None
    metrics = {}
    soak = Soak(args, workdir)
    problems = []
    try:
        if args.citus:
            # the coordinator is `pg` (the store dump, the URL); PostgreSQL
            # faults hit any node
            cluster = CitusCluster(workers=2)
            pg = cluster.coordinator
            nodes = cluster.nodes
            r = subprocess.run([IDEMPROXY_BIN, "migrate", "--store",
                                cluster.create_db("soak"), "--distributed",
                                "--ttl", f"{TTL_S:g}s"],
                               capture_output=True, text=True, timeout=120,
                               env=clean_env())
            if r.returncode != 0:
                raise RuntimeError(f"migrate --distributed: {r.stderr}")
        else:
            pg = PgServer()
            pg.psql("create database soak")
        if args.pgbouncer:
            bouncer = Bouncer(pg, "session", BOUNCER_POOL)
        if not args.no_redis:
            redis = RedisServer()
        up = Upstream(workdir)
        url = (bouncer or pg).url("soak")
        if args.negative_control:
            store = ["--store", "memory"]
        elif args.no_redis:
            store = ["--store", url]
        else:
            store = ["--store", url, "--redis", redis.url]
        flags = ["--upstream", up.url, "--workers", "2", *store,
                 "--lease", f"{LEASE_S:g}s",
                 "--upstream-timeout", f"{UPSTREAM_TIMEOUT_S:g}s",
                 "--ttl", f"{TTL_S:g}s", "--sweep-interval", "1s",
                 "--wait-timeout", f"{WAIT_TIMEOUT_S:g}s",
                 "--drain-timeout", "5s"]
        if binary_knows("--release-statuses"):
            # the list the checker uses, by construction (older binaries:
            # their default, the same list)
            flags += ["--release-statuses",
                      ",".join(map(str, RELEASE_STATUSES))]
        if args.lenient:
            flags += ["--unknown-outcome", "release"]
        for n in range(args.instances):
            inst = Instance(f"i{n}", workdir, flags)
            inst.start()
            soak.instances.append(inst)
            soak.available.append(True)
        for inst in soak.instances:
            inst.wait_ready()

        t_start = time.time()
        clients = [Client(soak, n, seed * 1000 + n)
                   for n in range(args.clients)]
        faults = Faults(soak, [] if args.negative_control else plan,
                        pg, redis, bouncer, t_start, nodes)
        for c in clients:
            c.start()
        faults.start()
        next_note = t_start + 10
        while time.time() < t_start + args.duration:
            time.sleep(0.2)
            if time.time() >= next_note:
                next_note += 10
                try:
                    st = up.stats()
                except OSError:
                    st = {}
                log(f"+{time.time() - t_start:.0f}s: "
                    f"{st.get('execs', '?')} executions")
        soak.stop.set()
        faults.join(30)
        for c in clients:
            c.join(CLIENT_TIMEOUT_S + 10)
            if c.is_alive():
                problems.append(f"{c.name} did not finish")
            if c.crash:
                problems.append(f"{c.name} crashed: {c.crash}")
        if faults.error:
            problems.append(f"fault injection failed: {faults.error}")
        # every instance up and running again before the end
        for i, inst in enumerate(soak.instances):
            if inst.stopped:
                inst.cont()
            if not inst.alive():
                inst.start()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and up.stats()["inflight"] > 0:
            time.sleep(0.1)
        time.sleep(1.0)     # settlements of the last executions
        if not args.negative_control:
            for n in nodes or [pg]:
                n.ensure_running()
            rows = pg.psql(STORE_DUMP, db="soak")
            with open(os.path.join(workdir, "store.jsonl"), "w") as f:
                f.write(rows + ("\n" if rows else ""))
        metrics = {}
        with open(os.path.join(workdir, "metrics.txt"), "w") as f:
            for inst in soak.instances:
                text = inst.metrics()
                f.write(f"# --- {inst.name} (incarnation "
                        f"{inst.incarnation}) ---\n{text}\n")
                for name in METRICS:
                    metrics[name] = metrics.get(name, 0) + \
                        (metric_value(text, name) or 0)
        for inst in soak.instances:
            rc = inst.terminate()
            if rc != 0:
                problems.append(f"{inst.name}: exit {rc} on SIGTERM")
        rc = up.stop()
        err = read_text(up.err_path)
        if rc != 0 or "Traceback" in err:
            problems.append(f"upstream exit {rc}: {err[-3000:]}")
        up = None
        for inst in soak.instances:
            for path, how in inst.logs:
                rep = sanitizer_report(read_text(path))
                if rep:
                    problems.append(f"{path} ({how}): sanitizer report "
                                    f"{rep}")
    finally:
        for inst in soak.instances:
            inst.force_stop()
        if up is not None:
            up.stop()
        if redis is not None:
            redis.shutdown()
        if bouncer is not None:
            bouncer.shutdown()
        if pg is not None:
            try:        # kept with the history (a failing run's evidence)
                for i, n in enumerate(nodes or [pg]):
                    shutil.copy(n.log_path, os.path.join(
                        workdir, f"pg{i if nodes else ''}.log"))
            except OSError:
                pass
            if cluster is not None:
                cluster.shutdown()
            else:
                pg.shutdown()

    h = check.load(workdir)
    ch = check.Checker(h)
    ch.run()
    # a proxy that answers nothing breaks no rule of the checker
    answered = sum(1 for r in h.reqs.values() if r.get("status") is not None)
    if answered < MIN_ANSWERED * len(h.reqs):
        problems.append(f"only {answered} of {len(h.reqs)} requests got a "
                        f"response (at least {MIN_ANSWERED:.0%} expected)")
    rep = ch.report()
    rep["seed"] = seed
    rep["duration_s"] = args.duration
    rep["problems"] = problems
    rep["metrics_since_last_start"] = metrics
    with open(os.path.join(workdir, "report.json"), "w") as f:
        json.dump(rep, f, indent=1, default=list)
    check.print_report(rep)
    log(f"{rep['counts'].get('requests', 0) / args.duration:.0f} requests/s;"
        f" instance metrics (summed, each since its last start): " +
        ", ".join(f"{k.replace('idemproxy_', '')} {v:g}"
                  for k, v in metrics.items()))
    for p in problems:
        log(f"PROBLEM: {p}")
    if args.negative_control:
        ok = not rep["ok"] and not problems
        log("negative control: the checker " +
            ("found the duplicates, as it must" if not rep["ok"] else
             "found NO violation without a shared store: checker broken"))
    else:
        ok = rep["ok"] and not problems
    if ok and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        log(f"history kept in {workdir}")
    log(f"{'PASS' if ok else 'FAIL'} (seed {seed})")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--instances", type=int, default=3)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--keep", action="store_true",
                    help="keep the history dir after a passing run")
    ap.add_argument("--negative-control", action="store_true")
    ap.add_argument("--lenient", action="store_true",
                    help="at-least-once: the proxies run with "
                    "--unknown-outcome release, and the checker accepts "
                    "the former reasons for a second execution (a release "
                    "after a drop, a 502/504 or a timeout; a takeover after "
                    "a kill, stop or store outage)")
    ap.add_argument("--no-redis", action="store_true",
                    help="PostgreSQL alone, no --redis (and no Redis faults)")
    ap.add_argument("--pgbouncer", action="store_true",
                    help="the instances reach PostgreSQL through a pgbouncer "
                    "(session mode); adds the faults " +
                    ",".join(BOUNCER_FAULTS))
    ap.add_argument("--citus", action="store_true",
                    help="the store is a Citus cluster (a coordinator and "
                    "two workers, the table distributed by migrate "
                    "--distributed); the PostgreSQL faults hit any node")
    ap.add_argument("--faults", help="only these fault kinds, comma-"
                    "separated (default: all of " + ",".join(FAULT_CYCLE) +
                    ")")
    args = ap.parse_args()
    # SIGTERM (a timeout of the caller) unwinds like Ctrl-C: every process
    # started is stopped by the finally blocks
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return run(args)
    except (SystemExit, KeyboardInterrupt):
        log("interrupted: every process it started is stopped; the "
            "history so far is kept (path above)")
        raise


if __name__ == "__main__":
    sys.exit(main())
