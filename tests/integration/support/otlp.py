"""An OTLP/HTTP trace receiver for the tests: what idemproxy and the traced
upstream (tests/support/otel/upstream.js) export their spans to.

    with OtlpReceiver() as rx:
        ... OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=rx.url ...
        [span] = rx.wait_for(lambda s: s["name"] == "POST /orders")

A ThreadingHTTPServer on 127.0.0.1, on a free port, served by a thread.
POST /v1/traces with Content-Type application/json (optionally gzip
Content-Encoding, Content-Length or chunked framing) is parsed as an
ExportTraceServiceRequest and every span in it is stored flattened (span()
below) and answered 200 "{}". Protobuf (application/x-protobuf) is not
understood: such a request is counted in .protobuf_requests and answered
415, as is any other type; a body that is not the JSON of an export request
is answered 400; both land in .errors, so a test sees them.

Faults, settable while it runs:
  mode = "ok"     store and answer 200 (the default)
  mode = "503"    answer 503, store nothing
  mode = "slow"   store, then answer 200 after slow_seconds (which a
                  stop() cuts short)
  fail_next(n, status=503)   the next n JSON export requests are
                  answered `status` (nothing stored), whatever the mode;
                  then the mode applies again

Every export request, whatever it was answered, is in .log (path, content
type, status, number of spans, headers) and counted by .requests.

Handler threads are daemons and stop() does not wait for them: it closes
the listening socket and every open connection, so a slow answer (or an
exporter's idle keep-alive connection) does not hold it up.
"""
import base64
import binascii
import gzip
import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TRACES_PATH = "/v1/traces"
MODES = ("ok", "503", "slow")

# SpanKind and StatusCode of opentelemetry/proto/trace/v1/trace.proto, the
# integers OTLP/JSON encodes them as
KIND_INTERNAL, KIND_SERVER, KIND_CLIENT, KIND_PRODUCER, KIND_CONSUMER = \
    1, 2, 3, 4, 5
KIND_NAMES = {"SPAN_KIND_UNSPECIFIED": 0, "SPAN_KIND_INTERNAL": 1,
              "SPAN_KIND_SERVER": 2, "SPAN_KIND_CLIENT": 3,
              "SPAN_KIND_PRODUCER": 4, "SPAN_KIND_CONSUMER": 5}
STATUS_UNSET, STATUS_OK, STATUS_ERROR = 0, 1, 2
STATUS_NAMES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1,
                "STATUS_CODE_ERROR": 2}

HEX_ID = re.compile(r"[0-9a-fA-F]+\Z")


# ------------------------------------------------------------ OTLP/JSON

def any_value(v):
    """An AnyValue as a plain Python value: stringValue, intValue (a
    string or a number in JSON: an int), boolValue, doubleValue,
    arrayValue (a list), kvlistValue (a dict), bytesValue (bytes)."""
    if not isinstance(v, dict):
        return v
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        return int(v["intValue"])
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "arrayValue" in v:
        return [any_value(x) for x in v["arrayValue"].get("values", [])]
    if "kvlistValue" in v:
        return attributes(v["kvlistValue"].get("values", []))
    if "bytesValue" in v:
        return base64.b64decode(v["bytesValue"])
    return None


def attributes(kvs):
    """A list of KeyValue as a dict."""
    return {kv["key"]: any_value(kv.get("value", {})) for kv in kvs or []}


def otlp_id(value, nbytes):
    """A traceId / spanId as lowercase hex: OTLP/JSON sends hex; base64
    (protobuf's JSON mapping, which some exporters used) is converted.
    An absent or empty id is None."""
    if not value:
        return None
    if len(value) == 2 * nbytes and HEX_ID.match(value):
        return value.lower()
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return value
    return raw.hex() if len(raw) == nbytes else value


def enum(value, names):
    """An enum sent as its integer (OTLP/JSON) or its name."""
    if isinstance(value, str):
        return names.get(value, int(value) if value.isdigit() else value)
    return int(value or 0)


def span(raw, resource, scope, headers):
    """One span of an export request, flattened. `raw` keeps the span's
    JSON as sent, for a test of the encoding itself."""
    status = raw.get("status") or {}
    return {
        "service": resource.get("service.name"),
        "resource": resource,
        "scope": scope.get("name"),
        "trace_id": otlp_id(raw.get("traceId"), 16),
        "span_id": otlp_id(raw.get("spanId"), 8),
        "parent_span_id": otlp_id(raw.get("parentSpanId"), 8),
        "trace_state": raw.get("traceState", ""),
        "flags": raw.get("flags"),
        "name": raw.get("name"),
        "kind": enum(raw.get("kind"), KIND_NAMES),
        "start_ns": int(raw.get("startTimeUnixNano") or 0),
        "end_ns": int(raw.get("endTimeUnixNano") or 0),
        "attributes": attributes(raw.get("attributes")),
        "events": [{"name": e.get("name"),
                    "time_ns": int(e.get("timeUnixNano") or 0),
                    "attributes": attributes(e.get("attributes"))}
                   for e in raw.get("events") or []],
        "links": [{"trace_id": otlp_id(k.get("traceId"), 16),
                   "span_id": otlp_id(k.get("spanId"), 8),
                   "attributes": attributes(k.get("attributes"))}
                  for k in raw.get("links") or []],
        "status": {"code": enum(status.get("code"), STATUS_NAMES),
                   "message": status.get("message", "")},
        "headers": headers,
        "raw": raw,
    }


def parse_export(body, headers):
    """The flattened spans of an ExportTraceServiceRequest's JSON; raises
    ValueError when it is not one."""
    doc = json.loads(body)
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    out = []
    for rs in doc.get("resourceSpans") or []:
        resource = attributes((rs.get("resource") or {}).get("attributes"))
        for ss in rs.get("scopeSpans") or []:
            scope = ss.get("scope") or {}
            for raw in ss.get("spans") or []:
                out.append(span(raw, resource, scope, headers))
    return out


def describe(s):
    """One line for a stored span, for failure messages."""
    return (f"{s['service']}: {s['name']!r} kind={s['kind']} "
            f"trace={s['trace_id']} span={s['span_id']} "
            f"parent={s['parent_span_id']}")


# ------------------------------------------------------------ the server

class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"   # keep-alive, as exporters use it
    timeout = 60                    # an idle connection is closed

    def log_message(self, fmt, *args):
        pass

    def setup(self):
        super().setup()
        self.server.receiver._track(self.connection, True)

    def finish(self):
        try:
            super().finish()
        finally:
            self.server.receiver._track(self.connection, False)

    def read_body(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass        # trailers
                    break
                parts.append(self.rfile.read(size))
                self.rfile.readline()
            body = b"".join(parts)
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length")
                                       or 0))
        if self.headers.get("Content-Encoding", "").lower() == "gzip":
            body = gzip.decompress(body)
        return body

    def answer(self, status, body=b"{}", ctype="application/json"):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        try:
            body = self.read_body()
        except (ValueError, OSError) as e:
            self.close_connection = True
            self.answer(400, json.dumps({"message": str(e)}).encode())
            return
        if self.path.split("?")[0] != TRACES_PATH:
            self.answer(404, b'{"message": "not found"}')
            return
        status, body = self.server.receiver._export(
            self.path, dict((k.lower(), v) for k, v in self.headers.items()),
            body)
        self.answer(status, body)

    def do_GET(self):
        self.answer(404, b'{"message": "POST /v1/traces only"}')


class OtlpReceiver:
    """The receiver (module docstring). A context manager: started on
    entry, stopped on exit; or start() and stop()."""

    def __init__(self, slow_seconds=5.0):
        self.slow_seconds = slow_seconds
        self._mode = "ok"
        self._fail = []             # statuses to answer the next requests
        self._spans = []
        self.log = []               # one dict per export request
        self.errors = []            # what was answered 4xx, and why
        self.protobuf_requests = 0
        self._cond = threading.Condition()
        self._conns = set()
        self._stopping = threading.Event()
        self._server = None
        self._thread = None

    # -- life

    def start(self):
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.block_on_close = False     # stop() never joins them
        self._server.receiver = self
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.1},
                                        name="otlp-receiver", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        if self._server is None:
            return
        self._stopping.set()            # a slow answer stops waiting
        self._server.shutdown()
        self._server.server_close()
        with self._cond:
            conns = list(self._conns)
        for c in conns:                 # handler threads see EOF and end
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(5)
        self._server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def base_url(self):
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self):
        """The traces endpoint: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT."""
        return self.base_url + TRACES_PATH

    # -- faults

    @property
    def mode(self):
        return self._mode

    @mode.setter
    def mode(self, value):
        if value not in MODES:
            raise ValueError(f"mode {value!r}: one of {MODES}")
        self._mode = value

    def fail_next(self, n, status=503):
        """Answer the next n export requests `status`, then recover."""
        with self._cond:
            self._fail = [int(status)] * n

    # -- what arrived

    @property
    def requests(self):
        """Export requests (POST /v1/traces) received, however answered."""
        with self._cond:
            return len(self.log)

    def spans(self, service=None, name=None):
        """The stored spans in arrival order, of one service.name and span
        name if given."""
        with self._cond:
            return [s for s in self._spans
                    if (service is None or s["service"] == service)
                    and (name is None or s["name"] == name)]

    def clear(self):
        """Forget the stored spans, the log and the errors."""
        with self._cond:
            self._spans.clear()
            self.log.clear()
            self.errors.clear()
            self.protobuf_requests = 0

    def wait_for(self, pred, timeout=10.0, count=1):
        """The stored spans for which pred(span) is true, once there are at
        least `count` of them; AssertionError after `timeout` seconds, with
        every span and request the receiver has."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = [s for s in self._spans if pred(s)]
                if len(found) >= count:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            have = "\n".join(describe(s) for s in self._spans) or "(none)"
            reqs = "\n".join(
                f"{r['status']} {r['content_type']} spans={r['spans']}"
                for r in self.log) or "(none)"
            errors = "\n".join(self.errors) or "(none)"
        raise AssertionError(
            f"{len(found)} matching span(s) after {timeout}s, want {count}\n"
            f"spans:\n{have}\nrequests:\n{reqs}\nerrors:\n{errors}")

    # -- the handler's side

    def _track(self, conn, add):
        with self._cond:
            (self._conns.add if add else self._conns.discard)(conn)

    def _export(self, path, headers, body):
        """(status, body) for one POST /v1/traces; records it."""
        ctype = headers.get("content-type", "")
        entry = {"path": path, "content_type": ctype, "spans": 0,
                 "headers": headers, "status": None}
        with self._cond:
            self.log.append(entry)
            self._cond.notify_all()
        mime = ctype.split(";")[0].strip().lower()
        if mime == "application/x-protobuf":
            with self._cond:
                self.protobuf_requests += 1
            return self._reject(entry, 415, "protobuf is not understood "
                                "(OTLP/HTTP JSON only)")
        if mime != "application/json":
            return self._reject(entry, 415, f"content type {ctype!r}")
        with self._cond:
            fail = self._fail.pop(0) if self._fail else None
            mode = self._mode
        if fail is not None:
            entry["status"] = fail
            return fail, b'{"message": "fail_next"}'
        if mode == "503":
            entry["status"] = 503
            return 503, b'{"message": "mode 503"}'
        try:
            spans = parse_export(body, headers)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            return self._reject(entry, 400, f"bad export request: {e!r}: "
                                f"{body[:200]!r}")
        with self._cond:
            self._spans.extend(spans)
            entry["spans"] = len(spans)
            self._cond.notify_all()
        if mode == "slow":
            self._stopping.wait(self.slow_seconds)
        entry["status"] = 200
        return 200, b"{}"

    def _reject(self, entry, status, why):
        with self._cond:
            entry["status"] = status
            self.errors.append(f"{status}: {why}")
        return status, json.dumps({"message": why}).encode()
