#!/usr/bin/python3
"""Big bodies of unprotected requests stream (issue 46 item 4): a 1 GiB
upload (Content-Length and chunked) and a 1 GiB download through idemproxy
and, in the same run, straight to the stub upstream and through nginx;
the proxy's RSS sampled every 50 ms. Not a test: it prints figures.

    tests/bench/bigbody.py [--size-mib 1024] [--build build-bench]

The upload is a PUT (not a protected method): its body is never buffered
for a fingerprint, it is moved to the upstream as it comes, under the
upstream connection's back-pressure. The client sends from a pre-built
4 MiB block, so its own cost stays out of the figures. Everything on
127.0.0.1; every process started here is stopped by PID.
"""
import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MIB = 1024 * 1024
BLOCK = (b"abcdefghijklmnopqrstuvwxyz" * (4 * MIB // 26 + 1))[:4 * MIB]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Sampler:
    """Peak VmRSS of some PIDs (summed), every 50 ms."""

    def __init__(self, pids):
        self.pids = pids
        self.base = sum(rss_kib(p) for p in pids)
        self.peak = self.base
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.wait(0.05):
            self.peak = max(self.peak, sum(rss_kib(p) for p in self.pids))

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.t.join()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_port(port, proc, secs=10):
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"bigbody.py: a server exited at start ({proc.args[0]})")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"bigbody.py: nothing listens on {port}")


def read_head(s):
    buf = b""
    while b"\r\n\r\n" not in buf:
        data = s.recv(65536)
        if not data:
            raise RuntimeError("closed before the response head")
        buf += data
    head, rest = buf.split(b"\r\n\r\n", 1)
    return head, rest


def upload(port, size, chunked):
    """Seconds to PUT size bytes and read the stub's answer."""
    s = socket.create_connection(("127.0.0.1", port))
    t0 = time.monotonic()
    frame = (b"Transfer-Encoding: chunked\r\n" if chunked else
             b"Content-Length: %d\r\n" % size)
    s.sendall(b"PUT /upload HTTP/1.1\r\nHost: bench\r\n" + frame + b"\r\n")
    left = size
    while left > 0:
        n = min(left, len(BLOCK))
        if chunked:
            s.sendall(b"%x\r\n" % n)
        s.sendall(BLOCK[:n])
        if chunked:
            s.sendall(b"\r\n")
        left -= n
    if chunked:
        s.sendall(b"0\r\n\r\n")
    head, rest = read_head(s)
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(head[:80])
    s.close()
    return time.monotonic() - t0


def download(port, size):
    """Seconds to GET size bytes (the stub's bytes=N), read to the end."""
    s = socket.create_connection(("127.0.0.1", port))
    t0 = time.monotonic()
    s.sendall(b"GET /download?bytes=%d HTTP/1.1\r\nHost: bench\r\n"
              b"Connection: close\r\n\r\n" % size)
    head, rest = read_head(s)
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(head[:80])
    got = len(rest)
    buf = bytearray(4 * MIB)
    while True:
        n = s.recv_into(buf)
        if n == 0:
            break
        got += n
    s.close()
    if got != size:
        raise RuntimeError(f"downloaded {got} of {size}")
    return time.monotonic() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--build", default=os.path.join(ROOT, "build-bench"))
    a = ap.parse_args()
    size = a.size_mib * MIB
    proxy_bin = os.environ.get("IDEMPROXY_BIN",
                               os.path.join(a.build, "proxy", "idemproxy"))
    stub_bin = os.path.join(os.path.dirname(os.path.dirname(proxy_bin)),
                            "tests", "support", "stub_upstream")
    for b in (proxy_bin, stub_bin):
        if not os.access(b, os.X_OK):
            sys.exit(f"bigbody.py: no {b} (meson setup {a.build} "
                     "-Dbuildtype=release && ninja -C it)")
    tmp = tempfile.mkdtemp(prefix="idemproxy-bigbody-")
    procs = []
    try:
        stub = subprocess.Popen([stub_bin, "--listen", "127.0.0.1:0"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        procs.append(stub)
        line = stub.stdout.readline().decode()
        stub_port = int(line.rsplit(":", 1)[1])
        pport, aport = free_port(), free_port()
        proxy = subprocess.Popen(
            [proxy_bin, "--upstream", f"http://127.0.0.1:{stub_port}",
             "--listen", f"127.0.0.1:{pport}", "--admin-listen",
             f"127.0.0.1:{aport}", "--workers", "1", "--log-level", "warn",
             "--upstream-timeout", "120s", "--lease", "180s"],
            stderr=open(os.path.join(tmp, "idemproxy.log"), "wb"))
        procs.append(proxy)
        wait_port(pport, proxy)
        targets = [("stub", stub_port, [stub.pid]),
                   ("idemproxy", pport, [proxy.pid])]
        nginx = shutil.which("nginx")
        if nginx:
            nport = free_port()
            os.makedirs(os.path.join(tmp, "nginx"))
            conf = open(os.path.join(HERE, "nginx.conf.in")).read()
            conf = (conf.replace("@WORKERS@", "1")
                    .replace("@PREFIX@", os.path.join(tmp, "nginx"))
                    .replace("@UPSTREAM_PORT@", str(stub_port))
                    .replace("@PORT@", str(nport)))
            # the reference streams request bodies already; streaming
            # responses and no body cap too: like with like both ways
            conf = conf.replace("location / {", "location / {\n"
                                "            proxy_buffering off;\n"
                                "            client_max_body_size 0;", 1)
            path = os.path.join(tmp, "nginx", "nginx.conf")
            open(path, "w").write(conf)
            ng = subprocess.Popen([nginx, "-c", path, "-p",
                                   os.path.join(tmp, "nginx"), "-e",
                                   os.path.join(tmp, "nginx", "error.log")],
                                  stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
            procs.append(ng)
            wait_port(nport, ng)
            time.sleep(0.3)
            kids = open(f"/proc/{ng.pid}/task/{ng.pid}/children").read().split()
            targets.append(("nginx", nport, [ng.pid] + [int(k) for k in kids]))
        print(f"== big bodies, {a.size_mib} MiB each way, "
              f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}")
        print(f"{'target':<10} {'transfer':<18} {'MiB/s':>8} {'RSS +MiB':>9}")
        for name, port, pids in targets:
            for what, fn in (("upload (length)", lambda: upload(port, size, False)),
                             ("upload (chunked)", lambda: upload(port, size, True)),
                             ("download", lambda: download(port, size))):
                with Sampler(pids) as smp:
                    secs = fn()
                grow = (smp.peak - smp.base) / 1024
                print(f"{name:<10} {what:<18} {size / MIB / secs:8.0f} "
                      f"{grow:9.1f}")
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
