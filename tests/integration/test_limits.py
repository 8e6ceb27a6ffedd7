"""Limits on the client side: header size (431), read time (408), idle
keep-alive connections, --max-connections; and the admin listener's."""
import os
import resource
import select
import signal
import socket
import time

import pytest

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


def admin_answer(port, path, timeout=3.0):
    """(seconds, head) of GET path on a fresh connection that asks at once
    (a probe); a timeout fails the test."""
    t0 = time.monotonic()
    s = socket.create_connection(("127.0.0.1", port), timeout)
    try:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(4096)
            assert chunk, f"{path}: closed before an answer ({head!r})"
            head += chunk
    finally:
        s.close()
    return time.monotonic() - t0, head.split(b"\r\n\r\n")[0]


def listen_backlog(port):
    """(connections waiting in port's accept queue, handshakes half done
    towards it) from /proc/net/tcp and tcp6: both 0 once the listener has
    accepted every connection whose SYN reached it."""
    queued = half = 0
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(name) as f:
            next(f)
            for line in f:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) != port:
                    continue
                if fields[3] == "0A":                  # LISTEN
                    queued += int(fields[4].split(":")[1], 16)
                elif fields[3] == "03":                # SYN_RECV
                    half += 1
    return queued, half


def settle(port, socks, timeout=10.0):
    """Until every one of socks has finished its handshake (is writable or
    failed) and the listener on port has accepted them all: a connection
    still retrying its SYN would otherwise arrive, seconds later, in the
    middle of what a test does next."""
    poller = select.poll()
    for s in socks:
        poller.register(s, select.POLLOUT)
    deadline = time.monotonic() + timeout
    while True:
        done = len(poller.poll(0))
        queued, half = listen_backlog(port)
        if done == len(socks) and queued == 0 and half == 0:
            return
        assert time.monotonic() < deadline, \
            f"{done} of {len(socks)} connected, {queued} queued, {half} " \
            f"half open after {timeout} s"
        time.sleep(0.01)


def hold_idle(port, n, batch=50):
    """n connections to port that never send a byte, opened batch at a
    time (non-blocking connects, each batch settled before the next: the
    listener's accept queue of 128 never overflows, so none arrives
    late)."""
    held = []
    try:
        for first in range(0, n, batch):
            some = []
            for _ in range(min(batch, n - first)):
                s = socket.socket()
                held.append(s)
                some.append(s)
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", port))
            settle(port, some)
    except BaseException:
        for s in held:
            s.close()
        raise
    return held


def test_admin_probes_answered_whatever_one_client_holds(make_proxy):
    """One client address holding 200 idle admin connections - more than
    the listener's 128 - does not starve the probes (issue 44): it gets at
    most 32 places that may ask anything and the 16 of the reserve (the
    newest of its connections; the older ones are closed), so it costs
    about 48 descriptors. /healthz, /readyz and /metrics on a new
    connection are answered meanwhile (before: after up to 10 s, once idle
    connections timed out), each closed after its answer; /keys/... on such
    a connection is told 503, and answered again once the 200 are gone."""
    p = make_proxy()
    wait_readyz(p)
    base = open_fds(p.pid)
    held = hold_idle(p.admin_port, 200)
    try:
        time.sleep(1.0)
        grown = open_fds(p.pid) - base
        assert grown <= 32 + 16 + 4, \
            f"{grown} descriptors for 200 idle clients of one address"
        assert grown >= 32, f"only {grown}: the clients did not connect"
        waits = []
        for path in ("/healthz", "/readyz", "/metrics", "/healthz"):
            took, head = admin_answer(p.admin_port, path)
            assert head.startswith(b"HTTP/1.1 200"), (path, head)
            assert b"Connection: close" in head, (path, head)
            waits.append(f"{path} {took * 1000:.1f} ms")
        print(f"with 200 idle connections held: {', '.join(waits)}")
        _, head = admin_answer(p.admin_port, "/keys/k1")
        assert head.startswith(b"HTTP/1.1 503"), head
        assert b"Retry-After: 1" in head, head
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + 3
    while True:
        _, head = admin_answer(p.admin_port, "/keys/k1")
        if head.startswith(b"HTTP/1.1 404"):
            break
        assert time.monotonic() < deadline, head
        time.sleep(0.1)
    assert "answered for probes only" in p.log()


def test_admin_probe_kept_through_a_burst_of_its_own_address(make_proxy):
    """A probe whose request has arrived keeps its place in the reserve
    while connections of its own address accepted on the same turn of the
    loop take the others: the ones that have sent nothing are closed first.
    The proxy is stopped while the probe and 40 silent connections queue
    up behind the 48 places one address may hold, so all 41 are accepted
    in one burst (before: the probe was closed unanswered by the 17th)."""
    p = make_proxy()
    wait_readyz(p)
    held = hold_idle(p.admin_port, 32 + 16)
    burst = []
    probe = None
    os.kill(p.pid, signal.SIGSTOP)
    try:
        probe = socket.create_connection(("127.0.0.1", p.admin_port), 3.0)
        probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        for _ in range(40):
            s = socket.socket()
            burst.append(s)
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", p.admin_port))
        deadline = time.monotonic() + 5
        while listen_backlog(p.admin_port) != (41, 0):
            assert time.monotonic() < deadline, listen_backlog(p.admin_port)
            time.sleep(0.01)
    finally:
        os.kill(p.pid, signal.SIGCONT)
    try:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = probe.recv(4096)
            assert chunk, f"the probe was closed unanswered ({head!r})"
            head += chunk
        assert head.startswith(b"HTTP/1.1 200"), head
    finally:
        for s in held + burst + [probe]:
            s.close()


def has_ipv6_loopback():
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_admin_cap_per_address_leaves_room_for_others(make_proxy):
    """The cap per address: while 127.0.0.1 holds 200 idle admin
    connections, another address (::1; the admin listener on [::], which
    takes both) still gets a place that may ask anything: /keys/... is
    answered (404: no such key), not 503, request after request on one
    connection."""
    if not has_ipv6_loopback():
        pytest.skip("no IPv6 loopback here")
    p = make_proxy(listen_host="[::]")
    wait_readyz(p)
    held = hold_idle(p.admin_port, 200)
    try:
        time.sleep(0.5)
        with RawConn(p.admin_port, host="::1", timeout=3) as c:
            for _ in range(3):
                r = c.request("GET", "/keys/k1")
                assert r.status == 404, r
    finally:
        for s in held:
            s.close()


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
