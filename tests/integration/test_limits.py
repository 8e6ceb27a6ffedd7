"""Limits on the client side: header size (431), read time (408), idle
keep-alive connections, --max-connections; and the admin listener's."""
import os
import resource
import signal
import socket
import time

from support.http import (RawConn, assert_problem, build_request, request,
                          upstream_echo)
from support.procs import RssSampler, wait_readyz


def test_head_larger_than_max_header_size(make_proxy, stub):
    p = make_proxy("--max-header-size", "4KiB")
    with RawConn(p.port) as c:
        c.send(build_request("GET", "/big", [("X-Big", "v" * 5000)]))
        r = c.read_response()
        assert_problem(r, 431, "headers-too-large")
        assert c.wait_closed(3)
    # under the limit passes
    r = request(p.port, "GET", "/small", [("X-Big", "v" * 3000)])
    assert r.status == 200
    assert upstream_echo(r)["hdict"]["x-big"] == ["v" * 3000]
    assert stub.stats()["requests"] == 1


def test_many_small_headers_count_towards_limit(make_proxy, stub):
    p = make_proxy("--max-header-size", "4KiB")
    headers = [(f"X-{i}", "v" * 40) for i in range(200)]
    with RawConn(p.port) as c:
        c.send(build_request("GET", "/many", headers))
        assert_problem(c.read_response(), 431, "headers-too-large")
    assert stub.stats()["requests"] == 0


def test_long_request_target_counts_towards_limit(make_proxy, stub):
    p = make_proxy("--max-header-size", "4KiB")
    with RawConn(p.port) as c:
        c.send(build_request("GET", "/" + "a" * 6000))
        assert_problem(c.read_response(), 431, "headers-too-large")
    assert stub.stats()["requests"] == 0


def test_default_max_header_size_is_32k(proxy, stub):
    r = request(proxy.port, "GET", "/ok", [("X-Big", "v" * 16000)])
    assert r.status == 200
    with RawConn(proxy.port) as c:
        c.send(build_request("GET", "/big", [("X-Big", "v" * 40000)]))
        assert_problem(c.read_response(), 431, "headers-too-large")
    assert stub.stats()["requests"] == 1


def test_head_arriving_slowly_gets_408(make_proxy, stub):
    p = make_proxy("--client-timeout", "500ms")
    with RawConn(p.port) as c:
        t0 = time.monotonic()
        c.send(b"GET /slow HTTP/1.1\r\nHost: a\r\nX-Partial: ")
        r = c.read_response()
        elapsed = time.monotonic() - t0
        assert_problem(r, 408, "request-timeout")
        assert 0.3 <= elapsed < 3.0, elapsed
        assert "close" in r.connection_tokens()
        assert c.wait_closed(3)
    assert stub.stats()["requests"] == 0


def test_head_dribbled_past_timeout_gets_408(make_proxy, stub):
    """The timeout bounds the whole head (slowloris), not each byte gap: a
    head that keeps dribbling past the timeout still gets 408."""
    p = make_proxy("--client-timeout", "800ms")
    with RawConn(p.port) as c:
        t0 = time.monotonic()
        c.send(b"GET /slow HTTP/1.1\r\nHost: a\r\n")
        try:
            for _ in range(40):
                c.send(b"X-A: b\r\n")
                time.sleep(0.1)
        except (BrokenPipeError, ConnectionResetError):
            pass
        r = c.read_response()
        assert_problem(r, 408, "request-timeout")
        assert time.monotonic() - t0 < 3.5
    assert stub.stats()["requests"] == 0


def test_body_read_gap_gets_408_and_close(make_proxy, stub):
    p = make_proxy("--client-timeout", "500ms")
    with RawConn(p.port) as c:
        c.send(build_request("POST", "/body", [("Content-Length", "10")])
               + b"12345")
        t0 = time.monotonic()
        r = c.read_response(allow_truncated=True)
        assert r.status == 408, r
        assert time.monotonic() - t0 < 3.0
        assert c.wait_closed(3)
    # the upstream never saw a complete request
    assert stub.stats()["requests"] == 0


def test_idle_keepalive_connection_closed(make_proxy):
    p = make_proxy("--idle-timeout", "500ms")
    with RawConn(p.port) as c:
        assert c.request("GET", "/").status == 200
        t0 = time.monotonic()
        assert c.wait_closed(5), "idle connection not closed"
        assert time.monotonic() - t0 >= 0.3
        assert c.buf == b"", f"unexpected bytes on idle close: {c.buf!r}"


def test_slow_but_steady_client_within_idle_timeout(make_proxy):
    p = make_proxy("--idle-timeout", "1s", "--client-timeout", "1s")
    with RawConn(p.port) as c:
        for i in range(4):
            assert c.request("GET", f"/s/{i}").status == 200
            time.sleep(0.4)


def test_max_connections_pauses_accept(make_proxy, stub):
    p = make_proxy("--max-connections", "2")
    a, b = RawConn(p.port), RawConn(p.port)
    try:
        assert a.request("GET", "/a").status == 200
        assert b.request("GET", "/b").status == 200
        with RawConn(p.port, timeout=5) as c:
            c.send(build_request("GET", "/c"))
            # not served while two connections are open
            assert not c.wait_closed(0.7)
            assert c.buf == b""
            a.close()
            r = c.read_response()
            assert upstream_echo(r)["target"] == "/c"
    finally:
        a.close()
        b.close()


def test_burst_of_connections_waits_in_the_backlog(make_proxy, stub):
    """Connections that arrive while the worker cannot accept wait in the
    kernel's backlog (1,024 deep, not the 128 libevent's listener would
    have set), and every one is served once the worker takes them, a few
    per loop turn."""
    p = make_proxy()
    n = 400
    conns = []
    p.signal(signal.SIGSTOP)
    try:
        # the kernel completes each handshake while the backlog has room;
        # past it the SYN is dropped and retried after 1 s: a timeout here
        for _ in range(n):
            conns.append(RawConn(p.port, timeout=0.5))
    finally:
        p.signal(signal.SIGCONT)
    try:
        for i, c in enumerate(conns):
            c.settimeout(10)
            r = c.request("GET", f"/burst/{i}")
            assert r.status == 200
            assert upstream_echo(r)["target"] == f"/burst/{i}"
    finally:
        for c in conns:
            c.close()
    assert stub.stats()["requests"] == n


def test_out_of_descriptors_backs_off_and_recovers(make_proxy, stub):
    """accept() failing with EMFILE is logged, retried every 100 ms rather
    than spun on, and the proxy serves again once descriptors are free."""
    p = make_proxy()
    assert request(p.port, "GET", "/warm").status == 200   # upstream pooled
    used = len(os.listdir(f"/proc/{p.pid}/fd"))
    soft, hard = resource.prlimit(p.pid, resource.RLIMIT_NOFILE)
    resource.prlimit(p.pid, resource.RLIMIT_NOFILE, (used + 4, hard))
    held = []
    try:
        for _ in range(12):
            held.append(socket.create_connection(("127.0.0.1", p.port), 5))
        t0 = time.monotonic()
        deadline = t0 + 10
        while "Too many open files" not in p.log() and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        assert "accept: Too many open files" in p.log()
        time.sleep(1.0)
        elapsed = time.monotonic() - t0
        # one warning per retry at most: no busy loop on the listener
        warnings = p.log().count("accept: Too many open files")
        assert warnings <= elapsed / 0.1 + 3, warnings
    finally:
        for s in held:
            s.close()
    # the connections still in the backlog are taken and found closed;
    # then a new one is served
    deadline = time.monotonic() + 10
    while True:
        try:
            r = request(p.port, "GET", "/after", timeout=2)
            break
        except OSError:
            assert time.monotonic() < deadline
            time.sleep(0.2)
    assert r.status == 200
    assert upstream_echo(r)["target"] == "/after"
    resource.prlimit(p.pid, resource.RLIMIT_NOFILE, (soft, hard))


def first_bytes_after(port, *parts):
    """Send parts on a fresh connection (as far as the peer takes them)
    and return the first bytes of its answer (b"" when it closed)."""
    s = socket.create_connection(("127.0.0.1", port), 10)
    try:
        try:
            for part in parts:
                s.sendall(part)
        except OSError:
            pass                # refused and closed
        s.settimeout(5)
        try:
            return s.recv(64)
        except OSError:
            return b""
    finally:
        s.close()


def test_admin_listener_bounds_heads_and_bodies(make_proxy):
    """The admin listener takes no body and short heads: an
    unauthenticated 64 MiB POST to /healthz is refused without being
    buffered (RSS grows by less than 8 MiB while 32 MiB of it are sent),
    and so is a 1 MiB head; /healthz still answers after both."""
    p = make_proxy()
    wait_readyz(p)
    with RssSampler(p.pid) as rss:
        first = first_bytes_after(
            p.admin_port, b"POST /healthz HTTP/1.1\r\nHost: x\r\n"
            b"Content-Length: 67108864\r\n\r\n", *[b"x" * 65536] * 512)
        assert not first.startswith(b"HTTP/1.1 200"), first
        first = first_bytes_after(
            p.admin_port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " +
            b"a" * (1 << 20) + b"\r\n\r\n")
        assert not first.startswith(b"HTTP/1.1 200"), first
    assert rss.growth_mib < 8, f"RSS grew {rss.growth_mib:.1f} MiB"
    assert first_bytes_after(
        p.admin_port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
        b"Connection: close\r\n\r\n").startswith(b"HTTP/1.1 200")


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_admin_listener_caps_connections(make_proxy):
    """At 128 open admin connections the proxy stops accepting more:
    200 idle clients cost it at most 128 descriptors, and a probe that
    waited in the backlog behind them is answered once they go. (200: the
    72 not accepted and the probe fit in the listen backlog of 128; with
    more, the kernel drops the probe's SYN and it cannot connect.)"""
    p = make_proxy()
    wait_readyz(p)
    base = open_fds(p.pid)
    held = []
    try:
        for _ in range(200):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", p.admin_port))
            held.append(s)
        time.sleep(1.0)
        grown = open_fds(p.pid) - base
        assert grown <= 128 + 4, f"{grown} descriptors for 200 idle clients"
        assert grown >= 100, f"only {grown}: the clients did not connect"
        probe = socket.create_connection(("127.0.0.1", p.admin_port), 5)
        probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
                      b"Connection: close\r\n\r\n")
    finally:
        for s in held:
            s.close()
    probe.settimeout(15)
    assert probe.recv(64).startswith(b"HTTP/1.1 200")
    probe.close()


def test_admin_listener_gives_a_request_ten_seconds(make_proxy):
    """A head trickled a byte a second (each read within the idle
    timeout) is cut once the request has had 10 s; a request sent whole
    on the same listener is answered meanwhile."""
    p = make_proxy()
    wait_readyz(p)
    s = socket.create_connection(("127.0.0.1", p.admin_port), 5)
    s.sendall(b"GET /healthz HTTP/1.1\r\n")
    start = time.monotonic()
    closed = None
    try:
        while time.monotonic() - start < 25:
            time.sleep(1)
            try:
                s.sendall(b"X-a: b\r\n")
                s.settimeout(0.01)
                if s.recv(64) == b"":
                    closed = time.monotonic() - start
                    break
            except socket.timeout:
                pass
            except OSError:
                closed = time.monotonic() - start
                break
    finally:
        s.close()
    assert closed is not None, "a trickled head held its connection 25 s"
    assert closed >= 8, f"cut after {closed:.1f} s, before its 10 s"
    assert first_bytes_after(
        p.admin_port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
        b"Connection: close\r\n\r\n").startswith(b"HTTP/1.1 200")
