#!/usr/bin/env python3
"""Write the seed corpora of tests/fuzz/corpus/TARGET (run from anywhere).

The seeds come from the tests: every raw request the integration tests send
as bytes (tests/integration/*.py), requests built with their own
build_request() for the scenarios of test_routes.py against the routes of
fuzz_request.c, the config files of test_routes.py and of the docs' INI
examples, the values of the unit tests; plus hand-written edge cases. A
file whose name starts with crash- is a regression input (a finding, kept)
and is never written or removed here.

    tests/fuzz/seeds.py          rewrite the generated seeds
"""
import ast
import base64
import hashlib
import hmac
import json
import os
import re
import sys

sys.dont_write_bytecode = True

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from support.http import build_request  # noqa: E402

# fuzz_request.c's and fuzz_verify.c's secrets
HOOK_SECRET = b"s3cret"
STRIPE_SECRET = b"whsec_fuzz"
VERIFY_SECRET = b"whsec_fuzz_secret"
VERIFY_NOW = 1700000000
METHODS = rb"(GET|HEAD|POST|PUT|PATCH|DELETE|OPTIONS|TRACE|CONNECT|PRI|X)"


def constants(path):
    """Bytes and str constants of a Python file, concatenations evaluated."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, (bytes, str)):
            out.append(node.value)
        elif isinstance(node, ast.BinOp) and all(
                isinstance(n, (ast.BinOp, ast.Constant, ast.operator))
                for n in ast.walk(node)):
            try:
                v = eval(compile(ast.Expression(node), path, "eval"), {})
            except Exception:
                continue
            if isinstance(v, (bytes, str)):
                out.append(v)
    return out


def test_files():
    d = os.path.join(ROOT, "tests", "integration")
    return [os.path.join(d, f) for f in sorted(os.listdir(d)) if f.endswith(".py")]


def gh_sig(body, secret=HOOK_SECRET):
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def st_sig(body, t, secret=STRIPE_SECRET):
    mac = hmac.new(secret, f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={'0' * 64},v1={mac}"


def req(method, target, headers=None, body=None, **kw):
    return build_request(method, target, headers, body, **kw)


def request_seeds():
    seeds = {}
    # the raw requests of the integration tests
    for path in test_files():
        for v in constants(path):
            if isinstance(v, bytes) and re.match(METHODS + rb" \S* HTTP/", v):
                seeds["it-" + hashlib.sha1(v).hexdigest()[:12]] = v
    form = "application/x-www-form-urlencoded"
    js = "application/json"
    jbody = json.dumps({"data": {"id": "ord-42"}, "amount": 5}).encode()
    hook = b'{"action":"opened","number":1}'
    stripe = b'{"id":"evt_1","type":"charge.succeeded"}'
    built = {
        # test_routes.py's scenarios against fuzz_request.c's routes
        "json-key": req("POST", "/pay/json", [("Content-Type", js)], jbody),
        "json-int-key": req("POST", "/pay/json/v2",
                            [("Content-Type", "application/problem+json")],
                            b'{"data":{"id":12345}}'),
        "json-no-key": req("POST", "/pay/json", [("Content-Type", js)], b"{}"),
        "form-key": req("POST", "/pay/form", [("Content-Type", form)],
                        b"out_trade_no=T%2B1001&total=5+00"),
        "form-wrong-type": req("POST", "/pay/form", [("Content-Type", "text/plain")],
                               b"out_trade_no=T1"),
        "query-key": req("POST", "/q?k=abc%20def&x=1", None, b"x"),
        "auto-key": req("PUT", "/legacy/orders", [("Content-Type", form)], b"a=1"),
        "scoped": req("PATCH", "/mine/cart", [("Authorization", "Bearer u1"),
                                             ("Idempotency-Key", "k-1")], b"{}"),
        "github": req("POST", "/hooks/github",
                      [("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
                       ("X-Hub-Signature-256", gh_sig(hook)),
                       ("Content-Type", js)], hook),
        "github-bad-sig": req("POST", "/hooks/github",
                              [("X-GitHub-Delivery", "d-2"),
                               ("X-Hub-Signature-256", "sha256=" + "0" * 64)], hook),
        "stripe": req("POST", "/hooks/stripe",
                      [("Stripe-Signature", st_sig(stripe, VERIFY_NOW)),
                       ("Content-Type", js)], stripe),
        "issued-get": req("GET", "/.well-known/idempotency-key"),
        "issued-use": req("POST", "/orders", [("Idempotency-Key",
                                               "AAAAAAAAAAAAAAAAAAAAAA.1700000000")],
                          b"{}"),
        "global-header-key": req("POST", "/anything", [("Idempotency-Key",
                                                        '"quoted \\"key\\""')], b"x"),
        "global-two-keys": req("POST", "/anything", [("Idempotency-Key", "a"),
                                                     ("Idempotency-Key", "b")], b""),
        "expect-100": req("POST", "/pay/json", [("Content-Type", js),
                                                ("Expect", "100-continue")], jbody),
        "free": req("DELETE", "/free/x"),
        "http10-keepalive": req("POST", "/anything", [("Connection", "keep-alive"),
                                                      ("Idempotency-Key", "k")],
                                b"ab", version="HTTP/1.0", host=None),
        "absolute-form": req("GET", "http://example.test/a//b/%7Euser;p=1/?x=1"),
        "options-star": req("OPTIONS", "*"),
        "dot-segments": req("POST", "/pay/%2e%2E/json", [("Idempotency-Key", "k")], b""),
        "encoded-slash": req("POST", "/pay%2Fjson", [("Idempotency-Key", "k")], b""),
        "connection-options": req("GET", "/", [("Connection", "close, X-Drop"),
                                               ("X-Drop", "1"), ("TE", "trailers"),
                                               ("X-Forwarded-For", "10.0.0.1")]),
        "chunked-keyed": (b"POST /pay/json HTTP/1.1\r\nHost: a\r\n"
                          b"Content-Type: application/json\r\n"
                          b"Transfer-Encoding: chunked\r\n\r\n"
                          b"5\r\n{\"dat\r\n11;ext=1\r\na\":{\"id\":\"c-1\"}}\r\n"
                          b"0\r\nX-Trailer: t\r\n\r\n"),
        "chunked-pass": (b"PUT /free/up HTTP/1.1\r\nHost: a\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n"
                         b"3\r\nabc\r\n0\r\n\r\n"
                         b"GET /next HTTP/1.1\r\nHost: a\r\n\r\n"),
    }
    pipelined = b"".join([built["json-key"], built["form-key"], built["free"],
                          req("GET", "/", [("Connection", "close")])])
    built["pipelined"] = pipelined
    seeds.update(built)
    return seeds


def response_seeds():
    # flag byte (fuzz_response.c): 1 HEAD, 2 HTTP/1.0 client, 4 pause,
    # 8 fresh connection, 16 client closes, 32 scoped, 64 upgrade asked
    ok = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 8\r\n\r\n{\"n\":1}\n"
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
               b"Set-Cookie: s=1\r\n\r\n4\r\nabcd\r\n3;x=y\r\nefg\r\n0\r\nT: 1\r\n\r\n")
    return {
        "cl": b"\x00" + ok,
        "cl-pipelined-extra": b"\x00" + ok + b"HTTP/1.1 200 OK\r\n",
        "chunked": b"\x00" + chunked,
        "chunked-http10-client": b"\x02" + chunked,
        "chunked-paused": b"\x04" + chunked,
        "scoped-cookie": b"\x20" + chunked,
        "eof-body": b"\x08HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end",
        "http10-upstream": b"\x08HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
        "no-content": b"\x00HTTP/1.1 204 No Content\r\nX-A: b\r\n\r\n",
        "not-modified": b"\x00HTTP/1.1 304 Not Modified\r\nContent-Length: 99\r\nETag: \"x\"\r\n\r\n",
        "head": b"\x01HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n",
        "continue": b"\x00HTTP/1.1 100 Continue\r\n\r\n" + ok,
        "early-hints": b"\x00HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n" + chunked,
        "connection-close": b"\x10HTTP/1.1 500 Internal Server Error\r\nConnection: close, X-Hop\r\n"
                            b"X-Hop: 1\r\nKeep-Alive: timeout=5\r\nContent-Length: 3\r\n\r\nerr",
        "short-body": b"\x00HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial",
        "switching": b"\x00HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n",
        "upgrade-websocket": b"\x40HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                             b"Connection: Upgrade\r\nSec-WebSocket-Accept: x\r\n\r\n\x81\x02hi",
        "upgrade-no-field": b"\x40HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n\r\n",
        "upgrade-refused": b"\x40HTTP/1.1 426 Upgrade Required\r\nContent-Length: 2\r\n\r\nno",
        "upgrade-after-continue": b"\x48HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 101 Switching "
                                  b"Protocols\r\nUpgrade: test\r\n\r\nraw bytes",
        "gzip-te": b"\x00HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nxx",
    }


def keysrc_seeds():
    # selector byte: 0 query, 1 form, 2 json; | 4 with a key_prefix
    return {
        "query": b"\x00k\n/q?k=abc%20def&x=1#frag",
        "query-plus": b"\x04idempotency_key\n/p?a&idempotency_key=a+b%41",
        "form": b"\x01out_trade_no\nout_trade_no=T%2B1001&total_fee=100",
        "form-no-eq": b"\x01out_trade_no\nfoo=1&out_trade_no&bar",
        "json": b'\x02/data/id\n{"data":{"id":"ord-42"},"amount":5}',
        "json-int": b'\x06/data/id\n{"data":{"id":-12345678901234}}',
        "json-escape": b'\x02/a~1b/m~0n\n{"a/b":{"m~n":"k\\u00e9y"}}',
        "json-array": b'\x02/items/0/id\n{"items":[{"id":"x"}]}',
        "json-root": b'\x02\n"whole"',
        "json-float": b'\x02/id\n{"id":1.0}',
    }


def idemkey_seeds():
    return {
        "bare": b"8e03978e-40d5-43e8-bc93-6894a57f9324",
        "quoted": b'"abc"',
        "escapes": b'  "a\\"b\\\\c"\t',
        "issued": b"AAAAAAAAAAAAAAAAAAAAAA.1700000000",
        "long": b"k" * 255,
        "too-long": b"k" * 256,
        "inner-space": b'"a b"',
        "utf8": "\u00e9t\u00e9".encode(),
    }


def verify_seeds():
    body = b'{"action":"opened","number":1}'
    mac = hmac.new(VERIFY_SECRET, body, hashlib.sha256).hexdigest()
    t = VERIFY_NOW - 10
    smac = hmac.new(VERIFY_SECRET, f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return {
        "github": b"\x00sha256=" + mac.encode() + b"\n" + body,
        "github-upper": b"\x00SHA256=" + mac.upper().encode() + b"\n" + body,
        "stripe": f"\x01t={t}, v1={'0' * 64},v1={smac}\n".encode() + body,
        "stripe-old": f"\x01t={t - 1000},v1={smac}\n".encode() + body,
        "stripe-no-t": f"\x01v1={smac}\n".encode() + body,
    }


def config_seeds():
    seeds = {}
    path = os.path.join(ROOT, "tests", "integration", "test_routes.py")
    for v in constants(path):
        if isinstance(v, str) and ("[route" in v or "[idemproxy]" in v):
            seeds["it-" + hashlib.sha1(v.encode()).hexdigest()[:12]] = v.encode()
    for doc in ("configuration.md", "recipes.md", "deploy.md", "operations.md"):
        text = open(os.path.join(ROOT, "docs", doc), encoding="utf-8").read()
        for block in re.findall(r"```ini\n(.*?)```", text, re.S):
            seeds["doc-" + hashlib.sha1(block.encode()).hexdigest()[:12]] = block.encode()
    seeds["all-keys"] = (
        "\ufeff[idemproxy]\n  store = postgres://u:p%40ss@db/x?password=q&sslmode=require\n"
        "redis = redis://127.0.0.1:6379/2\nmethods = POST, PATCH,PUT\n"
        "in_flight = reject\nttl = 24h\nlease = 60s\nmax_body = 1MiB\n"
        "log_level = debug\nlog_format = json\n; comment\n# comment\n"
        "[route a]\nmatch = * /a*\nkey = header:X-Key\nkey_prefix = a:\n"
        "require_key = yes\nin_flight = wait\nwait_timeout = 5s\nttl = 1h\n"
        "lease = 30s\nmax_body = 1KiB\nmax_cached_response = 2KiB\n"
        "on_upstream_error = keep\nstore_down = fail-open\nscope = header:Authorization\n"
        "verify = hmac-sha256\nverify_format = stripe\nverify_header = Stripe-Signature\n"
        "verify_secret_env = STRIPE_SECRET\nverify_tolerance = 5m\n"
        "require_issued_key = yes\nissued_key_ttl = 10m\n"
        "[route  b c]\nmatch = GET,POST /b\nkey = none\n").encode()
    return seeds


def setting_seeds():
    # option selector byte (fuzz_setting.c's table), source byte, value
    names = ["listen", "upstream", "store", "redis", "admin-listen", "workers",
             "key-header", "methods", "require-key", "in-flight", "wait-timeout",
             "ttl", "lease", "upstream-timeout", "max-body", "max-cached-response",
             "store-down", "on-upstream-error", "drain-timeout", "sweep-interval",
             "log-level", "log-format", "client-timeout", "idle-timeout",
             "max-header-size", "max-connections", "issued-key-ttl",
             "memory-max-bytes", "max-buffered", "store-connections",
             "response-cache"]
    values = {
        "listen": ["127.0.0.1:8080", "[::1]:0", "localhost:08080"],
        "upstream": ["http://127.0.0.1:9000/base/", "http://[::1]:80"],
        "store": ["memory", "postgres://user:secret@db:5432/idem?sslmode=disable",
                  "postgresql://h/d?password='a\\'b' x"],
        "redis": ["redis://127.0.0.1:6379/3"],
        "methods": ["POST,PATCH", " PUT , DELETE"],
        "require-key": ["yes", "OFF"],
        "in-flight": ["wait", "reject"],
        "ttl": ["24h", "1500ms"],
        "max-body": ["1MiB", "4096"],
        "log-level": ["warn"],
        "workers": ["4"],
        "key-header": ["Idempotency-Key"],
        "store-down": ["fail-open"],
        "on-upstream-error": ["keep"],
    }
    seeds = {}
    for i, name in enumerate(names):
        for j, v in enumerate(values.get(name, [])):
            seeds[f"{name}-{j}"] = bytes([i, j & 1]) + v.encode()
    return seeds


def jcs_seeds():
    """A selector byte (fuzz_jcs.c: the shaping), then a body: RFC 8785's
    examples, the unit tests' edge cases, payment notifications."""
    bodies = [
        b'{"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001],'
        b'"string":"\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/",'
        b'"literals":[null,true,false]}',
        b'{"\\u20ac":1,"\\r":2,"\\ufb33":3,"1":4,"\\ud83d\\ude00":5,"\\u0080":6,"\\u00f6":7}',
        b'{"a":1,"a":2}', b'"\\ud800"', b'"\\ud83d\\ude00"', b'[18446744073709551616]',
        b'[1e400, -0, -0.0, 5e-324, 1.7976931348623157e308, 9007199254740993]',
        b'{"amount":100,"currency":"EUR","sent_at":"10:00","meta":{"nonce":"x"},'
        b'"b":[{"c/d":1,"e~":2}]}',
        b'{"x":{"y":{"z":[0,1,{"a":null}]}}}', b'42', b' [ ] ', b'{}',
        b'notify_time=2026-12-05+10%3A00%3A00&out_trade_no=T1&sign=abc%2B%3D&a=1&a=2',
        b'a=%zz&b', b'&&a=&=b&',
        # not UTF-8 as RFC 3629 has it, though json-c takes them (issue 44):
        # overlong, an encoded surrogate, beyond U+10FFFF; then the largest
        b'"\xc0\x80"', b'{"\xe0\x80\xaf":1}', b'["\xed\xa0\x80"]',
        b'"\xf4\x90\x80\x80"', b'"\xf5\x80\x80\x80"', b'"\xf4\x8f\xbf\xbf"',
    ]
    seeds = {}
    for i, body in enumerate(bodies):
        for sel in (0x00, 0x01, 0x02, 0x04, 0x81, 0xc2, 0x91, 0xa5):
            seeds[f"body{i:02d}-{sel:02x}"] = bytes([sel]) + body
    return seeds


def fpshape_seeds():
    """fuzz_fpshape.c: a mode byte, four picks, then a body. Lists (mode 0
    ignore, 1 only, | 4 pointers that name nothing): picks 0-2 are the
    listed places and pick 3 the changed one, by their number in a walk of
    the body (members in order, each before what is inside it). Media
    types (mode 2 json, 3 form): pick 0 the Content-Type (fuzz_fpshape.c's
    table), pick 1 the byte replaced by pick 2. Each issue-44 case is here:
    elements of one array listed together, a pointer under a removed
    element, a JSON, text or multipart body on a form route."""
    none = 0xFF
    items = b'{"items":[{"amount":1},{"amount":2},{"amount":1000}]}'
    # /items 0, /items/0 1, /items/0/amount 2, /items/1 3, ... /items/2/amount 6
    lines = (b'{"lines":[{"sent_at":"10:00","sku":"a"},'
             b'{"sent_at":"10:01","sku":"b"}],"total":3}')
    # /lines 0, /lines/0 1, /lines/0/sent_at 2, /lines/0/sku 3, /lines/1 4,
    # /lines/1/sent_at 5, /lines/1/sku 6, /total 7
    escaped = b'{"a/b":[1,2,3],"m~n":{"x":[4,5]},"~1":0}'
    # /a~1b 0, /a~1b/0 1, /a~1b/1 2, /a~1b/2 3, /m~0n 4, /m~0n/x 5,
    # /m~0n/x/0 6, /m~0n/x/1 7, /~01 8
    nested = b'{"m":[[1,2,3],[4],[5]]}'
    # /m 0, /m/0 1, /m/0/0 2, /m/0/1 3, /m/0/2 4, /m/1 5, /m/1/0 6, /m/2 7
    top = b'[{"a":1},{"a":2},{"a":3}]'
    lists = {
        "items-0-1-change-2": (0, [1, 3, none, 6], items),
        "items-0-1-change-1": (0, [1, 3, none, 4], items),
        "items-0-twice": (0, [1, 1, none, 3], items),
        "items-only-0-2": (1, [1, 5, none, 4], items),
        "items-only-0-2-change-2": (1, [1, 5, none, 6], items),
        "items-junk": (4, [1, 3, none, 6], items),
        "items-only-junk": (5, [2, none, none, 3], items),
        "items-overlap": (0, [0, 1, 2, 6], items),
        "items-under-removed": (0, [1, 2, none, 4], items),
        "lines-0-and-1-sent-at": (0, [1, 5, none, 5], lines),
        "lines-sent-at-both": (0, [2, 5, none, 5], lines),
        "lines-sent-at-both-sku": (0, [2, 5, none, 6], lines),
        "escaped": (0, [1, 2, 8, 3], escaped),
        "escaped-member": (0, [4, 8, none, 7], escaped),
        "nested": (0, [2, 3, 5, 4], nested),
        "nested-same": (0, [2, 3, 5, 6], nested),
        "top-array": (0, [0, 2, none, 4], top),
        "top-array-only": (1, [0, 2, none, 4], top),
    }
    multipart = (b'--x\r\nContent-Disposition: form-data; name="f"; '
                 b'filename="a.txt"\r\n\r\nx+y\r\n--x--\r\n')
    media = {
        # form route (mode 3): JSON, text, multipart: '+' and ' ' differ
        "form-route-json": (3, [2, 8, 0x20, 0], b'{"to":"a+b"}'),
        "form-route-text": (3, [9, 3, ord("+"), 0], b"pay 10&to bob"),
        "form-route-multipart": (3, [11, multipart.index(b"+"), 0x20, 0],
                                 multipart),
        "form-route-no-type": (3, [0, 1, ord("+"), 0], b"a b=1"),
        "form-route-formx": (3, [16, 1, ord("+"), 0], b"a b=1"),
        "form-route-form": (3, [6, 7, 0x20, 0], b"a=1&b=x+y"),
        "form-route-form-upper": (3, [7, 7, 0x20, 0], b"a=1&b=x+y"),
        "form-route-form-blank": (3, [8, 7, 0x20, 0], b"a=1&b=x+y"),
        # json route (mode 2): a form or text type is the raw bytes
        "json-route-form": (2, [6, 5, 0x0A, 0], b'{"a": 1}'),
        "json-route-text": (2, [9, 5, 0x0A, 0], b'{"a": 1}'),
        "json-route-jsonx": (2, [13, 5, 0x0A, 0], b'{"a": 1}'),
        "json-route-json-x": (2, [14, 5, 0x0A, 0], b'{"a": 1}'),
        "json-route-plus-json": (2, [15, 5, 0x0A, 0], b'{"a": 1}'),
        "json-route-json": (2, [2, 5, 0x0A, 0], b'{"a": 1}'),
        "json-route-json-upper": (2, [3, 5, 0x0A, 0], b'{"a": 1}'),
        "json-route-problem": (2, [4, 5, 0x0A, 0], b'{"a": 1}'),
        "json-route-vnd": (2, [5, 5, 0x0A, 0], b'{"a": 1}'),
    }
    seeds = {}
    for name, (mode, picks, body) in {**lists, **media}.items():
        seeds[name] = bytes([mode] + picks) + body
    return seeds


def jwt_seeds():
    """A selector byte (fuzz_jwt.c), then a token (bit 0 clear: against keys
    nobody can sign for) or "HEADER\nCLAIMS" that the harness signs with
    HS256/384/512 (bit 0 set, bits 1-2). Bits 3-4: the claim (sub, email,
    aud, exp), 5 an issuer, 6 an audience."""
    def b64(b):
        return base64.urlsafe_b64encode(b).rstrip(b"=")

    def fake_sig(n, salt):
        out = b""
        while len(out) < n:
            out += hashlib.sha256(salt + bytes([len(out)])).digest()
        return b64(out[:n])

    claims = b'{"sub":"user-1","iss":"https://id.example","aud":["orders","x"],' \
             b'"exp":1700003600,"nbf":1699999000,"iat":1699999000}'
    seeds = {}
    headers = {
        "rs256": (b'{"alg":"RS256","typ":"JWT","kid":"r"}', 256),
        "ps384": (b'{"alg":"PS384","kid":"r"}', 256),
        "es256": (b'{"alg":"ES256","kid":"e1"}', 64),
        "es256-nokid": (b'{"alg":"ES256","typ":"at+jwt"}', 64),
        "es384": (b'{"alg":"ES384","kid":"e3"}', 96),
        "es512": (b'{"alg":"ES512"}', 132),
        "eddsa": (b'{"alg":"EdDSA","kid":"ed","typ":"application/jwt"}', 64),
        "hs256": (b'{"alg":"HS256","kid":"h"}', 32),
        "hs512": (b'{"alg":"HS512"}', 64),
        "es256-der": (b'{"alg":"ES256"}', 71),
        "none": (b'{"alg":"none"}', 0),
        "crit": (b'{"alg":"RS256","crit":["b64"],"b64":false}', 256),
        "jwk-header": (b'{"alg":"ES256","jwk":{"kty":"EC","crv":"P-256","x":"AA","y":"AA"}}', 64),
        "kid-unknown": (b'{"alg":"RS256","kid":"nope"}', 256),
        "dup-alg": (b'{"alg":"HS256","alg":"RS256"}', 256),
    }
    for name, (hdr, n) in headers.items():
        tok = b64(hdr) + b"." + b64(claims) + b"." + fake_sig(n, name.encode())
        seeds["raw-" + name] = b"\x00" + tok
    seeds["raw-padded"] = b"\x00" + b64(b'{"alg":"HS256"}') + b"==." + b64(claims) + b".AAAA"
    seeds["raw-two-segments"] = b"\x00" + b64(b'{"alg":"HS256"}') + b"." + b64(claims)
    seeds["raw-bad-char"] = b"\x00eyJhbGciOiJIUzI1NiJ9.e*J9.AAAA"
    seeds["raw-empty-segments"] = b"\x00.."
    # signed: header, newline, claims; selector 1 = HS256, 3 = HS384, 5 = HS512
    signed = {
        "hs256": (1, b'{"alg":"HS256","typ":"JWT"}', claims),
        "hs384": (3, b'{"alg":"HS384"}', claims),
        "hs512": (5, b'{"alg":"HS512","kid":"k"}', claims),
        "int-sub": (1, b'{"alg":"HS256"}', b'{"sub":12345678901234567890}'),
        "neg-sub": (1, b'{"alg":"HS256"}', b'{"sub":-42,"exp":1.7e9}'),
        "email": (1 | 1 << 3, b'{"alg":"HS256"}', b'{"sub":"a","email":"a@b.example"}'),
        "aud-claim": (1 | 2 << 3, b'{"alg":"HS256"}', b'{"aud":"orders"}'),
        "iss-aud": (1 | 0x20 | 0x40, b'{"alg":"HS256"}', claims),
        "expired": (1, b'{"alg":"HS256"}', b'{"sub":"a","exp":1600000000}'),
        "not-yet": (1, b'{"alg":"HS256"}', b'{"sub":"a","nbf":1800000000}'),
        "escapes": (1, b'{"alg":"HS\\u0032\\u00356"}', b'{"sub":"\\ud83d\\ude00 \\"x\\""}'),
        "dup-sub": (1, b'{"alg":"HS256"}', b'{"sub":"a","sub":"b"}'),
        "nan": (1, b'{"alg":"HS256"}', b'{"sub":"a","exp":NaN}'),
        "alg-mismatch": (1, b'{"alg":"HS512"}', claims),
    }
    for name, (sel, hdr, body) in signed.items():
        seeds["signed-" + name] = bytes([sel]) + hdr + b"\n" + body
    return seeds


def logs_seeds():
    """fuzz_logs.c: NUL-separated path, key, request id, user agent,
    referer, error; the first also a traceparent."""
    tp = [b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
          b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
          b"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
          b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
          b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
          b" 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00 "]
    fields = [b"/orders?x=1", b"order-42", b"req-1", b"curl/8.5.0",
              b"https://example.com/", b""]
    hostile = [b"/a\"b\\c\n\r\tx", b"k\x01\x7f\xc2\x85", b"\xff\xfe\xc0\x80",
               "é€😀".encode(), b"x" * 5000, b"\xe2\x82" + b"y" * 4090]
    out = [b"\0".join([t] + fields[1:]) for t in tp]
    for i, h in enumerate(hostile):
        f = list(fields)
        f[i % len(f)] = h
        out.append(b"\0".join(f))
    out.append(b"\0".join(hostile))
    return {f"seed-{i:02d}": data for i, data in enumerate(out)}


def crc32c(data):
    """CRC32c (RFC 4960 appendix B), bit by bit."""
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def proxyproto_seeds():
    """fuzz_proxyproto.c: the bytes a connection starts with. Every kind
    of v1 line and v2 header the unit test accepts, most followed by a
    request (its bytes are the stream's), and some that are refused."""
    get = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"
    sig = b"\r\n\r\n\x00\r\nQUIT\n"

    def v2(ver_cmd, fam, block=b"", tlvs=b"", crc=False):
        if crc:
            tlvs += b"\x03\x00\x04\x00\x00\x00\x00"
        body = block + tlvs
        out = bytearray(sig + bytes([ver_cmd, fam]) + len(body).to_bytes(2, "big") + body)
        if crc:
            out[-4:] = crc32c(bytes(out)).to_bytes(4, "big")
        return bytes(out)

    tcp4 = bytes([10, 1, 2, 3, 192, 0, 2, 7]) + (8080).to_bytes(2, "big") + (443).to_bytes(2, "big")
    tcp6 = (bytes.fromhex("20010db8000000000000000000000017") +
            bytes.fromhex("20010db8000000000000000000000001") + b"\xff\xff\x00\x50")
    unix = b"/run/lb.sock".ljust(108, b"\x00") + b"/run/idem.sock".ljust(108, b"\x00")
    tlvs = (b"\x01\x00\x02h2" + b"\x02\x00\x0bexample.com" + b"\x04\x00\x00" +
            b"\x20\x00\x05\x07\x00\x00\x00\x00")
    return {
        "v1-tcp4": b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n" + get,
        "v1-tcp6": b"PROXY TCP6 2001:db8::1 2001:db8::2 65535 0\r\n" + get,
        "v1-tcp6-mapped": b"PROXY TCP6 ::ffff:10.1.2.3 ::1 1 2\r\n",
        "v1-tcp6-longest": (b"PROXY TCP6 ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff "
                            b"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe 65535 65535\r\n"),
        "v1-unknown": b"PROXY UNKNOWN\r\n" + get,
        "v1-unknown-worst": (b"PROXY UNKNOWN ffff:f...f:ffff ffff:f...f:ffff "
                             b"65535 65535\r\n"),
        "v1-lf-only": b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n" + get,
        "v1-no-crlf": b"PROXY UNKNOWN " + b"x" * 100,
        "v2-tcp4": v2(0x21, 0x11, tcp4) + get,
        "v2-tcp4-tlvs": v2(0x21, 0x11, tcp4, tlvs) + get,
        "v2-tcp4-crc": v2(0x21, 0x11, tcp4, tlvs, crc=True) + get,
        "v2-tcp6": v2(0x21, 0x21, tcp6) + get,
        "v2-tcp6-crc": v2(0x21, 0x21, tcp6, b"\x04\x00\x01x", crc=True),
        "v2-local": v2(0x20, 0x00) + get,
        "v2-local-crc": v2(0x20, 0x00, b"", b"", crc=True),
        "v2-local-tcp4": v2(0x20, 0x11, tcp4),
        "v2-unspec-tlvs": v2(0x21, 0x00, b"", tlvs),
        "v2-unix": v2(0x21, 0x31, unix, tlvs) + get,
        "v2-udp": v2(0x21, 0x12, tcp4),
        "v2-tlv-past-end": v2(0x21, 0x11, tcp4, b"\x01\x00\x03h2"),
        "v2-too-long": sig + b"\x21\x11\x10\x01" + tcp4,
        "http": get,
    }


def write(target, seeds):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        if not f.startswith("crash-"):
            os.remove(os.path.join(d, f))
    for name, data in sorted(seeds.items()):
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    print(f"corpus/{target}: {len(seeds)} seeds")


def main():
    write("request", request_seeds())
    write("response", response_seeds())
    write("keysrc", keysrc_seeds())
    write("idemkey", idemkey_seeds())
    write("verify", verify_seeds())
    write("config", config_seeds())
    write("setting", setting_seeds())
    write("jcs", jcs_seeds())
    write("fpshape", fpshape_seeds())
    write("jwt", jwt_seeds())
    write("logs", logs_seeds())
    write("proxyproto", proxyproto_seeds())


if __name__ == "__main__":
    main()
