#!/usr/bin/python3
"""The soak's history checker: reads what the clients saw, what the
recording upstream executed and which faults were injected, and proves
idemproxy's guarantees from them (docs/reliability.md).

    check.py [--strict|--lenient] DIR
                          exit 0: no violation; 1: violations (listed,
                          each with the history of its key). The rules
                          are strict unless config.json says "lenient"
                          (soak.py --lenient) or --lenient is given.

DIR holds what tests/soak/soak.py wrote:
  config.json      lease_s, upstream_timeout_s, ttl_s, release_statuses,
                   lenient, seed, ...
  upstream.jsonl   one "exec" line per execution, one "end" line when it
                   was answered, dropped or cut (tests/soak/upstream.py)
  clients*.jsonl   one line per client request: id, key, fp, inst, t0, t1,
                   status, replayed, exec (the execution its body names),
                   resp_sha, ptype (problem type slug), err
  faults.jsonl     one line per fault: kind, inst, t, t_end
  store.jsonl      (optional) the PostgreSQL table at the end of the run

Times are time.time() of the process that logged them; every process runs
on one machine, the same clock as PostgreSQL's now().

The rule (DESIGN.md §1 items 7-10): a request that may have reached the
upstream is never sent to it again. The properties:

 1. One execution per key. Executions of a key are ordered by the time
    the upstream read them; each one after the first needs, from its
    predecessor X, one of:
      release  X's upstream sent a releasing status line (config
               release_statuses, default 500,503,401,408,425,429; the
               body in full or cut short) and the new execution came
               after that answer (and after X's owner
               could act on it: not while it was SIGSTOPped, never if it
               was killed before the answer);
      expiry   the new execution came --ttl after X was answered (dropped
               or cut included: the unknown outcome, or the cut's stored
               problem, expires ttl later), or, when X's owner may never have settled it
               (its instance killed or stopped, PostgreSQL or pgbouncer
               down, or the upstream never ended), max(ttl, lease) after
               X's request was sent (the in-flight record's expiry) --
               lease + ttl once a duplicate was answered that the key's
               outcome was unknown (the record had become unknown).
    Nothing else: not a kill, a stop or a store outage (a claim whose
    owner stopped extending it is an unknown outcome), not a dropped
    connection or one cut after a status that does not release (stored
    as a problem, docs/protocol.md), not a 502/504 from the upstream
    (stored), not an
    upstream slower than --upstream-timeout (the late response is
    stored). A different fingerprint follows the same rule.
    --lenient (at-least-once, the proxies run with --unknown-outcome
    release) also accepts the former reasons: a release after a dropped
    connection, a 502/504 the client got, an upstream slower than the
    timeout; a takeover (the same fingerprint, at least --lease after X's
    request, X's owner killed or stopped or the store down in X's lease
    window, or the mirror case). In strict mode each second execution
    they would have explained is still a violation, labelled with that
    reason (report "forbidden_by_lenient_reason").
 2. No request is executed twice (the proxy never re-sends a keyed
    request), and what the upstream executed is what the client sent
    (key, target, body).
 3. Every response that names an execution is byte-identical (status, body
    sha256, X-Soak-Exec header) to what that execution sent. A fresh one
    (no Idempotent-Replayed) is its own request's execution. A replay is
    of an execution of the same key and fingerprint that answered in full
    with a storable status (not a releasing one; 502/504 from the
    upstream are storable), and not stale: no execution of the key that
    was certainly claimed after it had reached the upstream before the
    replay was sent. A replay that names no execution is only a
    502 outcome-unknown, after another request of the key and
    fingerprint was sent, or the 502/504 problem of a response the
    upstream cut after its status (docs/protocol.md: "executed, its
    response lost"); any other replayed problem is a violation.
 4. A request the proxy answered itself (409, 422, 503, ...) was never
    executed; only a live 502 outcome-unknown or 504 upstream-timeout may
    have been (also a 502 upstream-unavailable with --lenient: a 502 for
    a request that reached the upstream says "never sent" otherwise). A
    422 came when another fingerprint had been sent for the key.
 5. (store.jsonl) Every completed row holds the response of an execution
    of its key and fingerprint, with a storable status, that no later
    claim superseded, or the problem of a response cut short. Rows in
    state 'unknown' (the outcome-unknown problem) and 'in_flight' are
    counted only.
"""
import glob
import json
import os
import sys
from collections import Counter, defaultdict

SLACK = 0.05            # s: log timestamps are taken just before/after
DEFAULT_RELEASE_STATUSES = (500, 503, 401, 408, 425, 429)
UNKNOWN = "outcome-unknown"
# live answers of the proxy that may come after the request reached the
# upstream: the outcome is unknown, or the upstream is slower than
# --upstream-timeout (the exchange goes on, its late response is stored)
MAY_HAVE_EXECUTED = ((502, UNKNOWN), (504, "upstream-timeout"))
# what a response cut short after its status is stored as (docs/protocol.md:
# "executed, and its response is lost"): a problem, never a second execution
CUT_PROBLEMS = ((502, "upstream-unavailable"), (504, "upstream-timeout"))
EXCERPT_LIMIT = 40


def old_releases(status):
    """What the proxy released before the strict rule: 401, 408, 425, 429
    and every 5xx (--on-upstream-error release). Labels only."""
    return status in (401, 408, 425, 429) or status >= 500


def no_answer(e):
    """The upstream never answered e in full: dropped or cut."""
    return bool(e.get("drop") or e.get("dropped") or e.get("cut"))


class History:
    def __init__(self, config, execs, reqs, faults, store=None):
        self.config = config
        self.lease = float(config["lease_s"])
        self.timeout = float(config["upstream_timeout_s"])
        self.ttl = float(config["ttl_s"])
        self.release_statuses = frozenset(
            int(s) for s in config.get("release_statuses",
                                       DEFAULT_RELEASE_STATUSES))
        self.lenient = bool(config.get("lenient", False))
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
            # planned: cut only once the end line says the head went out
            ev["cut_planned"] = ev.pop("cut", False)
            execs[ev["exec"]] = ev
        elif ev["ev"] == "end":
            e = execs.get(ev["exec"])
            if e is not None:
                e["t_end"] = ev["t"]
                e["sent"] = ev.get("sent")
                e["dropped"] = ev.get("dropped", False)
                e["cut"] = ev.get("cut", False)
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
    def __init__(self, h, lenient=None):
        self.h = h
        self.lenient = h.lenient if lenient is None else lenient
        self.violations = []
        self.reasons = Counter()        # second executions by reason
        self.forbidden = Counter()      # strict: violations by the reason
        #                                 the lenient rules would give
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
                f"drop={e.get('drop')}{' cut' if e.get('cut') else ''} "
                f"end={_fmt(e.get('t_end'))} "
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
        PostgreSQL (or the pgbouncer in front of it) down, or its backends
        terminated."""
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
            elif k.startswith(("pg-", "bouncer-")):
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

    def releases(self, status):
        return status in self.h.release_statuses

    def status_release(self, x, releases=None):
        """When x's own answer may have released its key (a releasing
        status line sent, the body in full or cut short after it, that x's
        owner could act on), or None."""
        releases = releases or self.releases
        if not releases(x["status"]) or x.get("t_end") is None or \
                not (x.get("sent") or x.get("cut")) or x.get("drop"):
            return None
        return self.owner_time(x, x["t_end"])

    def may_be_abandoned(self, x, y):
        """x's owner may never have settled its record before y: it never
        got an answer from the upstream, or a fault of its instance or of
        the store hit its request's window (faults after its completion
        window cannot have kept it from settling: it settles when
        answered)."""
        if x.get("t_end") is None:
            return True
        t0 = self.t0(x)
        return bool(self.fault_hits(x, t0, min(y["t"],
                                               x["t_end"] + self.h.lease)))

    def found_unknown(self, x, y):
        """A duplicate of x (same key and fingerprint, sent after x's
        request) was answered, before y and before x's in-flight record
        could expire, that the outcome is unknown: x's record had become
        unknown, and lives ttl from then on."""
        t0 = self.t0(x)
        hi = min(y["t"], t0 + max(self.h.ttl, self.h.lease)) + SLACK
        return any(q.get("status") == 502 and q.get("ptype") == UNKNOWN and
                   q.get("fp") == x["fp"] and q["t0"] > t0 and
                   q.get("t1") is not None and q["t1"] <= hi
                   for q in self.reqs_by_key.get(x["key"], []))

    def expiry(self, x, y):
        """The earliest expiry the history allows: ttl after x's answer
        (when its owner lived to settle it), or the abandoned record's."""
        if x.get("t_end") is not None and \
                y["t"] >= x["t_end"] + self.h.ttl - SLACK and \
                self.owner_time(x, x["t_end"]) is not None:
            return "expiry"
        if not self.may_be_abandoned(x, y):
            return None
        t0 = self.t0(x)
        t_exp = t0 + (self.h.lease + self.h.ttl if self.found_unknown(x, y)
                      else max(self.h.ttl, self.h.lease))
        if y["t"] >= t_exp - SLACK:
            return "expiry of an abandoned claim"
        return None

    def strict_reason(self, x, y):
        """Why y (read by the upstream after x) may execute under the
        strict rule: a release by x's own answer, or an expiry; or None."""
        t = self.status_release(x)
        if t is not None and y["t"] >= t - SLACK:
            return f"release after status {x['status']}"
        return self.expiry(x, y)

    # ---------------------------------------------------- the lenient rules
    # (--lenient, proxies with --unknown-outcome release); in strict mode
    # they only label a forbidden second execution

    def release_cands(self, x, releases):
        """[(earliest time x's key may have been released, why)]."""
        r = self.req_of(x)
        cands = []
        if no_answer(x):
            cands.append((x.get("t_end") or x["t"],
                          "cut" if x.get("cut") else "drop"))
        t = self.status_release(x, releases)
        if t is not None:
            cands.append((t, f"status {x['status']}"))
        if x.get("t_end") is not None and \
                x["t_end"] - x["t"] >= self.h.timeout - SLACK:
            cands.append((self.t0(x) + self.h.timeout, "upstream timeout"))
        if r and r.get("status") == 504 and r.get("ptype") == "upstream-timeout":
            cands.append((r["t0"] + self.h.timeout, "504"))
        if r and r.get("status") == 502 and \
                r.get("ptype") in ("upstream-unavailable", UNKNOWN):
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

    def lenient_reason(self, x, y, releases=None):
        """Why y may execute under the lenient rules: a reason or None.
        When several hold, the first of: a release the upstream's own
        answer caused (a releasing status, a dropped or cut connection), a
        release after the 502/504 x's client had already received, an
        expiry ttl after x was answered, a takeover, a release after a
        timeout or 502, the expiry of a claim abandoned by a fault."""
        cands = self.release_cands(x, releases or self.releases)
        for t, why in cands:
            if why.startswith(("status", "drop", "cut")) and \
                    y["t"] >= t - SLACK:
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

    def justify(self, x, y):
        why = self.strict_reason(x, y)
        if why is None and self.lenient:
            why = self.lenient_reason(x, y)
        return why

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
                    # what the proxy did before the strict rule (any 5xx
                    # released) would have explained it, if anything
                    label = None if self.lenient else \
                        self.lenient_reason(x, y, old_releases)
                    if not self.lenient:
                        self.forbidden[label or "no reason at all"] += 1
                    self.violation(kind, key, (
                        f"{y['exec']} (req {y['req']}) executed after "
                        f"{x['exec']} (req {x['req']}) with "
                        + ("no release, takeover or expiry to explain it"
                           if self.lenient else
                           "no release by a releasing status and no expiry"
                           + (f" (lenient rules: {label})" if label else
                              " (not even under the lenient rules)")) +
                        f"; {self.timeline(x, y)}"), at=y["t"])
                    self.violations[-1]["lenient_reason"] = label
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
            pt = r.get("ptype")
            executed = self.execs_of_req.get(r["id"])
            if r.get("replayed"):
                c[f"replayed {st} {pt or ''}".rstrip()] += 1
                if st == 502 and pt == UNKNOWN:
                    self.check_unknown_replay(r)
                elif (st, pt) in CUT_PROBLEMS and \
                        self.cut_before(r["key"], r.get("fp"), r["t1"]):
                    c["replays of a response cut short (its problem)"] += 1
                else:
                    self.violation(
                        "replay that is no execution's response", r["key"],
                        f"{r['id']}: {st} {pt or ''} with "
                        f"Idempotent-Replayed: the store holds a response "
                        f"no execution sent, and not the outcome-unknown "
                        f"problem (executions of the key before it: "
                        f"{self.ran_before(r)}; a stalled proxy storing a "
                        f"whole response as cut short: "
                        f"tests/soak/stall_repro.py)", at=r["t0"])
            else:
                c[f"proxy answered {st} {pt or ''}".rstrip()] += 1
            if executed and (r.get("replayed") or
                             (st, pt) not in MAY_HAVE_EXECUTED):
                what = executed[0]["exec"]
                if st not in (502, 504) or r.get("replayed"):
                    self.violation(
                        "executed but answered as not executed", r["key"],
                        f"{r['id']} got {st} {pt}"
                        f"{' replayed' if r.get('replayed') else ''} but "
                        f"reached the upstream as {what}")
                elif not self.lenient:
                    self.violation(
                        "executed but answered as never sent", r["key"],
                        f"{r['id']} got {st} {pt}, which says the request "
                        f"never left, but it reached the upstream as "
                        f"{what} (a request that may have reached the "
                        f"upstream is answered 502 {UNKNOWN} or 504 "
                        f"upstream-timeout)", at=r["t0"])
            if st == 422 and r.get("ptype") == "idempotency-key-mismatch":
                others = [q for q in self.reqs_by_key[r["key"]]
                          if q.get("fp") != r.get("fp") and
                          q["t0"] < r["t1"]]
                if not others:
                    self.violation("422 with no other fingerprint", r["key"],
                                   f"{r['id']} got 422 but no other body was "
                                   f"ever sent for the key before")

    def ran_before(self, r):
        return ", ".join(
            f"{e['exec']} answered {e['status']}"
            f"{'' if e.get('sent') else ' (not sent)'}"
            for e in self.by_key.get(r["key"], [])
            if e["t"] < r["t0"]) or "none"

    def cut_before(self, key, fp, before=float("inf")):
        """An execution of the key and fingerprint that the upstream cut
        after its status line, read before `before` (a replay's answer: a
        duplicate may have waited for it)."""
        return any(e.get("cut") and e["fp"] == fp and e["t"] < before
                   for e in self.by_key.get(key, []))

    def check_unknown_replay(self, r):
        """A replayed 502 outcome-unknown names no execution: some request
        of the key and fingerprint claimed it before (and may or may not
        have reached the upstream)."""
        before = [q for q in self.reqs_by_key[r["key"]]
                  if q["id"] != r["id"] and q.get("fp") == r.get("fp") and
                  q["t0"] < (r.get("t1") or r["t0"])]
        if not before:
            self.violation(
                "unknown outcome replayed before any request", r["key"],
                f"{r['id']} got a replayed 502 {UNKNOWN}, but no other "
                f"request of the key and its fingerprint had been sent",
                at=r["t0"])

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
        if no_answer(e):
            self.violation("replay of an execution that never answered",
                           r["key"], f"{r['id']} got a replay of "
                           f"{e['exec']}, which was dropped or cut")
        elif self.releases(e["status"]):
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
            if row["state"] != "completed":
                continue        # in_flight, or 'unknown' (its problem)
            if row.get("exec") is None and \
                    row.get("status") in (502, 504) and \
                    self.cut_before(row["key"], row.get("fp")):
                continue        # the problem of a response cut short
            if row.get("exec") is None:
                self.violation(
                    "completed row without an execution's response",
                    row["key"], f"row {row['key']} is completed with status "
                    f"{row.get('status')} and a body that names no "
                    f"execution (an outcome that is not an execution's "
                    f"response is state 'unknown')")
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
            if self.releases(e["status"]) or no_answer(e):
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
                "rules": "lenient" if self.lenient else "strict",
                "release_statuses": sorted(self.h.release_statuses),
                "forbidden_by_lenient_reason":
                    dict(self.forbidden.most_common()),
                "faults": dict(sorted(faults.items())),
                "violations": Counter(v["kind"] for v in self.violations),
                "violation_list": self.violations,
                "second_execution_list": self.seconds}


def _fmt(t):
    if t is None:
        return "-"
    return f"{t:.3f}"


def print_report(rep, out=None, max_violations=10):
    out = out or sys.stdout
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
    w(f"rules: {rep.get('rules', 'strict')}; release statuses "
      f"{rep.get('release_statuses', '?')}\n")
    w("second executions by reason:\n")
    for k, v in rep["second_executions"].items():
        w(f"  {k}: {v}\n")
    for sx in rep.get("second_execution_list", []):
        if sx["reason"].startswith("takeover"):
            w(f"  {sx['reason']}, key {sx['key']}: {sx['timeline']}\n")
    if rep.get("forbidden_by_lenient_reason"):
        w("second executions the strict rule forbids, by the reason the "
          "lenient rules would give:\n")
        for k, v in rep["forbidden_by_lenient_reason"].items():
            w(f"  {k}: {v}\n")
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
    args = argv[1:]
    lenient = None
    if args and args[0] in ("--strict", "--lenient"):
        lenient = args.pop(0) == "--lenient"
    if len(args) != 1:
        sys.stderr.write("usage: check.py [--strict|--lenient] DIR\n")
        return 2
    d = args[0]
    h = load(d)
    ch = Checker(h, lenient)
    ch.run()
    rep = ch.report()
    with open(os.path.join(d, "report.json"), "w",
              encoding="utf-8") as f:
        json.dump(rep, f, indent=1, default=list)
    print_report(rep)
    return 0 if rep["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
