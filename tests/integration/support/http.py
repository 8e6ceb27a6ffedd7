"""The client side of the tests: raw HTTP/1.1 over plain sockets.

RawConn reads responses framed by Content-Length, chunked or close, with
interim 1xx, into a Response; build_request and chunked make request bytes.
"""
import http.client
import json
import socket
import threading
import time


class Response:
    def __init__(self):
        self.version = None
        self.status = None
        self.reason = None
        self.headers = []       # [(name, value)] in order, names as sent
        self.body = b""
        self.body_len = 0       # also set when a sink consumed the body
        self.interim = []       # [(status, headers)] of 1xx responses
        self.framing = None     # "length" | "chunked" | "close" | "none"
        self.complete = False   # body ended as framed (not cut short)

    def header(self, name, default=None):
        name = name.lower()
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return default

    def header_all(self, name):
        name = name.lower()
        return [v for k, v in self.headers if k.lower() == name]

    def has(self, name):
        return self.header(name) is not None

    def json(self):
        return json.loads(self.body)

    def connection_tokens(self):
        toks = []
        for v in self.header_all("Connection"):
            toks += [t.strip().lower() for t in v.split(",") if t.strip()]
        return toks

    def __repr__(self):
        return (f"<Response {self.status} {self.headers!r} "
                f"body={self.body[:300]!r}>")


class RawConn:
    """One client connection with a read buffer."""

    def __init__(self, port, timeout=10.0, host="127.0.0.1"):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.eof = False

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def settimeout(self, t):
        self.sock.settimeout(t)

    def send(self, data):
        if isinstance(data, str):
            data = data.encode("latin-1")
        self.sock.sendall(data)

    def _fill(self):
        """Read more into buf; False at EOF (or reset)."""
        if self.eof:
            return False
        try:
            data = self.sock.recv(1 << 20)
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def _read_line(self):
        while b"\r\n" not in self.buf:
            if not self._fill():
                raise EOFError("connection closed in a line: %r" % self.buf)
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _read_exact(self, n, sink=None):
        got = 0
        out = []
        while got < n:
            if not self.buf and not self._fill():
                raise EOFError(f"connection closed after {got} of {n} bytes")
            take = self.buf[:n - got]
            self.buf = self.buf[len(take):]
            got += len(take)
            if sink:
                sink(take)
            else:
                out.append(take)
        return b"".join(out)

    def read_head(self):
        """Status line and headers of the next message: (ver, status, reason, headers)."""
        while b"\r\n\r\n" not in self.buf:
            if not self._fill():
                if self.buf:
                    raise EOFError("connection closed in a head: %r" % self.buf)
                raise EOFError("connection closed before a response")
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        ver, status = parts[0], int(parts[1])
        reason = parts[2] if len(parts) > 2 else ""
        headers = []
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers.append((name, value.strip(" \t")))
        return ver, status, reason, headers

    def read_response(self, method="GET", sink=None, allow_truncated=False):
        """Read one final response (collecting 1xx into .interim).

        sink: called with each body piece instead of keeping the body.
        allow_truncated: a body cut short by EOF returns complete=False
        instead of raising.
        """
        r = Response()
        while True:
            r.version, r.status, r.reason, r.headers = self.read_head()
            if 100 <= r.status < 200 and r.status != 101:
                r.interim.append((r.status, r.headers))
                continue
            break
        pieces = []

        def keep(b):
            r.body_len += len(b)
            if sink:
                sink(b)
            else:
                pieces.append(b)

        te = ",".join(r.header_all("Transfer-Encoding")).lower()
        try:
            if method == "HEAD" or r.status in (204, 304):
                r.framing = "none"
            elif "chunked" in te:
                r.framing = "chunked"
                while True:
                    line = self._read_line()
                    size = int(line.split(b";")[0].strip(), 16)
                    if size == 0:
                        while self._read_line() != b"":
                            pass        # trailers
                        break
                    self._read_exact(size, keep)
                    if self._read_line() != b"":
                        raise AssertionError("bad chunk terminator")
            elif r.header("Content-Length") is not None:
                r.framing = "length"
                self._read_exact(int(r.header("Content-Length")), keep)
            else:
                r.framing = "close"
                while True:
                    if self.buf:
                        b, self.buf = self.buf, b""
                        keep(b)
                    if not self._fill():
                        break
            r.complete = True
        except EOFError:
            if not allow_truncated:
                raise
        r.body = b"".join(pieces)
        return r

    def request(self, method, target, headers=None, body=None,
                version="HTTP/1.1", host="example.test"):
        self.send(build_request(method, target, headers, body, version, host))
        return self.read_response(method)

    def wait_closed(self, timeout=5.0):
        """True when the peer closes (EOF or reset) within timeout, with no
        further data arriving; False on timeout."""
        deadline = time.monotonic() + timeout
        old = self.sock.gettimeout()
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.sock.settimeout(left)
                try:
                    data = self.sock.recv(65536)
                except socket.timeout:
                    return False
                except ConnectionResetError:
                    return True
                if not data:
                    self.eof = True
                    return True
                self.buf += data
        finally:
            self.sock.settimeout(old)


def build_request(method, target, headers=None, body=None,
                  version="HTTP/1.1", host="example.test"):
    """Bytes of a request. headers: list of (name, value); a Host header is
    added when absent unless host is None; Content-Length when body is bytes
    and no framing header was given."""
    headers = list(headers or [])
    names = {k.lower() for k, _ in headers}
    if host is not None and "host" not in names:
        headers.insert(0, ("Host", host))
    if isinstance(body, str):
        body = body.encode()
    if body is not None and "content-length" not in names \
            and "transfer-encoding" not in names:
        headers.append(("Content-Length", str(len(body))))
    out = f"{method} {target} {version}\r\n"
    out += "".join(f"{k}: {v}\r\n" for k, v in headers)
    out += "\r\n"
    return out.encode("latin-1") + (body or b"")


def chunked(body, size=4096):
    """body framed as chunks of `size`."""
    out = []
    for i in range(0, len(body), size):
        piece = body[i:i + size]
        out.append(b"%x\r\n" % len(piece) + piece + b"\r\n")
    out.append(b"0\r\n\r\n")
    return b"".join(out)


def request(port, method, target, headers=None, body=None, timeout=10.0,
            **kw):
    """One request on a fresh connection."""
    with RawConn(port, timeout=timeout) as c:
        return c.request(method, target, headers, body, **kw)


def upstream_echo(resp):
    """The stub's echo of what reached the upstream, with helpers."""
    assert resp.status is not None
    doc = resp.json()
    doc["hdict"] = {}
    for k, v in doc["headers"]:
        doc["hdict"].setdefault(k.lower(), []).append(v)
    return doc


def assert_problem(resp, status, slug):
    assert resp.status == status, resp
    ctype = (resp.header("Content-Type") or "").split(";")[0].strip()
    assert ctype == "application/problem+json", resp
    doc = resp.json()
    assert doc.get("type") == f"urn:idemproxy:problem:{slug}", doc
    assert doc.get("status") == status, doc
    assert isinstance(doc.get("title"), str) and doc["title"], doc
    assert "detail" in doc, doc
    return doc


def http_get(port, path, timeout=5.0):
    """(status, body) via http.client; raises on connection errors."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def send_together(conns, raw, timeout=30.0):
    """Each of the connected RawConns sends `raw` at the same moment (a
    barrier); returns their responses in order and closes them."""
    import concurrent.futures as cf
    barrier = threading.Barrier(len(conns))

    def one(c):
        barrier.wait(timeout)
        c.send(raw)
        return c.read_response()

    try:
        with cf.ThreadPoolExecutor(len(conns)) as ex:
            return list(ex.map(one, conns))
    finally:
        for c in conns:
            c.close()
