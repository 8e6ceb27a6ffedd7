#!/usr/bin/env python3
"""tests/bench/ka_client.py - a fixed number of requests on one keep-alive
connection, one at a time, for tests/bench/instructions.sh.

    ka_client.py PORT COUNT KIND [--tls]

KIND: GET (GET /), POST (a 1 KiB body, as tests/bench/post1k.lua sends) or
KEYED (the same POST with an Idempotency-Key of its own each time: every
request a new key). Every response must be 200, or the script exits 1:
a count of instructions is only worth reading for requests that took the
path it claims to measure. Talks to 127.0.0.1 only.
"""
import http.client
import os
import ssl
import sys


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    port, count, kind = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    if kind not in ("GET", "POST", "KEYED"):
        sys.exit("KIND must be GET, POST or KEYED")
    if "--tls" in sys.argv[4:]:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx,
                                           timeout=60)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = b"x" * 1024 if kind != "GET" else None
    prefix = os.urandom(8).hex()
    for i in range(count):
        headers = {}
        if body is not None:
            headers["Content-Type"] = "application/octet-stream"
        if kind == "KEYED":
            headers["Idempotency-Key"] = f"ka-{prefix}-{i}"
        conn.request("GET" if kind == "GET" else "POST", "/", body=body,
                     headers=headers)
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            sys.exit(f"request {i + 1}: status {resp.status}")
    conn.close()


if __name__ == "__main__":
    main()
