#!/usr/bin/python3
"""Hold N idle keep-alive HTTP/1.1 connections open to HOST:PORT.

Used by tests/bench/passthrough.sh to measure memory per idle connection.
Each connection sends one `GET /` and reads the whole response, so it is a
real keep-alive connection that has served a request (buffers, parser and
pool state touched), then stays open and silent.

    idle_conns.py HOST PORT N

Prints "ready N" once all N connections have their response, then waits
until stdin closes (or SIGTERM), and closes everything. Exits 1 if a
connection fails or the whole set is not ready within 60 s.
"""
import selectors
import signal
import socket
import sys
import time

REQ = b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n"


def complete(buf):
    """True once buf holds a whole response with a Content-Length body."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return False
    length = 0
    for line in buf[:end].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    return len(buf) >= end + 4 + length


def main():
    host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sel = selectors.DefaultSelector()
    socks = []
    pending = {}
    deadline = time.monotonic() + 60
    opened = 0
    # Open in batches so the listen backlog never overflows.
    while opened < n or pending:
        while opened < n and len(pending) < 500:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            s.connect_ex((host, port))
            socks.append(s)
            pending[s.fileno()] = [s, b"", False]
            sel.register(s, selectors.EVENT_WRITE)
            opened += 1
        if time.monotonic() > deadline:
            print(f"timeout: {n - len(pending)} of {n} ready", file=sys.stderr)
            return 1
        for key, ev in sel.select(timeout=1):
            st = pending[key.fd]
            s = st[0]
            if not st[2]:
                err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    print(f"connect: errno {err}", file=sys.stderr)
                    return 1
                s.send(REQ)
                st[2] = True
                sel.modify(s, selectors.EVENT_READ)
                continue
            data = s.recv(65536)
            if not data:
                print("connection closed by server", file=sys.stderr)
                return 1
            st[1] += data
            if complete(st[1]):
                sel.unregister(s)
                del pending[key.fd]
    print(f"ready {len(socks)}", flush=True)
    sys.stdin.read()
    for s in socks:
        s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
