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
import concurrent.futures as cf
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


def start(make_proxy, tmp_path, fmt, *flags, store_args=(), name=None, **kw):
    """A proxy logging to tmp_path/<name>.log in fmt; p.alog is the path."""
    name = name or f"alog-{fmt}"
    path = tmp_path / f"{name}.log"
    p = make_proxy(*store_args, "--access-log", str(path),
                   "--access-log-format", fmt, *flags, name=name, **kw)
    if store_args:
        wait_readyz(p)
    p.alog = path
    return p


def send(port, method, target, rid=None, key=None, body=None, headers=(),
         raw=None, timeout=20.0):
    """One request on a fresh connection; the response gets .sent (request
    bytes) and .got (response bytes, exactly)."""
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
    for part in ("claim_s", "wait_s", "upstream_s", "store_s"):
        assert d[part] is None or 0 <= d[part] <= d["duration_s"] + 1e-6, \
            (part, where)
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
    ini = tmp_path / "routes.ini"
    ini.write_text(ROUTES_INI)
    p = start(make_proxy, tmp_path, fmt, "--config", str(ini),
              "--require-key", "true", "--max-body", "1KiB",
              "--wait-timeout", "10s", store_args=store_args)
    auth = [("Authorization", "Bearer alice")]
    seen = []                  # every response, in order

    def go(*a, **kw):
        r = send(p.port, *a, **kw)
        seen.append(r)
        return r

    # forwarded, on the route, the query not logged
    k1 = newkey("fwd")
    fwd = go("POST", "/orders?secret=s3cr3t", rid=rid("fwd"), key=k1,
             body=ORDER, headers=auth + [("User-Agent", "agent/1.0"),
                                         ("Referer", "http://ref.test/a")])
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
    unk = go("POST", "/pay?drop=1", rid=rid("unk"), key=k5, body=ORDER)
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
    for r in (bad, garbage):
        assert UUID4.fullmatch(r.header("X-Request-Id") or ""), r
        assert r.json()["request_id"] == r.header("X-Request-Id"), r
    by = wait_rids(p.alog, [bad.header("X-Request-Id"),
                            garbage.header("X-Request-Id")], fmt)
    for r in (bad, garbage):
        d = one_line(by, r)
        assert d["status"] == 400 and d["outcome"] == "bad_request", d
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
