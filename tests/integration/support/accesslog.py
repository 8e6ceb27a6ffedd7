"""Reading idemproxy's access log (issue 45; the layout is the top comment of
common/accesslog.c).

  parse_json(line)   one JSON line -> dict; asserts every member is there,
                     in the documented order, and nothing else
  parse_text(line)   one text line (nginx combined + key=value) -> a dict
                     with the JSON member names and types, so a test checks
                     both forms the same way; the unescaped bytes of the
                     free-text fields are in d["_raw"]
  parse(line, fmt)   either
  read_lines(path)   the whole lines of a file (asserts it ends with '\\n')
  wait_lines(...)    poll a file until a predicate holds on its lines
  CountingConn       a RawConn that counts the bytes it received (a
                     response's exact size: bytes_out)
"""
import json
import re
import time

from .http import RawConn

JSON_MEMBERS = (
    "time", "client", "forwarded_for", "method", "path", "protocol",
    "status", "bytes_in", "bytes_out", "duration_s", "claim_s", "wait_s",
    "upstream_s", "store_s", "route", "outcome", "replayed", "key", "scope",
    "upstream", "request_id", "original_request_id", "trace_id", "span_id",
    "user_agent", "referer", "error")

DURATIONS = ("duration_s", "claim_s", "wait_s", "upstream_s", "store_s")

JSON_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
TEXT_TIME = re.compile(r"\d\d/[A-Z][a-z]{2}/\d{4}:\d\d:\d\d:\d\d\.\d{3} \+0000")
SECONDS = re.compile(r"\d+\.\d{6}")

# the key=value fields after the combined part, in their order:
# (text name, JSON name, quoted)
TEXT_FIELDS = (
    ("rid", "request_id", False), ("outcome", "outcome", False),
    ("replayed", "replayed", False), ("route", "route", False),
    ("key", "key", True), ("scope", "scope", False), ("in", "bytes_in", False),
    ("total", "duration_s", False), ("claim", "claim_s", False),
    ("wait", "wait_s", False), ("upstream", "upstream_s", False),
    ("store", "store_s", False), ("up", "upstream", False),
    ("trace", "trace_id", False), ("span", "span_id", False),
    ("orig_rid", "original_request_id", False),
    ("fwd", "forwarded_for", False), ("err", "error", True))

_Q = r'"((?:[^"\\]|\\.)*)"'
TEXT_LINE = re.compile(
    r"(\S+) - - \[([^\]]*)\] " + _Q + r" (\S+) (\S+) " + _Q + " " + _Q + " " +
    " ".join(f"{name}=(?:{_Q}|(\\S+))" if quoted else f"{name}=(\\S+)"
             for name, _, quoted in TEXT_FIELDS) + r"\Z", re.S)


def unescape(s):
    """The bytes a text field stands for (\\" \\\\ \\n \\r \\t \\xHH; the
    rest as UTF-8). Asserts there is no other backslash sequence."""
    out = bytearray()
    data = s.encode("utf-8", "surrogateescape")
    i = 0
    while i < len(data):
        ch = data[i]
        if ch != 0x5C:
            out.append(ch)
            i += 1
            continue
        nxt = data[i + 1:i + 2]
        if nxt in (b'"', b"\\"):
            out += nxt
            i += 2
        elif nxt in (b"n", b"r", b"t"):
            out += {b"n": b"\n", b"r": b"\r", b"t": b"\t"}[nxt]
            i += 2
        elif nxt == b"x" and re.fullmatch(rb"[0-9a-fA-F]{2}", data[i + 2:i + 4]):
            out.append(int(data[i + 2:i + 4], 16))
            i += 4
        else:
            raise AssertionError(f"bad escape at {i} in {s!r}")
    return bytes(out)


def parse_json(line):
    assert line.endswith("\n") and "\n" not in line[:-1], repr(line)
    doc = json.loads(line)
    assert isinstance(doc, dict), line
    assert tuple(doc) == JSON_MEMBERS, (tuple(doc), line)
    assert JSON_TIME.fullmatch(doc["time"]), doc["time"]
    for d in DURATIONS:
        assert doc[d] is None or isinstance(doc[d], (int, float)), (d, doc)
    assert isinstance(doc["replayed"], bool), doc
    assert doc["status"] is None or isinstance(doc["status"], int), doc
    assert isinstance(doc["bytes_in"], int), doc
    assert isinstance(doc["bytes_out"], int), doc
    assert len(line.encode("utf-8", "surrogateescape")) <= 4096, len(line)
    doc["_raw"] = {k: v.encode("utf-8", "surrogatepass") for k, v in doc.items()
                   if isinstance(v, str)}
    return doc


def _bare(v):
    return None if v == "-" else unescape(v).decode("utf-8", "replace")


def parse_text(line):
    assert line.endswith("\n") and "\n" not in line[:-1], repr(line)
    assert len(line.encode("utf-8", "surrogateescape")) <= 4096
    m = TEXT_LINE.match(line[:-1])
    assert m, f"not a text access-log line: {line!r}"
    g = list(m.groups())
    client, tm, request, status, bytes_out, referer, ua = g[:7]
    rest = g[7:]
    assert TEXT_TIME.fullmatch(tm), tm
    raw = {}
    doc = {"time": tm, "client": _bare(client)}
    req = unescape(request)
    parts = req.split(b" ")
    assert len(parts) >= 3, request
    method, path, proto = parts[0], b" ".join(parts[1:-1]), parts[-1]
    raw["method"], raw["path"], raw["protocol"] = method, path, proto
    for name, b in (("method", method), ("path", path), ("protocol", proto)):
        doc[name] = None if b == b"-" else b.decode("utf-8", "replace")
    doc["status"] = None if status == "-" else int(status)
    doc["bytes_out"] = int(bytes_out)
    for name, v in (("referer", referer), ("user_agent", ua)):
        raw[name] = unescape(v)
        doc[name] = None if v == "-" else raw[name].decode("utf-8", "replace")
    i = 0
    for tname, jname, quoted in TEXT_FIELDS:
        if quoted:
            q, bare = rest[i], rest[i + 1]
            i += 2
            if q is not None:
                raw[jname] = unescape(q)
                doc[jname] = raw[jname].decode("utf-8", "replace")
            else:
                assert bare == "-", (tname, bare, line)
                doc[jname] = None
            continue
        v = rest[i]
        i += 1
        if jname == "replayed":
            assert v in ("0", "1"), line
            doc[jname] = v == "1"
        elif jname == "bytes_in":
            doc[jname] = int(v)
        elif jname in DURATIONS:
            assert v == "-" or SECONDS.fullmatch(v), (tname, v)
            doc[jname] = None if v == "-" else float(v)
        else:
            doc[jname] = _bare(v)
            if v != "-":
                raw[jname] = unescape(v)
    doc["_raw"] = raw
    return doc


def parse(line, fmt):
    return parse_json(line) if fmt == "json" else parse_text(line)


def read_lines(path, allow_partial=False):
    """The file's lines, each with its '\\n' (none when it does not exist).
    A last line without '\\n' is an error unless allow_partial (then it is
    left out)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    text = data.decode("utf-8", "surrogateescape")
    # only '\n' ends a line (str.splitlines would split on \r, \x1c, ...)
    parts = text.split("\n")
    tail = parts.pop()
    assert not tail or allow_partial, \
        f"{path}: a partial last line {tail[-200:]!r}"
    return [p + "\n" for p in parts]


def wait_lines(path, cond, timeout=10.0, what="access-log lines"):
    """Poll path until cond(lines) is true; returns the lines."""
    deadline = time.monotonic() + timeout
    while True:
        lines = read_lines(path, allow_partial=True)
        if cond(lines):
            return lines
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; "
                                 f"{len(lines)} lines: {lines[-5:]!r}")
        time.sleep(0.02)


def wait_rids(path, rids, fmt, timeout=10.0):
    """Poll until every request id in rids has a line; returns
    {request_id: [parsed lines]} of the whole file."""
    rids = set(rids)

    def have(lines):
        seen = set()
        for ln in lines:
            m = re.search(r'"request_id":"([^"]*)"' if fmt == "json"
                          else r" rid=(\S+) ", ln)
            if m:
                seen.add(m.group(1))
        return rids <= seen

    lines = wait_lines(path, have, timeout, f"lines of {sorted(rids)}")
    out = {}
    for ln in lines:
        d = parse(ln, fmt)
        out.setdefault(d["request_id"], []).append(d)
    return out


class CountingConn(RawConn):
    """A RawConn that counts every byte it receives (.received)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.received = 0

    def _fill(self):
        before = len(self.buf)
        ok = super()._fill()
        self.received += len(self.buf) - before
        return ok

    def response_bytes(self):
        """Bytes received so far that belong to responses already read."""
        return self.received - len(self.buf)
