"""Fixtures for idemproxy's integration tests; the helpers they use, and
that tests import, are in the support package (support/__init__.py).

Processes:
  stub         a running tests/support/stub_upstream (STUB_UPSTREAM_BIN)
  proxy        idemproxy (IDEMPROXY_BIN) in front of `stub`, one worker
  make_proxy   factory: make_proxy(*extra_flags, upstream=..., env=...)
               -> Proxy
  spawn_proxy  like make_proxy, but a proxy the test SIGKILLed
               (support.procs.proxy_kill) is only checked for sanitizer
               reports at teardown

Every process is started on 127.0.0.1 with free ports, its stderr captured
to a file in tmp_path (printed at teardown: pytest shows it for failing
tests), stopped with SIGTERM by PID at teardown, and must then exit 0 with no
AddressSanitizer / LeakSanitizer / UBSan report.
"""
import itertools
import os
import shutil

import pytest

from support.procs import (IDEMPROXY_BIN, STUB_BIN, Proxy, Stub, read_text,
                           sanitizer_report)
from support.stores import PG_BINDIR, REDIS_BIN, PgDb, PgServer, RedisServer

STORE_SETUPS = ("memory", "postgres", "postgres+redis")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "stores(*setups): the store setups a test runs with "
        "(default: memory, postgres, postgres+redis)")
    for path, what in ((IDEMPROXY_BIN, "IDEMPROXY_BIN"),
                       (STUB_BIN, "STUB_UPSTREAM_BIN")):
        if not os.access(path, os.X_OK):
            raise pytest.UsageError(
                f"{what}: {path} is not an executable; build first "
                f"(meson compile -C build) or set {what}")


def pytest_generate_tests(metafunc):
    if "store_setup" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("stores")
        setups = marker.args if marker else STORE_SETUPS
        for s in setups:
            assert s in STORE_SETUPS, s
        metafunc.parametrize("store_setup", setups, indirect=True)


# ---------------------------------------------------------------- processes

@pytest.fixture
def stub(tmp_path):
    s = Stub(tmp_path)
    yield s
    print(f"--- stub stderr ---\n{read_text(s.log_path)}")
    s.check_stopped()


def proxy_factory(tmp_path, stub, may_kill):
    """make_proxy and spawn_proxy: yields make(*flags, upstream=stub.url,
    env=None, workers=1, ...) -> Proxy; at teardown every proxy started
    must stop on SIGTERM with exit 0 and no sanitizer report, or, with
    may_kill, one ended by proxy_kill(p) only shows no sanitizer report."""
    started = []

    def make(*flags, upstream=None, **kw):
        kw.setdefault("name", f"idemproxy{len(started)}")
        p = Proxy(tmp_path, stub.url if upstream is None else upstream,
                  *flags, **kw)
        p.killed = False
        started.append(p)
        return p

    yield make
    errors = []
    for p in started:
        try:
            if may_kill and p.killed:
                p.stop()
                text = p.log()
                if sanitizer_report(text):
                    errors.append(text)
            else:
                p.check_stopped()
        except AssertionError as e:
            errors.append(str(e))
        finally:
            print(f"--- {p.log_path.name} ---\n{p.log()}")
    assert not errors, "\n".join(errors)


@pytest.fixture
def make_proxy(tmp_path, stub):
    """make_proxy(*flags, upstream=stub.url, env=None, workers=1)."""
    yield from proxy_factory(tmp_path, stub, may_kill=False)


@pytest.fixture
def proxy(make_proxy):
    return make_proxy()


@pytest.fixture
def spawn_proxy(tmp_path, stub):
    """spawn_proxy(*flags, upstream=stub.url, ...) -> Proxy, like
    make_proxy; a proxy ended with proxy_kill(p) is allowed a non-zero exit
    status."""
    yield from proxy_factory(tmp_path, stub, may_kill=True)


# ---------------------------------------------------------------- stores
#
# PostgreSQL 15 and Redis started by the tests (issue 4 "Tests"):
#
#   pg_server    session: a private PostgreSQL 15 cluster in a temp dir,
#                127.0.0.1 on a free port, fsync off; .stop() / .start() /
#                .crash() restart it on the same port mid-test
#   pg_db        per test: a fresh database t_<n> on it (.url, .psql(sql))
#   redis_server session: redis-server on a free port, no persistence;
#                .stop() / .kill() / .start() / .pause() / .resume()
#   redis        per test: redis_server running and flushed
#   store_setup  "memory" | "postgres" | "postgres+redis"; a test that uses
#                it (directly or through store_args) runs once per setup.
#                @pytest.mark.stores("memory", "postgres") narrows the set.
#   store_args   the proxy flags of the test's store setup
#
# Missing binaries (PostgreSQL 15's initdb, redis-server) skip the tests
# that need them. Every server is stopped by PID at the end of the session.

@pytest.fixture(scope="session")
def pg_server():
    if not os.access(os.path.join(PG_BINDIR, "initdb"), os.X_OK):
        pytest.skip(f"PostgreSQL 15 not installed ({PG_BINDIR}/initdb)")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("runuser missing: cannot run PostgreSQL as root")
    server = PgServer()
    try:
        yield server
    finally:
        server.shutdown()


_db_numbers = itertools.count(1)
_dbs_to_drop = []


@pytest.fixture
def pg_db(pg_server):
    """A fresh, empty database (no table: the proxy or migrate creates it).
    It is dropped when the next test asks for one: by then every proxy
    that used it has stopped (a drop at this fixture's teardown could run
    before the proxies' teardown and cut their connections)."""
    pg_server.ensure_running()
    while _dbs_to_drop:
        old = _dbs_to_drop.pop()
        pg_server.psql(f"drop database if exists {old} with (force)",
                       check=False)
    name = f"t_{next(_db_numbers)}"
    pg_server.psql(f"create database {name}")
    _dbs_to_drop.append(name)
    log_start = os.path.getsize(pg_server.log_path) \
        if os.path.exists(pg_server.log_path) else 0
    yield PgDb(pg_server, name)
    with open(pg_server.log_path, "rb") as f:
        f.seek(log_start)
        print(f"--- postgresql log ---\n"
              f"{f.read()[-4000:].decode('utf-8', 'replace')}")


@pytest.fixture(scope="session")
def redis_server():
    if not os.access(REDIS_BIN, os.X_OK):
        pytest.skip(f"redis-server not installed ({REDIS_BIN})")
    server = RedisServer()
    try:
        yield server
    finally:
        server.shutdown()


@pytest.fixture
def redis(redis_server):
    """The session's Redis, running and empty."""
    redis_server.ensure_running()
    redis_server.cmd("FLUSHALL")
    yield redis_server
    try:
        redis_server.ensure_running()
    except Exception as e:
        print(f"redis restart: {e}")


@pytest.fixture
def store_setup(request):
    return request.param


@pytest.fixture
def store_args(store_setup, request):
    """Proxy flags for the test's store setup (a fresh database, a flushed
    Redis)."""
    if store_setup == "memory":
        return []
    db = request.getfixturevalue("pg_db")
    args = ["--store", db.url]
    if store_setup == "postgres+redis":
        args += ["--redis", request.getfixturevalue("redis").url]
    return args
