"""Bodies are streamed both ways with back-pressure: large uploads and
downloads pass through while the proxy's RSS stays small."""
import hashlib
import os
import time

import pytest

from support.http import RawConn, build_request, upstream_echo
from support.procs import PATTERN, RssSampler

MIB = 1024 * 1024
RSS_LIMIT_MIB = 64

# AddressSanitizer keeps freed memory in a quarantine (256 MiB by default),
# which would show up as RSS growth that has nothing to do with buffering;
# shrink it for these tests (ignored by a build without sanitizers).
SMALL_QUARANTINE = {"ASAN_OPTIONS": "detect_leaks=1:quarantine_size_mb=1:"
                                    "thread_local_quarantine_size_kb=64"}


@pytest.fixture
def proxy(make_proxy):
    return make_proxy(env=SMALL_QUARANTINE)


def _block(size=MIB):
    return (os.urandom(256) * (size // 256 + 1))[:size]


def _upload(proxy, total, use_chunked):
    block = _block()
    sha = hashlib.sha256()
    headers = [("Transfer-Encoding", "chunked")] if use_chunked else \
        [("Content-Length", str(total))]
    with RssSampler(proxy.pid) as rss, RawConn(proxy.port, timeout=60) as c:
        c.send(build_request("POST", "/upload", headers))
        sent = 0
        while sent < total:
            piece = block[:min(len(block), total - sent)]
            sha.update(piece)
            if use_chunked:
                c.send(b"%x\r\n" % len(piece) + piece + b"\r\n")
            else:
                c.send(piece)
            sent += len(piece)
        if use_chunked:
            c.send(b"0\r\n\r\n")
        r = c.read_response()
    assert r.status == 200, r
    doc = upstream_echo(r)
    assert doc["body_len"] == total
    assert doc["body_sha256"] == sha.hexdigest()
    print(f"RSS growth {rss.growth_mib:.1f} MiB (base {rss.base_kib} KiB)")
    assert rss.growth_mib < RSS_LIMIT_MIB, \
        f"RSS grew {rss.growth_mib:.1f} MiB during a {total // MIB} MiB upload"


def test_large_upload_content_length(proxy):
    _upload(proxy, 200 * MIB, use_chunked=False)


def test_large_upload_chunked(proxy):
    _upload(proxy, 200 * MIB, use_chunked=True)


def _download(proxy, total, query, slow_start=False):
    ref = PATTERN * (4 * MIB // 26 + 2)
    state = {"off": 0, "bad": None}

    def sink(piece):
        off = state["off"]
        start = off % 26
        # compare against the pattern in pieces of at most 4 MiB
        i = 0
        while i < len(piece) and state["bad"] is None:
            n = min(len(piece) - i, 4 * MIB)
            s = (start + i) % 26
            if piece[i:i + n] != ref[s:s + n]:
                state["bad"] = off + i
            i += n
        state["off"] = off + len(piece)

    with RssSampler(proxy.pid) as rss, RawConn(proxy.port, timeout=60) as c:
        c.send(build_request("GET", f"/download?bytes={total}{query}"))
        if slow_start:
            # a client that does not read for a while: the proxy must stop
            # reading from the upstream instead of buffering
            time.sleep(2)
        r = c.read_response(sink=sink)
    assert r.status == 200
    assert r.body_len == total
    assert state["bad"] is None, f"body differs at offset {state['bad']}"
    print(f"RSS growth {rss.growth_mib:.1f} MiB (base {rss.base_kib} KiB)")
    assert rss.growth_mib < RSS_LIMIT_MIB, \
        f"RSS grew {rss.growth_mib:.1f} MiB during a {total // MIB} MiB download"
    return r


def test_large_download_content_length(proxy):
    r = _download(proxy, 1024 * MIB, "", slow_start=True)
    assert r.header("Content-Length") == str(1024 * MIB)


def test_large_download_chunked(proxy):
    _download(proxy, 256 * MIB, "&chunked=1", slow_start=True)


def test_large_download_close_delimited(proxy):
    _download(proxy, 128 * MIB, "&noclen=1")
