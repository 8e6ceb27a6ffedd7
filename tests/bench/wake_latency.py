#!/usr/bin/env python3
"""How long after the winner's answer a duplicate waiting on another
instance is answered: how promptly a completion wakes waiters across
instances (issue 22; docs/benchmarks.md "New keys against the application").

    wake_latency.py PORT_A PORT_B [ROUNDS]

PORT_A and PORT_B: two idemproxy instances on one PostgreSQL database, in
front of tests/support/stub_upstream. Each round sends a new key to A with
a 300 ms upstream delay, the same request to B 100 ms later (it waits), and
records B's answer time minus A's. Prints the median, p90, min and max.
A waiter woken by its notification answers within milliseconds; one left
to its poll, within 500 ms.
"""
import socket
import statistics
import sys
import threading
import time
import uuid

BODY = b'{"sku":"x"}'


def post(port, key, out, i):
    s = socket.create_connection(("127.0.0.1", port), 10)
    s.sendall(b"POST /orders?delay_ms=300 HTTP/1.1\r\nHost: x\r\n"
              b"Idempotency-Key: %s\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
              % (key.encode(), len(BODY), BODY))
    data = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        data += d
    s.close()
    out[i] = (time.monotonic(), data.split(b"\r\n", 1)[0])


def main():
    pa, pb = int(sys.argv[1]), int(sys.argv[2])
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    lags = []
    for _ in range(n):
        key = "wake-" + str(uuid.uuid4())
        out = [None, None]
        a = threading.Thread(target=post, args=(pa, key, out, 0))
        a.start()
        time.sleep(0.1)
        b = threading.Thread(target=post, args=(pb, key, out, 1))
        b.start()
        a.join()
        b.join()
        if not (out[0][1].endswith(b" 200 OK") and out[1][1].endswith(b" 200 OK")):
            sys.exit(f"unexpected answers: {out[0][1]!r} {out[1][1]!r}")
        lags.append((out[1][0] - out[0][0]) * 1000)
    lags.sort()
    print(f"{n} rounds: the waiter answered after the winner by median "
          f"{statistics.median(lags):.1f} ms, p90 {lags[int(n * 0.9) - 1]:.1f} ms, "
          f"min {lags[0]:.1f} ms, max {lags[-1]:.1f} ms")


main()
