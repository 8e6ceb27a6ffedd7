"""The trace tests' own support, without idemproxy: the OTLP receiver
(support/otlp.py) and the traced node upstream (tests/support/otel/
upstream.js, run by support/otel_node.py).

  - a request with a made-up traceparent straight to the upstream: the
    receiver gets the upstream's SERVER span, in that trace, the child of
    the traceparent's span, with its HTTP attributes; the answer echoes
    what the upstream received
  - the upstream's other answers: /fail, ?sleep_ms=, /count, a request
    without traceparent (a root span), a SIGTERM while an export is slow
  - the receiver's faults, with plain urllib POSTs: mode "503" then "ok",
    fail_next, mode "slow" (and a stop() that a slow answer does not hold
    up), protobuf (415), a body that is no export request (400), chunked
    and gzip bodies
"""
import gzip
import json
import secrets
import time
import urllib.error
import urllib.request

from support.http import RawConn, chunked
from support.otel_node import (DEFAULT_SERVICE, make_upstream,  # noqa: F401
                               otel_modules, otlp_receiver)
from support.otlp import (KIND_CLIENT, KIND_SERVER, STATUS_ERROR,
                          OtlpReceiver)


def post(url, body, ctype="application/json", headers=None, timeout=10):
    """(status, body) of a POST by urllib; an HTTP error status is
    returned, not raised."""
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": ctype,
                                          **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def export_body(service="svc", name="op", trace_id=None, span_id=None,
                parent=None):
    """An ExportTraceServiceRequest's JSON with one span, as an OTLP/JSON
    exporter writes it (hex ids, intValue as a string, kind an integer)."""
    return json.dumps({"resourceSpans": [{
        "resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": service}}]},
        "scopeSpans": [{"scope": {"name": "t"}, "spans": [{
            "traceId": trace_id or secrets.token_hex(16),
            "spanId": span_id or secrets.token_hex(8),
            "parentSpanId": parent or "",
            "name": name, "kind": KIND_CLIENT,
            "startTimeUnixNano": "1700000000000000000",
            "endTimeUnixNano": "1700000000500000000",
            "attributes": [
                {"key": "http.response.status_code",
                 "value": {"intValue": "201"}},
                {"key": "retry", "value": {"boolValue": False}},
                {"key": "ratio", "value": {"doubleValue": 0.5}},
                {"key": "tags", "value": {"arrayValue": {"values": [
                    {"stringValue": "a"}, {"intValue": 2}]}}}],
            "events": [{"name": "store.claimed",
                        "timeUnixNano": "1700000000100000000",
                        "attributes": [{"key": "n",
                                        "value": {"intValue": 1}}]}],
            "status": {"code": 2, "message": "boom"},
        }]}],
    }]}).encode()


def traceparent():
    """A made-up sampled traceparent: (header, trace id, span id)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


# ------------------------------------------------------------ the upstream

def test_upstream_span_is_child_of_traceparent(otlp_receiver, make_upstream):
    up = make_upstream(otlp_receiver.url)
    header, trace_id, parent_id = traceparent()
    with RawConn(up.port) as c:
        r = c.request("POST", "/orders?x=1", headers=[
            ("traceparent", header), ("Idempotency-Key", "k-1"),
            ("X-Request-Id", "req-1"), ("Content-Type", "application/json")],
            body=b'{"item": 1}')
    assert r.status == 201, r
    got = r.json()
    assert got["order"] == 1 and got["key"] == "k-1", got
    assert got["traceparent"] == header and got["x_request_id"] == "req-1"
    assert got["trace_id"] == trace_id, got

    [s] = otlp_receiver.wait_for(lambda s: s["name"] == "POST /orders")
    assert s["service"] == DEFAULT_SERVICE, s
    assert s["kind"] == KIND_SERVER, s
    assert s["trace_id"] == trace_id and s["parent_span_id"] == parent_id, s
    assert s["span_id"] == got["span_id"] != parent_id, s
    assert s["attributes"]["http.request.method"] == "POST", s
    assert s["attributes"]["url.path"] == "/orders", s
    assert s["attributes"]["url.query"] == "x=1", s
    assert s["attributes"]["http.response.status_code"] == 201, s
    assert s["status"]["code"] != STATUS_ERROR, s
    assert s["end_ns"] >= s["start_ns"] > 0, s
    # what the SDK's exporter sent: OTLP/HTTP JSON
    assert s["headers"]["content-type"].startswith("application/json"), s
    assert otlp_receiver.protobuf_requests == 0 and not otlp_receiver.errors
    assert up.count("k-1") == 1


def test_upstream_answers(otlp_receiver, make_upstream):
    """/fail, ?sleep_ms=, /count, /healthz, a root span, a service name."""
    up = make_upstream(otlp_receiver.url, service_name="other-upstream")
    with RawConn(up.port) as c:
        r = c.request("GET", "/healthz")
        assert r.status == 200 and r.body == b"ok\n", r
        r = c.request("PUT", "/orders/7", headers=[("Idempotency-Key", "k")],
                      body=b"x")
        assert r.status == 201 and r.json()["order"] == 1, r
        r = c.request("DELETE", "/orders/7",
                      headers=[("Idempotency-Key", "k")])
        assert r.json()["order"] == 2 and r.json()["traceparent"] is None, r
        r = c.request("POST", "/fail", headers=[("Idempotency-Key", "f")],
                      body=b"")
        assert r.status == 500 and r.json()["order"] == 1, r
        t0 = time.monotonic()
        r = c.request("GET", "/slow?sleep_ms=300")
        assert r.status == 200 and time.monotonic() - t0 >= 0.3, r
        assert r.json()["path"] == "/slow", r
    assert up.count("k") == 2 and up.count("f") == 1 and up.count("no") == 0

    [fail] = otlp_receiver.wait_for(lambda s: s["name"] == "POST /fail")
    assert fail["status"]["code"] == STATUS_ERROR, fail
    assert fail["attributes"]["http.response.status_code"] == 500, fail
    [put] = otlp_receiver.wait_for(lambda s: s["name"] == "PUT /orders/7")
    assert put["parent_span_id"] is None, put     # no traceparent: a root
    assert put["service"] == "other-upstream", put
    [slow] = otlp_receiver.wait_for(lambda s: s["name"] == "GET /slow")
    assert slow["end_ns"] - slow["start_ns"] >= 300_000_000, slow


def test_upstream_sigterm_flushes(make_upstream):
    """SIGTERM while the receiver holds an export: the upstream waits for
    it and exits 0."""
    with OtlpReceiver(slow_seconds=1.5) as rx:
        rx.mode = "slow"
        up = make_upstream(rx.url)
        with RawConn(up.port) as c:
            assert c.request("GET", "/a").status == 200
        rx.wait_for(lambda s: s["name"] == "GET /a")
        t0 = time.monotonic()
        assert up.stop() == 0, up.log()
        assert time.monotonic() - t0 < 8
        assert rx.log[0]["status"] == 200, rx.log


# ------------------------------------------------------------ the receiver

def test_receiver_parses_export():
    with OtlpReceiver() as rx:
        trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
        status, body = post(rx.url, export_body(
            "idemproxy", "POST /orders", trace_id, span_id, "ab" * 8),
            headers={"X-Test": "1"})
        assert (status, json.loads(body)) == (200, {})
        [s] = rx.spans(service="idemproxy")
        assert s["trace_id"] == trace_id and s["span_id"] == span_id, s
        assert s["parent_span_id"] == "ab" * 8 and s["kind"] == KIND_CLIENT
        assert s["attributes"] == {"http.response.status_code": 201,
                                   "retry": False, "ratio": 0.5,
                                   "tags": ["a", 2]}, s
        assert s["events"] == [{"name": "store.claimed",
                                "time_ns": 1700000000100000000,
                                "attributes": {"n": 1}}], s
        assert s["status"] == {"code": STATUS_ERROR, "message": "boom"}, s
        assert s["headers"]["x-test"] == "1", s
        assert rx.spans(service="nobody") == [] and rx.requests == 1

        # gzip, chunked framing, a charset parameter
        with RawConn(rx.port) as c:
            c.send(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n"
                   b"Content-Type: application/json; charset=utf-8\r\n"
                   b"Content-Encoding: gzip\r\n"
                   b"Transfer-Encoding: chunked\r\n\r\n")
            c.send(chunked(gzip.compress(export_body(name="zipped")), 100))
            assert c.read_response().status == 200
        rx.wait_for(lambda s: s["name"] == "zipped")


def test_receiver_rejects():
    """Protobuf and other types: 415, counted; not an export: 400."""
    with OtlpReceiver() as rx:
        assert post(rx.url, b"\x0a\x00", "application/x-protobuf")[0] == 415
        assert rx.protobuf_requests == 1
        assert post(rx.url, b"{}", "text/plain")[0] == 415
        assert post(rx.url, b"not json")[0] == 400
        assert post(rx.url, b'{"resourceSpans": 3}')[0] == 400
        assert post(rx.base_url + "/v1/metrics", b"{}")[0] == 404
        assert rx.requests == 4 and len(rx.errors) == 4, rx.errors
        assert rx.spans() == []


def test_receiver_503_then_ok():
    with OtlpReceiver() as rx:
        rx.mode = "503"
        assert post(rx.url, export_body(name="lost"))[0] == 503
        rx.mode = "ok"
        assert post(rx.url, export_body(name="kept"))[0] == 200
        assert [s["name"] for s in rx.spans()] == ["kept"]

        rx.fail_next(2, 429)
        statuses = [post(rx.url, export_body(name=f"n{i}"))[0]
                    for i in range(3)]
        assert statuses == [429, 429, 200]
        assert [s["name"] for s in rx.spans()] == ["kept", "n2"]
        assert [r["status"] for r in rx.log] == [503, 200, 429, 429, 200]


def test_receiver_slow_and_stop():
    rx = OtlpReceiver(slow_seconds=0.5).start()
    try:
        rx.mode = "slow"
        t0 = time.monotonic()
        assert post(rx.url, export_body(name="late"))[0] == 200
        assert time.monotonic() - t0 >= 0.5
        rx.slow_seconds = 60
        c = RawConn(rx.port)
        c.send(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n"
               b"Content-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (
                   len(body := export_body(name="held")), body))
        rx.wait_for(lambda s: s["name"] == "held")    # stored, unanswered
    finally:
        t0 = time.monotonic()
        rx.stop()
        assert time.monotonic() - t0 < 2.5
    c.close()
    try:
        urllib.request.urlopen(rx.url, timeout=1)
        raise AssertionError("the receiver still answers after stop()")
    except OSError:
        pass


def test_receiver_wait_for_reports():
    with OtlpReceiver() as rx:
        post(rx.url, export_body(service="svc", name="present"))
        try:
            rx.wait_for(lambda s: s["name"] == "absent", timeout=0.3)
        except AssertionError as e:
            assert "'present'" in str(e) and "200" in str(e), e
        else:
            raise AssertionError("wait_for found a span nobody sent")
