"""Reading from TLS clients: what libevent's OpenSSL bufferevent could lose.

OpenSSL decrypts whole records; when the proxy's read watermark stops the
bufferevent mid-record, the rest waits inside OpenSSL, not in the socket.
A client that sent everything (pipelined requests) then waits forever
unless the proxy pulls those bytes itself (conn.c tls_pump_cb). These
tests fail without that: the responses after the first never come.
"""
import json
import socket
import ssl
import subprocess
import time

import pytest


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")

    def run(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True,
                       capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
        "-out", "ca.pem", "-days", "2", "-subj", "/CN=reading test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "srv.key",
        "-out", "srv.csr", "-subj", "/CN=localhost")
    (d / "ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    run("x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "srv.pem", "-days", "2", "-extfile", "ext")
    return d


@pytest.fixture
def tls_proxy(make_proxy, pki):
    return make_proxy("--tls-cert", str(pki / "srv.pem"),
                      "--tls-key", str(pki / "srv.key"))


def connect(port, pki):
    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    return ctx.wrap_socket(raw, server_hostname="localhost")


def read_responses(s, n, timeout=5.0):
    """Read until n complete responses (Content-Length framed) arrived."""
    data = b""
    got = []
    deadline = time.monotonic() + timeout
    s.settimeout(0.5)
    while len(got) < n and time.monotonic() < deadline:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            continue
        if not chunk:
            break
        data += chunk
        while b"\r\n\r\n" in data:
            head, rest = data.split(b"\r\n\r\n", 1)
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(rest) < length:
                break
            got.append((head, rest[:length]))
            data = rest[length:]
    return got


@pytest.mark.parametrize("size", [66000, 70000, 80000, 100000, 300000])
def test_pipelined_body_behind_a_slow_request(tls_proxy, pki, stub, size):
    body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    reqs = (b"GET /first?delay_ms=300 HTTP/1.1\r\nHost: h\r\n\r\n" +
            b"POST /second HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n"
            % len(body) + body +
            b"GET /third HTTP/1.1\r\nHost: h\r\n\r\n")
    with connect(tls_proxy.port, pki) as s:
        s.sendall(reqs)
        got = read_responses(s, 3)
    assert len(got) == 3, f"{len(got)} of 3 responses (stalled)"
    echoed = [json.loads(b) for _, b in got]
    assert [e["target"] for e in echoed] == ["/first?delay_ms=300",
                                             "/second", "/third"]
    assert echoed[1]["body_len"] == len(body)


def test_requests_in_records_of_their_own_read_at_once(tls_proxy, pki, stub):
    """Each request in a TLS record of its own. The first is slow, so the
    others wait in the socket and one read takes them all (the listener
    reads ahead): records read but not decrypted are pulled all the same."""
    reqs = [b"GET /r0?delay_ms=200 HTTP/1.1\r\nHost: h\r\n\r\n"] + \
        [b"GET /r%d HTTP/1.1\r\nHost: h\r\n\r\n" % i for i in range(1, 6)]
    with connect(tls_proxy.port, pki) as s:
        for r in reqs:
            s.sendall(r)            # one record each
        got = read_responses(s, len(reqs))
    assert len(got) == len(reqs), f"{len(got)} of {len(reqs)} responses (stalled)"
    assert [json.loads(b)["target"] for _, b in got] == \
        ["/r0?delay_ms=200"] + ["/r%d" % i for i in range(1, 6)]


class BioClient:
    """A TLS client on memory BIOs, so that the test decides what leaves in
    one send(); reads like a socket (settimeout, recv) for read_responses."""

    def __init__(self, port, pki):
        ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = ctx.wrap_bio(self.incoming, self.outgoing,
                                server_hostname="localhost")
        self.raw = socket.create_connection(("127.0.0.1", port), timeout=5)

    def handshake_then_send(self, request):
        """The client's last handshake flight and the request's record
        leave in one send(), so the proxy reads them in one read."""
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self.raw.sendall(self.outgoing.read())
                if not self._feed():
                    raise ConnectionError("closed during the handshake")
        self.tls.write(request)
        self.raw.sendall(self.outgoing.read())

    def _feed(self):
        data = self.raw.recv(65536)
        self.incoming.write(data)
        return data != b""

    def settimeout(self, t):
        self.raw.settimeout(t)

    def recv(self, n):
        while True:
            try:
                return self.tls.read(n)
            except ssl.SSLWantReadError:     # a partial record, or a ticket
                if not self._feed():
                    return b""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.raw.close()


def test_request_in_one_segment_with_the_last_flight(tls_proxy, pki, stub):
    """The request leaves with the client's Finished: OpenSSL reads it with
    the handshake's last flight, and the proxy pulls it once the handshake
    is done (no more bytes will make the socket readable)."""
    for i in range(5):
        with BioClient(tls_proxy.port, pki) as c:
            c.handshake_then_send(b"GET /h%d HTTP/1.1\r\nHost: h\r\n\r\n" % i)
            got = read_responses(c, 1)
        assert len(got) == 1, f"connection {i}: no response (stalled)"
        assert got[0][0].startswith(b"HTTP/1.1 200")
        assert json.loads(got[0][1])["target"] == "/h%d" % i


def test_forwarded_proto_is_https_whatever_the_client_says(tls_proxy, pki):
    with connect(tls_proxy.port, pki) as s:
        s.sendall(b"GET /p HTTP/1.1\r\nHost: h\r\n"
                  b"X-Forwarded-Proto: http\r\n\r\n")
        got = read_responses(s, 1)
    assert len(got) == 1
    seen = json.loads(got[0][1])["headers"]
    protos = [v for k, v in seen if k.lower() == "x-forwarded-proto"]
    assert protos == ["https"], seen
