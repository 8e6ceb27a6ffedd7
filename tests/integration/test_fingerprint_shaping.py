"""Shaped fingerprints through the real binary (issue 23; DESIGN.md §4;
docs/protocol.md "Shaped fingerprints"): what counts as the same request.

- The article's scenario 2: an Alipay notification redelivered with a new
  notify_time, notify_id and sign, its fields in another order, replays the
  first delivery's "success"; a changed amount under the same out_trade_no
  is 422.
- JSON re-serialised by another client (member order, spacing, number
  spelling) replays; a per-attempt member in fingerprint_ignore does not
  count; a changed amount does. fingerprint_only counts only what it names.
- fingerprint_query = sorted / ignore.
- A body that is not JSON on a json route still passes as before, by its
  raw bytes, counted in idemproxy_fingerprint_fallbacks_total.
- A changed shaping is a different fingerprint domain: a key completed
  before a reload that turns json on answers 422, never a replay.
- key = auto uses the shaped fingerprint.
- Issue 44: every pointer of a list names a place in the body as the client
  sent it (ignoring /items/0 and /items/1 leaves items[2] counted, and a
  re-stamped lines[1] still replays); a json or form route shapes only a
  body whose Content-Type says it is one (JSON, text and multipart bodies on
  a form route are their bytes); JSON that is not UTF-8 as RFC 3629 has it
  falls back to its bytes.

Executions are counted by the stub; its echo's "n" tells executions apart.
"""
import json
import signal
import subprocess
import uuid

import pytest

from support.http import assert_problem
from support.procs import IDEMPROXY_BIN, clean_env, metric_value
from test_routes import (FORM, JSON, echo_n, executions, replayed, routed,
                         send, wait_log, write_config)

assert routed  # a fixture, used by name

ALIPAY_INI = """
[idemproxy]
upstream_timeout = 5s
lease = 10s

[route alipay]
match = POST /alipay/notify
key = form:out_trade_no
key_prefix = alipay:
require_key = yes
fingerprint = form
fingerprint_ignore = notify_time, notify_id, sign, sign_type

[route orders]
match = POST /orders*
fingerprint = json
fingerprint_ignore = /sent_at, /meta/attempt

[route charges]
match = POST /charges*
fingerprint = json
fingerprint_only = /amount, /currency

[route search]
match = POST /search*
fingerprint_query = sorted

[route ping]
match = POST /ping*
fingerprint_query = ignore

[route click]
match = POST /click*
key = auto
ttl = 30s
fingerprint = json
"""


def alipay_body(notify_time, notify_id, sign, amount="88.80", order=None):
    fields = [("notify_time", notify_time), ("notify_type", "trade_status_sync"),
              ("notify_id", notify_id), ("sign_type", "RSA2"), ("sign", sign),
              ("out_trade_no", "T20261205-0001"), ("trade_no", "2026120522001"),
              ("trade_status", "TRADE_SUCCESS"), ("total_amount", amount)]
    if order is not None:
        fields = [fields[i] for i in order]
    from urllib.parse import quote_plus
    return "&".join(f"{k}={quote_plus(v)}" for k, v in fields).encode()


@pytest.mark.stores("memory", "postgres")
def test_alipay_redelivery_replays(store_args, stub, routed):
    p = routed(ALIPAY_INI, *store_args)
    base = executions(stub)
    first = send(p.port, "POST", "/alipay/notify",
                 alipay_body("2026-12-05 10:00:00", "n-1", "c2lnbjE="), FORM)
    assert first.status == 200 and not replayed(first), first
    # the channel redelivers: new time, id and signature, fields reordered
    again = send(p.port, "POST", "/alipay/notify",
                 alipay_body("2026-12-05 10:04:00", "n-2", "c2lnbjI+/w==",
                             order=[8, 7, 6, 5, 4, 3, 2, 1, 0]), FORM)
    assert again.status == 200 and replayed(again), again
    assert echo_n(again) == echo_n(first)
    assert again.body == first.body
    # the same trade number with another amount is another request
    other = send(p.port, "POST", "/alipay/notify",
                 alipay_body("2026-12-05 10:05:00", "n-3", "c2lnbjM=",
                             amount="99.90"), FORM)
    assert_problem(other, 422, "idempotency-key-mismatch")
    assert executions(stub) == base + 1


@pytest.mark.stores("memory", "postgres")
def test_json_reserialised_replays(store_args, stub, routed):
    p = routed(ALIPAY_INI, *store_args)
    base = executions(stub)
    k = [("Idempotency-Key", f"o-{uuid.uuid4()}")]
    a = send(p.port, "POST", "/orders",
             b'{"amount":100,"currency":"EUR","items":[{"sku":"b","n":1}],'
             b'"sent_at":"10:00:00","meta":{"attempt":1,"src":"app"}}', JSON, k)
    assert a.status == 200 and not replayed(a), a
    # another SDK: members reordered, spaces, 100.0, a new sent_at/attempt
    b = send(p.port, "POST", "/orders",
             b'{ "meta": {"src": "app", "attempt": 2}, "sent_at": "10:00:05",\n'
             b'  "items": [ {"n": 1.0, "sku": "b"} ], "currency": "EUR",'
             b' "amount": 1e2 }', JSON, k)
    assert b.status == 200 and replayed(b), b
    assert echo_n(b) == echo_n(a)
    # a changed amount, or a changed member next to an ignored one: 422
    c = send(p.port, "POST", "/orders",
             b'{"amount":101,"currency":"EUR","items":[{"sku":"b","n":1}],'
             b'"sent_at":"10:00:00","meta":{"attempt":1,"src":"app"}}', JSON, k)
    assert_problem(c, 422, "idempotency-key-mismatch")
    d = send(p.port, "POST", "/orders",
             b'{"amount":100,"currency":"EUR","items":[{"sku":"b","n":1}],'
             b'"sent_at":"10:00:00","meta":{"attempt":1,"src":"web"}}', JSON, k)
    assert_problem(d, 422, "idempotency-key-mismatch")
    # fingerprint_only: nothing but the amount and currency count
    k2 = [("Idempotency-Key", f"c-{uuid.uuid4()}")]
    e = send(p.port, "POST", "/charges",
             b'{"amount":5,"currency":"USD","note":"first"}', JSON, k2)
    f = send(p.port, "POST", "/charges",
             b'{"note":"retry","currency":"USD","amount":5,"trace":"x"}',
             JSON, k2)
    g = send(p.port, "POST", "/charges",
             b'{"amount":5,"currency":"EUR","note":"first"}', JSON, k2)
    assert e.status == 200 and not replayed(e), e
    assert f.status == 200 and replayed(f) and echo_n(f) == echo_n(e), f
    assert_problem(g, 422, "idempotency-key-mismatch")
    assert executions(stub) == base + 2


def test_query_shaping(stub, routed):
    p = routed(ALIPAY_INI)
    base = executions(stub)
    k = [("Idempotency-Key", f"s-{uuid.uuid4()}")]
    a = send(p.port, "POST", "/search?b=2&a=%7Ex+y&a=0", b"q", FORM, k)
    b = send(p.port, "POST", "/search?a=~x%20y&a=0&b=%32", b"q", FORM, k)
    c = send(p.port, "POST", "/search?a=0&a=~x+y&b=2", b"q", FORM, k)
    assert a.status == 200 and not replayed(a), a
    assert b.status == 200 and replayed(b) and echo_n(b) == echo_n(a), b
    # a repeated parameter keeps its order: another request
    assert_problem(c, 422, "idempotency-key-mismatch")
    k = [("Idempotency-Key", f"p-{uuid.uuid4()}")]
    d = send(p.port, "POST", "/ping?cb=1", b"x", FORM, k)
    e = send(p.port, "POST", "/ping?cb=2", b"x", FORM, k)
    f = send(p.port, "POST", "/ping", b"y", FORM, k)
    assert d.status == 200 and not replayed(d), d
    assert e.status == 200 and replayed(e), e
    assert_problem(f, 422, "idempotency-key-mismatch")
    # what went upstream is what the client sent, not the shaped target
    assert a.json()["target"] == "/search?b=2&a=%7Ex+y&a=0", a.json()
    assert executions(stub) == base + 2


def test_not_json_falls_back_to_bytes(stub, routed):
    p = routed(ALIPAY_INI)
    base = executions(stub)
    before = metric_value(p.metrics(), "idemproxy_fingerprint_fallbacks_total")
    k = [("Idempotency-Key", f"f-{uuid.uuid4()}")]
    a = send(p.port, "POST", "/orders", b"amount=100 (not JSON)", FORM, k)
    b = send(p.port, "POST", "/orders", b"amount=100 (not JSON)", FORM, k)
    c = send(p.port, "POST", "/orders", b"amount=100  (not JSON)", FORM, k)
    # a member named twice: not JCS; never the same as its last value
    k2 = [("Idempotency-Key", f"d-{uuid.uuid4()}")]
    d = send(p.port, "POST", "/orders", b'{"amount":1,"amount":100}', JSON, k2)
    e = send(p.port, "POST", "/orders", b'{"amount":100}', JSON, k2)
    assert a.status == 200 and not replayed(a), a
    assert b.status == 200 and replayed(b), b
    assert_problem(c, 422, "idempotency-key-mismatch")
    assert d.status == 200 and not replayed(d), d
    assert_problem(e, 422, "idempotency-key-mismatch")
    after = metric_value(p.metrics(), "idemproxy_fingerprint_fallbacks_total")
    assert after - (before or 0) == 4, (before, after)
    assert executions(stub) == base + 2


def test_auto_key_uses_the_shaped_fingerprint(stub, routed):
    p = routed(ALIPAY_INI)
    base = executions(stub)
    a = send(p.port, "POST", "/click", b'{"cart":7,"qty":1}', JSON)
    b = send(p.port, "POST", "/click", b'{ "qty": 1, "cart": 7 }', JSON)
    c = send(p.port, "POST", "/click", b'{"cart":7,"qty":2}', JSON)
    assert not replayed(a) and replayed(b) and not replayed(c), (a, b, c)
    assert echo_n(b) == echo_n(a) and echo_n(c) != echo_n(a)
    assert executions(stub) == base + 2


def test_changed_shaping_never_replays_across(stub, routed):
    """A record written under one shaping is not replayed for a request
    fingerprinted under another: turning json on answers 422 for a key
    completed before, even for the very same bytes."""
    ini = "[route o]\nmatch = POST /o\n"
    p = routed(ini)
    base = executions(stub)
    k = [("Idempotency-Key", f"x-{uuid.uuid4()}")]
    body = b'{"amount":100}'
    a = send(p.port, "POST", "/o", body, JSON, k)
    assert a.status == 200 and not replayed(a), a
    with open(p.config_path, "w") as f:
        f.write(ini + "fingerprint = json\n")
    p.signal(signal.SIGHUP)
    wait_log(p, "SIGHUP: reloaded", 1)
    b = send(p.port, "POST", "/o", body, JSON, k)
    assert_problem(b, 422, "idempotency-key-mismatch")
    # new keys are shaped: reordered JSON replays
    k = [("Idempotency-Key", f"y-{uuid.uuid4()}")]
    c = send(p.port, "POST", "/o", b'{"a":1,"b":2}', JSON, k)
    d = send(p.port, "POST", "/o", b'{"b":2,"a":1}', JSON, k)
    assert not replayed(c) and replayed(d), (c, d)
    assert executions(stub) == base + 2


@pytest.mark.parametrize("text,line,what", [
    ("[route o]\nmatch = POST /o\nfingerprint_ignore = /a\n", 1,
     "fingerprint_ignore needs fingerprint = json or form"),
    ("[route o]\nmatch = POST /o\nfingerprint = json\n"
     "fingerprint_ignore = sent_at\n", 1, "is not a JSON pointer"),
    ("[route o]\nmatch = POST /o\nfingerprint = form\n"
     "fingerprint_ignore = a\nfingerprint_only = b\n", 1, "exclude each other"),
    ("[route o]\nmatch = POST /o\nfingerprint = form\n"
     "fingerprint_only = a,,b\n", 4, "an empty item"),
    ("[route o]\nmatch = POST /o\nfingerprint = xml\n", 3, "fingerprint"),
    ("[route o]\nmatch = POST /o\nfingerprint_query = lower\n", 3,
     "fingerprint_query"),
])
def test_shaping_config_errors(tmp_path, stub, text, line, what):
    path = write_config(tmp_path, text)
    r = subprocess.run([IDEMPROXY_BIN, "--check-config", path,
                        "--upstream", stub.url],
                       capture_output=True, timeout=20, env=clean_env({}))
    err = r.stderr.decode()
    assert r.returncode == 2, (r.returncode, err)
    assert f"{path}:{line}: route o" in err and what in err, err


def test_check_config_shows_shaping(tmp_path, stub):
    path = write_config(tmp_path, "[idemproxy]\nupstream = http://127.0.0.1:9\n"
                        "fingerprint_query = sorted\n"
                        + ALIPAY_INI.replace("[idemproxy]", ""))
    r = subprocess.run([IDEMPROXY_BIN, "--check-config", path],
                       capture_output=True, timeout=20, env=clean_env({}))
    out = r.stdout.decode()
    assert r.returncode == 0, r.stderr.decode()
    for want in ("[route alipay]\n",
                 "fingerprint = form\n"
                 "fingerprint_ignore = notify_time,notify_id,sign,sign_type\n"
                 "fingerprint_query = sorted\n",
                 "fingerprint = json\nfingerprint_only = /amount,/currency\n",
                 "[route ping]\n", "fingerprint_query = ignore\n"):
        assert want in out, (want, out)


# ------------------------------------------------------ issue 44: places, media

PLACES_INI = """
[idemproxy]
upstream_timeout = 5s

[route items]
match = POST /items*
fingerprint = json
fingerprint_ignore = /items/0, /items/1

[route lines]
match = POST /lines*
fingerprint = json
fingerprint_ignore = /lines/0/sent_at, /lines/1/sent_at

[route batch]
match = POST /batch*
fingerprint = json
fingerprint_ignore = /lines/0, /lines/1/sent_at

[route transfer]
match = POST /transfer*
fingerprint = form

[route doc]
match = POST /doc*
fingerprint = json
"""


def key_executions(stub, key):
    """How often the stub executed requests with this Idempotency-Key."""
    return stub.stats()["keys"].get(key, 0)


def keyed(prefix):
    k = f"{prefix}-{uuid.uuid4()}"
    return k, [("Idempotency-Key", k)]


def items(*amounts):
    return json.dumps({"items": [{"sku": f"s{i}", "amount": a}
                                 for i, a in enumerate(amounts)]}).encode()


@pytest.mark.stores("memory", "postgres")
def test_ignored_elements_of_one_array(store_args, stub, routed):
    """fingerprint_ignore = /items/0, /items/1: items[2] counts, items[0]
    and items[1] do not. At d99a8fe the second pointer removed items[2]
    (the first had shifted the array), so another amount replayed 201."""
    p = routed(PLACES_INI, *store_args)
    k, h = keyed("items")
    a = send(p.port, "POST", "/items?status=201", items(5, 7, 1), JSON, h)
    assert a.status == 201 and not replayed(a), a
    # items[2].amount 1 -> 1000: another request
    b = send(p.port, "POST", "/items?status=201", items(5, 7, 1000), JSON, h)
    assert_problem(b, 422, "idempotency-key-mismatch")
    # items[0] and items[1] changed, items[2] as it was: the same request
    c = send(p.port, "POST", "/items?status=201", items(6, 8, 1), JSON, h)
    assert c.status == 201 and replayed(c) and echo_n(c) == echo_n(a), c
    assert key_executions(stub, k) == 1


@pytest.mark.stores("memory", "postgres")
def test_restamped_lines_replay(store_args, stub, routed):
    """A retry that only re-stamps sent_at replays: with the stamps of
    lines[0] and lines[1] ignored, and with lines[0] and lines[1].sent_at
    ignored (at d99a8fe the second pointer named what had been lines[2]
    once lines[0] was gone: 422)."""
    p = routed(PLACES_INI, *store_args)

    def body(stamp0, stamp1, sku1="b"):
        return json.dumps({"order": "o-1", "lines": [
            {"sku": "a", "sent_at": stamp0},
            {"sku": sku1, "sent_at": stamp1}]}).encode()

    for target in ("/lines", "/batch"):
        k, h = keyed(target[1:])
        a = send(p.port, "POST", target, body("10:00:00", "10:00:00"), JSON, h)
        assert a.status == 200 and not replayed(a), a
        b = send(p.port, "POST", target, body("10:00:00", "10:00:07"), JSON, h)
        assert b.status == 200 and replayed(b), (target, b)
        assert echo_n(b) == echo_n(a)
        # what is not ignored still counts
        c = send(p.port, "POST", target, body("10:00:00", "10:00:07", "c"),
                 JSON, h)
        assert_problem(c, 422, "idempotency-key-mismatch")
        assert key_executions(stub, k) == 1, target


MULTIPART = (b"--xyz\r\nContent-Disposition: form-data; name=\"f\"; "
             b"filename=\"a.txt\"\r\nContent-Type: text/plain\r\n\r\n"
             b"%s\r\n--xyz--\r\n")


@pytest.mark.stores("memory", "postgres")
def test_form_route_shapes_only_forms(store_args, stub, routed):
    """fingerprint = form reads only an urlencoded body as a form: JSON,
    text and multipart bodies are their bytes, so '+' and ' ' or another
    order of '&' pieces are other requests (at d99a8fe each second one
    was replayed). Each is a fallback, counted."""
    p = routed(PLACES_INI, *store_args)
    before = metric_value(p.metrics(), "idemproxy_fingerprint_fallbacks_total")
    pairs = [
        (JSON, b'{"to":"a+b"}', b'{"to":"a b"}'),
        ("text/plain", b"pay 10&to bob", b"to bob&pay 10"),
        ("multipart/form-data; boundary=xyz", MULTIPART % b"x+y",
         MULTIPART % b"x y"),
    ]
    for ctype, first, second in pairs:
        k, h = keyed("t")
        a = send(p.port, "POST", "/transfer", first, ctype, h)
        assert a.status == 200 and not replayed(a), (ctype, a)
        b = send(p.port, "POST", "/transfer", second, ctype, h)
        assert_problem(b, 422, "idempotency-key-mismatch")
        c = send(p.port, "POST", "/transfer", first, ctype, h)
        assert c.status == 200 and replayed(c), (ctype, c)
        assert key_executions(stub, k) == 1, ctype
    # a form, its type in any case and with a charset, is still shaped
    k, h = keyed("f")
    a = send(p.port, "POST", "/transfer", b"pay=10&to=a+b", FORM, h)
    b = send(p.port, "POST", "/transfer", b"to=a%20b&pay=10",
             "Application/X-WWW-Form-Urlencoded; charset=UTF-8", h)
    assert a.status == 200 and not replayed(a), a
    assert b.status == 200 and replayed(b), b
    assert key_executions(stub, k) == 1
    after = metric_value(p.metrics(), "idemproxy_fingerprint_fallbacks_total")
    assert after - (before or 0) == 9, (before, after)


@pytest.mark.stores("memory", "postgres")
def test_json_route_shapes_only_json(store_args, stub, routed):
    """fingerprint = json reads a body as JSON only when its Content-Type
    is application/json or a +json type (parameters and case aside);
    anything else, or no Content-Type, is its bytes."""
    p = routed(PLACES_INI, *store_args)
    first, second = b'{"a":1,"b":"x y"}', b'{ "b": "x y", "a": 1.0 }'
    for ctype in ("application/json", "APPLICATION/JSON; charset=utf-8",
                  "application/vnd.api+json", "application/problem+json"):
        k, h = keyed("j")
        a = send(p.port, "POST", "/doc", first, ctype, h)
        b = send(p.port, "POST", "/doc", second, ctype, h)
        assert a.status == 200 and not replayed(a), (ctype, a)
        assert b.status == 200 and replayed(b), (ctype, b)
        assert key_executions(stub, k) == 1, ctype
    before = metric_value(p.metrics(), "idemproxy_fingerprint_fallbacks_total")
    for ctype in (FORM, "text/plain", "application/jsonx", None):
        k, h = keyed("n")
        a = send(p.port, "POST", "/doc", first, ctype, h)
        b = send(p.port, "POST", "/doc", second, ctype, h)
        c = send(p.port, "POST", "/doc", first, ctype, h)
        assert a.status == 200 and not replayed(a), (ctype, a)
        assert_problem(b, 422, "idempotency-key-mismatch")
        assert c.status == 200 and replayed(c), (ctype, c)
        assert key_executions(stub, k) == 1, ctype
    after = metric_value(p.metrics(), "idemproxy_fingerprint_fallbacks_total")
    assert after - (before or 0) == 12, (before, after)


@pytest.mark.parametrize("bad", [b"\xc0\x80", b"\xed\xa0\x80",
                                 b"\xf4\x90\x80\x80"])
def test_json_not_utf8_falls_back(stub, routed, bad):
    """An overlong form, an encoded surrogate, a code point beyond
    U+10FFFF: not UTF-8, so not JSON, so the raw bytes (docs "Shaped
    fingerprints"); at d99a8fe they were canonicalised and two spellings
    replayed."""
    p = routed(PLACES_INI)
    before = metric_value(p.metrics(), "idemproxy_fingerprint_fallbacks_total")
    k, h = keyed("u")
    a = send(p.port, "POST", "/doc", b'{"a":"' + bad + b'","b":1}', JSON, h)
    b = send(p.port, "POST", "/doc", b'{ "b": 1, "a": "' + bad + b'" }', JSON, h)
    assert a.status == 200 and not replayed(a), a
    assert_problem(b, 422, "idempotency-key-mismatch")
    assert key_executions(stub, k) == 1
    after = metric_value(p.metrics(), "idemproxy_fingerprint_fallbacks_total")
    assert after - (before or 0) == 2, (before, after)
