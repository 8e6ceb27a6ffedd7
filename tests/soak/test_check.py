#!/usr/bin/python3
"""The checker's own tests: hand-made histories with and without each
violation it exists to find (a checker that cannot fail proves nothing).

    /usr/bin/python3 tests/soak/test_check.py
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import check  # noqa: E402

CONFIG = {"lease_s": 3.0, "upstream_timeout_s": 2.0, "ttl_s": 10.0}
FP1 = "a" * 64
FP2 = "b" * 64


class H:
    """A history under construction: req() is a client request, ex() the
    upstream executing it, fault() a fault."""

    def __init__(self):
        self.execs = {}
        self.reqs = {}
        self.faults = []
        self.store = None
        self.n = 0

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
           drop=False, sent=True):
        self.execs[eid] = {"exec": eid, "req": rid, "t": t, "t_end": t_end,
                           "key": key, "fp": fp, "status": status,
                           "delay_ms": 0, "drop": drop,
                           "dropped": drop, "sent": sent and not drop,
                           "resp_sha": "sha-" + eid}

    def fault(self, kind, t, t_end=None, inst=None):
        self.faults.append({"kind": kind, "inst": inst, "t": t,
                            "t_end": t if t_end is None else t_end})

    def check(self):
        c = check.Checker(check.History(CONFIG, self.execs, self.reqs,
                                        self.faults, self.store))
        c.run()
        return c

    def kinds(self):
        return sorted({v["kind"] for v in self.check().violations})


def executed_once():
    h = H()
    h.ex("E1", "r1", 100.01, 100.02)
    h.req("r1", 100.0, 100.03, 200, exec="E1")
    h.req("r2", 101.0, 101.01, 200, exec="E1", replayed=True)
    return h


class TestExecutions(unittest.TestCase):
    def test_clean_history_passes(self):
        c = executed_once().check()
        self.assertEqual(c.violations, [])
        self.assertEqual(c.counts["replays"], 1)

    def test_second_execution_without_reason(self):
        h = executed_once()
        h.ex("E2", "r3", 102.01, 102.02)
        h.req("r3", 102.0, 102.03, 200, exec="E2")
        self.assertEqual(h.kinds(), ["duplicate execution"])

    def test_second_execution_after_release(self):
        h = H()
        h.ex("E1", "r1", 100.01, 100.02, status=503)
        h.req("r1", 100.0, 100.03, 503, exec="E1")
        h.ex("E2", "r2", 100.5, 100.51)
        h.req("r2", 100.49, 100.52, 200, exec="E2")
        c = h.check()
        self.assertEqual(c.violations, [])
        self.assertEqual(dict(c.reasons), {"release after status 503": 1})

    def test_release_needs_the_answer_first(self):
        h = H()
        h.ex("E1", "r1", 100.01, 101.0, status=503)   # answered at 101
        h.req("r1", 100.0, 101.01, 503, exec="E1")
        h.ex("E2", "r2", 100.5, 100.51)                # before that
        h.req("r2", 100.49, 100.52, 200, exec="E2")
        self.assertEqual(h.kinds(), ["duplicate execution"])

    def test_release_after_timeout(self):
        h = H()
        h.ex("E1", "r1", 100.01, 102.6, sent=False)
        h.req("r1", 100.0, 102.01, 504, ptype="upstream-timeout")
        h.ex("E2", "r2", 102.1, 102.11)
        h.req("r2", 102.05, 102.12, 200, exec="E2")
        self.assertEqual(h.check().violations, [])

    def test_takeover_after_kill_and_lease(self):
        h = H()
        h.ex("E1", "r1", 100.01, 100.5, sent=False)
        h.req("r1", 100.0, 100.2, None)
        h.fault("kill", 100.2, inst="i0")
        h.ex("E2", "r2", 103.1, 103.11)
        h.req("r2", 101.0, 103.12, 200, inst="i1", exec="E2")
        c = h.check()
        self.assertEqual(c.violations, [])
        self.assertEqual(dict(c.reasons), {"takeover after kill": 1})

    def test_no_release_from_a_stopped_owner(self):
        """The owner's 504 came after SIGCONT: it cannot explain an
        execution while the owner was stopped and before the lease."""
        h = H()
        h.fault("stop", 100.1, 104.5, inst="i0")
        h.ex("E1", "r1", 100.01, 100.5, sent=False)
        h.req("r1", 100.0, 104.6, 504, ptype="upstream-timeout")
        h.ex("E2", "r2", 102.5, 102.51)
        h.req("r2", 101.0, 102.52, 200, inst="i1", exec="E2")
        self.assertEqual(h.kinds(), ["duplicate execution"])

    def test_no_release_from_a_killed_owner(self):
        h = H()
        h.ex("E1", "r1", 100.01, 100.9, status=503, sent=True)
        h.req("r1", 100.0, 100.5, None)
        h.fault("kill", 100.5, inst="i0")
        h.ex("E2", "r2", 101.0, 101.01)
        h.req("r2", 100.95, 101.02, 200, inst="i1", exec="E2")
        self.assertEqual(h.kinds(), ["duplicate execution"])

    def test_takeover_before_the_lease(self):
        h = H()
        h.ex("E1", "r1", 100.01, 100.5, sent=False)
        h.req("r1", 100.0, 100.2, None)
        h.fault("kill", 100.2, inst="i0")
        h.ex("E2", "r2", 102.5, 102.51)               # lease ends at 103.0
        h.req("r2", 101.0, 102.52, 200, inst="i1", exec="E2")
        self.assertEqual(h.kinds(), ["duplicate execution"])

    def test_takeover_needs_a_fault_of_the_owner(self):
        h = H()
        h.ex("E1", "r1", 100.01, 100.5, sent=False)
        h.req("r1", 100.0, 100.2, None)
        h.fault("kill", 100.2, inst="i2")             # another instance
        h.fault("redis-kill", 100.3, 101.3)           # never a reason
        h.ex("E2", "r2", 103.1, 103.11)
        h.req("r2", 101.0, 103.12, 200, inst="i1", exec="E2")
        self.assertEqual(h.kinds(), ["duplicate execution"])

    def test_takeover_after_store_outage(self):
        h = H()
        h.ex("E1", "r1", 100.01, 100.02)
        h.req("r1", 100.0, 100.03, 200, exec="E1")
        h.fault("pg-long", 100.02, 104.0)
        h.ex("E2", "r2", 104.2, 104.21)
        h.req("r2", 104.1, 104.22, 200, inst="i1", exec="E2")
        self.assertEqual(h.check().violations, [])

    def test_takeover_never_with_another_fingerprint(self):
        h = H()
        h.ex("E1", "r1", 100.01, 100.5, sent=False)
        h.req("r1", 100.0, 100.2, None)
        h.fault("kill", 100.2, inst="i0")
        h.ex("E2", "r2", 103.1, 103.11, fp=FP2)
        h.req("r2", 101.0, 103.12, 200, inst="i1", exec="E2", fp=FP2)
        self.assertEqual(h.kinds(), ["second fingerprint executed"])

    def test_mirrored_takeover(self):
        """r1 claims, its owner is stopped before forwarding; r2 takes
        over after the lease and executes; r1's owner resumes and
        forwards late."""
        h = H()
        h.fault("stop", 100.01, 104.5, inst="i0")
        h.ex("E1", "r2", 103.2, 103.21)
        h.req("r2", 101.0, 103.22, 200, inst="i1", exec="E1")
        h.ex("E2", "r1", 104.6, 104.61)
        h.req("r1", 100.0, 105.0, 200, exec="E2")
        c = h.check()
        self.assertEqual(c.violations, [])
        self.assertIn("forwarded late", list(c.reasons)[0])

    def test_expiry(self):
        h = executed_once()
        h.ex("E2", "r3", 110.03, 110.04, fp=FP2)      # ttl after 100.02
        h.req("r3", 110.0, 110.05, 200, exec="E2", fp=FP2)
        c = h.check()
        self.assertEqual(c.violations, [])
        self.assertEqual(dict(c.reasons), {"expiry": 1})

    def test_other_fingerprint_before_expiry(self):
        h = executed_once()
        h.ex("E2", "r3", 105.0, 105.01, fp=FP2)
        h.req("r3", 104.9, 105.02, 200, exec="E2", fp=FP2)
        self.assertEqual(h.kinds(), ["second fingerprint executed"])


class TestRequests(unittest.TestCase):
    def test_request_executed_twice(self):
        h = H()
        h.ex("E1", "r1", 100.01, 100.02, status=503)
        h.ex("E2", "r1", 100.1, 100.11)
        h.req("r1", 100.0, 100.12, 200, exec="E2")
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

    def test_422_for_the_only_body(self):
        h = H()
        h.req("r1", 100.0, 100.1, 422, ptype="idempotency-key-mismatch")
        self.assertEqual(h.kinds(), ["422 with no other fingerprint"])


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
        h = H()
        h.ex("E1", "r1", 100.01, 100.02, status=500)
        h.req("r1", 100.0, 100.03, 500, exec="E1")
        h.req("r2", 100.5, 100.51, 500, exec="E1", replayed=True)
        self.assertEqual(h.kinds(), ["replay of a released response"])

    def test_stale_replay(self):
        h = executed_once()
        h.ex("E2", "r3", 110.1, 110.11)               # after expiry
        h.req("r3", 110.05, 110.12, 200, exec="E2")
        h.req("r4", 111.0, 111.01, 200, exec="E1", replayed=True)
        self.assertEqual(h.kinds(), ["stale replay"])

    def test_fresh_response_of_another_request(self):
        h = executed_once()
        h.req("r3", 101.5, 101.51, 200, exec="E1")    # no replay header
        self.assertEqual(
            h.kinds(), ["another request's response, not marked replayed"])

    def test_replay_of_a_problem(self):
        """A stored problem replayed although the execution answered in
        full (the soak's upstream never cuts a response after its
        head)."""
        h = executed_once()
        h.req("r3", 101.5, 101.51, 504, replayed=True,
              ptype="upstream-timeout")
        self.assertEqual(h.kinds(), ["replay that is no execution's response"])

    def test_unknown_execution(self):
        h = executed_once()
        h.reqs["r2"]["exec"] = "E9"
        self.assertEqual(h.kinds(), ["response of an unknown execution"])


class TestStore(unittest.TestCase):
    def row(self, exec, key="k", fp=FP1, status=200, sha=None):
        return {"key": key, "state": "completed", "fp": fp,
                "status": status, "exec": exec,
                "body_sha": sha or "sha-" + exec}

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
        h.ex("E2", "r3", 110.1, 110.11)
        h.req("r3", 110.05, 110.12, 200, exec="E2")
        h.store = [self.row("E1")]
        self.assertEqual(h.kinds(), ["store holds a superseded execution"])


if __name__ == "__main__":
    unittest.main(verbosity=1)
