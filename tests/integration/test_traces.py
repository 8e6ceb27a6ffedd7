"""Traces (issue 45): idemproxy's spans, exported over OTLP/HTTP JSON to a
support.otlp.OtlpReceiver, joined with the client's trace and with the
traced node upstream's (support/otel_node.py).

  - the trace end to end: client traceparent -> idemproxy SERVER span ->
    its CLIENT span -> the upstream's SERVER span, one trace, in one
    receiver; a replay is a new SERVER span with no upstream span
  - the idempotency attributes of each outcome (forwarded, replayed,
    conflict, mismatch, a duplicate that waited) on every store setup
  - an unknown outcome: its span event, error status
  - sampling: parent-based with an unsampled parent, always_off,
    traceidratio 0 and 1, malformed client traceparents (a new trace),
    OTEL_SDK_DISABLED and no endpoint (the client's traceparent untouched)
  - the exporter's faults: a collector that is down (requests unaffected,
    drops counted, a prompt SIGTERM), slow, answering 503 (retried);
    headers, resource attributes, service name, endpoints, http/protobuf
  - the access log's trace_id / span_id; idempotency.route and the
    client's X-Request-Id; batching and the flush at SIGTERM
  - start-up errors: grpc, a bad sampler, a bad endpoint (exit 2); the
    --otel-* flags in --help

Absence of spans is asserted after a barrier where one exists: a sampled
request sent after the unsampled one on the same proxy goes through the
same FIFO export queue, so once its span arrived the earlier one would
have too. Without a barrier (a proxy that exports nothing) the test waits
ten schedule delays and checks the exporter's counters as well.
"""
import json
import re
import secrets
import signal
import subprocess
import threading
import time

import pytest

from support.http import RawConn, assert_problem, upstream_echo
from support.otel_node import (DEFAULT_SERVICE, make_upstream,  # noqa: F401
                               otel_modules, otlp_receiver)
from support.otlp import (KIND_CLIENT, KIND_INTERNAL, KIND_SERVER,
                          STATUS_ERROR, OtlpReceiver, describe)
from support.procs import (IDEMPROXY_BIN, clean_env, free_port, metric_value,
                           wait_readyz)

SERVICE = "idemproxy-under-test"
ORDER = b'{"item":"book","amount":100}'
TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-(0[01])\Z")
SCHEDULE_MS = 100


def otel_env(endpoint, **extra):
    """The proxy's environment: traces to `endpoint`, batches every 100 ms."""
    env = {"OTEL_SERVICE_NAME": SERVICE,
           "OTEL_BSP_SCHEDULE_DELAY": str(SCHEDULE_MS)}
    if endpoint is not None:
        env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = endpoint
    env.update(extra)
    return env


def new_tp(flags="01"):
    """A made-up client traceparent: (header, trace id, span id)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-{flags}", trace_id, span_id


def newkey(prefix="k"):
    return f"{prefix}-{secrets.token_hex(8)}"


def send(port, target="/orders", key=None, tp=None, body=ORDER,
         method="POST", headers=(), timeout=20.0):
    hs = [("Content-Type", "application/json"),
          ("User-Agent", "trace-tests/1.0")]
    if key is not None:
        hs.append(("Idempotency-Key", key))
    if tp is not None:
        hs.append(("traceparent", tp))
    hs += list(headers)
    with RawConn(port, timeout=timeout) as c:
        return c.request(method, target, headers=hs, body=body)


def replayed(r):
    return (r.header("Idempotent-Replayed") or "").lower() == "true"


def upstream_tp(r):
    """The traceparent field(s) the C stub received (its echo)."""
    return upstream_echo(r)["hdict"].get("traceparent", [])


def ours(rx, trace_id=None, service=SERVICE):
    """idemproxy's stored spans (of one trace)."""
    return [s for s in rx.spans(service=service)
            if trace_id is None or s["trace_id"] == trace_id]


def server_span(rx, trace_id, timeout=10.0, service=SERVICE):
    """idemproxy's one SERVER span of trace_id, waited for."""
    found = rx.wait_for(lambda s: s["service"] == service
                        and s["trace_id"] == trace_id
                        and s["kind"] == KIND_SERVER, timeout=timeout)
    assert len(found) == 1, [describe(s) for s in found]
    return found[0]


def children(rx, server, trace_id=None):
    """idemproxy's spans whose parent is `server`, by name."""
    out = {}
    for s in ours(rx, trace_id or server["trace_id"],
                  service=server["service"]):
        if s["parent_span_id"] == server["span_id"]:
            assert s["name"] not in out, (s, out)
            out[s["name"]] = s
    return out


def within(child, parent):
    assert parent["start_ns"] <= child["start_ns"] <= child["end_ns"] \
        <= parent["end_ns"], (describe(child), child["start_ns"],
                              child["end_ns"], describe(parent),
                              parent["start_ns"], parent["end_ns"])


def metric(p, name, **labels):
    return metric_value(p.metrics(), name, labels or None) or 0


def wait_metric(p, name, pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        v = metric(p, name)
        if pred(v):
            return v
        assert time.monotonic() < deadline, f"{name} = {v} after {timeout}s"
        time.sleep(0.05)


def quiet_period():
    """Long enough for any span queued to have been sent (ten batches)."""
    time.sleep(10 * SCHEDULE_MS / 1000.0)


# ------------------------------------------------ the trace end to end

def test_trace_joined_end_to_end(otlp_receiver, make_upstream, make_proxy):
    """Client -> idemproxy -> traced node upstream, one receiver: one
    trace; the upstream's SERVER span is the child of idemproxy's CLIENT
    span, which is the child of idemproxy's SERVER span, which is the
    child of the client's span. The replay: a new SERVER span, replayed,
    naming the original request id; the upstream is not called."""
    rx = otlp_receiver
    up = make_upstream(endpoint=rx.url)
    p = make_proxy(upstream=up.url, env=otel_env(rx.url))
    key = newkey("e2e")
    tp, trace_id, client_span = new_tp()

    r = send(p.port, "/orders?x=1", key, tp)
    assert r.status == 201 and not replayed(r), r
    request_id = r.header("X-Request-Id")
    assert request_id, r
    got = r.json()
    assert got["order"] == 1 and got["key"] == key, got
    assert got["x_request_id"] == request_id, got
    m = TRACEPARENT.match(got["traceparent"] or "")
    assert m, got
    assert m.group(1) == trace_id and m.group(3) == "01", got
    assert m.group(2) != client_span, got
    assert got["trace_id"] == trace_id, got

    srv = server_span(rx, trace_id)
    [cli] = rx.wait_for(lambda s: s["service"] == SERVICE
                        and s["trace_id"] == trace_id
                        and s["kind"] == KIND_CLIENT)
    [usrv] = rx.wait_for(lambda s: s["service"] == DEFAULT_SERVICE
                         and s["trace_id"] == trace_id)

    # the chain of parents
    assert srv["parent_span_id"] == client_span, describe(srv)
    assert cli["parent_span_id"] == srv["span_id"], describe(cli)
    assert usrv["parent_span_id"] == cli["span_id"], describe(usrv)
    assert m.group(2) == cli["span_id"], (got, describe(cli))
    assert usrv["span_id"] == got["span_id"], (got, describe(usrv))
    assert usrv["kind"] == KIND_SERVER and usrv["name"] == "POST /orders"
    assert len({srv["span_id"], cli["span_id"], usrv["span_id"],
                client_span}) == 4
    within(cli, srv)

    # idemproxy's SERVER span
    assert srv["name"] == "POST" and srv["service"] == SERVICE, describe(srv)
    assert srv["resource"]["service.name"] == SERVICE, srv["resource"]
    a = srv["attributes"]
    assert a["http.request.method"] == "POST", a
    assert a["url.path"] == "/orders", a          # no query
    assert a["url.scheme"] == "http", a
    assert a["server.address"] == "example.test", a
    assert a["client.address"] == "127.0.0.1", a
    assert a["network.peer.address"] == "127.0.0.1", a
    assert a["network.protocol.version"] == "1.1", a
    assert a["user_agent.original"] == "trace-tests/1.0", a
    assert a["http.response.status_code"] == 201, a
    assert "error.type" not in a, a
    assert a["idempotency.key"] == key, a
    assert a["idempotency.outcome"] == "forwarded", a
    assert a["idempotency.replayed"] is False, a
    assert a["idempotency.store"] == "memory", a
    assert a["idempotency.request_id"] == request_id, a
    assert "idempotency.original_request_id" not in a, a
    assert srv["status"]["code"] != STATUS_ERROR, srv["status"]
    assert srv["end_ns"] >= srv["start_ns"] > 0

    # its CLIENT span
    assert cli["name"] == "POST", describe(cli)
    c = cli["attributes"]
    assert c["http.request.method"] == "POST", c
    assert c["server.address"] == "127.0.0.1", c
    assert c["server.port"] == up.port, c
    assert c["url.full"] == f"http://127.0.0.1:{up.port}/orders", c
    assert c["http.response.status_code"] == 201, c
    assert "error.type" not in c, c

    # the claim and the store write: INTERNAL children
    kids = children(rx, srv)
    for name in ("idempotency claim", "idempotency record"):
        assert name in kids, (name, sorted(kids))
        assert kids[name]["kind"] == KIND_INTERNAL, describe(kids[name])
        within(kids[name], srv)
    assert "idempotency wait" not in kids, sorted(kids)
    assert rx.protobuf_requests == 0 and not rx.errors, rx.errors
    assert all(e["content_type"].startswith("application/json")
               for e in rx.log), rx.log
    assert up.count(key) == 1

    # the replay: a new SERVER span, no upstream exchange
    tp2, trace2, client2 = new_tp()
    r2 = send(p.port, "/orders?x=1", key, tp2)
    assert r2.status == 201 and replayed(r2), r2
    assert r2.json() == got, (r2.json(), got)
    srv2 = server_span(rx, trace2)
    a2 = srv2["attributes"]
    assert srv2["parent_span_id"] == client2, describe(srv2)
    assert a2["idempotency.replayed"] is True, a2
    assert a2["idempotency.outcome"] == "replayed", a2
    assert a2["idempotency.original_request_id"] == request_id, a2
    assert a2["idempotency.request_id"] == r2.header("X-Request-Id") \
        != request_id, (a2, r2)
    assert a2["http.response.status_code"] == 201, a2
    assert up.count(key) == 1
    quiet_period()
    assert not [s for s in ours(rx, trace2) if s["kind"] == KIND_CLIENT], \
        [describe(s) for s in ours(rx, trace2)]
    # (its GET /count spans aside)
    assert rx.spans(service=DEFAULT_SERVICE, name="POST /orders") == [usrv], \
        [describe(s) for s in rx.spans(service=DEFAULT_SERVICE)]
    assert metric(p, "idemproxy_trace_spans_exported_total") >= 6
    assert metric(p, "idemproxy_trace_spans_dropped_total") == 0


# ------------------------------------------------ outcomes

def start(make_proxy, store_args, *flags, env):
    p = make_proxy(*store_args, *flags, env=env)
    wait_readyz(p)
    return p


def in_background(fn, *args, **kw):
    out = {}

    def run():
        try:
            out["r"] = fn(*args, **kw)
        except BaseException as e:      # noqa: B902 (reported by the test)
            out["e"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def wait_runs(stub, key, n=1, timeout=5.0):
    deadline = time.monotonic() + timeout
    while stub.stats()["keys"].get(key, 0) < n:
        assert time.monotonic() < deadline, f"{key} never reached the stub"
        time.sleep(0.01)


def test_outcome_attributes(otlp_receiver, make_proxy, stub, store_setup,
                            store_args):
    """forwarded, replayed, mismatch (422), conflict (409, --in-flight
    reject) and a duplicate that waited (--in-flight wait: its wait span),
    each a SERVER span with its outcome and the store's name."""
    rx = otlp_receiver
    env = otel_env(rx.url)
    rej = start(make_proxy, store_args, "--in-flight", "reject", env=env)
    wait = start(make_proxy, store_args, "--in-flight", "wait",
                 "--wait-timeout", "10s", env=env)

    def span_of(port, key, target="/orders", body=ORDER):
        tp, trace_id, parent = new_tp()
        r = send(port, target, key, tp, body=body)
        s = server_span(rx, trace_id)
        assert s["parent_span_id"] == parent, describe(s)
        a = s["attributes"]
        assert a["idempotency.store"] == store_setup, a
        assert a["idempotency.key"] == key, a
        assert a["http.response.status_code"] == r.status, (a, r)
        assert a["idempotency.request_id"] == r.header("X-Request-Id"), a
        return r, s, a

    key = newkey("fwd")
    r, s, a = span_of(rej.port, key)
    assert r.status == 200 and not replayed(r), r
    assert a["idempotency.outcome"] == "forwarded", a
    assert a["idempotency.replayed"] is False, a
    first_id = r.header("X-Request-Id")
    assert KIND_CLIENT in {k["kind"] for k in children(rx, s).values()}

    r, s, a = span_of(rej.port, key)
    assert r.status == 200 and replayed(r), r
    assert a["idempotency.outcome"] == "replayed", a
    assert a["idempotency.replayed"] is True, a
    assert a["idempotency.original_request_id"] == first_id, a
    assert "idempotency claim" in children(rx, s), sorted(children(rx, s))
    assert KIND_CLIENT not in {k["kind"] for k in children(rx, s).values()}

    r, s, a = span_of(rej.port, key, body=b'{"item":"car","amount":1}')
    assert_problem(r, 422, "idempotency-key-mismatch")
    assert a["idempotency.outcome"] == "mismatch", a
    assert a["idempotency.replayed"] is False, a
    assert "error.type" not in a and s["status"]["code"] != STATUS_ERROR, s
    assert KIND_CLIENT not in {k["kind"] for k in children(rx, s).values()}

    # conflict: a duplicate while the original runs (1.5 s at the stub)
    slow = newkey("conflict")
    t, out = in_background(send, rej.port, "/orders?delay_ms=1500", slow)
    wait_runs(stub, slow)
    r, s, a = span_of(rej.port, slow, "/orders?delay_ms=1500")
    assert_problem(r, 409, "request-in-progress")
    assert a["idempotency.outcome"] == "conflict", a
    assert a["idempotency.replayed"] is False, a
    assert "idempotency wait" not in children(rx, s)
    t.join(10)
    assert out.get("r") is not None and out["r"].status == 200, out

    # a duplicate that waits for the original (0.8 s at the stub)
    held = newkey("wait")
    t, out = in_background(send, wait.port, "/orders?delay_ms=800", held)
    wait_runs(stub, held)
    t0 = time.monotonic()
    r, s, a = span_of(wait.port, held, "/orders?delay_ms=800")
    waited = time.monotonic() - t0
    assert r.status == 200 and replayed(r), r
    assert a["idempotency.outcome"] == "replayed", a
    assert a["idempotency.replayed"] is True, a
    kids = children(rx, s)
    assert "idempotency wait" in kids, sorted(kids)
    w = kids["idempotency wait"]
    assert w["kind"] == KIND_INTERNAL, describe(w)
    within(w, s)
    # it waited for the original: a good part of the 0.8 s
    assert 0.2e9 < w["end_ns"] - w["start_ns"] <= waited * 1e9, \
        (w["end_ns"] - w["start_ns"], waited)
    t.join(10)
    assert out.get("r") is not None and out["r"].status == 200, out
    assert a["idempotency.original_request_id"] == \
        out["r"].header("X-Request-Id"), (a, out["r"])
    assert stub.stats()["keys"] == {key: 1, slow: 1, held: 1}


# ------------------------------------------------ unknown outcomes

@pytest.mark.stores("memory", "postgres")
def test_unknown_outcome_event(otlp_receiver, make_proxy, stub, store_args):
    """The stub executes and drops the connection: 502 outcome-unknown;
    the SERVER span has the event idempotency.unknown_outcome (cause
    reset) and error status; its CLIENT span an error.type."""
    rx = otlp_receiver
    p = start(make_proxy, store_args, env=otel_env(rx.url))
    key = newkey("drop")
    tp, trace_id, parent = new_tp()
    r = send(p.port, "/payments?drop=1", key, tp)
    assert_problem(r, 502, "outcome-unknown")
    s = server_span(rx, trace_id)
    a = s["attributes"]
    assert s["parent_span_id"] == parent, describe(s)
    assert s["status"]["code"] == STATUS_ERROR, s["status"]
    assert a["http.response.status_code"] == 502, a
    assert a["error.type"], a
    assert a["idempotency.key"] == key, a
    events = [e for e in s["events"]
              if e["name"] == "idempotency.unknown_outcome"]
    assert len(events) == 1, s["events"]
    assert events[0]["attributes"].get("idempotency.unknown_cause") \
        == "reset", events
    assert s["start_ns"] <= events[0]["time_ns"] <= s["end_ns"], (events, s)
    [cli] = [k for k in children(rx, s).values() if k["kind"] == KIND_CLIENT]
    assert cli["status"]["code"] == STATUS_ERROR, describe(cli)
    assert cli["attributes"].get("error.type"), cli["attributes"]

    # its replay: 502 again, replayed, not executed
    tp2, trace2, _ = new_tp()
    r2 = send(p.port, "/payments?drop=1", key, tp2)
    assert_problem(r2, 502, "outcome-unknown")
    s2 = server_span(rx, trace2)
    assert s2["attributes"]["idempotency.replayed"] is True, s2["attributes"]
    assert s2["status"]["code"] == STATUS_ERROR, s2["status"]
    assert not [k for k in children(rx, s2).values()
                if k["kind"] == KIND_CLIENT]
    assert stub.stats()["keys"].get(key) == 1


# ------------------------------------------------ sampling

def test_parentbased_unsampled_parent(otlp_receiver, make_proxy):
    """parentbased_always_on (the default) and a client's unsampled
    parent: nothing exported; the upstream gets idemproxy's span id with
    flags 00 in the client's trace."""
    rx = otlp_receiver
    p = make_proxy(env=otel_env(rx.url))
    tp, trace_id, parent = new_tp("00")
    r = send(p.port, "/orders", newkey(), tp)
    assert r.status == 200, r
    [sent] = upstream_tp(r)
    m = TRACEPARENT.match(sent)
    assert m, sent
    assert m.group(1) == trace_id and m.group(3) == "00", sent
    assert m.group(2) != parent and m.group(2) != "0" * 16, sent

    # the barrier: a sampled request after it, through the same queue
    tp2, trace2, _ = new_tp("01")
    r2 = send(p.port, "/orders", newkey(), tp2)
    assert r2.status == 200, r2
    server_span(rx, trace2)
    assert ours(rx, trace_id) == [], [describe(s) for s in ours(rx, trace_id)]
    assert not [s for s in rx.spans() if s["trace_id"] == trace_id]


@pytest.mark.parametrize("env_sampler, flags, arg", [
    ("always_off", (), None),
    ("traceidratio", (), "0"),
    # a flag wins over OTEL_TRACES_SAMPLER
    ("always_on", ("--otel-traces-sampler", "always_off"), None),
    ("traceidratio", ("--otel-traces-sampler-arg", "0"), "1"),
], ids=["always_off", "ratio-0", "flag-always_off", "flag-arg-0"])
def test_sampler_exports_nothing(otlp_receiver, make_proxy, env_sampler,
                                 flags, arg):
    """Sampled parents and root requests alike: no span; the upstream gets
    idemproxy's traceparent with flags 00 (the client's trace kept)."""
    rx = otlp_receiver
    extra = {"OTEL_TRACES_SAMPLER": env_sampler}
    if arg is not None:
        extra["OTEL_TRACES_SAMPLER_ARG"] = arg
    p = make_proxy(*flags, env=otel_env(rx.url, **extra))
    for i in range(10):
        tp, trace_id, parent = new_tp("01")
        r = send(p.port, "/orders", newkey(), tp if i % 2 else None)
        assert r.status == 200, r
        [sent] = upstream_tp(r)
        m = TRACEPARENT.match(sent)
        assert m and m.group(3) == "00", sent
        if i % 2:
            assert m.group(1) == trace_id and m.group(2) != parent, sent
    quiet_period()
    assert rx.requests == 0 and rx.spans() == [], \
        [describe(s) for s in rx.spans()]
    assert metric(p, "idemproxy_trace_spans_exported_total") == 0


def test_parentbased_always_off(otlp_receiver, make_proxy):
    """parentbased_always_off: a root request is not sampled, a sampled
    parent's child is, an unsampled parent's is not."""
    rx = otlp_receiver
    p = make_proxy(env=otel_env(rx.url,
                                OTEL_TRACES_SAMPLER="parentbased_always_off"))
    r = send(p.port, "/orders", newkey())
    [root] = upstream_tp(r)
    assert TRACEPARENT.match(root).group(3) == "00", root
    tp0, trace0, _ = new_tp("00")
    [unsampled] = upstream_tp(send(p.port, "/orders", newkey(), tp0))
    assert TRACEPARENT.match(unsampled).group(3) == "00", unsampled
    tp1, trace1, parent1 = new_tp("01")
    [sampled] = upstream_tp(send(p.port, "/orders", newkey(), tp1))
    assert TRACEPARENT.match(sampled).group(3) == "01", sampled
    assert server_span(rx, trace1)["parent_span_id"] == parent1
    # the barrier passed: the two before it exported nothing
    assert {s["trace_id"] for s in rx.spans()} == {trace1}, \
        [describe(s) for s in rx.spans()]


@pytest.mark.parametrize("sampler, arg", [
    ("always_on", None), ("traceidratio", "1"),
    ("parentbased_traceidratio", "1")])
def test_sampler_exports_everything(otlp_receiver, make_proxy, sampler, arg):
    """always_on and ratio 1: every request's SERVER span, including a
    client's unsampled parent for the non-parent-based ones."""
    rx = otlp_receiver
    extra = {"OTEL_TRACES_SAMPLER": sampler}
    if arg is not None:
        extra["OTEL_TRACES_SAMPLER_ARG"] = arg
    p = make_proxy(env=otel_env(rx.url, **extra))
    traces = []
    for i in range(20):
        flags = "00" if i % 4 == 0 and not sampler.startswith("parent") \
            else "01"
        tp, trace_id, _ = new_tp(flags)
        r = send(p.port, "/orders", newkey(), tp)
        assert r.status == 200, r
        [sent] = upstream_tp(r)
        assert TRACEPARENT.match(sent).group(3) == "01", (flags, sent)
        traces.append(trace_id)
    rx.wait_for(lambda s: s["service"] == SERVICE
                and s["kind"] == KIND_SERVER, count=20)
    got = sorted(s["trace_id"] for s in rx.spans(service=SERVICE)
                 if s["kind"] == KIND_SERVER)
    assert got == sorted(traces)


def test_traceidratio_half_is_by_trace_id(otlp_receiver, make_proxy):
    """traceidratio 0.5: a fraction of about half, and the decision is the
    trace id's (the same trace id twice: the same decision)."""
    rx = otlp_receiver
    p = make_proxy(env=otel_env(rx.url, OTEL_TRACES_SAMPLER="traceidratio",
                                OTEL_TRACES_SAMPLER_ARG="0.5"))
    decisions = {}
    for i in range(80):
        tp, trace_id, _ = new_tp()
        r = send(p.port, "/orders", None, tp)
        [sent] = upstream_tp(r)
        decisions[trace_id] = TRACEPARENT.match(sent).group(3) == "01"
        # the same trace, another span of the client's: the same decision
        r = send(p.port, "/orders", None,
                 f"00-{trace_id}-{secrets.token_hex(8)}-01")
        [again] = upstream_tp(r)
        assert (TRACEPARENT.match(again).group(3) == "01") == \
            decisions[trace_id], (trace_id, sent, again)
    n = sum(decisions.values())
    assert 15 <= n <= 65, n         # binomial(80, .5): far outside 6 sigma
    rx.wait_for(lambda s: s["service"] == SERVICE
                and s["kind"] == KIND_SERVER, count=2 * n)
    quiet_period()
    got = {s["trace_id"] for s in rx.spans(service=SERVICE)
           if s["kind"] == KIND_SERVER}
    assert got == {t for t, d in decisions.items() if d}


BAD_TRACEPARENTS = [
    ("uppercase", lambda t, s: f"00-{t.upper()}-{s}-01"),
    ("uppercase-span", lambda t, s: f"00-{t}-{s.upper()}-01"),
    ("short-trace", lambda t, s: f"00-{t[:31]}-{s}-01"),
    ("long-span", lambda t, s: f"00-{t}-{s}0-01"),
    ("version-ff", lambda t, s: f"ff-{t}-{s}-01"),
    ("zero-trace", lambda t, s: f"00-{'0' * 32}-{s}-01"),
    ("zero-span", lambda t, s: f"00-{t}-{'0' * 16}-01"),
    ("version-00-extra", lambda t, s: f"00-{t}-{s}-01-extra"),
    ("no-dashes", lambda t, s: f"00{t}{s}01"),
    ("bad-flags", lambda t, s: f"00-{t}-{s}-0g"),
]


@pytest.mark.parametrize("make_bad", [b for _, b in BAD_TRACEPARENTS],
                         ids=[n for n, _ in BAD_TRACEPARENTS])
def test_malformed_traceparent_starts_a_new_trace(otlp_receiver, make_proxy,
                                                  make_bad):
    """A traceparent that is not W3C's: not the parent, not forwarded;
    idemproxy's SERVER span is the root of a new (sampled) trace."""
    rx = otlp_receiver
    p = make_proxy(env=otel_env(rx.url))
    t, s = secrets.token_hex(16), secrets.token_hex(8)
    bad = make_bad(t, s)
    r = send(p.port, "/orders", newkey(), bad)
    assert r.status == 200, r
    [sent] = upstream_tp(r)
    m = TRACEPARENT.match(sent)
    assert m and sent != bad, (bad, sent)
    assert m.group(1) not in (t, "0" * 32) and m.group(3) == "01", (bad, sent)
    srv = server_span(rx, m.group(1))
    assert srv["parent_span_id"] is None, describe(srv)
    kids = children(rx, srv)
    [cli] = [k for k in kids.values() if k["kind"] == KIND_CLIENT]
    assert cli["span_id"] == m.group(2), (describe(cli), sent)
    assert not [x for x in rx.spans() if x["trace_id"] == t]


def test_two_traceparents_start_a_new_trace(otlp_receiver, make_proxy):
    """Two traceparent fields (W3C: trust neither): a new trace, and one
    traceparent upstream."""
    rx = otlp_receiver
    p = make_proxy(env=otel_env(rx.url))
    tp1, t1, _ = new_tp()
    tp2, t2, _ = new_tp()
    r = send(p.port, "/orders", newkey(), tp1,
             headers=[("traceparent", tp2)])
    assert r.status == 200, r
    [sent] = upstream_tp(r)
    m = TRACEPARENT.match(sent)
    assert m and m.group(1) not in (t1, t2), sent
    assert server_span(rx, m.group(1))["parent_span_id"] is None


@pytest.mark.parametrize("how", ["env", "flag", "flag-over-env"])
def test_sdk_disabled(otlp_receiver, make_proxy, how):
    """OTEL_SDK_DISABLED=true (or --otel-sdk-disabled) with an endpoint:
    no spans, the client's traceparent goes upstream unchanged."""
    rx = otlp_receiver
    extra, flags = {}, ()
    if how == "env":
        extra["OTEL_SDK_DISABLED"] = "true"
    elif how == "flag":
        flags = ("--otel-sdk-disabled",)
    else:
        extra["OTEL_SDK_DISABLED"] = "true"
        flags = ("--otel-sdk-disabled=no",)
    p = make_proxy(*flags, env=otel_env(rx.url, **extra))
    tp, trace_id, _ = new_tp()
    r = send(p.port, "/orders", newkey(), tp)
    assert r.status == 200, r
    if how == "flag-over-env":      # --otel-sdk-disabled=no: tracing on
        [sent] = upstream_tp(r)
        assert sent != tp and TRACEPARENT.match(sent).group(1) == trace_id
        server_span(rx, trace_id)
        return
    assert upstream_tp(r) == [tp], upstream_echo(r)["headers"]
    r = send(p.port, "/orders", newkey())
    assert upstream_tp(r) == [], upstream_echo(r)["headers"]
    quiet_period()
    assert rx.requests == 0 and rx.spans() == []


def test_sighup_does_not_start_or_stop_tracing(otlp_receiver, make_proxy,
                                              tmp_path):
    """The otel settings need a restart: an endpoint the config file gains
    on SIGHUP is logged as such and changes nothing (the client's
    traceparent still goes upstream as it came); one it loses keeps
    tracing on."""
    rx = otlp_receiver
    ini = tmp_path / "p.ini"
    ini.write_text("[idemproxy]\n")
    p = make_proxy("--config", str(ini), env=otel_env(None))
    ini.write_text(f"[idemproxy]\notel_traces_endpoint = {rx.url}\n")
    p.signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while "otel-traces-endpoint changed" not in p.log():
        assert time.monotonic() < deadline, p.log()
        time.sleep(0.05)
    tp, _, _ = new_tp()
    r = send(p.port, "/orders", newkey(), tp)
    assert r.status == 200 and upstream_tp(r) == [tp], upstream_echo(r)["headers"]
    quiet_period()
    assert rx.requests == 0
    assert metric(p, "idemproxy_trace_spans_dropped_total") == 0

    ini2 = tmp_path / "q.ini"
    ini2.write_text(f"[idemproxy]\notel_traces_endpoint = {rx.url}\n")
    q = make_proxy("--config", str(ini2), env=otel_env(None))
    ini2.write_text("[idemproxy]\notel_sdk_disabled = yes\n")
    q.signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while "otel-sdk-disabled changed" not in q.log():
        assert time.monotonic() < deadline, q.log()
        time.sleep(0.05)
    tp, trace_id, _ = new_tp()
    r = send(q.port, "/orders", newkey(), tp)
    assert r.status == 200
    server_span(rx, trace_id)		# still traced


def test_no_endpoint_is_tracing_off(make_proxy, tmp_path):
    """No endpoint at all (OTEL_SERVICE_NAME alone does not turn it on):
    the client's traceparent (and tracestate) go upstream unchanged, none
    is added; the access log still names the client's trace."""
    log = tmp_path / "access.log"
    p = make_proxy("--access-log", str(log), "--access-log-format", "json",
                   env=otel_env(None))
    tp, trace_id, _ = new_tp()
    r = send(p.port, "/orders", newkey(), tp,
             headers=[("tracestate", "vendor=abc")])
    assert r.status == 200, r
    echo = upstream_echo(r)
    assert echo["hdict"].get("traceparent") == [tp], echo["headers"]
    assert echo["hdict"].get("tracestate") == ["vendor=abc"], echo["headers"]
    r = send(p.port, "/orders", newkey())
    assert upstream_tp(r) == [], upstream_echo(r)["headers"]
    lines = wait_lines(log, 2)
    assert lines[0].get("trace_id") == trace_id, lines[0]
    assert lines[0].get("span_id") is None, lines[0]
    assert lines[1].get("trace_id") is None, lines[1]
    assert metric(p, "idemproxy_trace_spans_exported_total") == 0


# ------------------------------------------------ the access log

def wait_lines(path, n, timeout=5.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            text = path.read_text()
        except FileNotFoundError:
            text = ""
        lines = [json.loads(x) for x in text.splitlines() if x.strip()]
        if len(lines) >= n:
            return lines
        assert time.monotonic() < deadline, f"{len(lines)} lines: {text!r}"
        time.sleep(0.05)


def test_access_log_names_the_span(otlp_receiver, make_proxy, tmp_path):
    """--access-log json: trace_id and span_id are those of idemproxy's
    SERVER span (the client's trace; a new one without traceparent)."""
    rx = otlp_receiver
    log = tmp_path / "access.log"
    p = make_proxy("--access-log", str(log), "--access-log-format", "json",
                   env=otel_env(rx.url))
    tp, trace_id, _ = new_tp()
    r1 = send(p.port, "/orders", newkey(), tp)
    r2 = send(p.port, "/orders", newkey())
    assert r1.status == r2.status == 200
    lines = wait_lines(log, 2)
    srv = server_span(rx, trace_id)
    assert lines[0]["trace_id"] == trace_id, lines[0]
    assert lines[0]["span_id"] == srv["span_id"], (lines[0], describe(srv))
    m = TRACEPARENT.match(upstream_tp(r2)[0])
    assert lines[1]["trace_id"] == m.group(1), (lines[1], m.group(0))
    srv2 = server_span(rx, m.group(1))
    assert lines[1]["span_id"] == srv2["span_id"], lines[1]


# ------------------------------------------------ the exporter's faults

def test_collector_down(make_proxy):
    """Nobody listens at the endpoint: 200 keyed requests are answered
    normally and promptly; failures and drops are counted; SIGTERM still
    exits at once (bounded) and cleanly."""
    dead = f"http://127.0.0.1:{free_port()}/v1/traces"
    p = make_proxy(env=otel_env(dead, OTEL_BSP_MAX_QUEUE_SIZE="64",
                                OTEL_BSP_MAX_EXPORT_BATCH_SIZE="16",
                                OTEL_EXPORTER_OTLP_TIMEOUT="1000"))
    worst = 0.0
    t0 = time.monotonic()
    with RawConn(p.port, timeout=10) as c:
        for i in range(200):
            tp, _, _ = new_tp()
            t1 = time.monotonic()
            r = c.request("POST", "/orders", headers=[
                ("Content-Type", "application/json"),
                ("Idempotency-Key", f"down-{i}"), ("traceparent", tp)],
                body=ORDER)
            worst = max(worst, time.monotonic() - t1)
            assert r.status == 200 and not replayed(r), r
    total = time.monotonic() - t0
    assert worst < 1.0 and total < 15.0, (worst, total)
    wait_metric(p, "idemproxy_trace_export_failures_total", lambda v: v >= 1)
    # 200 requests x at least 3 spans into a queue of 64: most are dropped
    wait_metric(p, "idemproxy_trace_spans_dropped_total", lambda v: v >= 300)
    assert metric(p, "idemproxy_trace_spans_exported_total") == 0
    t0 = time.monotonic()
    assert p.stop(timeout=15) == 0, p.log()
    assert time.monotonic() - t0 < 10.0, time.monotonic() - t0


def test_collector_slow(make_proxy):
    """A collector that takes 3 s to answer each export: requests are not
    slowed down; the spans arrive (stored before the answer)."""
    with OtlpReceiver(slow_seconds=3.0) as rx:
        rx.mode = "slow"
        p = make_proxy(env=otel_env(rx.url))
        traces = []
        worst = 0.0
        t0 = time.monotonic()
        for i in range(30):
            tp, trace_id, _ = new_tp()
            t1 = time.monotonic()
            r = send(p.port, "/orders", newkey("slow"), tp)
            worst = max(worst, time.monotonic() - t1)
            assert r.status == 200, r
            traces.append(trace_id)
            time.sleep(0.02)
        assert worst < 0.5 and time.monotonic() - t0 < 5.0, worst
        server_span(rx, traces[0])
        t0 = time.monotonic()
        assert p.stop(timeout=15) == 0, p.log()
        assert time.monotonic() - t0 < 10.0, time.monotonic() - t0


def test_collector_503_retried(otlp_receiver, make_proxy):
    """503 twice, then OK: the batch arrives after its retries, once;
    the failures are counted, nothing dropped."""
    rx = otlp_receiver
    rx.fail_next(2, 503)
    p = make_proxy(env=otel_env(rx.url))
    tp, trace_id, _ = new_tp()
    assert send(p.port, "/orders", newkey(), tp).status == 200
    server_span(rx, trace_id, timeout=15)
    statuses = [e["status"] for e in rx.log]
    assert statuses[:3] == [503, 503, 200], statuses
    assert metric(p, "idemproxy_trace_export_failures_total") == 2
    quiet_period()
    assert len([s for s in ours(rx, trace_id)
                if s["kind"] == KIND_SERVER]) == 1
    assert metric(p, "idemproxy_trace_spans_dropped_total") == 0
    assert metric(p, "idemproxy_trace_spans_exported_total") == \
        len(ours(rx)), [describe(s) for s in ours(rx)]


def test_collector_429_then_recovers(otlp_receiver, make_proxy):
    """429 is retried too."""
    rx = otlp_receiver
    rx.fail_next(1, 429)
    p = make_proxy(env=otel_env(rx.url))
    tp, trace_id, _ = new_tp()
    assert send(p.port, "/orders", newkey(), tp).status == 200
    server_span(rx, trace_id, timeout=15)
    assert [e["status"] for e in rx.log][:2] == [429, 200], rx.log
    assert metric(p, "idemproxy_trace_export_failures_total") == 1


def test_headers_resource_and_service_name(otlp_receiver, make_proxy):
    """OTEL_EXPORTER_OTLP_HEADERS (percent-decoded) on every export;
    OTEL_RESOURCE_ATTRIBUTES in the resource; --otel-service-name over
    OTEL_SERVICE_NAME; OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf: a
    warning, and JSON is sent."""
    rx = otlp_receiver
    p = make_proxy("--otel-service-name", "from-flag", env=otel_env(
        rx.url, OTEL_EXPORTER_OTLP_HEADERS="authorization=Bearer%20x,"
        "x-tenant=t1",
        OTEL_RESOURCE_ATTRIBUTES="deployment.environment=test,"
        "service.namespace=shop",
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf"))
    tp, trace_id, _ = new_tp()
    assert send(p.port, "/orders", newkey(), tp).status == 200
    srv = server_span(rx, trace_id, service="from-flag")
    assert srv["headers"].get("authorization") == "Bearer x", srv["headers"]
    assert srv["headers"].get("x-tenant") == "t1", srv["headers"]
    assert srv["headers"]["content-type"].startswith("application/json")
    assert srv["resource"].get("deployment.environment") == "test", \
        srv["resource"]
    assert srv["resource"].get("service.namespace") == "shop", srv["resource"]
    assert srv["resource"].get("service.name") == "from-flag"
    assert srv["scope"] == "idemproxy", srv["scope"]
    assert rx.protobuf_requests == 0 and not rx.errors, rx.errors
    assert not ours(rx)     # nothing as the variable's service name
    assert "protobuf" in p.log().lower(), p.log()


def test_headers_flag_over_variable(otlp_receiver, make_proxy):
    rx = otlp_receiver
    p = make_proxy("--otel-headers", "x-from=flag",
                   "--otel-resource-attributes", "deployment.environment=f",
                   env=otel_env(rx.url, OTEL_EXPORTER_OTLP_HEADERS="x-from=env",
                                OTEL_RESOURCE_ATTRIBUTES=
                                "deployment.environment=env"))
    tp, trace_id, _ = new_tp()
    assert send(p.port, "/orders", newkey(), tp).status == 200
    srv = server_span(rx, trace_id)
    assert srv["headers"].get("x-from") == "flag", srv["headers"]
    assert srv["resource"].get("deployment.environment") == "f"


@pytest.mark.parametrize("how", ["env-base", "flag-base", "flag-traces",
                                 "traces-over-base"])
def test_endpoints(otlp_receiver, make_proxy, how):
    """OTEL_EXPORTER_OTLP_ENDPOINT / --otel-endpoint are base URLs
    (+ /v1/traces); the traces endpoint is taken as is and wins; a flag
    wins over its variable."""
    rx = otlp_receiver
    dead = f"http://127.0.0.1:{free_port()}"
    env, flags = otel_env(None), ()
    if how == "env-base":
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = rx.base_url
    elif how == "flag-base":
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = dead
        flags = ("--otel-endpoint", rx.base_url)
    elif how == "flag-traces":
        env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = dead + "/v1/traces"
        flags = ("--otel-traces-endpoint", rx.url)
    else:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = dead
        env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = rx.url
    p = make_proxy(*flags, env=env)
    tp, trace_id, _ = new_tp()
    assert send(p.port, "/orders", newkey(), tp).status == 200
    server_span(rx, trace_id)
    assert {e["path"] for e in rx.log} == {"/v1/traces"}, rx.log
    assert metric(p, "idemproxy_trace_export_failures_total") == 0


# ------------------------------------------------ start-up errors

def run_proxy(stub, *flags, env=None):
    """idemproxy started with flags; (exit code, stderr), or it is killed
    and AssertionError when it is still running after 10 s."""
    argv = [IDEMPROXY_BIN, "--upstream", stub.url,
            "--listen", f"127.0.0.1:{free_port()}",
            "--admin-listen", f"127.0.0.1:{free_port()}", *flags]
    try:
        r = subprocess.run(argv, env=clean_env(env), capture_output=True,
                           timeout=10)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{argv} still running: {e.stderr!r}")
    return r.returncode, r.stderr.decode("utf-8", "replace")


@pytest.mark.parametrize("flags, env, names", [
    ((), {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
     "OTEL_EXPORTER_OTLP_PROTOCOL"),
    ((), {"OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER"),
    (("--otel-traces-sampler", "sometimes"), {},
     ("otel-traces-sampler", "OTEL_TRACES_SAMPLER")),
    (("--otel-endpoint", "not-a-url"), {},
     ("otel-endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT")),
    ((), {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "ftp://127.0.0.1:1/x"},
     "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
], ids=["grpc", "bad-sampler-env", "bad-sampler-flag", "endpoint-not-url",
        "endpoint-ftp"])
def test_startup_errors(stub, flags, env, names):
    """Exit 2, naming the setting, before serving anything."""
    full = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
            **env}
    rc, err = run_proxy(stub, *flags, env=full)
    assert rc == 2, (rc, err)
    names = (names,) if isinstance(names, str) else names
    assert any(n in err for n in names), err


def test_future_version_traceparent_is_joined(otlp_receiver, make_proxy):
    """A higher version is read by its version-00 part (W3C §3.2.4): its
    trace is joined, its span is the parent; 00 goes upstream."""
    rx = otlp_receiver
    p = make_proxy(env=otel_env(rx.url))
    t, s = secrets.token_hex(16), secrets.token_hex(8)
    r = send(p.port, "/orders", newkey(), f"cc-{t}-{s}-01-what-comes-next")
    assert r.status == 200, r
    [sent] = upstream_tp(r)
    m = TRACEPARENT.match(sent)
    assert m and m.group(1) == t and m.group(3) == "01", sent
    assert server_span(rx, t)["parent_span_id"] == s


def test_route_and_client_request_id(otlp_receiver, make_proxy, tmp_path):
    """idempotency.route names the matched route; the client's
    X-Request-Id is idempotency.request_id (and the original id of its
    replay)."""
    rx = otlp_receiver
    ini = tmp_path / "traces.ini"
    ini.write_text("[route payments]\nmatch = POST /payments*\n"
                   "key = header:Idempotency-Key\n")
    p = make_proxy("--config", str(ini), env=otel_env(rx.url))
    key = newkey("route")
    tp, trace_id, _ = new_tp()
    r = send(p.port, "/payments/1", key, tp,
             headers=[("X-Request-Id", "client-req-1")])
    assert r.status == 200 and r.header("X-Request-Id") == "client-req-1", r
    a = server_span(rx, trace_id)["attributes"]
    assert a["idempotency.route"] == "payments", a
    assert a["idempotency.request_id"] == "client-req-1", a
    tp2, trace2, _ = new_tp()
    r = send(p.port, "/payments/1", key, tp2,
             headers=[("X-Request-Id", "client-req-2")])
    assert r.status == 200 and replayed(r), r
    a = server_span(rx, trace2)["attributes"]
    assert a["idempotency.route"] == "payments", a
    assert a["idempotency.request_id"] == "client-req-2", a
    assert a["idempotency.original_request_id"] == "client-req-1", a


def test_batching_and_exit_flush(otlp_receiver, make_proxy):
    """OTEL_BSP_SCHEDULE_DELAY 60 s and batches of 8: one request's spans
    wait (fewer than a batch); more requests fill a batch, sent at once, no
    POST above 8 spans; SIGTERM sends the rest before the exit."""
    rx = otlp_receiver
    p = make_proxy(env=otel_env(rx.url, OTEL_BSP_SCHEDULE_DELAY="60000",
                                OTEL_BSP_MAX_EXPORT_BATCH_SIZE="8"))
    traces = []

    def one():
        tp, trace_id, _ = new_tp()
        assert send(p.port, "/orders", newkey("batch"), tp).status == 200
        traces.append(trace_id)

    one()
    time.sleep(1.0)
    assert rx.requests == 0, rx.log     # 4 spans: no batch yet, no delay
    for _ in range(3):
        one()
    rx.wait_for(lambda s: True, count=8, timeout=5)
    assert all(0 < e["spans"] <= 8 for e in rx.log), rx.log
    t0 = time.monotonic()
    assert p.stop(timeout=15) == 0, p.log()
    assert time.monotonic() - t0 < 5.0
    got = {s["trace_id"] for s in ours(rx) if s["kind"] == KIND_SERVER}
    assert got == set(traces), (got, traces)
    assert all(0 < e["spans"] <= 8 for e in rx.log), rx.log
    assert len(ours(rx)) == len({s["span_id"] for s in ours(rx)})


def test_help_of_the_otel_flags():
    """--help documents every --otel-* flag with its variable and a real
    default (a missing one printed as "(null)" is a NULL given to %s)."""
    r = subprocess.run([IDEMPROXY_BIN, "--help"], capture_output=True,
                       timeout=10, env=clean_env())
    text = (r.stdout + r.stderr).decode("utf-8", "replace")
    flags = ("otel-endpoint", "otel-traces-endpoint", "otel-headers",
             "otel-service-name", "otel-resource-attributes",
             "otel-traces-sampler", "otel-traces-sampler-arg",
             "otel-sdk-disabled")
    for f in flags:
        assert f"--{f}" in text, (f, text)
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("--otel-"):
            block = "\n".join(lines[i:i + 3])
            assert "(null)" not in block, block
