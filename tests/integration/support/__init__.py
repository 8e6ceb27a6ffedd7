"""Helpers for idemproxy's integration tests; the fixtures that use them
are in ../conftest.py (pgbouncer's test/conftest.py + test/utils.py).

  http     the client side: RawConn speaks HTTP/1.1 over a plain socket and
           reads responses framed by Content-Length, chunked or close, with
           interim 1xx; build_request, chunked, request, http_get,
           send_together, upstream_echo, assert_problem
  procs    the binaries and their processes: IDEMPROXY_BIN, STUB_BIN, Stub,
           Proxy, proxy_kill, readyz, wait_readyz, metric_value; free_port,
           clean_env, sanitizer_report, read_text, pattern_bytes, rss_kib,
           RssSampler
  stores   PostgreSQL 15 and Redis in a temp dir: PgServer, PgDb,
           RedisServer, resp_command

Tests import them by package (`from support.http import RawConn`): pytest
puts tests/integration, the folder of conftest.py, on sys.path.
"""
