#!/usr/bin/python3
"""The soak's history checker: reads what the clients saw, what the
recording upstream executed and which faults were injected, and proves
idemproxy's guarantees from them (docs/reliability.md).

    check.py DIR          exit 0: no violation; 1: violations (listed,
                          each with the history of its key)

DIR holds what tests/soak/soak.py wrote:
  config.json      lease_s, upstream_timeout_s, ttl_s, seed, ...
  upstream.jsonl   one "exec" line per execution, one "end" line when it
                   was answered (tests/soak/upstream.py)
  clients*.jsonl   one line per client request: id, key, fp, inst, t0, t1,
                   status, replayed, exec (the execution its body names),
                   resp_sha, ptype (problem type slug), err
  faults.jsonl     one line per fault: kind, inst, t, t_end
  store.jsonl      (optional) the PostgreSQL table at the end of the run

Times are time.time() of the process that logged them; every process runs
on one machine, the same clock as PostgreSQL's now().

The properties:

 1. One execution per key, except for a documented reason. Executions of a
    key are ordered by the time the upstream read them; each one after the
    first needs, from its predecessor X:
      release  X's upstream answered 401/408/425/429/5xx, or dropped the
               connection, or the exchange may have run past
               --upstream-timeout (X's client got 502/504, or the upstream
               took that long), and the new execution came after that;
      takeover the same fingerprint, X's owner instance was SIGKILLed or
               SIGSTOPped, or PostgreSQL was down or its backends
               terminated, between X's request and X's completion window,
               and the new execution came at least --lease after X's
               request was sent (also the mirror case: X's owner stopped
               between its claim and forwarding, the other one took over
               and reached the upstream first);
      expiry   the new execution came --ttl after X was answered (or
               max(ttl, lease) after X's request when X's owner or the
               store failed, so that X may never have completed).
    A different fingerprint is only ever allowed after a release or an
    expiry: a takeover needs the same fingerprint.
 2. No request is executed twice (the proxy never re-sends a keyed
    request), and what the upstream executed is what the client sent
    (key, target, body).
 3. Every response that names an execution is byte-identical (status, body
    sha256, X-Soak-Exec header) to what that execution sent. A fresh one
    (no Idempotent-Replayed) is its own request's execution. A replay is
    of an execution of the same key and fingerprint whose response is
    storable (not 401/408/425/429/5xx), and not stale: no execution of
    the key that was certainly claimed after it had reached the upstream
    before the replay was sent.
 4. A request the proxy answered itself (409, 422, 503, ...) was never
    executed; a 422 came when another fingerprint had been sent for the
    key.
 5. (store.jsonl) Every completed row holds the response of an execution
    of its key and fingerprint that no later claim superseded.
"""
import glob
import json
import os
import sys
from collections import Counter, defaultdict

SLACK = 0.05            # s: log timestamps are taken just before/after
RELEASE_STATUSES = (401, 408, 425, 429)
EXCERPT_LIMIT = 40


def releases(status):
    return status in RELEASE_STATUSES or status >= 500


class History:
    def __init__(self, config, execs, reqs, faults, store=None):
        self.config = config
        self.lease = float(config["lease_s"])
        self.timeout = float(config["upstream_timeout_s"])
        self.ttl = float(config["ttl_s"])
        self.execs = execs          # exec id -> dict
        self.reqs = reqs            # request id -> dict
        self.faults = faults        # list of dicts
        self.store = store          # list of rows or None


def read_jsonl(path):
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except ValueError:
                # a line cut by a crash: only tolerated as the last one
                rest = f.read().strip()
                if rest:
                    raise ValueError(f"{path}:{n}: bad JSON line")
    return out


def load(d):
    with open(os.path.join(d, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    execs = {}
    for ev in read_jsonl(os.path.join(d, "upstream.jsonl")):
        if ev["ev"] == "exec":
            ev = dict(ev)
            ev.setdefault("t_end", None)
            ev.setdefault("sent", None)
            execs[ev["exec"]] = ev
        elif ev["ev"] == "end":
            e = execs.get(ev["exec"])
            if e is not None:
                e["t_end"] = ev["t"]
                e["sent"] = ev.get("sent")
                e["dropped"] = ev.get("dropped", False)
    reqs = {}
    for p in sorted(glob.glob(os.path.join(d, "clients*.jsonl"))):
        for r in read_jsonl(p):
            reqs[r["id"]] = r
    fp = os.path.join(d, "faults.jsonl")
    faults = read_jsonl(fp) if os.path.exists(fp) else []
    sp = os.path.join(d, "store.jsonl")
    store = read_jsonl(sp) if os.path.exists(sp) else None
    return History(config, execs, reqs, faults, store)


class Checker:
    def __init__(self, h):
        self.h = h
        self.violations = []
        self.reasons = Counter()        # second executions by reason
        self.seconds = []               # and each of them
        self.counts = Counter()
        self.by_key = defaultdict(list)
        self.execs_of_req = defaultdict(list)
        for e in h.execs.values():
            self.by_key[e["key"]].append(e)
            self.execs_of_req[e["req"]].append(e)
        for k in self.by_key:
            self.by_key[k].sort(key=lambda e: e["t"])
        self.reqs_by_key = defaultdict(list)
        for r in h.reqs.values():
            self.reqs_by_key[r["key"]].append(r)

    # ------------------------------------------------------------ helpers

    def violation(self, kind, key, msg, at=None):
        self.violations.append({"kind": kind, "key": key, "msg": msg,
                                "history": self.excerpt(key, at)})

    def excerpt(self, key, at=None):
        """The key's executions, requests and the faults around them, from
        a little before `at` (the violation's time) on."""
        ev = []
        for e in self.by_key.get(key, []):
            ev.append((e["t"], "upstream", (
                f"exec {e['exec']} req={e['req']} fp={e['fp'][:10]} "
                f"status={e['status']} delay={e['delay_ms']}ms "
                f"drop={e.get('drop')} end={_fmt(e.get('t_end'))} "
                f"sent={e.get('sent')}")))
        reqs = sorted(self.reqs_by_key.get(key, []), key=lambda r: r["t0"])
        for r in reqs:
            ev.append((r["t0"], "client", (
                f"req {r['id']} {r.get('kind')} inst={r.get('inst')} "
                f"fp={(r.get('fp') or '')[:10]} t1={_fmt(r.get('t1'))} -> "
                f"{r.get('status')} replayed={r.get('replayed')} "
                f"exec={r.get('exec')} {r.get('ptype') or ''} "
                f"{r.get('err') or ''}".rstrip())))
        if ev:
            lo = min(t for t, _, _ in ev) - self.h.lease
            hi = max(t for t, _, _ in ev) + self.h.lease
            for f in self.h.faults:
                if f["t"] <= hi and (f.get("t_end") or f["t"]) >= lo:
                    ev.append((f["t"], "fault", (
                        f"{f['kind']} {f.get('inst') or ''} until "
                        f"{_fmt(f.get('t_end'))}")))
        ev.sort(key=lambda x: x[0])
        if at is not None and len(ev) > EXCERPT_LIMIT:
            lo = at - 2 * self.h.lease - self.h.ttl
            first = next((i for i, x in enumerate(ev) if x[0] >= lo), 0)
            first = min(first, max(0, len(ev) - EXCERPT_LIMIT))
            if first:
                ev = [(ev[first][0], "...", f"{first} earlier")] + ev[first:]
        if len(ev) > EXCERPT_LIMIT:
            ev = ev[:EXCERPT_LIMIT] + [(ev[-1][0], "...",
                                        f"{len(ev) - EXCERPT_LIMIT} more")]
        return [f"{_fmt(t)} {who:8} {what}" for t, who, what in ev]

    def req_of(self, e):
        return self.h.reqs.get(e["req"])

    def t0(self, e):
        """When the request that led to execution e was sent (its claim
        came later); the upstream's time when that is unknown."""
        r = self.req_of(e)
        return r["t0"] if r else e["t"]

    def fault_hits(self, e, lo, hi):
        """Faults that can stop e's owner from extending or settling its
        claim within [lo, hi]: its instance killed or stopped, or
        PostgreSQL down or its backends terminated."""
        r = self.req_of(e)
        inst = r.get("inst") if r else None
        hits = []
        for f in self.h.faults:
            a, b = f["t"], f.get("t_end") or f["t"]
            k = f["kind"]
            if k in ("kill", "stop"):
                if f.get("inst") != inst:
                    continue
                if k == "kill":
                    b = a     # dead from a on; the kill itself is the event
            elif k.startswith("pg-"):
                if k == "pg-terminate":
                    b += 1.0  # reconnection
            else:
                continue      # Redis never justifies anything
            if a <= hi and b >= lo:
                hits.append(k)
        return hits

    def timeline(self, x, y):
        """x and y's times and the faults between, from x's request (+0)."""
        t0 = self.t0(x)
        r = self.req_of(x) or {}
        parts = [f"{x['exec']} ({r.get('inst')}) sent +0",
                 f"upstream {x['t'] - t0:+.2f}.."
                 f"{(x.get('t_end') or x['t']) - t0:+.2f}"]
        if r.get("status") is not None:
            parts.append(f"client got {r['status']} {r['t1'] - t0:+.2f}")
        for f in self.h.faults:
            a, b = f["t"], f.get("t_end") or f["t"]
            if a <= y["t"] and b >= t0 - 1.0 and \
                    not f["kind"].startswith("redis"):
                who = f" {f['inst']}" if f.get("inst") else ""
                parts.append(f"{f['kind']}{who} {a - t0:+.2f}..{b - t0:+.2f}")
        ry = self.req_of(y) or {}
        parts.append(f"{y['exec']} ({ry.get('inst')}) upstream "
                     f"{y['t'] - t0:+.2f}")
        return ", ".join(parts)

    def owner_time(self, x, t):
        """The earliest time >= t at which x's owner could have written a
        release it decided at t: after a SIGSTOP of its instance that
        covers t, never (None) when its instance was killed before t. A
        statement already on the wire commits without its sender, hence
        SLACK."""
        r = self.req_of(x)
        inst = r.get("inst") if r else None
        moved = True
        while moved:
            moved = False
            for f in self.h.faults:
                if f.get("inst") != inst or inst is None:
                    continue
                if f["kind"] == "kill" and \
                        self.t0(x) <= f["t"] <= t - SLACK:
                    return None
                if f["kind"] == "stop" and \
                        f["t"] + SLACK <= t < f["t_end"]:
                    t = f["t_end"]
                    moved = True
        return t

    def release_time(self, x):
        """(earliest time x's key may have been released, why) or None."""
        cands = self.release_cands(x)
        return min(cands) if cands else None

    def release_cands(self, x):
        """[(earliest time x's key may have been released, why)]."""
        r = self.req_of(x)
        cands = []
        if x.get("dropped") or x.get("drop"):
            cands.append((x.get("t_end") or x["t"], "drop"))
        if releases(x["status"]) and x.get("sent"):
            cands.append((x["t_end"], f"status {x['status']}"))
        if x.get("t_end") is not None and \
                x["t_end"] - x["t"] >= self.h.timeout - SLACK:
            cands.append((self.t0(x) + self.h.timeout, "upstream timeout"))
        if r and r.get("status") == 504 and r.get("ptype") == "upstream-timeout":
            cands.append((r["t0"] + self.h.timeout, "504"))
        if r and r.get("status") == 502 and \
                r.get("ptype") == "upstream-unavailable":
            cands.append((r["t0"], "502"))
        cands = [(self.owner_time(x, t), why) for t, why in cands]
        return sorted(c for c in cands if c[0] is not None)

    def takeover(self, x, y):
        """y took over x's claim: a reason string or None."""
        if x["fp"] != y["fp"]:
            return None
        t0 = self.t0(x)
        if y["t"] < t0 + self.h.lease - SLACK:
            return None
        # a fault after x's completion window cannot have kept it from
        # settling: x settles when answered, retrying while its lease lasts
        end = x.get("t_end") or y["t"]
        hits = self.fault_hits(x, t0, min(y["t"], end + self.h.lease))
        if not hits:
            return None
        return "takeover after " + "+".join(sorted(set(hits)))

    def expiry(self, x, y):
        if x.get("t_end") is not None and \
                y["t"] >= x["t_end"] + self.h.ttl - SLACK:
            return "expiry"
        t0 = self.t0(x)
        if y["t"] >= t0 + max(self.h.ttl, self.h.lease) - SLACK and \
                self.fault_hits(x, t0, y["t"]):
            return "expiry of an abandoned claim"
        return None

    def justify(self, x, y):
        """Why y (read by the upstream after x) may execute: a reason or
        None. When several hold, the first of: a release the upstream's
        own answer caused (a releasing status, a dropped connection), a
        release after the 502/504 x's client had already received, an
        expiry ttl after x was answered, a takeover, a release after a
        timeout or 502, the expiry of a claim abandoned by a fault."""
        cands = self.release_cands(x)
        for t, why in cands:
            if why.startswith(("status", "drop")) and y["t"] >= t - SLACK:
                return "release after " + why
        r = self.req_of(x)
        for t, why in cands:
            if why in ("502", "504") and \
                    y["t"] >= max(t, r["t1"]) - SLACK:
                return "release after " + why
        rel = cands[0] if cands else None
        ex = self.expiry(x, y)
        if ex == "expiry":
            return ex
        tk = self.takeover(x, y)
        if tk:
            return tk
        # mirror: y claimed first and its owner stalled before forwarding;
        # x took it over and reached the upstream first
        tk = self.takeover(y, x)
        if tk and self.t0(y) < x["t"]:
            return tk + " (claim forwarded late)"
        if rel is not None and y["t"] >= rel[0] - SLACK:
            return "release after " + rel[1]
        return ex

    # ------------------------------------------------------------ checks

    def check_executions(self):
        for key, execs in self.by_key.items():
            self.counts["keys executed"] += 1
            for i, y in enumerate(execs):
                if i == 0:
                    continue
                x = execs[i - 1]
                why = self.justify(x, y)
                if why is None:
                    kind = ("second fingerprint executed"
                            if x["fp"] != y["fp"] else
                            "duplicate execution")
                    self.violation(kind, key, (
                        f"{y['exec']} (req {y['req']}) executed after "
                        f"{x['exec']} (req {x['req']}) with no release, "
                        f"takeover or expiry to explain it"), at=y["t"])
                else:
                    self.reasons[why] += 1
                    self.seconds.append({"key": key, "reason": why,
                                         "first": x["exec"],
                                         "then": y["exec"],
                                         "gap_s": round(y["t"] - x["t"], 3),
                                         "timeline": self.timeline(x, y)})
                    if x["fp"] != y["fp"]:
                        self.counts["other fingerprint after " +
                                    why.split(" ")[0]] += 1

    def check_requests(self):
        for rid, es in self.execs_of_req.items():
            if len(es) > 1:
                self.violation("request executed twice", es[0]["key"], (
                    f"request {rid} reached the upstream {len(es)} times: "
                    f"{', '.join(e['exec'] for e in es)}"))
        for e in self.h.execs.values():
            r = self.req_of(e)
            if r is None:
                self.violation("execution of an unknown request", e["key"],
                               f"{e['exec']} names request {e['req']!r}, "
                               f"which no client sent")
                continue
            for f in ("key", "fp"):
                if r.get(f) != e.get(f):
                    self.violation("upstream got another request", e["key"],
                                   f"{e['exec']}: {f} {e.get(f)!r}, the "
                                   f"client sent {r.get(f)!r}")

    def check_responses(self):
        c = self.counts
        for r in self.h.reqs.values():
            c["requests"] += 1
            st = r.get("status")
            if st is None:
                c["requests without a response (connection error, "
                  "timeout)"] += 1
                continue
            name = r.get("exec")
            if name is not None:
                e = self.h.execs.get(name)
                if r.get("replayed"):
                    c["replays"] += 1
                else:
                    c["responses of their own execution"] += 1
                if e is None:
                    self.violation("response of an unknown execution",
                                   r["key"], f"{r['id']} got a body naming "
                                   f"{name}, which the upstream never ran")
                    continue
                if r.get("resp_sha") != e["resp_sha"] or \
                        st != e["status"] or r.get("exec_hdr") != name:
                    self.violation(
                        "response not byte-identical", r["key"],
                        f"{r['id']} got {st} sha {r.get('resp_sha')} "
                        f"X-Soak-Exec {r.get('exec_hdr')!r} for {name}, "
                        f"which sent {e['status']} sha {e['resp_sha']}")
                if r.get("replayed"):
                    self.check_replay(r, e)
                elif e["req"] != r["id"]:
                    self.violation(
                        "another request's response, not marked replayed",
                        r["key"], f"{r['id']} got {name}'s response (req "
                        f"{e['req']}) without Idempotent-Replayed")
                continue
            if r.get("replayed"):
                ran = ", ".join(
                    f"{e['exec']} answered {e['status']}"
                    f"{'' if e.get('sent') else ' (not sent)'}"
                    for e in self.by_key.get(r["key"], [])
                    if e["t"] < r["t0"]) or "none"
                self.violation(
                    "replay that is no execution's response", r["key"],
                    f"{r['id']}: {st} {r.get('ptype') or ''} with "
                    f"Idempotent-Replayed: the store holds a response no "
                    f"execution sent (executions of the key before it: "
                    f"{ran}; a stalled proxy storing a whole response as "
                    f"cut short: tests/soak/stall_repro.py)", at=r["t0"])
            c[f"proxy answered {st} {r.get('ptype') or ''}".rstrip()] += 1
            if st not in (502, 504) and self.execs_of_req.get(r["id"]):
                self.violation(
                    "executed but answered as not executed", r["key"],
                    f"{r['id']} got {st} {r.get('ptype')} but reached the "
                    f"upstream as "
                    f"{self.execs_of_req[r['id']][0]['exec']}")
            if st == 422 and r.get("ptype") == "idempotency-key-mismatch":
                others = [q for q in self.reqs_by_key[r["key"]]
                          if q.get("fp") != r.get("fp") and
                          q["t0"] < r["t1"]]
                if not others:
                    self.violation("422 with no other fingerprint", r["key"],
                                   f"{r['id']} got 422 but no other body was "
                                   f"ever sent for the key before")

    def later_claims(self, e, before):
        """Executions of e's key certainly claimed after e was (their
        request was sent after e reached the upstream) that reached the
        upstream before `before`."""
        return [o for o in self.by_key[e["key"]]
                if o is not e and self.t0(o) > e["t"] + SLACK and
                o["t"] < before - SLACK]

    def check_replay(self, r, e):
        if e["key"] != r["key"] or e["fp"] != r.get("fp"):
            self.violation("replay of another request", r["key"],
                           f"{r['id']} (fp {r.get('fp', '')[:10]}) got a "
                           f"replay of {e['exec']} (key {e['key']}, fp "
                           f"{e['fp'][:10]})")
            return
        if releases(e["status"]) or e.get("drop"):
            self.violation("replay of a released response", r["key"],
                           f"{r['id']} got a replay of {e['exec']} whose "
                           f"status {e['status']} releases the key")
        stale = self.later_claims(e, r["t0"])
        if stale:
            self.violation("stale replay", r["key"], (
                f"{r['id']} sent at {_fmt(r['t0'])} got a replay of "
                f"{e['exec']}, but {stale[0]['exec']} had claimed the key "
                f"after it and reached the upstream at "
                f"{_fmt(stale[0]['t'])}"), at=r["t0"])

    def check_store(self):
        if self.h.store is None:
            return
        c = self.counts
        for row in self.h.store:
            c[f"store rows {row['state']}"] += 1
            if row["state"] != "completed" or row.get("exec") is None:
                continue
            e = self.h.execs.get(row["exec"])
            if e is None:
                self.violation("stored response of an unknown execution",
                               row["key"], f"row {row['key']} holds "
                               f"{row['exec']}")
                continue
            if e["key"] != row["key"] or e["fp"] != row["fp"] or \
                    e["status"] != row["status"] or \
                    e["resp_sha"] != row["body_sha"]:
                self.violation("stored response differs", row["key"], (
                    f"row {row['key']} fp {row['fp'][:10]} status "
                    f"{row['status']} sha {row['body_sha']} holds "
                    f"{e['exec']} (key {e['key']} fp {e['fp'][:10]} status "
                    f"{e['status']} sha {e['resp_sha']})"))
            if releases(e["status"]):
                self.violation("stored a releasing status", row["key"],
                               f"row {row['key']} holds {e['exec']} with "
                               f"status {e['status']}")
            later = self.later_claims(e, float("inf"))
            if later:
                self.violation("store holds a superseded execution",
                               row["key"], f"row {row['key']} holds "
                               f"{e['exec']}, but {later[0]['exec']} "
                               f"claimed the key after it")

    def run(self):
        self.check_requests()
        self.check_executions()
        self.check_responses()
        self.check_store()
        self.counts["executions"] = len(self.h.execs)
        self.counts["second executions"] = sum(self.reasons.values())
        return not self.violations

    def report(self):
        faults = Counter(f["kind"] for f in self.h.faults)
        return {"ok": not self.violations,
                "counts": dict(sorted(self.counts.items())),
                "second_executions": dict(sorted(self.reasons.items())),
                "faults": dict(sorted(faults.items())),
                "violations": Counter(v["kind"] for v in self.violations),
                "violation_list": self.violations,
                "second_execution_list": self.seconds}


def _fmt(t):
    if t is None:
        return "-"
    return f"{t:.3f}"


def print_report(rep, out=sys.stdout, max_violations=10):
    c = rep["counts"]
    w = out.write
    w("soak check: requests {} ({} replays, {} answered by their own "
      "execution); executions {} over {} keys, {} of them second "
      "executions\n".format(
          c.get("requests", 0), c.get("replays", 0),
          c.get("responses of their own execution", 0),
          c.get("executions", 0), c.get("keys executed", 0),
          c.get("second executions", 0)))
    for k, v in c.items():
        if k not in ("requests", "replays", "executions", "keys executed",
                     "second executions",
                     "responses of their own execution"):
            w(f"  {k}: {v}\n")
    w("second executions by reason:\n")
    for k, v in rep["second_executions"].items():
        w(f"  {k}: {v}\n")
    for sx in rep.get("second_execution_list", []):
        if sx["reason"].startswith("takeover"):
            w(f"  {sx['reason']}, key {sx['key']}: {sx['timeline']}\n")
    w("faults injected: " + ", ".join(
        f"{k} {v}" for k, v in rep["faults"].items()) + "\n")
    if rep["ok"]:
        w("soak check: PASS, no violation\n")
        return
    w("soak check: FAIL, violations: " + ", ".join(
        f"{k} {v}" for k, v in rep["violations"].items()) + "\n")
    for v in rep["violation_list"][:max_violations]:
        w(f"\n[{v['kind']}] key {v['key']}: {v['msg']}\n")
        for line in v["history"]:
            w(f"    {line}\n")
    more = len(rep["violation_list"]) - max_violations
    if more > 0:
        w(f"\n... {more} more in report.json\n")


def main(argv):
    if len(argv) != 2:
        sys.stderr.write("usage: check.py DIR\n")
        return 2
    h = load(argv[1])
    ch = Checker(h)
    ch.run()
    rep = ch.report()
    with open(os.path.join(argv[1], "report.json"), "w",
              encoding="utf-8") as f:
        json.dump(rep, f, indent=1, default=list)
    print_report(rep)
    return 0 if rep["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
