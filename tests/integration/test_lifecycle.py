"""Process lifecycle: SIGTERM drain, SIGHUP, admin endpoints and metrics."""
import signal
import threading
import time

import pytest

from support.http import (RawConn, build_request, http_get, request,
                          upstream_echo)
from support.procs import metric_value


def test_sigterm_drains_in_flight_request(make_proxy, stub):
    p = make_proxy()
    result = {}

    with RawConn(p.port, timeout=10) as c:
        c.send(build_request("POST", "/slow?delay_ms=1000", body=b"drain"))
        time.sleep(0.3)
        t0 = time.monotonic()
        p.signal(signal.SIGTERM)
        time.sleep(0.2)
        # listeners closed at once: new connections are refused
        with pytest.raises(ConnectionRefusedError):
            RawConn(p.port, timeout=2).close()
        r = c.read_response()
        result["elapsed"] = time.monotonic() - t0
        assert r.status == 200
        assert "close" in r.connection_tokens(), r
        doc = upstream_echo(r)
        assert doc["body"] == "drain"
        assert c.wait_closed(3)
    rc = p.proc.wait(10)
    assert rc == 0, p.log()
    assert stub.stats()["requests"] == 1


def test_sigterm_closes_idle_keepalive_at_once(make_proxy):
    p = make_proxy()
    with RawConn(p.port) as c:
        assert c.request("GET", "/").status == 200
        t0 = time.monotonic()
        p.signal(signal.SIGTERM)
        assert c.wait_closed(3), "idle connection not closed on SIGTERM"
        assert c.buf == b""
        p.proc.wait(5)
        assert time.monotonic() - t0 < 3
    assert p.proc.returncode == 0, p.log()


def test_sigterm_drain_is_bounded(make_proxy):
    p = make_proxy("--drain-timeout", "500ms")
    with RawConn(p.port, timeout=10) as c:
        c.send(build_request("GET", "/stuck?delay_ms=8000"))
        time.sleep(0.3)
        t0 = time.monotonic()
        p.signal(signal.SIGTERM)
        rc = p.proc.wait(6)
        assert time.monotonic() - t0 < 3.0
        assert rc == 0, p.log()
        assert c.wait_closed(3)


def test_sigterm_with_pipelined_requests_pending(make_proxy, stub):
    """In-flight work finishes; the connection then closes."""
    p = make_proxy()
    with RawConn(p.port, timeout=10) as c:
        c.send(build_request("GET", "/1?delay_ms=600"))
        time.sleep(0.2)
        p.signal(signal.SIGTERM)
        r = c.read_response()
        assert r.status == 200 and "close" in r.connection_tokens()
        assert c.wait_closed(3)
    assert p.proc.wait(10) == 0


def test_sighup_without_config_file_keeps_running(make_proxy):
    p = make_proxy()
    p.signal(signal.SIGHUP)
    time.sleep(0.3)
    assert p.proc.poll() is None
    assert http_get(p.admin_port, "/healthz")[0] == 200
    assert request(p.port, "GET", "/").status == 200


def test_sighup_reloads_config_and_keeps_old_on_error(make_proxy, stub, tmp_path):
    cfg = tmp_path / "idemproxy.ini"
    cfg.write_text("[idemproxy]\nupstream_timeout = 5s\n")
    p = make_proxy("--config", str(cfg))
    cfg.write_text("[idemproxy]\nupstream_timeout = banana\n")
    p.signal(signal.SIGHUP)
    time.sleep(0.5)
    assert p.proc.poll() is None, "a bad config file on SIGHUP killed the proxy"
    assert request(p.port, "GET", "/").status == 200
    assert "upstream_timeout" in p.log() or "upstream-timeout" in p.log()


def test_admin_endpoints(proxy):
    status, body = http_get(proxy.admin_port, "/healthz")
    assert status == 200
    status, body = http_get(proxy.admin_port, "/readyz")
    assert status == 200
    status, _ = http_get(proxy.admin_port, "/no-such-thing")
    assert status == 404


def test_metrics(proxy, stub):
    text = proxy.metrics()
    for name in ("idemproxy_connections", "idemproxy_requests_total",
                 "idemproxy_upstream_seconds_bucket",
                 "idemproxy_upstream_seconds_count"):
        assert name in text, name
    before = metric_value(text, "idemproxy_requests_total",
                          {"outcome": "passthrough"}) or 0.0
    hist_before = metric_value(text, "idemproxy_upstream_seconds_count") or 0.0
    with RawConn(proxy.port) as c:
        for i in range(5):
            assert c.request("POST", f"/m/{i}", body=b"m").status == 200
        text = proxy.metrics()
        conns = metric_value(text, "idemproxy_connections")
        assert conns is not None and conns >= 1, text
    after = metric_value(text, "idemproxy_requests_total",
                         {"outcome": "passthrough"})
    assert after == before + 5, text
    assert metric_value(text, "idemproxy_upstream_seconds_count") == \
        hist_before + 5
    # the +Inf bucket equals the count
    assert metric_value(text, "idemproxy_upstream_seconds_bucket",
                        {"le": "+Inf"}) == hist_before + 5
    # proxy-made responses never reach the upstream
    assert stub.stats()["requests"] == 5


def test_metrics_count_other_outcomes_not_as_passthrough(proxy, stub):
    before = metric_value(proxy.metrics(), "idemproxy_requests_total",
                          {"outcome": "passthrough"}) or 0.0
    with RawConn(proxy.port) as c:
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
        assert c.read_response().status == 400
    after = metric_value(proxy.metrics(), "idemproxy_requests_total",
                         {"outcome": "passthrough"}) or 0.0
    assert after == before


def test_concurrent_clients(make_proxy, stub):
    p = make_proxy(workers=2)
    errors = []

    def client(i):
        try:
            with RawConn(p.port) as c:
                for j in range(25):
                    r = c.request("POST", f"/cc/{i}/{j}?delay_ms=5",
                                  body=f"{i}-{j}".encode())
                    doc = upstream_echo(r)
                    if doc["body"] != f"{i}-{j}":
                        errors.append((i, j, doc["body"]))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append((i, repr(e)))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:5]
    assert stub.stats()["requests"] == 16 * 25
