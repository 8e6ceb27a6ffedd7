"""Never twice when the upstream is slow, its answer is lost, or the proxy
dies mid-request (issue 43; docs/protocol.md "How an exchange ends").

A request that may have reached the upstream is never sent to it again
unless its route says so: a late response is stored for the retries, a
gateway's 502/504 is stored, an answer lost after the request left is an
unknown outcome (502 outcome-unknown, replayed, never forwarded), and an
owner killed or stalled past its lease leaves an unknown outcome that its
late completion may still replace. Only the release statuses and a
failure before anything was sent release the key.

Executions are what the stub counts per Idempotency-Key (GET /__stats
"keys"): an outcome probe carries no key, so it is not one.
"""
import http.client
import json
import signal
import time
import urllib.parse

import pytest

from support.http import RawConn, assert_problem
from support.procs import Stub, free_port, metric_value, proxy_kill, wait_readyz
from test_idempotency import ORDER, kreq, newkey, post, replayed
# keyed(*flags): a proxy on the test's store with the admin token
from test_keys import TOKEN, keyed, token_file  # noqa: F401 (fixtures)


def runs(stub, key):
    """How many times the upstream executed key."""
    return stub.stats()["keys"].get(key, 0)


def wait_runs(stub, key, n, timeout=5.0):
    deadline = time.monotonic() + timeout
    while runs(stub, key) < n:
        assert time.monotonic() < deadline, f"{key}: never reached the upstream"
        time.sleep(0.01)


def wait_for(what, cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def metric(p, name, **labels):
    return metric_value(p.metrics(), name, labels or None) or 0


def key_state(p, key, query=""):
    path = "/keys/" + urllib.parse.quote(key, safe="") + (
        "?" + query if query else "")
    conn = http.client.HTTPConnection("127.0.0.1", p.admin_port, timeout=10)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        body = r.read()
        return json.loads(body).get("state") if r.status == 200 else None
    finally:
        conn.close()


def purge(p, key):
    conn = http.client.HTTPConnection("127.0.0.1", p.admin_port, timeout=10)
    try:
        conn.request("DELETE", "/keys/" + urllib.parse.quote(key, safe=""),
                     headers={"Authorization": f"Bearer {TOKEN}"})
        r = conn.getresponse()
        r.read()
        return r.status
    finally:
        conn.close()


def owner_and_duplicate(spawn_proxy, store_args):
    """A (the owner, which the test kills or stops) and B (its duplicates'
    instance, which waits), both with a 2 s lease, ready."""
    flags = (*store_args, "--lease", "2s", "--upstream-timeout", "1800ms")
    a = spawn_proxy(*flags, name="a")
    b = spawn_proxy(*flags, "--wait-timeout", "10s", name="b")
    wait_readyz(a)
    wait_readyz(b)
    return a, b


def start_pg(factory, db, *flags, **kw):
    p = factory("--store", db.url, *flags, **kw)
    wait_readyz(p)
    return p


def assert_unknown(r, replay):
    assert_problem(r, 502, "outcome-unknown")
    assert replayed(r) == replay, r
    doc = r.json()
    assert doc["error"]["type"] == "idempotency_error", doc
    assert "may have executed" in doc["detail"], doc


# ------------------------------------------------ late answers are kept

def test_slow_upstream_504_then_late_response_replayed(keyed, stub):
    """An order that takes 2.5 s behind --upstream-timeout 1s, a client
    that retries every 0.3 s: the first call gets 504 at 1 s, the exchange
    goes on, the retries wait for it and replay it. One order."""
    p = keyed("--upstream-timeout", "1s", "--lease", "3s")
    key = newkey("slow")
    target = "/orders?delay_ms=2500"
    t0 = time.monotonic()
    first = post(p.port, key, target)
    assert_problem(first, 504, "upstream-timeout")
    assert "goes on" in first.json()["detail"]
    assert 0.9 < time.monotonic() - t0 < 2.0
    seen = []
    while time.monotonic() - t0 < 6:
        time.sleep(0.3)
        r = post(p.port, key, target)
        seen.append(r.status)
        if r.status == 200:
            break
    assert r.status == 200 and replayed(r), (seen, r)
    assert r.json()["n"] == 1
    assert runs(stub, key) == 1
    assert metric(p, "idemproxy_late_responses_total") == 1
    assert post(p.port, key, target).json()["n"] == 1
    assert runs(stub, key) == 1


@pytest.mark.stores("postgres")
def test_slow_upstream_retries_on_another_instance(make_proxy, pg_db, stub):
    """The issue's case: retries of a 2.5 s order go to a second instance,
    one rejecting (409 + Retry-After while it runs), one waiting; both end
    with the stored late response. One order."""
    flags = ("--upstream-timeout", "1s", "--lease", "3s")
    a = start_pg(make_proxy, pg_db, *flags, name="a")
    rej = start_pg(make_proxy, pg_db, *flags, "--in-flight", "reject",
                   name="b-reject")
    wait = start_pg(make_proxy, pg_db, *flags, name="b-wait")
    key = newkey("slow2")
    target = "/orders?delay_ms=2500"
    first = post(a.port, key, target)
    assert_problem(first, 504, "upstream-timeout")
    r = post(rej.port, key, target)
    assert_problem(r, 409, "request-in-progress")
    assert r.header("Retry-After") == "1"
    w = post(wait.port, key, target)
    assert w.status == 200 and replayed(w) and w.json()["n"] == 1, w
    wait_for("the reject instance to replay",
             lambda: post(rej.port, key, target).status == 200)
    assert runs(stub, key) == 1
    assert pg_db.count("state = 'completed'") == 1


def test_late_response_longer_than_the_lease(keyed, stub):
    """The late exchange extends its lease: a response after 4 s behind a
    2 s lease is still the one stored, and no duplicate executes."""
    p = keyed("--upstream-timeout", "1s", "--lease", "2s",
              "--wait-timeout", "10s")
    key = newkey("past-lease")
    target = "/orders?delay_ms=4000"
    assert post(p.port, key, target).status == 504
    time.sleep(2.5)                     # past the first lease
    r = post(p.port, key, target)
    assert r.status == 200 and replayed(r) and r.json()["n"] == 1, r
    assert runs(stub, key) == 1


def test_deadline_makes_the_outcome_unknown(keyed, stub):
    """No head within upstream_deadline: unknown (cause deadline); the
    upstream's answer afterwards is not stored and nothing is re-sent."""
    p = keyed("--upstream-timeout", "500ms", "--upstream-deadline", "1500ms",
              "--lease", "3s")
    key = newkey("deadline")
    target = "/orders?delay_ms=3000"
    assert post(p.port, key, target).status == 504
    wait_for("the deadline", lambda: metric(
        p, "idemproxy_unknown_outcomes_total", cause="deadline") == 1)
    assert_unknown(post(p.port, key, target), replay=True)
    time.sleep(2.0)                     # the upstream has answered by now
    assert_unknown(post(p.port, key, target), replay=True)
    assert runs(stub, key) == 1


def test_sigterm_drains_a_late_exchange(keyed, stub, store_setup, request):
    """SIGTERM waits for the late response (within --drain-timeout), which
    is stored: a retry after the restart replays it."""
    p = keyed("--upstream-timeout", "500ms", "--lease", "3s")
    key = newkey("drain")
    target = "/orders?delay_ms=1500"
    assert post(p.port, key, target).status == 504
    t0 = time.monotonic()
    assert p.stop() == 0
    assert time.monotonic() - t0 > 0.5, "exited before the late response"
    assert "late response came" in p.log()
    if store_setup != "memory":
        db = request.getfixturevalue("pg_db")
        assert db.count("state = 'completed'") == 1
        q = keyed("--upstream-timeout", "500ms", "--lease", "3s", name="q")
        r = post(q.port, key, target)
        assert r.status == 200 and replayed(r) and r.json()["n"] == 1
    assert runs(stub, key) == 1


# ------------------------------------------------ what releases, what is kept

@pytest.mark.parametrize("status", [502, 504])
def test_gateway_502_504_are_stored(keyed, stub, status):
    """A gateway in front of the app answers 502/504 after the app
    executed: stored and replayed, never executed again."""
    p = keyed()
    key = newkey(f"gw{status}")
    target = f"/orders?status={status}"
    r = post(p.port, key, target)
    assert r.status == status and not replayed(r)
    again = post(p.port, key, target)
    assert again.status == status and replayed(again)
    assert again.body == r.body
    assert runs(stub, key) == 1


@pytest.mark.parametrize("status", [500, 503, 401, 408, 425, 429])
def test_release_statuses_let_a_retry_execute(keyed, stub, status):
    p = keyed()
    key = newkey(f"rel{status}")
    target = f"/orders?status={status}"
    assert post(p.port, key, target).status == status
    r = post(p.port, key, target)
    assert r.status == status and not replayed(r)
    assert runs(stub, key) == 2


def test_release_statuses_setting_and_keep(make_proxy, stub, tmp_path):
    """release_statuses per route and globally; on_upstream_error = keep
    stores every 5xx whatever the list."""
    ini = tmp_path / "r.ini"
    ini.write_text("[idemproxy]\nrelease_statuses = 409\n"
                   "[route kept]\nmatch = POST /kept*\n"
                   "on_upstream_error = keep\nrelease_statuses = 500, 409\n")
    p = make_proxy("--config", str(ini))
    k1, k2, k3 = newkey("g409"), newkey("g500"), newkey("kept500")
    for k, t in ((k1, "/x?status=409"), (k2, "/x?status=500"),
                 (k3, "/kept?status=500")):
        post(p.port, k, t)
        post(p.port, k, t)
    assert runs(stub, k1) == 2, "409 is in the global list"
    assert runs(stub, k2) == 1, "500 is not in the global list: stored"
    assert runs(stub, k3) == 1, "keep: a 500 is stored"


def test_connect_refused_releases(make_proxy, tmp_path):
    """Nothing left: a refused connect releases, and the retry executes
    once the upstream is there."""
    port = free_port()
    p = make_proxy(upstream=f"http://127.0.0.1:{port}")
    key = newkey("refused")
    assert_problem(post(p.port, key), 502, "upstream-unavailable")
    up = Stub(tmp_path, port=port, name="late-stub")
    try:
        r = post(p.port, key)
        assert r.status == 200 and not replayed(r), r
        assert runs(up, key) == 1
    finally:
        up.stop()


# ------------------------------------------------ unknown outcomes

def test_reset_after_the_request_was_sent_is_unknown(keyed, stub):
    """The upstream executes and drops the connection (a crash after its
    commit): 502 outcome-unknown, the same replayed to every retry, never
    executed again; an operator's purge lets the next retry execute."""
    p = keyed()
    key = newkey("drop")
    target = "/payments?drop=1"
    assert_unknown(post(p.port, key, target), replay=False)
    for _ in range(3):
        assert_unknown(post(p.port, key, target), replay=True)
    assert runs(stub, key) == 1
    assert key_state(p, key) == "unknown"
    assert metric(p, "idemproxy_unknown_outcomes_total", cause="reset") == 1
    assert purge(p, key) == 200
    r = post(p.port, key, "/payments")
    assert r.status == 200 and not replayed(r)
    assert runs(stub, key) == 2


def test_a_changed_body_is_still_422(keyed, stub):
    p = keyed()
    key = newkey("drop422")
    post(p.port, key, "/payments?drop=1")
    r = post(p.port, key, "/payments?drop=1", body=b'{"amount":1}')
    assert_problem(r, 422, "idempotency-key-mismatch")
    assert runs(stub, key) == 1


def test_at_least_once_route_releases_unknown_outcomes(make_proxy, stub,
                                                       tmp_path):
    ini = tmp_path / "alo.ini"
    ini.write_text("[route notify]\nmatch = POST /notify*\n"
                   "unknown_outcome = release\n")
    p = make_proxy("--config", str(ini))
    key = newkey("alo")
    assert_problem(post(p.port, key, "/notify?drop=1"), 502,
                   "upstream-unavailable")
    r = post(p.port, key, "/notify")
    assert r.status == 200 and not replayed(r)
    assert runs(stub, key) == 2
    assert metric(p, "idemproxy_unknown_outcomes_released_total") == 1


@pytest.mark.stores("postgres", "postgres+redis")
def test_owner_sigkill_leaves_an_unknown_outcome(spawn_proxy, store_args,
                                                 pg_db, stub):
    """A is SIGKILLed while its request runs. Before the lease runs out a
    duplicate waits; after it, the duplicate gets 502 outcome-unknown
    (replayed) and the request is never executed again."""
    a, b = owner_and_duplicate(spawn_proxy, store_args)
    key = newkey("kill")
    target = "/orders?delay_ms=1200"
    c = RawConn(a.port)
    c.send(kreq("POST", target, key, ORDER))
    t0 = time.monotonic()
    wait_runs(stub, key, 1)
    proxy_kill(a)
    c.close()
    r = post(b.port, key, target)
    assert time.monotonic() - t0 > 1.8, "answered before the lease ran out"
    assert_unknown(r, replay=True)
    assert pg_db.count("state = 'unknown'") == 1
    assert metric(b, "idemproxy_unknown_outcomes_total", cause="lease") == 1
    time.sleep(1.0)
    assert_unknown(post(b.port, key, target), replay=True)
    assert runs(stub, key) == 1
    # a changed body is still 422
    assert_problem(post(b.port, key, target, body=b"changed"), 422,
                   "idempotency-key-mismatch")


@pytest.mark.stores("postgres", "postgres+redis")
def test_owner_sigstop_late_completion_replaces_the_unknown(
        spawn_proxy, store_args, pg_db, stub):
    """A is stopped (SIGSTOP) while its request runs; past the lease a
    duplicate at B gets the unknown outcome. A resumes, reads the answer
    that waited in its socket and completes with its owner token: the
    real response replaces the unknown outcome, and B replays it."""
    a, b = owner_and_duplicate(spawn_proxy, store_args)
    key = newkey("stop")
    target = "/orders?delay_ms=300"
    c = RawConn(a.port, timeout=30)
    c.send(kreq("POST", target, key, ORDER))
    wait_runs(stub, key, 1)
    a.signal(signal.SIGSTOP)
    try:
        time.sleep(2.3)                 # past A's lease
        assert_unknown(post(b.port, key, target), replay=True)
    finally:
        a.signal(signal.SIGCONT)
    resp = c.read_response("POST")
    c.close()
    assert resp.status == 200 and resp.json()["n"] == 1
    wait_for("the late completion", lambda: pg_db.count(
        "state = 'completed'") == 1)
    r = post(b.port, key, target)
    assert r.status == 200 and replayed(r) and r.body == resp.body, r
    assert runs(stub, key) == 1
    proxy_kill(a)


# ------------------------------------------------ the outcome probe

def probe_proxy(make_proxy, tmp_path, probe, *flags, extra=""):
    ini = tmp_path / "probe.ini"
    ini.write_text("[route payments]\nmatch = POST /payments*\n"
                   f"outcome_probe = {probe}\n{extra}")
    return make_proxy("--config", str(ini), *flags)


def test_probe_2xx_becomes_the_stored_response(make_proxy, stub, tmp_path):
    p = probe_proxy(make_proxy, tmp_path, "GET /payments/by-key/{key}")
    key = newkey("p200")
    assert_unknown(post(p.port, key, "/payments?drop=1"), replay=False)
    wait_for("the probe", lambda: metric(
        p, "idemproxy_outcome_probes_total", result="found") == 1)
    r = post(p.port, key, "/payments?drop=1")
    assert r.status == 200 and replayed(r), r
    echo = r.json()
    assert echo["method"] == "GET"
    assert echo["target"] == "/payments/by-key/" + key
    assert runs(stub, key) == 1
    assert key_state(p, key, "route=payments") == "completed"


def test_probe_404_releases_the_key(make_proxy, stub, tmp_path):
    p = probe_proxy(make_proxy, tmp_path,
                    "GET /payments/by-key/{key}?status=404")
    key = newkey("p404")
    assert_unknown(post(p.port, key, "/payments?drop=1"), replay=False)
    wait_for("the probe", lambda: metric(
        p, "idemproxy_outcome_probes_total", result="absent") == 1)
    r = post(p.port, key, "/payments")
    assert r.status == 200 and not replayed(r), r
    assert runs(stub, key) == 2


@pytest.mark.parametrize("probe", [
    "GET /payments/by-key/{key}?status=500",
    "GET /payments/by-key/{key}?delay_ms=3000"])
def test_probe_that_cannot_tell_leaves_it_unknown(make_proxy, stub, tmp_path,
                                                  probe):
    """A probe that answers 500, or never within --upstream-timeout: the
    owner asks 3 times, then the outcome stays unknown; a duplicate asks
    once more (its client waits) and replays the unknown outcome."""
    p = probe_proxy(make_proxy, tmp_path, probe, "--upstream-timeout",
                    "500ms", "--lease", "2s")
    key = newkey("pbad")
    assert_unknown(post(p.port, key, "/payments?drop=1"), replay=False)
    wait_for("three probes", lambda: metric(
        p, "idemproxy_outcome_probes_total", result="unknown") == 1,
        timeout=15)
    assert_unknown(post(p.port, key, "/payments?drop=1"), replay=True)
    assert metric(p, "idemproxy_outcome_probes_total", result="unknown") == 2
    assert runs(stub, key) == 1


@pytest.mark.stores("postgres")
def test_probe_resolves_a_lapsed_lease(spawn_proxy, store_args, pg_db, stub,
                                       tmp_path):
    """The owner is killed mid-request; the duplicate that finds its lease
    run out asks the probe, whose 2xx it replays."""
    ini = tmp_path / "probe.ini"
    ini.write_text("[route payments]\nmatch = POST /payments*\n"
                   "outcome_probe = GET /payments/by-key/{key}\n")
    flags = (*store_args, "--config", str(ini), "--lease", "2s",
             "--upstream-timeout", "1800ms")
    a = spawn_proxy(*flags, name="a")
    b = spawn_proxy(*flags, name="b")
    wait_readyz(a)
    wait_readyz(b)
    key = newkey("plapse")
    c = RawConn(a.port)
    c.send(kreq("POST", "/payments?delay_ms=1000", key, ORDER))
    wait_runs(stub, key, 1)
    proxy_kill(a)
    c.close()
    time.sleep(2.2)
    r = post(b.port, key, "/payments?delay_ms=1000")
    assert r.status == 200 and replayed(r), r
    assert r.json()["target"] == "/payments/by-key/" + key
    assert pg_db.count("state = 'completed'") == 1
    assert runs(stub, key) == 1
