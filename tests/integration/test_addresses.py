"""Names with several addresses (issue 24).

Debian's and Ubuntu's default /etc/hosts name `localhost` twice, and
getaddrinfo() returns ::1 before 127.0.0.1, while most backends (and the
stub, the TLS front and Redis here) listen on 127.0.0.1 only. These tests
run idemproxy in a private mount namespace whose /etc/hosts is Debian's
default (support.procs.with_hosts_file), whatever this machine's own file
says, and check that:

  - the upstream is reached as `localhost` over HTTP and HTTPS: the refused
    ::1 is skipped, once per worker, and the request executes exactly once;
  - an address that does not answer at all (a SYN dropped) is left for the
    next one after the per-address connect timeout;
  - an upstream refusing on every address is reported as a connect failure
    naming each address, not as a TLS error;
  - --listen and --admin-listen given a name accept on all its addresses;
  - the Redis host is tried on each of its addresses.
"""
import concurrent.futures
import os
import socket
import subprocess
import time

import pytest

from support.http import RawConn, assert_problem, upstream_echo
from support.procs import free_port, metric_value
from support.stores import REDIS_BIN, RedisServer
from support.tls import Pki, TlsConn, TlsFront

DEBIAN_HOSTS = """\
127.0.0.1\tlocalhost
::1\t\tlocalhost ip6-localhost ip6-loopback
ff02::1\t\tip6-allnodes
ff02::2\t\tip6-allrouters
"""
# a name whose first address drops SYNs (see silent_v6) and whose second
# is the stub
SILENT_NAME = "silent-first.idemproxy.test"


def resolve_in(hosts, name):
    """The addresses getaddrinfo gives `name` with `hosts` as /etc/hosts,
    in order (None when a mount namespace cannot be made here)."""
    r = subprocess.run(
        ["unshare", "-m", "sh", "-c",
         'mount --bind "$0" /etc/hosts && exec getent ahosts "$1"', str(hosts),
         name],
        capture_output=True, text=True, timeout=10)
    if r.returncode != 0:
        return None
    seen = []
    for line in r.stdout.splitlines():
        addr = line.split()[0]
        if addr not in seen:
            seen.append(addr)
    return seen


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    """Debian's default /etc/hosts (plus SILENT_NAME), checked to resolve
    localhost to ::1 first inside a mount namespace."""
    path = tmp_path_factory.mktemp("hosts") / "hosts"
    path.write_text(DEBIAN_HOSTS + f"::1\t{SILENT_NAME}\n"
                    f"127.0.0.1\t{SILENT_NAME}\n")
    order = resolve_in(path, "localhost")
    if order is None:
        pytest.skip("no private mount namespace here (unshare -m, as root)")
    assert order[:2] == ["::1", "127.0.0.1"], order
    assert resolve_in(path, SILENT_NAME)[:2] == ["::1", "127.0.0.1"]
    return path


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return Pki(tmp_path_factory.mktemp("pki"))


def m(p, name, **labels):
    return metric_value(p.metrics(), name, labels or None)


def keyed_post(port, key, body, host="127.0.0.1"):
    with RawConn(port, host=host) as c:
        return c.request("POST", "/orders", headers=[("Idempotency-Key", key)],
                         body=body)


def fallbacks(p, bad, good):
    return p.log().count(f"connect to {bad} failed: Connection refused; "
                         f"trying {good}")


def test_upstream_localhost_over_http(make_proxy, stub, hosts):
    p = make_proxy(upstream=f"http://localhost:{stub.port}", hosts=hosts)
    # eight at once: new upstream connections, all started after the first
    # connect learnt which address answers
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        rs = list(ex.map(lambda i: keyed_post(p.port, "order-1", b'{"n":1}'),
                         range(8)))
    assert {r.status for r in rs} == {200}, rs
    assert {r.body for r in rs} == {rs[0].body}
    assert stub.stats()["keys"].get("order-1") == 1, stub.stats()
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        rs = list(ex.map(lambda i: keyed_post(p.port, f"k{i}", b"x"),
                         range(8)))
    assert [r.status for r in rs] == [200] * 8, rs
    assert all(stub.stats()["keys"].get(f"k{i}") == 1 for i in range(8))
    # ::1 refused once, then remembered: later connections go straight
    # to 127.0.0.1
    n = fallbacks(p, f"[::1]:{stub.port}", f"127.0.0.1:{stub.port}")
    assert n == 1, p.log()
    assert m(p, "idemproxy_upstream_errors_total", cause="connect") == 0


def test_upstream_localhost_over_https(make_proxy, stub, pki, hosts):
    front = TlsFront(pki, stub.port)
    try:
        p = make_proxy("--upstream-ca", pki.ca, hosts=hosts,
                       upstream=f"https://localhost:{front.port}")
        r = keyed_post(p.port, "tls-1", b"{}")
        assert r.status == 200, r
        assert upstream_echo(r)["target"] == "/orders"
        r = keyed_post(p.port, "tls-1", b"{}")
        assert r.status == 200 and r.header("Idempotent-Replayed") == "true"
        assert stub.stats()["keys"].get("tls-1") == 1
        assert fallbacks(p, f"[::1]:{front.port}",
                         f"127.0.0.1:{front.port}") == 1, p.log()
        assert ": TLS:" not in p.log(), p.log()
    finally:
        front.stop()


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_refused_everywhere_is_a_connect_failure(make_proxy, stub, pki, hosts,
                                                 scheme):
    dead = free_port()
    ca = ["--upstream-ca", pki.ca] if scheme == "https" else []
    p = make_proxy(*ca, hosts=hosts, upstream=f"{scheme}://localhost:{dead}")
    r = keyed_post(p.port, "nobody-home", b"{}")
    assert_problem(r, 502, "upstream-unavailable")
    log = p.log()
    assert f"connect to [::1]:{dead} failed: Connection refused; " \
           f"trying 127.0.0.1:{dead}" in log, log
    assert f"upstream localhost:{dead}: connect to 127.0.0.1:{dead} " \
           f"failed: Connection refused" in log, log
    assert ": TLS:" not in log and "reason(5)" not in log, log
    assert m(p, "idemproxy_upstream_errors_total", cause="connect") == 1
    assert m(p, "idemproxy_upstream_errors_total", cause="tls") == 0


@pytest.fixture
def silent_v6(stub):
    """[::1]:stub.port accepts nothing: a listener with a full backlog, so
    the kernel drops further SYNs (as a firewall or a dead host would)."""
    lsock = socket.socket(socket.AF_INET6)
    lsock.bind(("::1", stub.port))
    lsock.listen(0)
    held = []
    for _ in range(4):
        c = socket.socket(socket.AF_INET6)
        c.setblocking(False)
        try:
            c.connect(("::1", stub.port))
        except BlockingIOError:
            pass
        held.append(c)
    probe = socket.socket(socket.AF_INET6)
    probe.settimeout(0.5)
    try:
        probe.connect(("::1", stub.port))
        pytest.skip("this kernel answers SYNs beyond the backlog")
    except socket.timeout:
        pass
    finally:
        probe.close()
    yield
    for c in held:
        c.close()
    lsock.close()


def test_silent_address_left_for_the_next(make_proxy, stub, hosts, silent_v6):
    p = make_proxy(upstream=f"http://{SILENT_NAME}:{stub.port}", hosts=hosts)
    r = keyed_post(p.port, "slow-1", b"{}")
    assert r.status == 200, r
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        rs = list(ex.map(lambda i: keyed_post(p.port, f"s{i}", b"{}"),
                         range(4)))
    assert [x.status for x in rs] == [200] * 4, rs
    log = p.log()
    assert log.count(f"connect to [::1]:{stub.port} failed: no answer within "
                     f"2000 ms; trying 127.0.0.1:{stub.port}") == 1, log
    assert stub.stats()["keys"].get("slow-1") == 1


def test_listen_and_admin_on_every_address(make_proxy, stub, hosts):
    p = make_proxy(hosts=hosts, listen_host="localhost")
    for host in ("127.0.0.1", "::1"):
        r = keyed_post(p.port, f"via-{host}", b"{}", host=host)
        assert r.status == 200, (host, r)
        with RawConn(p.admin_port, host=host) as c:
            assert c.request("GET", "/healthz").status == 200, host
    assert stub.stats()["keys"].get("via-::1") == 1


@pytest.mark.skipif(not os.access(REDIS_BIN, os.X_OK),
                    reason="redis-server not installed")
def test_redis_on_its_other_address(make_proxy, stub, pg_db, hosts):
    """Redis on ::1 only, named localhost: 127.0.0.1 (tried first, as
    hiredis would) refuses, ::1 answers, and the fast path fills."""
    r6 = RedisServer(bind="::1")
    try:
        p = make_proxy("--store", pg_db.url, "--redis",
                       f"redis://localhost:{r6.port}", hosts=hosts)
        for i in range(20):
            r = keyed_post(p.port, "redis-1", b"{}")
            assert r.status == 200, r
            if r6.cmd("DBSIZE") > 0:
                break
            time.sleep(0.1)
        assert r6.cmd("DBSIZE") > 0, p.log()
        assert stub.stats()["keys"].get("redis-1") == 1
        assert f"redis localhost:{r6.port}: 127.0.0.1: " in p.log()
        assert "; trying ::1" in p.log()
    finally:
        r6.shutdown()


# a name no resolver answers for in time: the resolver here is black-holed
HANGING_NAME = "pg-dns-hangs.idemproxy.test"


@pytest.fixture
def hanging_dns(tmp_path):
    """A resolv.conf whose only nameserver (127.0.0.77:53, bound here)
    reads every query and never answers: each lookup of a name that is not
    in /etc/hosts blocks for its timeouts (2 s x 3 attempts)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.bind(("127.0.0.77", 53))
    except OSError as e:
        sock.close()
        pytest.skip(f"cannot bind a DNS server here: {e}")
    path = tmp_path / "resolv.conf"
    path.write_text("nameserver 127.0.0.77\noptions timeout:2 attempts:3\n")
    yield path
    sock.close()


def test_store_names_resolved_off_the_loop(make_proxy, stub, pg_db, hosts,
                                           hanging_dns):
    """PostgreSQL named by host names: `localhost` (::1 refused, 127.0.0.1
    answers) first, then a name whose lookups hang. libpq would resolve
    both inside the connect, on the loop: every reconnect would stall the
    worker for the whole DNS timeout. They are resolved by a thread of
    their own, so requests keep being answered at once while the lookup
    hangs, before and after the store's connections are cut."""
    port = pg_db.url.rsplit(":", 1)[1].split("/")[0]
    url = (f"postgresql://postgres@localhost:{port},{HANGING_NAME}:{port}/"
           f"{pg_db.name}")
    p = make_proxy("--store", url, hosts=hosts, resolv=hanging_dns)
    worst = 0.0

    def round_trip(i):
        nonlocal worst
        t0 = time.monotonic()
        r = keyed_post(p.port, f"dns-{i}", b"{}")
        worst = max(worst, time.monotonic() - t0)
        return r

    assert round_trip(0).status == 200, p.log()
    pg_db.psql("select pg_terminate_backend(pid) from pg_stat_activity "
               f"where datname = '{pg_db.name}' and pid <> pg_backend_pid()")
    statuses = [round_trip(i).status for i in range(1, 16)
                if time.sleep(0.3) is None]
    # a lookup takes 6 s here: a loop blocked in it would have stalled a
    # request for that long (RawConn gives up after its own timeout)
    assert worst < 3.0, (worst, p.log())
    assert statuses[-1] == 200 and statuses.count(200) >= 10, statuses
    assert f"cannot resolve {HANGING_NAME}" in p.log() or \
        "no answer in time" in p.log(), p.log()
    assert stub.stats()["requests"] == statuses.count(200) + 1


def test_redis_frozen_first_address_is_left(make_proxy, stub, pg_db,
                                            tmp_path):
    """A Redis name whose first address accepts TCP and never answers (a
    frozen server) and whose second is Redis: the connection gives up on
    the first after 2 s (hiredis 0.14 has no connect timeout; the proxy
    keeps its own deadline over connect and preparation) and the fast path
    comes up on the second."""
    name = "redis-frozen-first.idemproxy.test"
    path = tmp_path / "hosts"
    path.write_text(DEBIAN_HOSTS + f"127.0.0.1\t{name}\n127.0.0.2\t{name}\n")
    if resolve_in(path, name) != ["127.0.0.1", "127.0.0.2"]:
        pytest.skip(f"{name} does not resolve in that order here")
    r2 = RedisServer(bind="127.0.0.2")
    frozen = socket.socket()
    try:
        frozen.bind(("127.0.0.1", r2.port))
        frozen.listen(64)       # the kernel completes handshakes; no reply
        p = make_proxy("--store", pg_db.url, "--response-cache", "0",
                       "--redis", f"redis://{name}:{r2.port}", hosts=path)
        deadline = time.monotonic() + 10
        i = 0
        while r2.cmd("DBSIZE") == 0 and time.monotonic() < deadline:
            r = keyed_post(p.port, f"frozen-{i}", b"{}")
            assert r.status == 200, r
            i += 1
            time.sleep(0.2)
        assert r2.cmd("DBSIZE") > 0, p.log()
        assert "127.0.0.1: no answer in 2000 ms; trying 127.0.0.2" in \
            p.log(), p.log()
    finally:
        frozen.close()
        r2.shutdown()
