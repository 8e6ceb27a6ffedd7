"""Routes through the real binary with a config file (DESIGN.md §3 config
file, §4; issue 5 "Tests"): each key source, key_prefix, a body that cannot
yield its key, per-caller scope, HMAC-SHA256 webhooks in the GitHub and
Stripe styles, auto keys, issued keys, config errors at start, and SIGHUP
reloads of the routes.

Executions are counted by the stub (GET /__stats "requests": everything that
reached the upstream); its echo carries "n", the execution number, so two
responses with the same "n" come from the same execution.

Most scenarios run with the memory store; the ones whose state lives in the
store (issued keys, scope) also run with PostgreSQL (and Redis).
"""
import concurrent.futures as cf
import hashlib
import hmac
import json
import os
import re
import signal
import subprocess
import time
import uuid

import pytest

from support.http import RawConn, assert_problem, request, upstream_echo
from support.procs import (IDEMPROXY_BIN, clean_env, free_port, metric_value,
                           read_text, wait_readyz)

GH_SECRET = "It's a Secret to Everybody"
ST_SECRET = "whsec_route_test_secret"
FORM = "application/x-www-form-urlencoded"
JSON = "application/json"
ISSUE = "/.well-known/idempotency-key"
ISSUED_RE = re.compile(r"^[A-Za-z0-9_-]{22}\.[0-9]+$")


# ---------------------------------------------------------------- helpers

def write_config(tmp_path, text, name="idemproxy.ini"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.fixture
def routed(tmp_path, make_proxy):
    """routed(ini_text, *flags, env=None) -> Proxy started with --config."""
    def make(text, *flags, env=None, name="idemproxy.ini", **kw):
        path = write_config(tmp_path, text, name)
        p = make_proxy("--config", path, *flags, env=env, **kw)
        p.config_path = path
        return p
    return make


def executions(stub):
    return stub.stats()["requests"]


def send(port, method, target, body=None, ctype=None, headers=None,
         timeout=20.0):
    hs = []
    if ctype is not None:
        hs.append(("Content-Type", ctype))
    hs += headers or []
    return request(port, method, target, hs, body, timeout=timeout)


def replayed(r):
    return r.header("Idempotent-Replayed") == "true"


def echo_n(r):
    return upstream_echo(r)["n"]


def gh_sig(body, secret=GH_SECRET):
    mac = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return f"sha256={mac}"


def st_sig(body, t=None, secret=ST_SECRET, extra_v1=()):
    t = int(time.time()) if t is None else t
    mac = hmac.new(secret.encode(), f"{t}.".encode() + body,
                   hashlib.sha256).hexdigest()
    return ",".join([f"t={t}"] + [f"v1={v}" for v in extra_v1] + [f"v1={mac}"])


def issue(port):
    r = request(port, "GET", ISSUE)
    assert r.status == 200, r
    return r, r.json()["key"]


def wait_log(p, text, count, timeout=10.0):
    """Wait until the proxy's stderr holds `text` at least `count` times."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if p.log().count(text) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"{text!r} x{count} not logged in {timeout}s\n{p.log()}")


# ---------------------------------------------------------------- key sources

SOURCES_INI = """
[idemproxy]
upstream_timeout = 5s
lease = 10s

[route hdr]
match = POST /hdr*
key = header:X-Request-Id
require_key = yes

[route query]
match = POST /query*
key = query:order_id

[route alipay]
match = POST /pay/notify
key = form:out_trade_no
key_prefix = pay:
require_key = yes

[route json]
match = POST /events*
key = json:/data/id
require_key = yes

[route json_loose]
match = POST /loose*
key = json:/data/id
"""


def test_header_source(stub, routed):
    p = routed(SOURCES_INI)
    base = executions(stub)
    k = f"r-{uuid.uuid4()}"
    a = send(p.port, "POST", "/hdr", b"x=1", FORM, [("X-Request-Id", k)])
    b = send(p.port, "POST", "/hdr", b"x=1", FORM, [("X-Request-Id", k)])
    assert a.status == 200 and not replayed(a), a
    assert b.status == 200 and replayed(b), b
    assert a.body == b.body
    assert executions(stub) == base + 1
    # Idempotency-Key is not this route's source: no X-Request-Id -> 400
    r = send(p.port, "POST", "/hdr", b"x=1", FORM, [("Idempotency-Key", k)])
    doc = assert_problem(r, 400, "missing-idempotency-key")
    assert "header:X-Request-Id" in doc["detail"], doc
    assert executions(stub) == base + 1


def test_query_source_percent_decoded(stub, routed):
    p = routed(SOURCES_INI)
    base = executions(stub)
    a = send(p.port, "POST", "/query?order_id=A%2D1&x=1", b"{}", JSON)
    b = send(p.port, "POST", "/query?order_id=A%2D1&x=1", b"{}", JSON)
    assert a.status == 200 and not replayed(a), a
    assert b.status == 200 and replayed(b), b
    assert echo_n(a) == echo_n(b)
    assert executions(stub) == base + 1
    # the same key once decoded ("A-1"), but a different raw target: the
    # fingerprint differs -> 422, which shows the key was decoded
    c = send(p.port, "POST", "/query?x=1&order_id=A-1", b"{}", JSON)
    assert_problem(c, 422, "idempotency-key-mismatch")
    # not required on this route: no order_id -> passes through, twice
    for _ in range(2):
        r = send(p.port, "POST", "/query?x=2", b"{}", JSON)
        assert r.status == 200 and not replayed(r), r
    assert executions(stub) == base + 3


def test_form_source_with_prefix(stub, routed):
    """Alipay-style callback (article §8.1): the key is out_trade_no."""
    p = routed(SOURCES_INI)
    base = executions(stub)
    body = (b"notify_id=n1&trade_status=TRADE_SUCCESS&out_trade_no=2024%2D0001"
            b"&total_amount=88.00&subject=a+book")
    rs = [send(p.port, "POST", "/pay/notify", body, FORM) for _ in range(3)]
    assert [r.status for r in rs] == [200, 200, 200], rs
    assert [replayed(r) for r in rs] == [False, True, True]
    assert len({echo_n(r) for r in rs}) == 1
    assert executions(stub) == base + 1
    # the body reached the upstream untouched
    assert upstream_echo(rs[0])["body"] == body.decode()
    # a redelivery with a different notify_id but the same trade number is
    # the same key with a different body: 422, not a second execution
    body2 = body.replace(b"notify_id=n1", b"notify_id=n2")
    assert_problem(send(p.port, "POST", "/pay/notify", body2, FORM), 422,
                   "idempotency-key-mismatch")
    assert executions(stub) == base + 1


def test_key_prefix_separates_routes(stub, routed):
    """Keys of different routes never meet (DESIGN §7): the same field
    value on two routes is two keys, with or without key_prefix."""
    p = routed("""
[route a]
match = POST /a
key = form:id
key_prefix = a:
[route b]
match = POST /b
key = form:id
key_prefix = b:
[route c]
match = POST /c
key = form:id
[route d]
match = POST /d
key = form:id
""")
    base = executions(stub)
    ra = send(p.port, "POST", "/a", b"id=42", FORM)
    rb = send(p.port, "POST", "/b", b"id=42", FORM)
    assert ra.status == 200 and rb.status == 200
    assert not replayed(rb)
    assert executions(stub) == base + 2
    rc = send(p.port, "POST", "/c", b"id=42", FORM)
    assert rc.status == 200
    rd = send(p.port, "POST", "/d", b"id=42", FORM)
    assert rd.status == 200 and not replayed(rd)
    assert executions(stub) == base + 4
    # and each still replays its own
    assert replayed(send(p.port, "POST", "/d", b"id=42", FORM))
    assert executions(stub) == base + 4


def test_json_source_string_and_integer(stub, routed):
    p = routed(SOURCES_INI)
    base = executions(stub)
    s = json.dumps({"type": "charge", "data": {"id": "evt_1", "amount": 5}})
    a = send(p.port, "POST", "/events", s.encode(), JSON)
    b = send(p.port, "POST", "/events", s.encode(), JSON)
    assert a.status == 200 and not replayed(a)
    assert b.status == 200 and replayed(b)
    i = json.dumps({"data": {"id": 12345}})
    c = send(p.port, "POST", "/events", i.encode(), JSON)
    d = send(p.port, "POST", "/events", i.encode(), JSON)
    assert c.status == 200 and not replayed(c)
    assert d.status == 200 and replayed(d)
    assert executions(stub) == base + 2
    # the same id, a different body -> one key, 422
    e = send(p.port, "POST", "/events", b'{"data":{"id":12345},"x":1}', JSON)
    assert_problem(e, 422, "idempotency-key-mismatch")
    assert executions(stub) == base + 2


@pytest.mark.parametrize("target,body,ctype,source", [
    ("/pay/notify", b"trade_status=TRADE_SUCCESS&total_amount=1", FORM,
     "form:out_trade_no"),                                  # field missing
    ("/pay/notify", b"", FORM, "form:out_trade_no"),       # empty body
    ("/events", b'{"data":{"other":"x"}}', JSON, "json:/data/id"),  # missing
    ("/events", b'{"data":', JSON, "json:/data/id"),       # malformed JSON
    ("/events", b'{"data":{"id":"x"}} trailing', JSON, "json:/data/id"),
    ("/events", b"data=x", FORM, "json:/data/id"),         # not JSON at all
    ("/pay/notify", b"out_trade_no=T1", JSON, "form:out_trade_no"),  # wrong type
])
def test_body_without_key_required(stub, routed, target, body, ctype, source):
    """issue 5: a body that cannot yield the key (not the content type,
    field missing, malformed JSON) -> 400 missing-idempotency-key with a
    detail naming the source, nothing forwarded."""
    p = routed(SOURCES_INI)
    base = executions(stub)
    r = send(p.port, "POST", target, body, ctype)
    doc = assert_problem(r, 400, "missing-idempotency-key")
    assert source in doc["detail"], doc
    assert executions(stub) == base


@pytest.mark.parametrize("body", [
    b'{"data":{"other":"x"}}',      # pointer missing
    b'{"data":',                    # malformed
    b"id=1",                        # not JSON
])
def test_body_without_key_passes_through(stub, routed, body):
    """Without require_key a body that cannot yield the key passes through,
    unprotected: two sends, two executions."""
    p = routed(SOURCES_INI)
    base = executions(stub)
    rs = [send(p.port, "POST", "/loose", body, JSON) for _ in range(2)]
    for r in rs:
        assert r.status == 200 and not replayed(r), r
        assert upstream_echo(r)["body"] == body.decode()
    assert executions(stub) == base + 2


def test_unusable_key_value(stub, routed):
    """A value that is there but is no valid key (too long with the prefix,
    not visible ASCII) is 400 invalid-idempotency-key, as for a header."""
    p = routed(SOURCES_INI)
    base = executions(stub)
    long = "x" * 252                    # 4 ("pay:") + 252 > 255
    r = send(p.port, "POST", "/pay/notify", f"out_trade_no={long}".encode(), FORM)
    assert_problem(r, 400, "invalid-idempotency-key")
    ok = "x" * 251
    r = send(p.port, "POST", "/pay/notify", f"out_trade_no={ok}".encode(), FORM)
    assert r.status == 200, r
    r = send(p.port, "POST", "/events", b'{"data":{"id":"a b"}}', JSON)
    assert_problem(r, 400, "invalid-idempotency-key")
    r = send(p.port, "POST", "/events", b'{"data":{"id":1.5}}', JSON)
    assert r.status == 400, r
    assert executions(stub) == base + 1


# ---------------------------------------------------------------- scope

SCOPE_INI = """
[route api]
match = POST,PATCH /api/*
key = header:Idempotency-Key
scope = header:Authorization
"""


@pytest.mark.stores("memory", "postgres", "postgres+redis")
def test_scope_isolation(store_args, stub, routed):
    p = routed(SCOPE_INI, *store_args)
    wait_readyz(p)
    base = executions(stub)
    k = f"k-{uuid.uuid4()}"
    target = "/api/orders?header=Set-Cookie:sid%3Dsecret-A"
    body = b'{"item":"book"}'
    a1 = send(p.port, "POST", target, body, JSON,
              [("Authorization", "Bearer A"), ("Idempotency-Key", k)])
    b1 = send(p.port, "POST", target, body, JSON,
              [("Authorization", "Bearer B"), ("Idempotency-Key", k)])
    assert a1.status == 200 and not replayed(a1), a1
    assert b1.status == 200 and not replayed(b1), b1
    assert echo_n(a1) != echo_n(b1)
    assert executions(stub) == base + 2
    # caller A again: replay of A's response, Set-Cookie kept (scoped key)
    a2 = send(p.port, "POST", target, body, JSON,
              [("Authorization", "Bearer A"), ("Idempotency-Key", k)])
    assert a2.status == 200 and replayed(a2), a2
    assert echo_n(a2) == echo_n(a1)
    assert a2.header_all("Set-Cookie") == ["sid=secret-A"], a2
    # B with a different body: B's own record -> 422; A's is untouched
    b2 = send(p.port, "POST", target, b'{"item":"car"}', JSON,
              [("Authorization", "Bearer B"), ("Idempotency-Key", k)])
    assert_problem(b2, 422, "idempotency-key-mismatch")
    # a caller without the header is a third scope
    c1 = send(p.port, "POST", target, body, JSON, [("Idempotency-Key", k)])
    assert c1.status == 200 and not replayed(c1), c1
    assert executions(stub) == base + 3


def test_set_cookie_dropped_without_scope(stub, routed):
    """DESIGN §7: with the global scope the stored copy has no Set-Cookie."""
    p = routed(SCOPE_INI)
    k = f"k-{uuid.uuid4()}"
    target = "/global?header=Set-Cookie:sid%3Dsecret"
    a = send(p.port, "POST", target, b"{}", JSON, [("Idempotency-Key", k)])
    b = send(p.port, "POST", target, b"{}", JSON, [("Idempotency-Key", k)])
    assert a.header_all("Set-Cookie") == ["sid=secret"], a
    assert replayed(b) and b.header_all("Set-Cookie") == [], b


# ---------------------------------------------------------------- signatures

HOOKS_INI = """
[route github]
match = POST /hooks/github
key = header:X-GitHub-Delivery
require_key = yes
verify = hmac-sha256
verify_format = github
verify_secret_env = ROUTE_TEST_GH_SECRET

[route stripe]
match = POST /hooks/stripe
key = json:/id
key_prefix = stripe:
require_key = yes
verify = hmac-sha256
verify_format = stripe
verify_secret_env = ROUTE_TEST_ST_SECRET
verify_tolerance = 60s
"""
HOOKS_ENV = {"ROUTE_TEST_GH_SECRET": GH_SECRET,
             "ROUTE_TEST_ST_SECRET": ST_SECRET}


def gh_post(p, body, delivery, sig):
    hs = [("X-GitHub-Event", "push"), ("X-GitHub-Delivery", delivery)]
    if sig is not None:
        hs.append(("X-Hub-Signature-256", sig))
    return send(p.port, "POST", "/hooks/github", body, JSON, hs)


def test_github_webhook(stub, routed):
    p = routed(HOOKS_INI, env=HOOKS_ENV)
    base = executions(stub)
    body = b'{"ref":"refs/heads/main","after":"abc123"}'
    d = str(uuid.uuid4())

    # forged first: 401, nothing claimed, nothing forwarded
    r = gh_post(p, body, d, gh_sig(body, "wrong secret"))
    doc = assert_problem(r, 401, "signature-invalid")
    r = gh_post(p, body, d, None)
    assert_problem(r, 401, "signature-invalid")
    r = gh_post(p, body, d, "sha256=zz")
    assert_problem(r, 401, "signature-invalid")
    assert executions(stub) == base

    # genuine: executes (the forged tries claimed nothing)
    a = gh_post(p, body, d, gh_sig(body))
    assert a.status == 200 and not replayed(a), a
    hd = upstream_echo(a)["hdict"]
    assert hd["x-hub-signature-256"] == [gh_sig(body)]
    # redelivery: replay
    b = gh_post(p, body, d, gh_sig(body))
    assert b.status == 200 and replayed(b), b
    assert echo_n(a) == echo_n(b)
    assert executions(stub) == base + 1
    # a forger reusing a known delivery id gets 401, never the stored response
    c = gh_post(p, body, d, gh_sig(body, "guess"))
    assert_problem(c, 401, "signature-invalid")
    # the body was changed in transit: the signature does not match
    c = gh_post(p, body + b" ", d, gh_sig(body))
    assert_problem(c, 401, "signature-invalid")
    assert executions(stub) == base + 1
    assert "urn:idemproxy:problem:signature-invalid" == doc["type"]


def test_github_documented_vector(stub, routed):
    """GitHub's documented test vector through the proxy."""
    p = routed(HOOKS_INI, env=HOOKS_ENV)
    sig = ("sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c"
           "8b043e17")
    r = gh_post(p, b"Hello, World!", "vector-1", sig)
    assert r.status == 200, r
    assert upstream_echo(r)["body"] == "Hello, World!"


def st_post(p, body, sig):
    hs = [] if sig is None else [("Stripe-Signature", sig)]
    return send(p.port, "POST", "/hooks/stripe", body, JSON, hs)


def test_stripe_webhook(stub, routed):
    p = routed(HOOKS_INI, env=HOOKS_ENV)
    base = executions(stub)
    evt = f"evt_{uuid.uuid4().hex}"
    body = json.dumps({"id": evt, "type": "payment_intent.succeeded",
                       "data": {"object": {"amount": 2000}}}).encode()
    now = int(time.time())

    assert_problem(st_post(p, body, st_sig(body, secret="whsec_wrong")), 401,
                   "signature-invalid")
    assert_problem(st_post(p, body, None), 401, "signature-invalid")
    # expired: older than verify_tolerance (60s), and from the future
    assert_problem(st_post(p, body, st_sig(body, t=now - 120)), 401,
                   "signature-invalid")
    assert_problem(st_post(p, body, st_sig(body, t=now + 120)), 401,
                   "signature-invalid")
    assert executions(stub) == base

    # genuine, with an old secret's v1 first (secrets being rolled)
    sig = st_sig(body, extra_v1=["0" * 64])
    a = st_post(p, body, sig)
    assert a.status == 200 and not replayed(a), a
    # redelivery (Stripe signs each attempt anew: a new timestamp)
    b = st_post(p, body, st_sig(body, t=now - 30))
    assert b.status == 200 and replayed(b), b
    assert echo_n(a) == echo_n(b)
    assert executions(stub) == base + 1
    # a replay of a captured delivery after the tolerance: refused
    assert_problem(st_post(p, body, st_sig(body, t=now - 61 - 5)), 401,
                   "signature-invalid")
    # a different event executes
    body2 = body.replace(evt.encode(), b"evt_other_" + evt.encode())
    c = st_post(p, body2, st_sig(body2))
    assert c.status == 200 and not replayed(c), c
    assert executions(stub) == base + 2
    m = p.metrics()
    assert metric_value(m, "idemproxy_requests_total",
                        {"outcome": "replayed"}) == 1.0, m


def test_stripe_absurd_timestamp(stub, routed):
    """A timestamp of 30 digits: 401, and no undefined behaviour (the
    proxy's stderr is checked for sanitizer reports at teardown)."""
    p = routed(HOOKS_INI, env=HOOKS_ENV)
    body = b'{"id":"evt_absurd"}'
    mac = hmac.new(ST_SECRET.encode(), b"9" * 30 + b"." + body,
                   hashlib.sha256).hexdigest()
    r = st_post(p, body, f"t={'9' * 30},v1={mac}")
    assert_problem(r, 401, "signature-invalid")
    assert executions(stub) == 0


# ---------------------------------------------------------------- auto keys

AUTO_INI = """
[route checkout]
match = POST /checkout*
key = auto
ttl = 2s
"""


def test_auto_key_double_click(stub, routed):
    p = routed(AUTO_INI)
    base = executions(stub)
    body = b"item=book&qty=1&address=Main+St+1"
    # a double-click: the second click arrives while the first runs
    with cf.ThreadPoolExecutor(2) as ex:
        f1 = ex.submit(send, p.port, "POST", "/checkout?delay_ms=400", body, FORM)
        time.sleep(0.1)
        f2 = ex.submit(send, p.port, "POST", "/checkout?delay_ms=400", body, FORM)
        r1, r2 = f1.result(), f2.result()
    assert r1.status == 200 and r2.status == 200, (r1, r2)
    assert echo_n(r1) == echo_n(r2)
    assert sorted([replayed(r1), replayed(r2)]) == [False, True]
    assert executions(stub) == base + 1
    # and a late third click inside the window
    r3 = send(p.port, "POST", "/checkout?delay_ms=400", body, FORM)
    assert replayed(r3) and echo_n(r3) == echo_n(r1)
    # a different order (body) is a different key
    r4 = send(p.port, "POST", "/checkout?delay_ms=400", body + b"&gift=1", FORM)
    assert r4.status == 200 and not replayed(r4)
    assert executions(stub) == base + 2


def test_auto_key_window(stub, routed):
    """After the short ttl the same order executes again (the trade-off:
    two intended identical orders inside the window become one)."""
    p = routed(AUTO_INI)
    base = executions(stub)
    body = b"item=book&qty=1"
    a = send(p.port, "POST", "/checkout", body, FORM)
    b = send(p.port, "POST", "/checkout", body, FORM)
    assert not replayed(a) and replayed(b)
    assert executions(stub) == base + 1
    time.sleep(2.5)
    c = send(p.port, "POST", "/checkout", body, FORM)
    assert c.status == 200 and not replayed(c), c
    assert echo_n(c) != echo_n(a)
    assert executions(stub) == base + 2


def test_auto_key_scoped(stub, routed):
    """auto with scope: two users posting the same form are two orders."""
    p = routed(AUTO_INI + "scope = header:X-User-Id\n")
    base = executions(stub)
    body = b"item=book"
    a = send(p.port, "POST", "/checkout", body, FORM, [("X-User-Id", "u1")])
    b = send(p.port, "POST", "/checkout", body, FORM, [("X-User-Id", "u2")])
    c = send(p.port, "POST", "/checkout", body, FORM, [("X-User-Id", "u1")])
    assert not replayed(a) and not replayed(b) and replayed(c)
    assert executions(stub) == base + 2


# ---------------------------------------------------------------- issued keys

ISSUED_INI = """
[route form]
match = POST /orders*
key = header:Idempotency-Key
require_key = yes
require_issued_key = yes

[route short]
match = POST /short*
key = header:Idempotency-Key
require_key = yes
require_issued_key = yes
issued_key_ttl = 1s
"""


def keyed(p, target, key, body=b"item=book"):
    return send(p.port, "POST", target, body, FORM, [("Idempotency-Key", key)])


def test_issue_endpoint(stub, routed):
    p = routed(ISSUED_INI)
    base = executions(stub)
    r, k = issue(p.port)
    assert (r.header("Content-Type") or "").split(";")[0] == "application/json"
    assert r.header("Cache-Control") == "no-store", r
    assert ISSUED_RE.match(k), k
    assert abs(int(k.rsplit(".", 1)[1]) - time.time()) < 5
    keys = {issue(p.port)[1] for _ in range(20)}
    assert len(keys) == 20 and k not in keys
    # served by the proxy, never forwarded
    assert executions(stub) == base
    # keep-alive: two on one connection
    with RawConn(p.port) as c:
        a = c.request("GET", ISSUE)
        b = c.request("GET", ISSUE + "?form=checkout")
        assert a.status == 200 and b.status == 200
        assert a.json()["key"] != b.json()["key"]


@pytest.mark.stores("memory", "postgres", "postgres+redis")
def test_issued_key_lifecycle(store_args, stub, routed):
    p = routed(ISSUED_INI, *store_args)
    wait_readyz(p)
    base = executions(stub)
    _, k = issue(p.port)
    a = keyed(p, "/orders", k)
    assert a.status == 200 and not replayed(a), a
    b = keyed(p, "/orders", k)
    assert b.status == 200 and replayed(b), b
    assert echo_n(a) == echo_n(b)
    assert_problem(keyed(p, "/orders", k, b"item=car"), 422,
                   "idempotency-key-mismatch")
    assert executions(stub) == base + 1

    # never issued: random, and forged in our format
    for bad in (f"k-{uuid.uuid4()}",
                f"AAAAAAAAAAAAAAAAAAAAAA.{int(time.time())}",
                k[:-3] + "000"):
        assert_problem(keyed(p, "/orders", bad), 400, "invalid-idempotency-key")
        # a refused key is refused again (nothing was kept for it)
        assert_problem(keyed(p, "/orders", bad), 400, "invalid-idempotency-key")
    assert executions(stub) == base + 1
    # no key at all on a require_key route
    r = send(p.port, "POST", "/orders", b"item=book", FORM)
    assert_problem(r, 400, "missing-idempotency-key")
    # a second issued key is a second order
    _, k2 = issue(p.port)
    c = keyed(p, "/orders", k2)
    assert c.status == 200 and not replayed(c)
    assert executions(stub) == base + 2


def test_issued_key_expiry(stub, routed):
    """issued_key_ttl (route: 1s): a key not used in time -> 400; a key
    used in time keeps replaying after that."""
    p = routed(ISSUED_INI)
    base = executions(stub)
    _, late = issue(p.port)
    _, early = issue(p.port)
    a = keyed(p, "/short", early)
    assert a.status == 200 and not replayed(a), a
    time.sleep(2.2)
    assert_problem(keyed(p, "/short", late), 400, "invalid-idempotency-key")
    b = keyed(p, "/short", early)
    assert b.status == 200 and replayed(b), b
    # the other route's ttl is the global default (10m): the late key is fine
    c = keyed(p, "/orders", late)
    assert c.status == 200 and not replayed(c), c
    assert executions(stub) == base + 2


@pytest.mark.stores("postgres")
def test_issued_key_across_instances(store_args, stub, routed):
    """Issued keys live in the store: issued by one instance, accepted by
    another sharing the database."""
    p1 = routed(ISSUED_INI, *store_args, name="i1.ini")
    p2 = routed(ISSUED_INI, *store_args, name="i2.ini")
    wait_readyz(p1)
    wait_readyz(p2)
    _, k = issue(p1.port)
    a = keyed(p2, "/orders", k)
    assert a.status == 200 and not replayed(a), a
    b = keyed(p1, "/orders", k)
    assert b.status == 200 and replayed(b), b
    assert executions(stub) == 1


# ---------------------------------------------------------------- config errors

@pytest.mark.parametrize("text,env,line,what", [
    ("[route o]\nmatch = POST /o\ncolour = red\n", {}, 3, "colour"),
    ("[idemproxy]\nttl = 1h\n[route o]\nmatch = POST orders\n", {}, 4, "match"),
    ("[route o]\nmatch = POST /o\nkey = cookie:x\n", {}, 3, "key"),
    ("[route o]\nmatch = POST /o\nkey = json:id\n", {}, 3, "key"),
    ("[route o]\nmatch = POST /o\nverify = hmac-sha256\n", {}, 3, "verify"),
    ("[route o]\nmatch = POST /o\nverify = hmac-sha256\n"
     "verify_secret_env = ROUTE_TEST_UNSET_SECRET\n", {}, 4, "verify_secret_env"),
    ("[route o]\nmatch = POST /o\n[route o]\nkey = auto\n", {}, 3, "route o"),
    ("[route o]\nmatch = POST /o\nttl = 1s\nttl = 2s\n", {}, 4, "ttl"),
    ("[route o]\nkey = auto\n", {}, 1, "match"),
    ("[route o]\nmatch = POST /o\nlease = 5s\n", {}, 1, "lease"),
])
def test_config_error_at_start(tmp_path, stub, text, env, line, what):
    path = write_config(tmp_path, text)
    e = clean_env(env)
    e.pop("ROUTE_TEST_UNSET_SECRET", None)
    r = subprocess.run([IDEMPROXY_BIN, "--upstream", stub.url, "--listen",
                        f"127.0.0.1:{free_port()}", "--admin-listen",
                        f"127.0.0.1:{free_port()}", "--config", path],
                       capture_output=True, timeout=20, env=e)
    err = r.stderr.decode()
    assert r.returncode == 2, (r.returncode, err)
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1, err
    assert f"{path}:{line}:" in lines[0], err
    assert what in lines[0], err
    assert "route o" in lines[0], err
    # --check-config says the same
    r2 = subprocess.run([IDEMPROXY_BIN, "--check-config", path,
                         "--upstream", stub.url],
                        capture_output=True, timeout=20, env=e)
    assert r2.returncode == 2 and f"{path}:{line}:" in r2.stderr.decode()


def test_check_config_prints_routes(tmp_path, stub):
    path = write_config(tmp_path, "[idemproxy]\nupstream = http://127.0.0.1:9\n"
                        + SOURCES_INI.replace("[idemproxy]", "")
                        + HOOKS_INI)
    r = subprocess.run([IDEMPROXY_BIN, "--check-config", path],
                       capture_output=True, timeout=20,
                       env=clean_env(HOOKS_ENV))
    out = r.stdout.decode()
    assert r.returncode == 0, r.stderr.decode()
    for want in ("[route alipay]\nmatch = POST /pay/notify\n"
                 "key = form:out_trade_no\nkey_prefix = pay:\nrequire_key = yes\n",
                 "[route json]\nmatch = POST /events*\nkey = json:/data/id\n",
                 "[route github]\n", "verify_format = github\n",
                 "verify_header = X-Hub-Signature-256\n",
                 "[route stripe]\n", "verify_format = stripe\n",
                 "verify_tolerance = 1m\n", "lease = 10s\n"):
        assert want in out, (want, out)
    assert GH_SECRET not in out and ST_SECRET not in out


# ---------------------------------------------------------------- SIGHUP

RELOAD_BASE = """
[idemproxy]
ttl = 1h

[route orders]
match = POST /orders*
key = form:order_id
"""


def test_sighup_reload_routes(stub, routed):
    p = routed(RELOAD_BASE)
    base = executions(stub)
    # /new has no route: a keyless POST passes through, twice
    for _ in range(2):
        r = send(p.port, "POST", "/new", b"item=1", FORM)
        assert r.status == 200 and not replayed(r)
    assert executions(stub) == base + 2

    with open(p.config_path, "a") as f:
        f.write("\n[route new]\nmatch = POST /new\nkey = auto\n")
    p.signal(signal.SIGHUP)
    wait_log(p, "SIGHUP: reloaded", 1)
    a = send(p.port, "POST", "/new", b"item=2", FORM)
    b = send(p.port, "POST", "/new", b"item=2", FORM)
    assert not replayed(a) and replayed(b), (a, b)
    assert executions(stub) == base + 3

    # a bad file: logged, the old routes stay
    with open(p.config_path, "a") as f:
        f.write("\n[route broken]\nmatch = POST /b\nkey = cookie:x\n")
    p.signal(signal.SIGHUP)
    wait_log(p, "SIGHUP: keeping the running config", 1)
    assert f"{p.config_path}:" in p.log() and "route broken" in p.log()
    c = send(p.port, "POST", "/new", b"item=3", FORM)
    d = send(p.port, "POST", "/new", b"item=3", FORM)
    assert not replayed(c) and replayed(d)
    assert executions(stub) == base + 4

    # remove the route again: /new passes through once more
    with open(p.config_path, "w") as f:
        f.write(RELOAD_BASE)
    p.signal(signal.SIGHUP)
    wait_log(p, "SIGHUP: reloaded", 2)
    for _ in range(2):
        r = send(p.port, "POST", "/new", b"item=4", FORM)
        assert r.status == 200 and not replayed(r)
    assert executions(stub) == base + 6


def test_sighup_reload_verify_secret(stub, routed):
    """A route with verify_secret_env still loads on SIGHUP (the secret
    comes from the process environment)."""
    p = routed(RELOAD_BASE, env=HOOKS_ENV)
    with open(p.config_path, "a") as f:
        f.write(HOOKS_INI)
    p.signal(signal.SIGHUP)
    wait_log(p, "SIGHUP: reloaded", 1)
    body = b'{"zen":"Keep it logically awesome."}'
    r = gh_post(p, body, "d-1", gh_sig(body))
    assert r.status == 200, r
    assert_problem(gh_post(p, body, "d-2", gh_sig(body, "x")), 401,
                   "signature-invalid")



def test_issued_key_in_form_field(stub, routed):
    """A plain HTML form cannot send a header: the issued key travels in a
    hidden field (key = form:FIELD)."""
    p = routed("""
[route form]
match = POST /form
key = form:idem_key
require_key = yes
require_issued_key = yes
""")
    base = executions(stub)
    _, k = issue(p.port)
    body = f"item=book&idem_key={k}".encode()
    a = send(p.port, "POST", "/form", body, FORM)
    b = send(p.port, "POST", "/form", body, FORM)
    assert a.status == 200 and not replayed(a), a
    assert b.status == 200 and replayed(b), b
    assert_problem(send(p.port, "POST", "/form", b"item=book&idem_key=nope.1",
                        FORM), 400, "invalid-idempotency-key")
    assert executions(stub) == base + 1


PREFIX_INI = """
[route shop]
match = POST /shop*
key = header:Idempotency-Key
key_prefix = shop:

[route blog]
match = POST /blog*
key = header:Idempotency-Key
key_prefix = blog:

[route issued]
match = POST /issued*
key = header:Idempotency-Key
key_prefix = shop:
require_key = yes
require_issued_key = yes
"""


def test_header_source_with_prefix(stub, routed):
    """key_prefix on a header source: duplicates replay, and the same
    header value on two prefixed routes is two keys."""
    p = routed(PREFIX_INI)
    base = executions(stub)
    k = f"k-{uuid.uuid4()}"
    a = send(p.port, "POST", "/shop", b"{}", JSON, [("Idempotency-Key", k)])
    b = send(p.port, "POST", "/shop", b"{}", JSON, [("Idempotency-Key", k)])
    c = send(p.port, "POST", "/blog", b"{}", JSON, [("Idempotency-Key", k)])
    assert a.status == 200 and not replayed(a), a
    assert b.status == 200 and replayed(b), b
    assert c.status == 200 and not replayed(c), c
    # the key goes upstream exactly as the client sent it (no prefix)
    assert upstream_echo(a)["hdict"]["idempotency-key"] == [k]
    assert executions(stub) == base + 2


def test_issued_key_with_prefix(stub, routed):
    """require_issued_key with a key_prefix: the client sends the key as
    issued; the prefix must not make it unknown."""
    p = routed(PREFIX_INI)
    _, k = issue(p.port)
    a = keyed(p, "/issued", k)
    assert a.status == 200 and not replayed(a), a
    b = keyed(p, "/issued", k)
    assert b.status == 200 and replayed(b), b
    assert executions(stub) == 1
