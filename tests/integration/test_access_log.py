"""The access log and request ids (issue 45; common/accesslog.c, proxy/reqlog.c,
docs/operations.md "Logs and traces").

One line per request, text (nginx combined + key=value) or JSON (every
member always there), written by a thread of its own: every outcome's line
says what happened (status, outcome, key, route, upstream, durations,
bytes, request ids); hostile input never forges or splits a line; a file
renamed under load and reopened on SIGUSR1 loses and repeats no line; a
stalled pipe drops lines (counted, said once) but never holds a request;
SIGHUP moves the log and changes its format. Request ids are kept when
well-formed, made otherwise, sent upstream once, echoed in every response
and logged; --trusted-proxies lets X-Forwarded-For name the client.

Lines are matched to requests by their request id (each request sends its
own, or the response's X-Request-Id says which one was made).
"""
import json
import os
import re
import signal
import subprocess
import threading
import time
import uuid

import pytest

from support.accesslog import (CountingConn, parse, parse_json, parse_text,
                               read_lines, wait_lines, wait_rids)
from support.http import (RawConn, assert_problem, build_request,
                          upstream_echo)
from support.procs import IDEMPROXY_BIN, clean_env, free_port, metric_value, \
    read_text, wait_readyz

FMTS = ("json", "text")
ORDER = b'{"item":"book","amount":100}'
UUID4 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}"
                   r"-[0-9a-f]{12}")
HEX12 = re.compile(r"[0-9a-f]{12}")


def newkey(prefix="k"):
    return f"{prefix}-{uuid.uuid4()}"


def rid(prefix="r"):
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def start(make_proxy, tmp_path, fmt, *flags, store_args=(), name=None,
          dest=None, **kw):
    """A proxy logging to dest (default tmp_path/<name>.log) in fmt; p.alog
    is the path."""
    name = name or f"alog-{fmt}"
    path = dest or tmp_path / f"{name}.log"
    p = make_proxy(*store_args, "--access-log", str(path),
                   "--access-log-format", fmt, *flags, name=name, **kw)
    if store_args:
        wait_readyz(p)
    p.alog = path
    return p


def send(port, method, target, rid=None, key=None, body=None, headers=(),
         raw=None, timeout=20.0, hold=None):
    """One request on a fresh connection; the response gets .sent (request
    bytes) and .got (response bytes, exactly). hold(r) is called before
    the connection is closed."""
    hs = []
    if rid is not None:
        hs.append(("X-Request-Id", rid))
    if key is not None:
        hs.append(("Idempotency-Key", key))
    if body is not None:
        hs.append(("Content-Type", "application/json"))
    hs += list(headers)
    data = raw if raw is not None else build_request(method, target, hs, body)
    with CountingConn(port, timeout=timeout) as c:
        c.send(data)
        r = c.read_response(method)
        r.sent = len(data)
        r.got = c.response_bytes()
        if hold is not None:
            hold(r)
    return r


def stub_runs(stub, key):
    return stub.stats()["keys"].get(key, 0)


def wait_until(what, cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def metric(p, name, **labels):
    return metric_value(p.metrics(), name, labels or None) or 0


def request_outcomes(p):
    """{outcome label: count} of idemproxy_requests_total, every label."""
    out = {}
    for line in p.metrics().splitlines():
        m = re.match(r'idemproxy_requests_total\{[^}]*outcome="([^"]+)"[^}]*\}'
                     r" (\S+)", line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0) + float(m.group(2))
    return out


def check_line(d, r, *, method, path, outcome, stub, key=None, route=None,
               forwarded=False, claim=False, wait=False, store=False,
               exact_in=True, replay=False, ua=None, referer=None,
               deferred=None):
    """The line d of the request that got response r. store_s is checked
    into deferred (a list) when given."""
    if deferred is None:
        deferred = _Raise()
    where = f"{d}\n{r!r}"
    assert d["status"] == r.status, where
    assert d["method"] == method, where
    assert d["path"] == path, where
    assert d["protocol"] == "HTTP/1.1", where
    assert d["client"] == "127.0.0.1", where
    assert d["forwarded_for"] is None, where
    assert d["outcome"] == outcome, where
    assert d["key"] == key, where
    assert d["route"] == route, where
    assert d["replayed"] is replay, where
    assert d["request_id"] == r.header("X-Request-Id"), where
    assert d["upstream"] == (f"127.0.0.1:{stub.port}" if forwarded
                             else None), where
    assert (d["upstream_s"] is not None) == forwarded, where
    assert (d["claim_s"] is not None) == claim, where
    assert (d["wait_s"] is not None) == wait, where
    if (d["store_s"] is not None) != store:
        # checked at the end of the test (the other members first)
        deferred.append(f"store_s {'missing' if store else 'set'}: {where}")
    assert d["duration_s"] is not None, where
    for part in ("claim_s", "wait_s", "upstream_s"):
        assert d[part] is None or 0 <= d[part] <= d["duration_s"] + 1e-6, \
            (part, where)
    # the outcome is written while the response is queued, where duration_s
    # ends (docs/operations.md): store_s is not a part of it
    assert d["store_s"] is None or 0 <= d["store_s"] < 10, where
    assert d["duration_s"] < 10, where
    # the response's head and body, exactly as received
    assert d["bytes_out"] == r.got, (r.got, where)
    assert d["bytes_out"] >= len(r.body), where
    if exact_in:
        assert d["bytes_in"] == r.sent, (r.sent, where)
    else:
        assert 0 < d["bytes_in"] <= r.sent, (r.sent, where)
    assert d["trace_id"] is None and d["span_id"] is None, where
    assert d["user_agent"] == ua, where
    assert d["referer"] == referer, where
    assert d["error"] is None, where
    if not replay:
        assert d["original_request_id"] is None, where


class _Raise:
    def append(self, what):
        raise AssertionError(what)


def one_line(lines_by_rid, r):
    got = lines_by_rid.get(r.header("X-Request-Id"))
    assert got is not None and len(got) == 1, (r.header("X-Request-Id"), got)
    return got[0]


# ------------------------------------------------ every outcome's line

ROUTES_INI = """\
[route orders]
match     = POST /orders*
in_flight = reject
scope     = header:Authorization
"""


@pytest.mark.stores("memory", "postgres")
@pytest.mark.parametrize("fmt", FMTS)
def test_every_outcome_has_its_line(make_proxy, stub, store_args, tmp_path,
                                    fmt):
    """forwarded, replayed, mismatch, conflict, a waiting duplicate,
    missing_key, invalid_key, too_large, an unknown outcome (the upstream
    drops the connection) and a pass-through: each has one line with its
    status, outcome, key, route, upstream (only when forwarded), the
    durations of the steps it went through and no others, its exact byte
    counts and the request id its response carried."""
    ini = tmp_path / "routes.ini"
    ini.write_text(ROUTES_INI)
    p = start(make_proxy, tmp_path, fmt, "--config", str(ini),
              "--require-key", "true", "--max-body", "1KiB",
              "--wait-timeout", "10s", store_args=store_args)
    auth = [("Authorization", "Bearer alice")]
    seen = []                  # every response, in order

    def logged(r):
        """A keyed request's line is written once its outcome is recorded,
        with store_s, if the client is still there (one that closes at
        once gets it earlier, without): hold the connection till then."""
        wait_rids(p.alog, [r.header("X-Request-Id")], fmt)

    def go(*a, **kw):
        r = send(p.port, *a, **kw)
        seen.append(r)
        return r

    # forwarded, on the route, the query not logged
    k1 = newkey("fwd")
    fwd = go("POST", "/orders?secret=s3cr3t", rid=rid("fwd"), key=k1,
             body=ORDER, headers=auth + [("User-Agent", "agent/1.0"),
                                         ("Referer", "http://ref.test/a")],
             hold=logged)
    assert fwd.status == 200 and fwd.header("X-Request-Id").startswith("fwd-")
    # replayed: the current request's id, and the executing one's
    rep = go("POST", "/orders?secret=s3cr3t", rid=rid("rep"), key=k1,
             body=ORDER, headers=auth)
    assert rep.status == 200 and rep.header("Idempotent-Replayed") == "true"
    assert rep.header("Idempotent-Original-Request-Id") == \
        fwd.header("X-Request-Id")
    # mismatch
    mis = go("POST", "/orders", rid=rid("mis"), key=k1,
             body=b'{"item":"pen"}', headers=auth)
    assert_problem(mis, 422, "idempotency-key-mismatch")
    # conflict: the route rejects a duplicate while the first one runs
    k2 = newkey("conf")
    with CountingConn(p.port, timeout=20) as owner:
        raw = build_request("POST", "/orders?delay_ms=800",
                            [("X-Request-Id", rid("owner")),
                             ("Idempotency-Key", k2),
                             ("Content-Type", "application/json")] + auth,
                            ORDER)
        owner.send(raw)
        wait_until("the owner at the upstream", lambda: stub_runs(stub, k2))
        conf = go("POST", "/orders?delay_ms=800", rid=rid("conf"), key=k2,
                  body=ORDER, headers=auth)
        assert_problem(conf, 409, "request-in-progress")
        own = owner.read_response()
        own.sent, own.got = len(raw), owner.response_bytes()
        seen.append(own)
        logged(own)
        assert own.status == 200
    # wait: the global policy waits for the first one's outcome
    k3 = newkey("wait")
    with CountingConn(p.port, timeout=20) as first:
        raw = build_request("POST", "/slow?delay_ms=800",
                            [("X-Request-Id", rid("first")),
                             ("Idempotency-Key", k3),
                             ("Content-Type", "application/json")], ORDER)
        first.send(raw)
        wait_until("the first at the upstream", lambda: stub_runs(stub, k3))
        t0 = time.monotonic()
        waiter = go("POST", "/slow?delay_ms=800", rid=rid("waiter"), key=k3,
                    body=ORDER)
        waited = time.monotonic() - t0
        assert waiter.status == 200 and \
            waiter.header("Idempotent-Replayed") == "true", waiter
        fr = first.read_response()
        fr.sent, fr.got = len(raw), first.response_bytes()
        seen.append(fr)
        logged(fr)
    # refused before anything is claimed
    miss = go("POST", "/other", rid=rid("miss"), body=ORDER)
    assert_problem(miss, 400, "missing-idempotency-key")
    inv = go("POST", "/other", rid=rid("inv"), key="has space", body=ORDER)
    assert_problem(inv, 400, "invalid-idempotency-key")
    k4 = newkey("big")
    big = go("POST", "/big", rid=rid("big"), key=k4, body=b"a" * 2000)
    assert big.status == 413, big
    # the upstream reads the request and drops the connection: an unknown
    # outcome; the line's outcome is the label idemproxy counted it under
    k5 = newkey("unk")
    before = request_outcomes(p)
    unk = go("POST", "/pay?drop=1", rid=rid("unk"), key=k5, body=ORDER,
             hold=logged)
    assert_problem(unk, 502, "outcome-unknown")
    after = request_outcomes(p)
    counted = {k: after[k] - before.get(k, 0) for k in after
               if after[k] != before.get(k, 0)}
    assert len(counted) == 1 and list(counted.values()) == [1], counted
    unk_label = list(counted)[0]
    # not keyed
    get = go("GET", "/items?q=secret", rid=rid("get"))
    assert get.status == 200
    for r in seen:
        assert r.header("X-Request-Id"), r
    by = wait_rids(p.alog, [r.header("X-Request-Id") for r in seen], fmt)
    assert sum(len(v) for v in by.values()) == len(seen), by
    L = lambda r: one_line(by, r)   # noqa: E731
    late = []                       # store_s problems, asserted last

    d = L(fwd)
    check_line(d, fwd, method="POST", path="/orders", outcome="forwarded",
               key=k1, route="orders", forwarded=True, claim=True,
               store=True, stub=stub, deferred=late, ua="agent/1.0",
               referer="http://ref.test/a")
    assert HEX12.fullmatch(d["scope"] or ""), d
    scope = d["scope"]
    d = L(rep)
    check_line(d, rep, method="POST", path="/orders", outcome="replayed",
               key=k1, route="orders", claim=True, replay=True, stub=stub, deferred=late)
    assert d["original_request_id"] == fwd.header("X-Request-Id"), d
    assert d["scope"] == scope, d
    d = L(mis)
    check_line(d, mis, method="POST", path="/orders", outcome="mismatch",
               key=k1, route="orders", claim=True, stub=stub, deferred=late)
    d = L(conf)
    check_line(d, conf, method="POST", path="/orders", outcome="conflict",
               key=k2, route="orders", claim=True, stub=stub, deferred=late)
    d = L(own)
    check_line(d, own, method="POST", path="/orders", outcome="forwarded",
               key=k2, route="orders", forwarded=True, claim=True,
               store=True, stub=stub, deferred=late)
    assert d["upstream_s"] >= 0.7, d
    d = L(waiter)
    check_line(d, waiter, method="POST", path="/slow", outcome="replayed",
               key=k3, claim=True, wait=True, replay=True, stub=stub, deferred=late)
    assert 0.2 <= d["wait_s"] <= waited + 0.05, (d, waited)
    assert d["original_request_id"] == fr.header("X-Request-Id"), d
    assert d["scope"] is None or HEX12.fullmatch(d["scope"]), d
    d = L(fr)
    check_line(d, fr, method="POST", path="/slow", outcome="forwarded",
               key=k3, forwarded=True, claim=True, store=True, stub=stub, deferred=late)
    d = L(miss)
    check_line(d, miss, method="POST", path="/other", outcome="missing_key",
               stub=stub, deferred=late, exact_in=False)
    d = L(inv)
    check_line(d, inv, method="POST", path="/other", outcome="invalid_key",
               key=d["key"], stub=stub, deferred=late, exact_in=False)
    assert d["key"] in (None, "has space"), d
    d = L(big)
    check_line(d, big, method="POST", path="/big", outcome="too_large",
               key=k4, stub=stub, deferred=late, exact_in=False)
    d = L(unk)
    check_line(d, unk, method="POST", path="/pay", outcome=unk_label,
               key=k5, forwarded=True, claim=True, store=True, stub=stub, deferred=late)
    d = L(get)
    check_line(d, get, method="GET", path="/items", outcome="passthrough",
               forwarded=True, stub=stub, deferred=late)
    assert not late, "\n".join(late)
    # every line counted as written
    wait_until("lines_total", lambda: metric(
        p, "idemproxy_access_log_lines_total") == len(seen))
    assert metric(p, "idemproxy_access_log_dropped_total") == 0


@pytest.mark.parametrize("fmt", FMTS)
def test_refused_request_line(make_proxy, stub, tmp_path, fmt):
    """A request refused before it was one (400): its line says
    bad_request, and what was read of it: the request line's method, path
    and protocol, and the bytes."""
    p = start(make_proxy, tmp_path, fmt)
    bad = send(p.port, None, None, raw=b"POST /orders?x=1 HTTP/1.1\r\n"
               b"Host: x\r\nX-Request-Id: bad-one\r\nBad Header\r\n\r\n")
    assert_problem(bad, 400, "bad-request")
    garbage = send(p.port, None, None, raw=b"GARBAGE\r\n\r\n")
    assert_problem(garbage, 400, "bad-request")
    huge = send(p.port, None, None, raw=b"GET /huge HTTP/1.1\r\nHost: x\r\n"
                b"X-Big: " + b"a" * 70000 + b"\r\n\r\n")
    assert huge.status == 431, huge
    for r in (bad, garbage, huge):
        assert UUID4.fullmatch(r.header("X-Request-Id") or ""), r
        assert r.json()["request_id"] == r.header("X-Request-Id"), r
    by = wait_rids(p.alog, [bad.header("X-Request-Id"),
                            garbage.header("X-Request-Id"),
                            huge.header("X-Request-Id")], fmt)
    assert len(read_lines(p.alog)) == 3
    for r, outcome in ((bad, "bad_request"), (garbage, "bad_request"),
                       (huge, "headers_too_large")):
        d = one_line(by, r)
        assert d["status"] == r.status and d["outcome"] == outcome, d
        assert d["upstream"] is None and d["upstream_s"] is None, d
        assert d["claim_s"] is None and d["key"] is None, d
        assert d["client"] == "127.0.0.1", d
        assert d["bytes_out"] == r.got, (r.got, d)
        assert stub.stats()["requests"] == 0
    d = one_line(by, bad)
    assert d["path"] == "/orders", d
    # the request line was read whole: it said POST and HTTP/1.1
    assert d["method"] == "POST", d
    assert d["protocol"] == "HTTP/1.1", d
    assert 0 < d["bytes_in"] <= bad.sent, d          # bytes were read
    d = one_line(by, garbage)
    assert d["protocol"] != "HTTP/1.0", d            # nothing said HTTP/1.0
    assert 0 < d["bytes_in"] <= garbage.sent, d
    d = one_line(by, huge)
    assert d["path"] == "/huge" and d["method"] == "GET", d
    assert d["protocol"] == "HTTP/1.1", d
    assert 0 < d["bytes_in"] <= huge.sent, d


def test_a_request_cut_short_says_why(make_proxy, stub, tmp_path):
    """The client leaves in the middle of its body: one line, no status,
    error says why; the next request on the proxy is logged as usual."""
    p = start(make_proxy, tmp_path, "json")
    with RawConn(p.port) as c:
        c.send(b"POST /x HTTP/1.1\r\nHost: x\r\nX-Request-Id: left-1\r\n"
               b"Content-Length: 100\r\n\r\nabc")
        time.sleep(0.2)
    r = send(p.port, "GET", "/next", rid="next-1")
    assert r.status == 200
    by = wait_rids(p.alog, ["left-1", "next-1"], "json")
    d = by["left-1"]
    assert len(d) == 1, d
    d = d[0]
    assert d["status"] is None and d["error"], d
    assert d["method"] == "POST" and d["path"] == "/x", d
    assert d["bytes_out"] == 0 and 0 < d["bytes_in"] <= 200, d
    assert by["next-1"][0]["error"] is None


@pytest.mark.parametrize("fmt", FMTS)
def test_store_unavailable_line(make_proxy, stub, tmp_path, fmt):
    """A store that cannot be reached: 503, outcome store_unavailable, the
    claim timed, nothing forwarded."""
    url = f"postgres://postgres@127.0.0.1:{free_port()}/none?connect_timeout=1"
    p = start(make_proxy, tmp_path, fmt, "--store", url)
    k = newkey("down")
    r = send(p.port, "POST", "/orders?x=1", rid=rid("down"), key=k,
             body=ORDER)
    assert_problem(r, 503, "store-unavailable")
    assert r.json()["request_id"] == r.header("X-Request-Id")
    d = one_line(wait_rids(p.alog, [r.header("X-Request-Id")], fmt), r)
    check_line(d, r, method="POST", path="/orders",
               outcome="store_unavailable", key=k, claim=d["claim_s"] is not None,
               stub=stub, exact_in=False)
    assert stub.stats()["requests"] == 0


@pytest.mark.parametrize("fmt", FMTS)
def test_query_logged_only_when_asked(make_proxy, stub, tmp_path, fmt):
    plain = start(make_proxy, tmp_path, fmt, name=f"plain-{fmt}")
    full = start(make_proxy, tmp_path, fmt, "--access-log-query",
                 name=f"query-{fmt}")
    target = "/search?token=abc&q=%22x%22"
    for p, want in ((plain, "/search"), (full, target)):
        r = send(p.port, "GET", target, rid=rid("q"))
        k = newkey("q")
        rk = send(p.port, "POST", target, rid=rid("qk"), key=k, body=ORDER)
        by = wait_rids(p.alog, [r.header("X-Request-Id"),
                                rk.header("X-Request-Id")], fmt)
        assert one_line(by, r)["path"] == want
        assert one_line(by, rk)["path"] == want
        assert "token=abc" not in read_text(plain.alog)


# ------------------------------------------------ hostile input

LONG = 6000


def hostile_requests():
    """(name, raw request bytes, {member: the bytes the client sent} to
    find again in the line, or None when only the line's count matters)."""
    ua = b'evil" 200 0 "-" "x\\ \t{"forged":true}\\"'
    key_q = '"q\\"uo\\\\te"'                # an sf-string: the key q"uo\te
    out = []

    def req(name, target, fields, body=None, expect=None):
        hs = b"".join(k + b": " + v + b"\r\n" for k, v in fields)
        head = b"POST " if body is not None else b"GET "
        raw = head + target + b" HTTP/1.1\r\nHost: x\r\n" + hs
        if body is not None:
            raw += b"Content-Length: %d\r\n" % len(body)
        raw += b"\r\n" + (body or b"")
        out.append((name, raw, expect))

    req("ua", b"/a", [(b"User-Agent", ua)], expect={"user_agent": ua})
    req("referer-bytes", b"/a", [(b"Referer", b"\xff x \xfe\xe9 \xc3\xa9\xe2\x9c\x93")],
        expect={"referer": b"\xff x \xfe\xe9 \xc3\xa9\xe2\x9c\x93"})
    req("path", b'/p"a\\th/%22%0a', [], expect={"path": b'/p"a\\th/%22%0a'})
    req("key-raw", b"/k", [(b"Idempotency-Key", b'a"b\\c')], body=b"{}",
        expect={"key": b'a"b\\c'})
    req("key-sf", b"/k", [(b"Idempotency-Key", key_q.encode())], body=b"{}")
    req("key-long", b"/k", [(b"Idempotency-Key", b"x" + b'"\\' * 127)],
        body=b"{}", expect={"key": b"x" + b'"\\' * 127})
    req("ua-long", b"/a", [(b"User-Agent", b'"\\\t\xc3\xa9' * (LONG // 5))],
        expect={"user_agent": ("cut", b'"\\\t\xc3\xa9' * (LONG // 5))})
    req("path-long", b"/" + b"\\x" * (LONG // 2), [],
        expect={"path": ("cut", b"/" + b"\\x" * (LONG // 2))})
    req("all-long", b"/" + b'"' * 3000,
        [(b"User-Agent", b"u" * 3000), (b"Referer", b'"' * 3000),
         (b"Idempotency-Key", b"k" * 255)], body=b"{}")
    req("obs-fold", b"/a", [(b"User-Agent", b'a"\r\n "forged')])
    # refused by the parser (control bytes, a bare CR, a header line made
    # of a JSON object): still exactly one line each
    req("ctl", b"/a", [(b"User-Agent", b"a\x01b\x1b[31mred")])
    req("nul", b"/a", [(b"User-Agent", b"a\x00b")])
    req("cr", b"/a", [(b"User-Agent", b"a\rb")])
    req("json-line", b"/a", [(b"X-A", b"1"), (b'{"outcome":"forged"}', b"x")])
    req("rid-quote", b"/a", [(b"X-Request-Id", b'a"b')])
    req("rid-long", b"/a", [(b"X-Request-Id", b"r" * 200)])
    return out


@pytest.mark.parametrize("fmt", FMTS)
def test_hostile_input_never_forges_a_line(make_proxy, stub, tmp_path, fmt):
    p = start(make_proxy, tmp_path, fmt)
    results = []
    for name, raw, expect in hostile_requests():
        r = send(p.port, None, None, raw=raw)
        assert r.header("X-Request-Id"), (name, r)
        results.append((name, r, expect))
    rids = [r.header("X-Request-Id") for _, r, _ in results]
    assert len(set(rids)) == len(rids), rids
    by = wait_rids(p.alog, rids, fmt)
    lines = read_lines(p.alog)
    assert len(lines) == len(results), lines
    for ln in lines:
        d = parse(ln, fmt)          # asserts a whole, well-formed line
        if fmt == "text":
            # the combined part cannot have been shifted: the status is
            # where nginx has it
            assert re.match(r'\S+ - - \[[^\]]+\] "(?:[^"\\]|\\.)*" '
                            r'(\d{3}|-) \d+ ', ln), ln
        assert "forged" not in (d["outcome"] or ""), d
    for name, r, expect in results:
        d = one_line(by, r)
        assert d["status"] == r.status, (name, d)
        assert not d["request_id"].startswith(("a\"", "rrr")), (name, d)
        for member, want in (expect or {}).items():
            cut = isinstance(want, tuple)
            if cut:
                want = want[1]
            got = d["_raw"].get(member)
            if fmt == "json":
                # JSON keeps valid UTF-8; any other byte is U+FFFD
                want = want.decode("utf-8", "replace").encode()
                got = d[member].encode() if d[member] is not None else None
            assert got is not None, (name, member, d)
            if cut:
                assert got.endswith(b"..."), (name, member, got[-40:])
                assert len(got) < len(want), (name, member)
                assert want.startswith(got[:-3]), (name, member, got[:80])
                got.decode("utf-8")     # no UTF-8 sequence split
            else:
                assert got == want, (name, member, got, want)
    # the three long fields are cut, the line still whole (parse checked
    # its length), the key included
    d = one_line(by, dict((n, r) for n, r, _ in results)["all-long"])
    assert d["key"] is None or len(d["key"]) <= 255, d


# ------------------------------------------------ rotation under load

def load(port, n_threads, per_thread, prefix, errors, target="/",
         headers=(), latencies=None):
    """n_threads threads, one keep-alive connection each, per_thread GETs
    with the request id PREFIX-T-I; returns the started threads."""
    def run(t):
        try:
            with RawConn(port, timeout=20) as c:
                for i in range(per_thread):
                    rid_ = f"{prefix}-{t}-{i}"
                    t0 = time.monotonic()
                    c.send(build_request("GET", target,
                                         [("X-Request-Id", rid_)] +
                                         list(headers)))
                    r = c.read_response()
                    if latencies is not None:
                        latencies.append(time.monotonic() - t0)
                    if r.status != 200 or r.header("X-Request-Id") != rid_:
                        errors.append((rid_, r))
                        return
        except Exception as e:          # noqa: BLE001 (reported)
            errors.append((t, repr(e)))

    threads = [threading.Thread(target=run, args=(t,), daemon=True)
               for t in range(n_threads)]
    for th in threads:
        th.start()
    return threads


def test_rotation_under_load_loses_and_repeats_no_line(make_proxy, stub,
                                                        tmp_path):
    """3000 requests on 6 keep-alive connections while the file is renamed
    and SIGUSR1 sent again and again: the files together hold exactly one
    whole line per request."""
    p = start(make_proxy, tmp_path, "json", workers=2)
    n_threads, per = 6, 500
    errors = []
    threads = load(p.port, n_threads, per, "rot", errors)
    rotated = []
    while any(th.is_alive() for th in threads) and len(rotated) < 12:
        time.sleep(0.08)
        if not p.alog.exists():
            continue
        dest = tmp_path / f"{p.alog.name}.{len(rotated) + 1}"
        os.rename(p.alog, dest)
        rotated.append(dest)
        p.signal(signal.SIGUSR1)
        # like logrotate's next run: the reopened file is there first
        wait_until("the reopened file", p.alog.exists, timeout=5)
    for th in threads:
        th.join(60)
        assert not th.is_alive(), "the load did not finish"
    assert not errors, errors[:5]
    assert len(rotated) >= 3, f"only {len(rotated)} rotations during the load"
    # everything flushed at exit
    assert p.stop() == 0, p.log()
    counts = {}
    files_with_lines = 0
    for path in rotated + [p.alog]:
        lines = read_lines(path)            # no partial last line
        files_with_lines += bool(lines)
        for ln in lines:
            d = parse_json(ln)
            counts[d["request_id"]] = counts.get(d["request_id"], 0) + 1
    want = {f"rot-{t}-{i}" for t in range(n_threads) for i in range(per)}
    missing = want - set(counts)
    extra = set(counts) - want
    twice = {k: v for k, v in counts.items() if v > 1}
    assert not missing and not extra and not twice, (
        f"missing {len(missing)} {sorted(missing)[:5]}, extra {sorted(extra)[:5]}, "
        f"duplicated {list(twice.items())[:5]}")
    assert files_with_lines >= 3, files_with_lines
    assert p.log().count("SIGUSR1: reopening the access log") == len(rotated)


# ------------------------------------------------ a pipe nobody reads

def drain(fd, sink, stop):
    while not stop.is_set():
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            time.sleep(0.005)
            continue
        if not data:
            time.sleep(0.005)
            continue
        sink.append(data)


def test_a_stalled_pipe_drops_lines_but_never_holds_a_request(make_proxy,
                                                              stub, tmp_path):
    """--access-log FIFO, opened by the test and not read: once the pipe
    (64 KiB) and the writer's buffers (2 x 1 MiB) are full, lines are
    dropped and counted, said once, and every request is still answered
    promptly; read the FIFO and lines flow again; stalled again, SIGTERM
    still exits within its flush bound."""
    fifo = tmp_path / "access.fifo"
    os.mkfifo(fifo)
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        p = start(make_proxy, tmp_path, "json", workers=2, name="fifo",
                  dest=fifo)
        ua = [("User-Agent", "u" * 3000)]      # ~3.5 KB lines
        errors, lat = [], []
        # ~3.5 MB of lines against 64 KiB + 2 MiB of room
        for th in load(p.port, 4, 250, "fill", errors, headers=ua,
                       latencies=lat):
            th.join(120)
        assert not errors, errors[:5]
        assert len(lat) == 1000
        assert max(lat) < 2.0, f"a request waited {max(lat):.2f} s"
        wait_until("drops counted", lambda: metric(
            p, "idemproxy_access_log_dropped_total") > 0, timeout=5)
        written = metric(p, "idemproxy_access_log_lines_total")
        dropped = metric(p, "idemproxy_access_log_dropped_total")
        assert written + dropped <= 1000, (written, dropped)
        wait_until("the warning", lambda: "cannot keep up" in p.log(), 5)
        time.sleep(0.3)
        warns = [ln for ln in p.log().splitlines() if "dropping" in ln]
        assert len(warns) == 1, warns
        assert "access log" in warns[0] and str(fifo) in warns[0], warns

        # read it: the writer catches up, new lines flow
        sink, stop = [], threading.Event()
        reader = threading.Thread(target=drain, args=(rfd, sink, stop),
                                  daemon=True)
        reader.start()
        try:
            wait_until("caught up", lambda: "caught up" in p.log(), 10)
            before = metric(p, "idemproxy_access_log_lines_total")
            for i in range(20):
                r = send(p.port, "GET", "/", rid=f"after-{i}")
                assert r.status == 200
            wait_until("the new lines", lambda: metric(
                p, "idemproxy_access_log_lines_total") >= before + 20, 10)
            wait_until("the new lines read", lambda: all(
                f'"after-{i}"'.encode() in b"".join(sink) for i in range(20)),
                10)
        finally:
            stop.set()
            reader.join(5)
        data = b"".join(sink)
        assert data.endswith(b"\n"), data[-200:]
        got = [parse_json(ln + "\n")["request_id"]
               for ln in data.decode().split("\n")[:-1]]
        assert len(got) == len(set(got)), "a line written twice"
        assert {f"after-{i}" for i in range(20)} <= set(got)
        # dropped lines are whole lines: what was read is whole lines
        assert len(got) <= 1020
        warns = [ln for ln in p.log().splitlines() if "dropping" in ln]
        assert len(warns) == 1, warns
        caught = [ln for ln in p.log().splitlines() if "caught up" in ln]
        assert len(caught) == 1, caught
        m = re.search(r"\b(\d+) lines were dropped", caught[0])
        assert m, caught
        # the episode's count is the counter's (nothing dropped since)
        assert int(m.group(1)) == metric(
            p, "idemproxy_access_log_dropped_total") >= dropped, caught

        # stalled again with lines waiting: SIGTERM exits within the flush
        # bound (2 s) and the drain
        for th in load(p.port, 2, 300, "again", errors, headers=ua):
            th.join(60)
        assert not errors, errors[:5]
        t0 = time.monotonic()
        rc = p.stop(timeout=15)
        took = time.monotonic() - t0
        assert rc == 0, p.log()
        assert took < 5.0, f"SIGTERM took {took:.1f} s"
    finally:
        os.close(rfd)


# ------------------------------------------------ where lines go

def wait_log(p, text, n=1, timeout=10.0):
    wait_until(f"{n} x {text!r} in the event log",
               lambda: p.log().count(text) >= n, timeout)


def test_sighup_moves_the_log_and_changes_its_format(make_proxy, stub,
                                                     tmp_path):
    """access_log in the config file: PATH1 text -> off -> PATH2 json ->
    a path that cannot be opened (kept: PATH2) -> PATH2 text."""
    ini = tmp_path / "idemproxy.ini"
    one, two = tmp_path / "one.log", tmp_path / "two.log"

    def conf(dest, fmt):
        ini.write_text(f"[idemproxy]\naccess_log = {dest}\n"
                       f"access_log_format = {fmt}\n")

    conf(one, "text")
    p = make_proxy("--config", str(ini))
    a = send(p.port, "GET", "/a", rid="hup-a")
    wait_rids(one, ["hup-a"], "text")

    conf("off", "text")
    p.signal(signal.SIGHUP)
    wait_log(p, "SIGHUP: reloaded", 1)
    b = send(p.port, "GET", "/b", rid="hup-b")

    conf(two, "json")
    p.signal(signal.SIGHUP)
    wait_log(p, "SIGHUP: reloaded", 2)
    c = send(p.port, "GET", "/c", rid="hup-c")
    wait_rids(two, ["hup-c"], "json")

    conf(tmp_path / "no-such-dir" / "x.log", "json")
    p.signal(signal.SIGHUP)
    wait_log(p, "SIGHUP: reloaded", 3)
    assert "SIGHUP: keeping the running access log" in p.log()
    d = send(p.port, "GET", "/d", rid="hup-d")
    wait_rids(two, ["hup-d"], "json")

    conf(two, "text")
    p.signal(signal.SIGHUP)
    wait_log(p, "SIGHUP: reloaded", 4)
    e = send(p.port, "GET", "/e", rid="hup-e")
    # (the file holds both forms now: found by its text)
    wait_lines(two, lambda ls: any(" rid=hup-e " in ln for ln in ls))
    for r in (a, b, c, d, e):
        assert r.status == 200
    lines1 = read_lines(one)
    assert len(lines1) == 1 and parse_text(lines1[0])["request_id"] == "hup-a"
    lines2 = read_lines(two)
    assert len(lines2) == 3, lines2
    assert parse_json(lines2[0])["request_id"] == "hup-c"
    assert parse_json(lines2[1])["request_id"] == "hup-d"
    assert parse_text(lines2[2])["request_id"] == "hup-e"
    assert "hup-b" not in read_text(one) + read_text(two) + p.log()
    assert not (tmp_path / "no-such-dir").exists()


def test_env_stdout_and_stderr_destinations(make_proxy, stub, tmp_path):
    path = tmp_path / "env.log"
    p = make_proxy(env={"IDEMPROXY_ACCESS_LOG": str(path),
                        "IDEMPROXY_ACCESS_LOG_FORMAT": "json"}, name="env")
    send(p.port, "GET", "/env", rid="env-1")
    lines = wait_lines(path, bool)
    assert [parse_json(ln)["request_id"] for ln in lines] == ["env-1"]

    out = make_proxy("--access-log", "stdout", "--access-log-format", "json",
                     name="out")
    send(out.port, "GET", "/out", rid="out-1")
    lines = wait_lines(out.out_path, bool)
    assert [parse_json(ln)["request_id"] for ln in lines] == ["out-1"]

    err = make_proxy("--access-log", "stderr", name="err")
    for i in range(5):
        send(err.port, "GET", "/err?drop=1" if i == 2 else "/err",
             rid=f"err-{i}")
    wait_lines(err.log_path, lambda ls: sum(" rid=err-" in ln
                                            for ln in ls) == 5)
    ours = [parse_text(ln) for ln in read_lines(err.log_path, True)
            if " rid=err-" in ln and " - - [" in ln]
    assert sorted(d["request_id"] for d in ours) == \
        [f"err-{i}" for i in range(5)]
    # the event log's line of the failure is a line of its own
    assert any("request_id=err-2 " in ln and "upstream" in ln
               for ln in err.log().splitlines()), err.log()


# ------------------------------------------------ request ids

RID_CHARS = "AZaz09-_.:+/=@"
ISSUE_INI = """\
[route pay]
match              = POST /pay*
require_issued_key = yes
"""


def upstream_rids(r, name="x-request-id"):
    return upstream_echo(r)["hdict"].get(name, [])


def test_request_ids(make_proxy, stub, tmp_path):
    ini = tmp_path / "issue.ini"
    ini.write_text(ISSUE_INI)
    p = start(make_proxy, tmp_path, "json", "--config", str(ini),
              "--require-key", "true")
    seen = []

    def get(fields):
        raw = build_request("GET", "/echo", fields)
        r = send(p.port, None, None, raw=raw)
        assert r.status == 200, r
        seen.append(r)
        return r

    # well-formed: kept, sent upstream once, echoed
    longest = (RID_CHARS * 10)[:128]
    for good in (longest, "a", "req-1", "A/b+c=d@e:f.g_h"):
        r = get([("X-Request-Id", good)])
        assert r.header_all("X-Request-Id") == [good], r
        assert upstream_rids(r) == [good], r
    r = get([("x-request-id", "lower-case-name")])
    assert r.header("X-Request-Id") == "lower-case-name"
    # malformed: replaced by a made one, which alone goes upstream
    for fields in ([("X-Request-Id", "r" * 129)], [("X-Request-Id", "a b")],
                   [("X-Request-Id", "a,b")], [("X-Request-Id", 'a"b')],
                   [("X-Request-Id", "caf\xe9")], [("X-Request-Id", "")],
                   [("X-Request-Id", "a;b")],
                   [("X-Request-Id", "one"), ("X-Request-Id", "two")]):
        r = get(fields)
        made = r.header("X-Request-Id")
        assert r.header_all("X-Request-Id") == [made], r
        assert UUID4.fullmatch(made or ""), (fields, r)
        assert upstream_rids(r) == [made], (fields, r)
    # absent: made, a UUID v4, a new one each time
    made = {get([]).header("X-Request-Id") for _ in range(5)}
    assert len(made) == 5 and all(UUID4.fullmatch(m) for m in made), made
    assert upstream_rids(seen[-1]) == [seen[-1].header("X-Request-Id")]

    # problem documents carry it, in the body too
    r = send(p.port, "POST", "/orders", rid="prob-1", body=ORDER)
    doc = assert_problem(r, 400, "missing-idempotency-key")
    assert r.header("X-Request-Id") == "prob-1" and doc["request_id"] == "prob-1"
    r = send(p.port, "POST", "/orders", body=ORDER)
    doc = assert_problem(r, 400, "missing-idempotency-key")
    assert UUID4.fullmatch(r.header("X-Request-Id")), r
    assert doc["request_id"] == r.header("X-Request-Id"), doc
    seen.append(r)
    # an issued key
    r = send(p.port, "GET", "/.well-known/idempotency-key", rid="iss-1")
    assert r.status == 200 and r.header("X-Request-Id") == "iss-1", r
    # a relayed upstream error keeps the id too
    r = send(p.port, "GET", "/x?status=503", rid="up503")
    assert r.status == 503 and r.header("X-Request-Id") == "up503", r

    by = wait_rids(p.alog, [r.header("X-Request-Id") for r in seen] +
                   ["prob-1", "iss-1", "up503"], "json")
    for r in seen:
        one_line(by, r)
    assert by["iss-1"][0]["outcome"] == "key_issued", by["iss-1"]
    assert by["prob-1"][0]["outcome"] == "missing_key", by["prob-1"]


def test_a_replay_names_the_request_that_executed(make_proxy, stub,
                                                  store_args, tmp_path):
    """The original request id is stored with the outcome: every replay
    has its own id and names the executing one, also from another
    instance on the same store."""
    p = start(make_proxy, tmp_path, "json", store_args=store_args, name="a")
    key = newkey("orig")
    first = send(p.port, "POST", "/orders", rid="exec-1", key=key, body=ORDER)
    assert first.status == 200 and upstream_rids(first) == ["exec-1"]
    rs = [send(p.port, "POST", "/orders", rid=f"again-{i}", key=key,
               body=ORDER) for i in range(2)]
    rs.append(send(p.port, "POST", "/orders", key=key, body=ORDER))
    if store_args:
        q = start(make_proxy, tmp_path, "json", store_args=store_args,
                  name="b")
        rs.append(send(q.port, "POST", "/orders", rid="other-1", key=key,
                       body=ORDER))
    for r in rs:
        assert r.status == 200 and r.header("Idempotent-Replayed") == "true"
        assert r.header("Idempotent-Original-Request-Id") == "exec-1", r
        assert r.header("X-Request-Id") != "exec-1", r
    assert [r.header("X-Request-Id") for r in rs[:2]] == ["again-0", "again-1"]
    assert UUID4.fullmatch(rs[2].header("X-Request-Id"))
    assert stub_runs(stub, key) == 1
    by = wait_rids(p.alog, ["exec-1"] + [r.header("X-Request-Id")
                                         for r in rs[:3]], "json")
    assert by["exec-1"][0]["original_request_id"] is None
    assert by["exec-1"][0]["replayed"] is False
    for r in rs[:3]:
        d = one_line(by, r)
        assert d["original_request_id"] == "exec-1" and d["replayed"], d
    if store_args:
        d = one_line(wait_rids(q.alog, ["other-1"], "json"), rs[3])
        assert d["original_request_id"] == "exec-1" and d["replayed"], d


def test_a_custom_request_id_header(make_proxy, stub, tmp_path):
    p = start(make_proxy, tmp_path, "text", "--request-id-header",
              "X-Correlation-Id", "--require-key", "true")
    r = send(p.port, "GET", "/c", headers=[("X-Correlation-Id", "corr-1")])
    assert r.header("X-Correlation-Id") == "corr-1", r
    assert not r.has("X-Request-Id"), r
    assert upstream_rids(r, "x-correlation-id") == ["corr-1"], r
    r2 = send(p.port, "GET", "/c")
    made = r2.header("X-Correlation-Id")
    assert UUID4.fullmatch(made or "") and not r2.has("X-Request-Id"), r2
    assert upstream_rids(r2, "x-correlation-id") == [made]
    assert upstream_rids(r2) == [], r2
    bad = send(p.port, "GET", "/c", headers=[("X-Correlation-Id", "a b")])
    assert UUID4.fullmatch(bad.header("X-Correlation-Id") or ""), bad
    prob = send(p.port, "POST", "/o", body=ORDER,
                headers=[("X-Correlation-Id", "corr-2")])
    doc = assert_problem(prob, 400, "missing-idempotency-key")
    assert prob.header("X-Correlation-Id") == "corr-2" == doc["request_id"]
    key = newkey("corr")
    send(p.port, "POST", "/o", key=key, body=ORDER,
         headers=[("X-Correlation-Id", "corr-x")])
    rep = send(p.port, "POST", "/o", key=key, body=ORDER,
               headers=[("X-Correlation-Id", "corr-y")])
    assert rep.header("X-Correlation-Id") == "corr-y", rep
    assert rep.header("Idempotent-Original-Request-Id") == "corr-x", rep
    by = wait_rids(p.alog, ["corr-1", made, "corr-2", "corr-x", "corr-y"],
                   "text")
    assert by["corr-y"][0]["original_request_id"] == "corr-x"


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_event_log_lines_carry_the_request_id(make_proxy, stub, log_format):
    """An upstream failure's event-log lines name the request: "request_id"
    in JSON, "request_id=ID " before the text's message."""
    p = make_proxy("--log-format", log_format)
    r = send(p.port, "GET", "/x?drop=1", rid="ev-pass")
    assert r.status == 502 and r.header("X-Request-Id") == "ev-pass", r
    key = newkey("ev")
    r = send(p.port, "POST", "/y?drop=1", rid="ev-keyed", key=key, body=ORDER)
    assert r.status == 502 and r.header("X-Request-Id") == "ev-keyed", r
    for rid_, what in (("ev-pass", "upstream"), ("ev-keyed", key)):
        def found():
            for ln in p.log().splitlines():
                if log_format == "json":
                    try:
                        doc = json.loads(ln)
                    except ValueError:
                        continue
                    if doc.get("request_id") == rid_ and what in doc["msg"]:
                        return True
                elif f" request_id={rid_} " in ln and what in ln:
                    return True
            return False
        wait_until(f"the event-log line of {rid_}", found, 5)
    if log_format == "json":
        for ln in p.log().splitlines():
            json.loads(ln)              # every event-log line is JSON


# ------------------------------------------------ --trusted-proxies

def forwarded_for(p, fmt, cases):
    """{name: forwarded_for} of one GET per case (name, [XFF values])."""
    for name, xffs in cases:
        hs = [("X-Forwarded-For", v) for v in xffs]
        assert send(p.port, "GET", "/f", rid=name, headers=hs).status == 200
    by = wait_rids(p.alog, [n for n, _ in cases], fmt)
    out = {}
    for name, _ in cases:
        d = by[name]
        assert len(d) == 1, d
        assert d[0]["client"] == "127.0.0.1", d
        out[name] = d[0]["forwarded_for"]
    return out


CASES = [("none", []), ("one", ["203.0.113.7"]),
         ("chain", ["1.2.3.4, 10.0.0.1"]),
         ("fields", ["1.2.3.4", "10.0.0.2"]),
         ("v6", ["2001:db8::1"]), ("junk", ["not-an-address"]),
         ("junk-near", ["1.2.3.4, bogus"]),
         ("spaces", ["  198.51.100.9  ,\t10.9.9.9 "])]


@pytest.mark.parametrize("fmt", FMTS)
def test_trusted_proxies_name_the_client(make_proxy, stub, tmp_path, fmt):
    lo = start(make_proxy, tmp_path, fmt, "--trusted-proxies", "127.0.0.0/8",
               name=f"lo-{fmt}")
    assert forwarded_for(lo, fmt, CASES) == {
        "none": None, "one": "203.0.113.7", "chain": "10.0.0.1",
        "fields": "10.0.0.2", "v6": "2001:db8::1", "junk": None,
        "junk-near": None, "spaces": "10.9.9.9"}
    both = start(make_proxy, tmp_path, fmt, "--trusted-proxies",
                 "127.0.0.1,10.0.0.0/8", name=f"both-{fmt}")
    assert forwarded_for(both, fmt, CASES) == {
        "none": None, "one": "203.0.113.7", "chain": "1.2.3.4",
        "fields": "1.2.3.4", "v6": "2001:db8::1", "junk": None,
        "junk-near": None, "spaces": "198.51.100.9"}
    # the peer itself is not trusted: its X-Forwarded-For names nobody
    for flags, name in (((), f"untrusted-{fmt}"),
                        (("--trusted-proxies", "10.0.0.0/8,::1"),
                         f"other-{fmt}")):
        p = start(make_proxy, tmp_path, fmt, *flags, name=name)
        assert set(forwarded_for(p, fmt, CASES).values()) == {None}


def run_bad(args, timeout=15):
    argv = [IDEMPROXY_BIN, "--listen", f"127.0.0.1:{free_port()}",
            "--admin-listen", f"127.0.0.1:{free_port()}", *args]
    return subprocess.run(argv, capture_output=True, timeout=timeout,
                          env=clean_env())


def assert_start_error(res, name):
    err = res.stderr.decode(errors="replace")
    assert res.returncode == 2, (res.returncode, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line on stderr: {err!r}"
    assert name in lines[0], lines


@pytest.mark.parametrize("value", ["10.0.0.0/33", "300.1.1.1", "nonsense",
                                   "10.0.0.0/8,,", "::1/129", "",
                                   "10.0.0.1/8", "10.0.0.0/8 127.0.0.1"])
def test_bad_trusted_proxies_exit_2(stub, value):
    assert_start_error(run_bad(["--upstream", stub.url, "--trusted-proxies",
                                value]), "--trusted-proxies")


def test_access_log_start_errors(stub, tmp_path):
    up = ["--upstream", stub.url]
    for dest in (tmp_path / "no-such-dir" / "a.log", tmp_path):
        assert_start_error(run_bad(up + ["--access-log", str(dest)]),
                           "--access-log")
    assert not (tmp_path / "no-such-dir").exists()
    assert_start_error(run_bad(up + ["--access-log-format", "yaml"]),
                       "--access-log-format")
    ini = tmp_path / "bad.ini"
    ini.write_text(f"[idemproxy]\naccess_log = {tmp_path}/nowhere/x.log\n")
    res = run_bad(up + ["--config", str(ini)])
    assert res.returncode == 2, res
    assert "access" in res.stderr.decode(), res.stderr
    res = run_bad(up + ["--request-id-header", "Bad Header"])
    assert_start_error(res, "request-id-header")
    # a field that frames, routes or is written by the proxy cannot carry
    # the id: it is replaced on both sides
    for name in ("Content-Length", "host", "Transfer-Encoding", "Connection",
                 "Content-Type", "traceparent", "X-Forwarded-For",
                 "Idempotent-Original-Request-Id"):
        assert_start_error(run_bad(up + ["--request-id-header", name]),
                           "request-id-header")
