"""The PROXY protocol on the client listener (issue 46 item 2).

Debian's haproxy in front (send-proxy, send-proxy-v2) hands over the
client's address; the client connects from 127.0.0.5 (any 127/8 address is
this host's) so that its address differs from the balancer's 127.0.0.1,
and the upstream's X-Forwarded-For and the access log must name it.
Hand-made headers check the rest: every header kind, TLS after the header,
byte-by-byte arrival, and the refusals - malformed, truncated, never sent
(the deadline), sent by a source --proxy-protocol does not list, or not
sent by one it does - each closing the connection with a log line.
"""
import http.server
import json
import socket
import ssl
import struct
import subprocess
import threading
import time

import pytest

from support.procs import free_port, metric_value, sigterm_and_wait
from support.tls import Pki

BOUND = 15.0
CLIENT = "127.0.0.5"		# the client's own address
SIG = b"\r\n\r\n\x00\r\nQUIT\n"


class EchoUpstream:
    """A threaded HTTP/1.1 upstream that records each request's headers and
    answers 200 "ok"."""

    def __init__(self):
        heads = self.heads = []

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_any(self):
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                heads.append(self.headers)
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")
            do_GET = do_POST = do_any

            def log_message(self, *a):
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def stop(self):
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture
def up():
    u = EchoUpstream()
    yield u
    u.stop()


class Haproxy:
    """haproxy in TCP mode on a free port of 127.0.0.1, forwarding to
    idemproxy with `send` (send-proxy or send-proxy-v2)."""

    def __init__(self, tmp_path, target_port, send):
        self.port = free_port()
        cfg = tmp_path / f"haproxy-{send}.cfg"
        cfg.write_text(f"""global
  maxconn 64
defaults
  mode tcp
  timeout connect 5s
  timeout client 30s
  timeout server 30s
frontend f
  bind 127.0.0.1:{self.port}
  default_backend b
backend b
  server s1 127.0.0.1:{target_port} {send}
""")
        self.log_path = tmp_path / f"haproxy-{send}.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(["haproxy", "-db", "-f", str(cfg)],
                                     stdout=self._log, stderr=self._log)
        deadline = time.monotonic() + BOUND
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                break
            except OSError:
                assert self.proc.poll() is None, self.log_path.read_text()
                assert time.monotonic() < deadline, "haproxy did not start"
                time.sleep(0.05)

    def stop(self):
        sigterm_and_wait(self.proc, BOUND, (self._log,), lambda: "haproxy hung")


@pytest.fixture
def haproxy_factory(tmp_path):
    made = []

    def make(target_port, send):
        h = Haproxy(tmp_path, target_port, send)
        made.append(h)
        return h
    yield make
    for h in made:
        h.stop()


def connect_from(addr, port):
    s = socket.socket()
    s.bind((addr, 0))
    s.settimeout(BOUND)
    s.connect(("127.0.0.1", port))
    return s


def request(s, method="GET", target="/t", headers=b"", body=b""):
    s.sendall(f"{method} {target} HTTP/1.1\r\nHost: x\r\n".encode() + headers +
              f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return read_response(s)


def read_response(s):
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = s.recv(65536)
        assert d, f"closed: {buf!r}"
        buf += d
    head, rest = buf.split(b"\r\n\r\n", 1)
    n = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            n = int(v)
    while len(rest) < n:
        rest += s.recv(65536)
    return int(head.split()[1]), head, rest[:n]


def closed_without_answer(s):
    """The proxy closed s without writing a byte."""
    try:
        return s.recv(65536) == b""
    except ConnectionResetError:
        return True


def v1(src="203.0.113.7", dst="127.0.0.1", sport=40000, dport=80, fam="TCP4"):
    return f"PROXY {fam} {src} {dst} {sport} {dport}\r\n".encode()


def v2(cmd=1, fam=0x11, addr=None, tlvs=b""):
    if addr is None:
        addr = socket.inet_aton("198.51.100.9") + socket.inet_aton("127.0.0.1") + \
            struct.pack("!HH", 5555, 80)
    body = addr + tlvs
    return SIG + bytes([0x20 | cmd, fam]) + struct.pack("!H", len(body)) + body


def last_forwarded_for(up):
    return up.heads[-1]["X-Forwarded-For"].split(",")[-1].strip()


def pp_errors(p):
    return metric_value(p.metrics(), "idemproxy_client_errors_total",
                        {"reason": "proxy_protocol"})


# ------------------------------------------------------------ haproxy

@pytest.mark.parametrize("send", ["send-proxy", "send-proxy-v2"])
def test_haproxy_in_front_names_the_client(make_proxy, haproxy_factory, up,
                                           tmp_path, send):
    log = tmp_path / "access.log"
    p = make_proxy("--proxy-protocol", "127.0.0.1/32", "--access-log", str(log),
                   "--access-log-format", "json",
                   upstream=f"http://127.0.0.1:{up.port}")
    h = haproxy_factory(p.port, send)
    s = connect_from(CLIENT, h.port)
    for i in range(3):		# keep-alive: one header, many requests
        st, _, body = request(s, headers=b"X-Forwarded-For: 192.0.2.1\r\n")
        assert (st, body) == (200, b"ok")
    st, _, _ = request(s, "POST", "/orders", b"Idempotency-Key: pp-1\r\n", b"{}")
    assert st == 200
    s.close()
    assert len(up.heads) == 4
    for hd in up.heads[:3]:
        # the client's own field, then the address haproxy accepted
        assert hd["X-Forwarded-For"] == f"192.0.2.1, {CLIENT}"
    assert up.heads[3]["X-Forwarded-For"] == CLIENT	# the keyed one
    deadline = time.monotonic() + BOUND
    while len(log.read_text().splitlines()) < 4 if log.exists() else True:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert {x["client"] for x in lines} == {CLIENT}
    assert pp_errors(p) == 0


def test_haproxy_e1_through_the_balancer(make_proxy, haproxy_factory):
    """The article's E1 through haproxy: 8 concurrent clicks, one order."""
    p = make_proxy("--proxy-protocol", "127.0.0.1")
    h = haproxy_factory(p.port, "send-proxy-v2")
    results = []

    def click():
        s = connect_from(CLIENT, h.port)
        results.append(request(s, "POST", "/orders?delay_ms=300",
                               b"Idempotency-Key: e1-pp\r\n", b'{"sku":1}')[0])
        s.close()
    ts = [threading.Thread(target=click) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(BOUND)
    assert sorted(results).count(409) + results.count(200) == 8
    assert results.count(200) >= 1
    m = p.metrics()
    assert metric_value(m, "idemproxy_requests_total", {"outcome": "forwarded"}) == 1


# ------------------------------------------------------------ hand-made

@pytest.mark.parametrize("header,client", [
    (v1(), "203.0.113.7"),
    (v1("2001:db8::7", "::1", fam="TCP6"), "2001:db8::7"),
    (b"PROXY UNKNOWN ffff::1 ::1 1 2\r\n", "127.0.0.1"),
    (v2(), "198.51.100.9"),
    (v2(fam=0x21, addr=socket.inet_pton(socket.AF_INET6, "2001:db8::9") +
        socket.inet_pton(socket.AF_INET6, "::1") + struct.pack("!HH", 1, 2)),
     "2001:db8::9"),
    (v2(cmd=0, fam=0x00, addr=b""), "127.0.0.1"),		# LOCAL: a health check
    (v2(tlvs=b"\x04\x00\x03abc" + b"\x01\x00\x02h2"), "198.51.100.9"),
], ids=["v1-tcp4", "v1-tcp6", "v1-unknown", "v2-tcp4", "v2-tcp6", "v2-local",
        "v2-tlvs"])
def test_headers_name_the_client(make_proxy, up, header, client):
    p = make_proxy("--proxy-protocol", "127.0.0.0/8",
                   upstream=f"http://127.0.0.1:{up.port}")
    s = connect_from("127.0.0.1", p.port)
    # the header and a first request in one segment: the request's bytes
    # are the stream's
    s.sendall(header + b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_response(s)[0] == 200
    assert request(s)[0] == 200
    s.close()
    assert [last_forwarded_for(up) for _ in range(1)] == [client]
    assert up.heads[0]["X-Forwarded-For"] == client


def test_header_byte_by_byte(make_proxy, up):
    p = make_proxy("--proxy-protocol", "127.0.0.1",
                   upstream=f"http://127.0.0.1:{up.port}")
    for header in (v1(), v2()):
        s = connect_from("127.0.0.1", p.port)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for b in header:
            s.send(bytes([b]))
            time.sleep(0.002)
        assert request(s)[0] == 200
        s.close()
    assert [h["X-Forwarded-For"] for h in up.heads] == ["203.0.113.7", "198.51.100.9"]


def test_tls_after_the_header(make_proxy, up, tmp_path_factory):
    pki = Pki(tmp_path_factory.mktemp("pppki"))
    p = make_proxy("--proxy-protocol", "127.0.0.1", "--tls-cert",
                   pki.cert("server"), "--tls-key", pki.key("server"),
                   upstream=f"http://127.0.0.1:{up.port}")
    for header in (v1(), v2()):
        raw = connect_from("127.0.0.1", p.port)
        raw.sendall(header)
        ctx = ssl.create_default_context(cafile=pki.ca)
        s = ctx.wrap_socket(raw, server_hostname="localhost")
        assert request(s)[0] == 200
        s.close()
    assert [h["X-Forwarded-For"] for h in up.heads] == ["203.0.113.7", "198.51.100.9"]
    assert all(h["X-Forwarded-Proto"] == "https" for h in up.heads)


@pytest.mark.parametrize("data,why", [
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "not a PROXY protocol header"),
    (b"PROXY TCP4 1.2.3 127.0.0.1 1 2\r\n", "bad source address"),
    (b"PROXY TCP4 1.2.3.4 127.0.0.1 99999 2\r\n", "bad source port"),
    (b"PROXY TCP6 1.2.3.4 127.0.0.1 1 2\r\n", "bad source address"),
    (b"PROXY TCP4 1.2.3.4 127.0.0.1 1 2\n", "line feed without"),
    (b"PROXY " + b"A" * 120, "not TCP4, TCP6 or UNKNOWN"),
    (b"PROXY UNKNOWN " + b"A" * 120, "107 bytes"),
    (SIG + b"\x21\x12\x00\x0c" + b"\x00" * 12, "UDP is not a stream"),
    (SIG + b"\x11\x11\x00\x0c" + b"\x00" * 12, "version is not 2"),
    (SIG + b"\x21\x11\x00\x04" + b"\x00" * 4, "shorter than its address block"),
    (SIG + b"\x21\x11\xff\xff", "longer than 4096"),
    (v2(tlvs=b"\x04\x00\x09abc"), "TLV runs past"),
    (v2(tlvs=b"\x03\x00\x04\x00\x00\x00\x00"), "CRC32c mismatch"),
], ids=["http", "v1-addr", "v1-port", "v1-family", "v1-lf", "v1-proto", "v1-long",
        "v2-udp", "v2-version", "v2-short", "v2-huge", "v2-tlv", "v2-crc"])
def test_bad_headers_close_with_a_log_line(make_proxy, up, data, why):
    p = make_proxy("--proxy-protocol", "127.0.0.1",
                   upstream=f"http://127.0.0.1:{up.port}")
    s = connect_from("127.0.0.1", p.port)
    s.sendall(data)
    assert closed_without_answer(s)
    s.close()
    wait_log(p, why)
    assert up.heads == []
    assert pp_errors(p) == 1


def wait_log(p, text):
    deadline = time.monotonic() + BOUND
    while text not in p.log():
        assert time.monotonic() < deadline, f"no log line with {text!r}:\n{p.log()}"
        time.sleep(0.05)


def test_truncated_header(make_proxy, up):
    p = make_proxy("--proxy-protocol", "127.0.0.1",
                   upstream=f"http://127.0.0.1:{up.port}")
    s = connect_from("127.0.0.1", p.port)
    s.sendall(v2()[:20])
    s.shutdown(socket.SHUT_WR)
    assert closed_without_answer(s)
    wait_log(p, "closed before the header was whole")
    assert up.heads == []


def test_header_deadline(make_proxy, up):
    """--client-timeout bounds the header: none, or one that stops."""
    p = make_proxy("--proxy-protocol", "127.0.0.1", "--client-timeout", "1s",
                   upstream=f"http://127.0.0.1:{up.port}")
    silent = connect_from("127.0.0.1", p.port)
    partial = connect_from("127.0.0.1", p.port)
    partial.sendall(b"PROXY TCP4 1.2.")
    t0 = time.monotonic()
    assert closed_without_answer(silent)
    assert closed_without_answer(partial)
    assert time.monotonic() - t0 < BOUND
    wait_log(p, "no header within --client-timeout")
    wait_log(p, "the header did not arrive in time")
    assert pp_errors(p) == 2


def test_header_from_a_source_not_listed(make_proxy, up):
    """A source --proxy-protocol does not list cannot name a client: its
    header is refused, and its plain requests work as ever."""
    p = make_proxy("--proxy-protocol", "10.0.0.0/8",
                   upstream=f"http://127.0.0.1:{up.port}")
    for data in (v1() + b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
                 v2() + b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"):
        s = connect_from("127.0.0.1", p.port)
        s.sendall(data)
        assert closed_without_answer(s)
        s.close()
    wait_log(p, "from a source --proxy-protocol does not list")
    assert up.heads == []
    s = connect_from(CLIENT, p.port)
    assert request(s)[0] == 200
    assert up.heads[0]["X-Forwarded-For"] == CLIENT
    assert pp_errors(p) == 2


def test_a_second_header_is_refused(make_proxy, up):
    p = make_proxy("--proxy-protocol", "127.0.0.1",
                   upstream=f"http://127.0.0.1:{up.port}")
    s = connect_from("127.0.0.1", p.port)
    s.sendall(v1())
    assert request(s)[0] == 200
    s.sendall(v1(src="192.0.2.99"))
    assert closed_without_answer(s)
    assert len(up.heads) == 1


def test_x_forwarded_for_off(make_proxy, up):
    p = make_proxy("--proxy-protocol", "127.0.0.1", "--x-forwarded-for", "off",
                   upstream=f"http://127.0.0.1:{up.port}")
    s = connect_from("127.0.0.1", p.port)
    s.sendall(v1())
    assert request(s, headers=b"X-Forwarded-For: 192.0.2.1\r\n")[0] == 200
    assert request(s)[0] == 200
    assert up.heads[0]["X-Forwarded-For"] == "192.0.2.1"	# as it came
    assert up.heads[1]["X-Forwarded-For"] is None


def test_off_by_default(make_proxy, up):
    """Without --proxy-protocol a header is just bytes: a request line
    llhttp refuses (400), never an address."""
    p = make_proxy(upstream=f"http://127.0.0.1:{up.port}")
    s = connect_from("127.0.0.1", p.port)
    s.sendall(v1() + b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    st, _, _ = read_response(s)
    assert st == 400
    assert up.heads == []


def test_bad_setting_is_refused(tmp_path):
    from support.procs import IDEMPROXY_BIN
    cfg = tmp_path / "c.ini"
    cfg.write_text("[idemproxy]\n")
    r = subprocess.run([IDEMPROXY_BIN, "--check-config", str(cfg), "--upstream",
                        "http://127.0.0.1:1", "--proxy-protocol", "10.0.0.1/8"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "--proxy-protocol" in r.stderr
