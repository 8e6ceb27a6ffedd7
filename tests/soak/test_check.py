#!/usr/bin/python3
"""The checker's own tests: hand-made histories with and without each
violation it exists to find (a checker that cannot fail proves nothing).

    /usr/bin/python3 tests/soak/test_check.py
    /usr/bin/python3 -m pytest tests/soak/test_check.py

The strict rule (the default): a second execution of a key follows only a
releasing status of its predecessor's upstream, or an expiry. Every reason
the lenient rules (--lenient) accept besides is a case here that the
strict checker must reject.
"""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import check  # noqa: E402

CONFIG = {"lease_s": 3.0, "upstream_timeout_s": 2.0, "ttl_s": 10.0}
FP1 = "a" * 64
FP2 = "b" * 64
UNKNOWN = "outcome-unknown"


class H:
    """A history under construction: req() is a client request, ex() the
    upstream executing it, fault() a fault."""

    def __init__(self, **config):
        self.config = dict(CONFIG, **config)
        self.execs = {}
        self.reqs = {}
        self.faults = []
        self.store = None

    def req(self, rid, t0, t1, status, key="k", fp=FP1, inst="i0",
            exec=None, replayed=False, ptype=None, resp_sha=None,
            exec_hdr=None):
        r = {"id": rid, "key": key, "fp": fp, "inst": inst, "t0": t0,
             "t1": t1, "status": status, "replayed": replayed,
             "exec": exec, "ptype": ptype, "kind": "seq", "err": None}
        if exec is not None:
            e = self.execs.get(exec)
            r["resp_sha"] = resp_sha or (e["resp_sha"] if e else "x")
            r["exec_hdr"] = exec_hdr or exec
        self.reqs[rid] = r
        return r

    def ex(self, eid, rid, t, t_end, status=200, key="k", fp=FP1,
           drop=False, sent=True, cut=False):
        self.execs[eid] = {"exec": eid, "req": rid, "t": t, "t_end": t_end,
                           "key": key, "fp": fp, "status": status,
                           "delay_ms": 0, "drop": drop,
                           "dropped": drop or cut,
                           "sent": sent and not drop and not cut,
                           "resp_sha": "sha-" + eid}
        if cut:
            self.execs[eid]["cut"] = True

    def then(self, eid, rid, t, t0=None, inst="i0", fp=FP1):
        """Request rid, sent at t0 (just before t unless given), executed
        at t as eid and answered 200 by it."""
        self.ex(eid, rid, t, t + 0.01, fp=fp)
        self.req(rid, t - 0.01 if t0 is None else t0, t + 0.02, 200, fp=fp,
                 inst=inst, exec=eid)

    def fault(self, kind, t, t_end=None, inst=None):
        self.faults.append({"kind": kind, "inst": inst, "t": t,
                            "t_end": t if t_end is None else t_end})

    def check(self, lenient=None):
        c = check.Checker(check.History(self.config, self.execs, self.reqs,
                                        self.faults, self.store), lenient)
        c.run()
        return c

    def kinds(self, lenient=None):
        return sorted({v["kind"] for v in self.check(lenient).violations})


def executed_once():
    h = H()
    h.then("E1", "r1", 100.01)
    h.req("r2", 101.0, 101.01, 200, exec="E1", replayed=True)
    return h


def answered(status, **config):
    """E1 read and answered `status` in full."""
    h = H(**config)
    h.ex("E1", "r1", 100.01, 100.02, status=status)
    h.req("r1", 100.0, 100.03, status, exec="E1")
    return h


def stopped_owner_503():
    """E1's owner (i0) is stopped from 100.1 to 104.5; the upstream
    answers 503 at 100.5, the owner can release only once resumed."""
    h = H()
    h.fault("stop", 100.1, 104.5, inst="i0")
    h.ex("E1", "r1", 100.01, 100.5, status=503)
    h.req("r1", 100.0, 104.6, 503, exec="E1")
    return h


def dropped_once(**config):
    """E1 read, then the connection dropped: an unknown outcome."""
    h = H(**config)
    h.ex("E1", "r1", 100.01, 100.02, drop=True)
    h.req("r1", 100.0, 100.03, 502, ptype=UNKNOWN)
    return h


def owner_killed():
    """E1 read, its owner (i0) killed before the answer."""
    h = H()
    h.ex("E1", "r1", 100.01, 100.5, sent=False)
    h.req("r1", 100.0, 100.2, None)
    h.fault("kill", 100.2, inst="i0")
    return h


# ------------------------------------------ second executions the rules allow

class TestAllowed(unittest.TestCase):
    def test_clean_history_passes(self):
        c = executed_once().check()
        self.assertEqual(c.violations, [])
        self.assertEqual(c.counts["replays"], 1)

    def test_release_after_each_default_releasing_status(self):
        for status in (500, 503, 401, 408, 425, 429):
            with self.subTest(status=status):
                h = answered(status)
                h.then("E2", "r2", 100.5)
                c = h.check()
                self.assertEqual(c.violations, [])
                self.assertEqual(dict(c.reasons),
                                 {f"release after status {status}": 1})

    def test_release_after_a_releasing_status_cut_short(self):
        """The status line said 503; the body was cut: the app did not act
        (docs/protocol.md: released)."""
        h = H()
        h.ex("E1", "r1", 100.01, 100.02, status=503, cut=True)
        h.req("r1", 100.0, 100.03, None)
        h.then("E2", "r2", 100.5)
        c = h.check()
        self.assertEqual(c.violations, [])
        self.assertEqual(dict(c.reasons), {"release after status 503": 1})

    def test_release_statuses_come_from_the_config(self):
        """--release-statuses 409 (or --on-upstream-error keep's list): a
        409 releases, a 503 is stored."""
        for status, ok in ((409, True), (503, False)):
            with self.subTest(status=status):
                h = answered(status, release_statuses=[409])
                h.then("E2", "r2", 100.5)
                self.assertEqual(h.kinds(),
                                 [] if ok else ["duplicate execution"])

    def test_other_fingerprint_after_release(self):
        h = answered(503)
        h.then("E2", "r2", 100.5, fp=FP2)
        c = h.check()
        self.assertEqual(c.violations, [])
        self.assertEqual(c.counts["other fingerprint after release"], 1)

    def test_release_from_a_stopped_owner_after_it_resumed(self):
        h = stopped_owner_503()
        h.then("E2", "r2", 104.7, t0=101.0, inst="i1")
        self.assertEqual(h.check().violations, [])

    def test_expiry(self):
        h = executed_once()
        h.then("E2", "r3", 110.03, t0=110.0, fp=FP2)  # ttl after 100.02
        c = h.check()
        self.assertEqual(c.violations, [])
        self.assertEqual(dict(c.reasons), {"expiry": 1})

    def test_expiry_of_an_unknown_outcome(self):
        """A drop is an unknown outcome from then on: ttl later the key is
        new."""
        h = dropped_once()
        h.req("r2", 101.0, 101.01, 502, ptype=UNKNOWN, replayed=True)
        h.then("E2", "r3", 110.03, t0=110.0)
        c = h.check()
        self.assertEqual(c.violations, [])
        self.assertEqual(dict(c.reasons), {"expiry": 1})

    def test_expiry_of_an_abandoned_claim(self):
        """The owner was killed before it could settle: the in-flight
        record expires max(ttl, lease) after its claim."""
        h = owner_killed()
        h.then("E2", "r2", 110.05, t0=110.0, inst="i1")
        c = h.check()
        self.assertEqual(c.violations, [])
        self.assertEqual(dict(c.reasons),
                         {"expiry of an abandoned claim": 1})

    def test_expiry_of_a_claim_found_unknown(self):
        """A duplicate after the lease found the outcome unknown: the
        record lives ttl from then, lease + ttl after the claim."""
        h = owner_killed()
        h.req("r2", 103.5, 103.6, 502, inst="i1", ptype=UNKNOWN,
              replayed=True)
        h.then("E2", "r3", 113.1, t0=113.0, inst="i1")
        self.assertEqual(h.check().violations, [])


# --------------------------------- second executions the strict rule forbids

class TestForbidden(unittest.TestCase):
    """Each was explained by the lenient rules (the reason is the label
    the strict checker gives it); the strict rule must reject it."""

    def assertForbidden(self, h, label, kind="duplicate execution"):
        c = h.check()
        self.assertEqual(sorted({v["kind"] for v in c.violations}), [kind])
        self.assertEqual(dict(c.forbidden), {label: 1})
        self.assertEqual(h.kinds(lenient=True), [])

    def test_second_execution_without_reason(self):
        h = executed_once()
        h.then("E2", "r3", 102.01)
        self.assertEqual(h.kinds(), ["duplicate execution"])
        self.assertEqual(h.kinds(lenient=True), ["duplicate execution"])
        self.assertEqual(dict(h.check().forbidden), {"no reason at all": 1})

    def test_release_needs_the_answer_first(self):
        h = H()
        h.ex("E1", "r1", 100.01, 101.0, status=503)   # answered at 101
        h.req("r1", 100.0, 101.01, 503, exec="E1")
        h.then("E2", "r2", 100.5)  # before that
        self.assertEqual(h.kinds(), ["duplicate execution"])

    def test_release_needs_the_answer_sent(self):
        """The upstream's 503 never reached the proxy (the write failed):
        nothing was released."""
        h = H()
        h.ex("E1", "r1", 100.01, 100.02, status=503, sent=False)
        h.req("r1", 100.0, 100.03, 502, ptype=UNKNOWN)
        h.then("E2", "r2", 100.5)
        self.assertForbidden(h, "release after 502")

    def test_no_release_from_a_stopped_owner(self):
        h = stopped_owner_503()
        h.then("E2", "r2", 102.5, t0=101.0, inst="i1")
        self.assertEqual(h.kinds(), ["duplicate execution"])

    def test_no_release_from_a_killed_owner(self):
        h = H()
        h.ex("E1", "r1", 100.01, 100.9, status=503, sent=True)
        h.req("r1", 100.0, 100.5, None)
        h.fault("kill", 100.5, inst="i0")
        h.then("E2", "r2", 101.0, t0=100.95, inst="i1")
        self.assertEqual(h.kinds(), ["duplicate execution"])

    def test_no_release_after_an_upstream_502_or_504(self):
        """A gateway's 502/504 in front of the app is stored and
        replayed; the proxy used to release every 5xx."""
        for status in (502, 504):
            with self.subTest(status=status):
                h = answered(status)
                h.then("E2", "r2", 100.5)
                c = h.check()
                self.assertEqual(sorted({v["kind"] for v in c.violations}),
                                 ["duplicate execution"])
                self.assertEqual(dict(c.forbidden),
                                 {f"release after status {status}": 1})

    def test_no_release_after_a_drop(self):
        h = dropped_once()
        h.then("E2", "r2", 100.5)
        self.assertForbidden(h, "release after drop")

    def test_no_release_after_a_response_cut_short(self):
        h = H()
        h.ex("E1", "r1", 100.01, 100.02, cut=True)
        h.req("r1", 100.0, 100.03, None)
        h.then("E2", "r2", 100.5)
        self.assertForbidden(h, "release after cut")

    def test_no_release_after_a_live_502(self):
        """The proxy's own 502 for a request that reached the upstream
        (what it answered a drop with before)."""
        h = H()
        h.ex("E1", "r1", 100.01, 100.02, status=200, sent=False)
        h.req("r1", 100.0, 100.03, 502, ptype="upstream-unavailable")
        h.then("E2", "r2", 100.5)
        c = h.check()
        self.assertEqual(sorted({v["kind"] for v in c.violations}),
                         ["duplicate execution",
                          "executed but answered as never sent"])
        self.assertEqual(dict(c.forbidden), {"release after 502": 1})
        self.assertEqual(h.kinds(lenient=True), [])

    def test_no_release_after_the_upstream_timeout(self):
        """No response head in --upstream-timeout: the client's 504, and
        the exchange goes on (here it is cut at the proxy's end)."""
        h = H()
        h.ex("E1", "r1", 100.01, 102.6, sent=False)
        h.req("r1", 100.0, 102.01, 504, ptype="upstream-timeout")
        h.then("E2", "r2", 102.1, t0=102.05)
        self.assertForbidden(h, "release after 504")

    def test_no_release_after_a_late_response(self):
        """The upstream answers 200 past the timeout: that late response
        is stored; a retry after it replays it, never executes."""
        h = H()
        h.ex("E1", "r1", 100.01, 102.6)
        h.req("r1", 100.0, 102.01, 504, ptype="upstream-timeout")
        h.req("r2", 102.2, 102.61, 200, inst="i1", exec="E1", replayed=True)
        self.assertEqual(h.kinds(), [])
        h.then("E2", "r3", 102.7, t0=102.65)
        self.assertForbidden(h, "release after 504")

    def test_no_takeover_after_an_owner_or_store_fault(self):
        """The owner stopped extending its lease (killed, stopped, the
        store unreachable): an unknown outcome, never a takeover."""
        for kind, inst in (("kill", "i0"), ("stop", "i0"),
                           ("pg-immediate", None), ("pg-long", None),
                           ("pg-fast", None), ("pg-terminate", None),
                           ("pg-pause", None), ("bouncer-kill", None),
                           ("bouncer-pause", None)):
            with self.subTest(fault=kind):
                h = H()
                h.ex("E1", "r1", 100.01, 100.5, sent=False)
                h.req("r1", 100.0, 100.2, None)
                h.fault(kind, 100.2, 100.2 if kind == "kill" else 104.0,
                        inst=inst)
                h.req("r2", 103.2, 103.3, 502, inst="i1", ptype=UNKNOWN,
                      replayed=True)
                h.then("E2", "r3", 104.1, t0=104.0, inst="i1")
                self.assertForbidden(h, f"takeover after {kind}")

    def test_no_takeover_after_an_outage_past_a_completion(self):
        h = H()
        h.then("E1", "r1", 100.01)
        h.fault("pg-long", 100.02, 104.0)
        h.then("E2", "r2", 104.2, t0=104.1, inst="i1")
        self.assertForbidden(h, "takeover after pg-long")

    def test_no_mirrored_takeover(self):
        """r1 claims, its owner is stopped before forwarding; r2 comes
        after the lease and executes; r1's owner resumes and forwards
        late: two executions."""
        h = H()
        h.fault("stop", 100.01, 104.5, inst="i0")
        h.then("E1", "r2", 103.2, t0=101.0, inst="i1")
        h.ex("E2", "r1", 104.6, 104.61)
        h.req("r1", 100.0, 105.0, 200, exec="E2")
        c = h.check()
        self.assertEqual(len(c.violations), 1)
        self.assertIn("forwarded late", list(c.forbidden)[0])
        self.assertEqual(h.kinds(lenient=True), [])

    def test_no_expiry_of_an_abandoned_claim_before_its_time(self):
        h = owner_killed()
        h.then("E2", "r2", 109.5, t0=109.4, inst="i1")  # max(ttl, lease): 110
        self.assertForbidden(h, "takeover after kill")

    def test_no_early_expiry_of_a_claim_without_a_fault(self):
        """A slow answer with a live owner: the record lives ttl after
        that answer, not max(ttl, lease) after the claim."""
        h = H()
        h.ex("E1", "r1", 100.01, 102.6)
        h.req("r1", 100.0, 102.01, 504, ptype="upstream-timeout")
        h.then("E2", "r2", 110.5, t0=110.4)  # < 102.6 + 10
        self.assertForbidden(h, "release after 504")

    def test_no_expiry_of_a_claim_found_unknown_before_lease_plus_ttl(self):
        h = owner_killed()
        h.req("r2", 103.5, 103.6, 502, inst="i1", ptype=UNKNOWN,
              replayed=True)
        h.then("E2", "r3", 111.0, t0=110.9, inst="i1")  # < 100 + 3 + 10
        self.assertForbidden(h, "takeover after kill")

    def test_no_expiry_of_an_unknown_outcome_before_ttl(self):
        h = dropped_once()
        h.then("E2", "r2", 109.0, t0=108.9)
        self.assertForbidden(h, "release after drop")

    def test_other_fingerprint_before_expiry(self):
        h = executed_once()
        h.then("E2", "r3", 105.0, t0=104.9, fp=FP2)
        self.assertEqual(h.kinds(), ["second fingerprint executed"])

    def test_other_fingerprint_after_a_drop(self):
        h = dropped_once()
        h.then("E2", "r2", 100.5, fp=FP2)
        self.assertForbidden(h, "release after drop",
                             kind="second fingerprint executed")


# ------------------------------------------------------ the lenient rules

class TestLenient(unittest.TestCase):
    """--lenient (--unknown-outcome release): the former reasons, and only
    those."""

    def test_config_selects_the_lenient_rules(self):
        h = dropped_once(lenient=True)
        h.then("E2", "r2", 100.5)
        c = h.check()
        self.assertEqual(c.violations, [])
        self.assertEqual(dict(c.reasons), {"release after drop": 1})
        self.assertEqual(h.kinds(lenient=False), ["duplicate execution"])

    def test_takeover_after_kill_and_lease(self):
        h = owner_killed()
        h.then("E2", "r2", 103.1, t0=101.0, inst="i1")
        c = h.check(lenient=True)
        self.assertEqual(c.violations, [])
        self.assertEqual(dict(c.reasons), {"takeover after kill": 1})

    def test_takeover_before_the_lease(self):
        h = owner_killed()
        h.then("E2", "r2", 102.5, t0=101.0, inst="i1")  # lease ends at 103.0
        self.assertEqual(h.kinds(lenient=True), ["duplicate execution"])

    def test_takeover_needs_a_fault_of_the_owner(self):
        h = H()
        h.ex("E1", "r1", 100.01, 100.5, sent=False)
        h.req("r1", 100.0, 100.2, None)
        h.fault("kill", 100.2, inst="i2")             # another instance
        h.fault("redis-kill", 100.3, 101.3)           # never a reason
        h.then("E2", "r2", 103.1, t0=101.0, inst="i1")
        self.assertEqual(h.kinds(lenient=True), ["duplicate execution"])

    def test_takeover_never_with_another_fingerprint(self):
        h = owner_killed()
        h.then("E2", "r2", 103.1, t0=101.0, inst="i1", fp=FP2)
        self.assertEqual(h.kinds(lenient=True),
                         ["second fingerprint executed"])
        self.assertEqual(h.kinds(), ["second fingerprint executed"])

    def test_no_release_from_a_stopped_owner(self):
        """The owner's 504 came after SIGCONT: it cannot explain an
        execution while the owner was stopped and before the lease."""
        h = H()
        h.fault("stop", 100.1, 104.5, inst="i0")
        h.ex("E1", "r1", 100.01, 100.5, sent=False)
        h.req("r1", 100.0, 104.6, 504, ptype="upstream-timeout")
        h.then("E2", "r2", 102.5, t0=101.0, inst="i1")
        self.assertEqual(h.kinds(lenient=True), ["duplicate execution"])

    def test_upstream_502_is_stored_also_when_lenient(self):
        h = answered(502)
        h.then("E2", "r2", 100.5)
        self.assertEqual(h.kinds(lenient=True), ["duplicate execution"])


# ---------------------------------------------------------------- requests

class TestRequests(unittest.TestCase):
    def test_request_executed_twice(self):
        h = H()
        h.ex("E1", "r1", 100.01, 100.02, status=503)
        h.then("E2", "r1", 100.1, t0=100.0)
        self.assertIn("request executed twice", h.kinds())

    def test_upstream_got_another_body(self):
        h = H()
        h.ex("E1", "r1", 100.01, 100.02, fp=FP2)
        h.req("r1", 100.0, 100.03, 200, exec="E1")
        self.assertEqual(h.kinds(), ["upstream got another request"])

    def test_executed_but_answered_422(self):
        h = executed_once()
        h.req("r3", 100.5, 100.6, 422, fp=FP2,
              ptype="idempotency-key-mismatch")
        h.ex("E2", "r3", 100.55, 100.56, fp=FP2)
        self.assertIn("executed but answered as not executed", h.kinds())

    def test_executed_but_answered_503(self):
        h = H()
        h.ex("E1", "r1", 100.01, 100.02)
        h.req("r1", 100.0, 100.03, 503, ptype="store-unavailable")
        self.assertEqual(h.kinds(), ["executed but answered as not executed"])

    def test_live_unknown_outcome_and_timeout_may_have_executed(self):
        for st, pt in ((502, UNKNOWN), (504, "upstream-timeout")):
            for executed in (True, False):
                with self.subTest(status=st, executed=executed):
                    h = H()
                    if executed:
                        h.ex("E1", "r1", 100.01, 102.5, sent=False)
                    h.req("r1", 100.0, 102.01, st, ptype=pt)
                    self.assertEqual(h.kinds(), [])

    def test_executed_but_answered_as_never_sent(self):
        """502 upstream-unavailable says the request never left (a
        connect failure); it reached the upstream."""
        h = H()
        h.ex("E1", "r1", 100.01, 100.02, drop=True)
        h.req("r1", 100.0, 100.03, 502, ptype="upstream-unavailable")
        self.assertEqual(h.kinds(), ["executed but answered as never sent"])
        self.assertEqual(h.kinds(lenient=True), [])

    def test_connect_failure_not_executed(self):
        h = H()
        h.req("r1", 100.0, 100.03, 502, ptype="upstream-unavailable")
        self.assertEqual(h.kinds(), [])

    def test_422_for_the_only_body(self):
        h = H()
        h.req("r1", 100.0, 100.1, 422, ptype="idempotency-key-mismatch")
        self.assertEqual(h.kinds(), ["422 with no other fingerprint"])


# ----------------------------------------------------------------- replays

class TestReplays(unittest.TestCase):
    def test_replay_not_identical(self):
        h = executed_once()
        h.req("r3", 101.5, 101.51, 200, exec="E1", replayed=True,
              resp_sha="other")
        self.assertEqual(h.kinds(), ["response not byte-identical"])

    def test_replay_with_another_status(self):
        h = executed_once()
        h.req("r3", 101.5, 101.51, 201, exec="E1", replayed=True)
        self.assertEqual(h.kinds(), ["response not byte-identical"])

    def test_replay_of_another_fingerprint(self):
        h = executed_once()
        h.req("r3", 101.5, 101.51, 200, exec="E1", replayed=True, fp=FP2)
        self.assertIn("replay of another request", h.kinds())

    def test_replay_of_a_released_response(self):
        for status in (500, 429):
            with self.subTest(status=status):
                h = answered(status)
                h.req("r2", 100.5, 100.51, status, exec="E1", replayed=True)
                self.assertEqual(h.kinds(), ["replay of a released response"])

    def test_replay_of_an_upstream_502_or_504(self):
        for status in (502, 504):
            with self.subTest(status=status):
                h = answered(status)
                h.req("r2", 100.5, 100.51, status, exec="E1", replayed=True)
                self.assertEqual(h.kinds(), [])

    def test_replay_of_a_dropped_execution(self):
        h = dropped_once()
        h.req("r2", 100.5, 100.51, 200, exec="E1", replayed=True)
        self.assertIn("replay of an execution that never answered",
                      h.kinds())

    def test_stale_replay(self):
        h = executed_once()
        h.then("E2", "r3", 110.1, t0=110.05)  # after expiry
        h.req("r4", 111.0, 111.01, 200, exec="E1", replayed=True)
        self.assertEqual(h.kinds(), ["stale replay"])

    def test_fresh_response_of_another_request(self):
        h = executed_once()
        h.req("r3", 101.5, 101.51, 200, exec="E1")    # no replay header
        self.assertEqual(
            h.kinds(), ["another request's response, not marked replayed"])

    def test_replay_of_a_problem(self):
        """A stored problem other than the unknown outcome (a 504 or a
        502 'cut short'): no execution's response."""
        for st, pt in ((504, "upstream-timeout"),
                       (502, "upstream-unavailable")):
            with self.subTest(status=st):
                h = executed_once()
                h.req("r3", 101.5, 101.51, st, replayed=True, ptype=pt)
                self.assertEqual(h.kinds(),
                                 ["replay that is no execution's response"])

    def test_replay_of_a_response_cut_short(self):
        """The upstream cut its response after the status line: the
        stored problem says it executed and its response is lost
        (docs/protocol.md); never a second execution."""
        for st, pt in ((502, "upstream-unavailable"),
                       (504, "upstream-timeout")):
            with self.subTest(status=st):
                h = H()
                h.ex("E1", "r1", 100.01, 100.02, cut=True)
                h.req("r1", 100.0, 100.03, None)
                h.req("r2", 100.5, 100.51, st, replayed=True, ptype=pt)
                c = h.check()
                self.assertEqual(c.violations, [])
                self.assertEqual(
                    c.counts["replays of a response cut short (its problem)"],
                    1)

    def test_replay_of_a_cut_problem_to_a_waiting_duplicate(self):
        """Sent just before the cut request reached the upstream, it
        waited, and got the problem."""
        h = H()
        h.ex("E1", "r1", 100.01, 100.02, cut=True)
        h.req("r1", 100.0, 100.03, None)
        h.req("r2", 100.005, 100.03, 502, replayed=True,
              ptype="upstream-unavailable")
        self.assertEqual(h.kinds(), [])

    def test_replay_of_a_cut_problem_needs_a_cut(self):
        """Finding 1: a stalled proxy storing a whole response as cut
        short. The upstream sent all of it."""
        h = executed_once()
        h.req("r3", 101.5, 101.51, 502, replayed=True,
              ptype="upstream-unavailable")
        self.assertEqual(h.kinds(), ["replay that is no execution's response"])

    def test_replay_of_an_unknown_outcome(self):
        """Drop, owner killed before forwarding: duplicates get the
        unknown outcome, which names no execution."""
        h = dropped_once()
        h.req("r2", 100.5, 100.51, 502, ptype=UNKNOWN, replayed=True)
        h.req("r3", 101.0, 101.2, None, inst="i1")    # owner killed
        h.fault("kill", 101.1, inst="i1")
        h.req("r4", 104.5, 104.51, 502, ptype=UNKNOWN, replayed=True)
        c = h.check()
        self.assertEqual(c.violations, [])
        self.assertEqual(c.counts[f"replayed 502 {UNKNOWN}"], 2)

    def test_unknown_outcome_replayed_before_any_request(self):
        h = H()
        h.req("r0", 99.0, 99.1, 200, fp=FP2, key="k")  # another body
        h.req("r1", 100.0, 100.01, 502, ptype=UNKNOWN, replayed=True)
        self.assertEqual(h.kinds(),
                         ["unknown outcome replayed before any request"])

    def test_late_completion_replaces_an_unknown_outcome(self):
        """The owner is stopped after the upstream answered; duplicates
        past the lease get the unknown outcome; SIGCONT, the owner
        completes, and later duplicates replay the real response."""
        h = H()
        h.ex("E1", "r1", 100.01, 100.02)
        h.fault("stop", 100.015, 104.5, inst="i0")
        h.req("r1", 100.0, 104.6, 200, exec="E1")
        h.req("r2", 103.5, 103.51, 502, inst="i1", ptype=UNKNOWN,
              replayed=True)
        h.req("r3", 105.0, 105.01, 200, inst="i1", exec="E1", replayed=True)
        h.store = [TestStore.row("E1")]
        self.assertEqual(h.check().violations, [])

    def test_executed_request_answered_as_a_replay(self):
        h = H()
        h.ex("E1", "r1", 100.01, 100.02, drop=True)
        h.req("r1", 100.0, 100.03, 502, ptype=UNKNOWN, replayed=True)
        h.req("r0", 99.0, 99.5, None)
        self.assertEqual(h.kinds(), ["executed but answered as not executed"])

    def test_unknown_execution(self):
        h = executed_once()
        h.reqs["r2"]["exec"] = "E9"
        self.assertEqual(h.kinds(), ["response of an unknown execution"])


# ------------------------------------------------------------------- store

class TestStore(unittest.TestCase):
    @staticmethod
    def row(exec, key="k", fp=FP1, status=200, sha=None, state="completed"):
        return {"key": key, "state": state, "fp": fp,
                "status": status, "exec": exec,
                "body_sha": sha or ("sha-" + exec if exec else "p")}

    def test_row_of_the_execution(self):
        h = executed_once()
        h.store = [self.row("E1")]
        self.assertEqual(h.check().violations, [])

    def test_row_differs(self):
        h = executed_once()
        h.store = [self.row("E1", sha="other")]
        self.assertEqual(h.kinds(), ["stored response differs"])

    def test_row_superseded(self):
        h = executed_once()
        h.then("E2", "r3", 110.1, t0=110.05)
        h.store = [self.row("E1")]
        self.assertEqual(h.kinds(), ["store holds a superseded execution"])

    def test_row_with_a_releasing_status(self):
        h = answered(503)
        h.store = [self.row("E1", status=503)]
        self.assertEqual(h.kinds(), ["stored a releasing status"])

    def test_row_of_an_upstream_502(self):
        h = answered(502)
        h.store = [self.row("E1", status=502)]
        self.assertEqual(h.kinds(), [])

    def test_unknown_row(self):
        h = dropped_once()
        h.store = [self.row(None, status=502, state="unknown")]
        c = h.check()
        self.assertEqual(c.violations, [])
        self.assertEqual(c.counts["store rows unknown"], 1)

    def test_completed_row_without_an_execution(self):
        """A drop's problem stored as 'completed' (it is 'unknown')."""
        h = dropped_once()
        h.store = [self.row(None, status=502)]
        self.assertEqual(h.kinds(),
                         ["completed row without an execution's response"])

    def test_completed_row_of_a_response_cut_short(self):
        """docs/protocol.md: a response cut after its status is stored as
        a problem that says it executed and its response is lost."""
        h = H()
        h.ex("E1", "r1", 100.01, 100.02, cut=True)
        h.req("r1", 100.0, 100.03, None)
        h.store = [self.row(None, status=502)]
        self.assertEqual(h.kinds(), [])


# ----------------------------------------------------- files and the report

class TestFiles(unittest.TestCase):
    def test_load_and_main(self):
        """A history on disk: the cut end line is read, the mode comes
        from config.json unless --strict/--lenient says otherwise."""
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(dict(CONFIG, lenient=True,
                               release_statuses=[500, 503]), f)
            lines = [
                {"ev": "exec", "exec": "E1", "t": 100.01, "key": "k",
                 "req": "r1", "fp": FP1, "status": 200, "delay_ms": 0,
                 "drop": False, "cut": True, "resp_sha": "s1"},
                {"ev": "end", "exec": "E1", "t": 100.02, "sent": False,
                 "dropped": True, "cut": True},
                {"ev": "exec", "exec": "E2", "t": 100.5, "key": "k",
                 "req": "r2", "fp": FP1, "status": 200, "delay_ms": 0,
                 "drop": False, "resp_sha": "s2"},
                {"ev": "end", "exec": "E2", "t": 100.51, "sent": True}]
            with open(os.path.join(d, "upstream.jsonl"), "w") as f:
                f.write("".join(json.dumps(x) + "\n" for x in lines))
            reqs = [{"id": "r1", "key": "k", "fp": FP1, "inst": "i0",
                     "t0": 100.0, "t1": 100.03, "status": None},
                    {"id": "r2", "key": "k", "fp": FP1, "inst": "i0",
                     "t0": 100.49, "t1": 100.52, "status": 200,
                     "exec": "E2", "exec_hdr": "E2", "resp_sha": "s2"}]
            with open(os.path.join(d, "clients0.jsonl"), "w") as f:
                f.write("".join(json.dumps(x) + "\n" for x in reqs))
            h = check.load(d)
            self.assertTrue(h.execs["E1"]["cut"])
            self.assertEqual(h.release_statuses, {500, 503})
            out = open(os.devnull, "w")
            old, sys.stdout = sys.stdout, out
            try:
                self.assertEqual(check.main(["check.py", d]), 0)
                self.assertEqual(check.main(["check.py", "--strict", d]), 1)
            finally:
                sys.stdout = old
                out.close()
            with open(os.path.join(d, "report.json")) as f:
                rep = json.load(f)
            self.assertEqual(rep["rules"], "strict")
            self.assertEqual(rep["forbidden_by_lenient_reason"],
                             {"release after cut": 1})


if __name__ == "__main__":
    unittest.main(verbosity=1)
