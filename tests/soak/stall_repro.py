#!/usr/bin/python3
"""A deterministic reproduction of what the soak found (seed 1000, 600 s;
docs/reliability.md "Findings"): a proxy that stalls (SIGSTOP here; a VM
pause or CPU throttling in production) for longer than --upstream-timeout
while a response is in progress treats a response that arrived complete
during the stall as cut short by the timeout: the client's connection is
cut after the head, and the record is completed with a 504 "cut short"
problem that every duplicate gets as a replay for the whole ttl, although
the upstream executed the request once and answered 201 in full.

    IDEMPROXY_BIN=build-test/proxy/idemproxy tests/soak/stall_repro.py

The upstream here sends the response head, then the body 50 ms later (two
writes, as most servers do); the proxy is SIGSTOPped 20 ms after the head
and resumed 3 s later (--upstream-timeout 2s). Exit 0 when the first client
gets the whole 201 and a duplicate replays it; 1 otherwise (the defect);
the control run (no SIGSTOP) must pass either way. Not part of tests/run.sh.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))

from support.http import RawConn, http_get  # noqa: E402
from support.procs import clean_env, free_port, read_text  # noqa: E402

IDEMPROXY_BIN = os.environ.get(
    "IDEMPROXY_BIN", os.path.join(ROOT, "build-test", "proxy", "idemproxy"))
GAP_S = 0.05        # head -> body
STOP_AFTER_S = 0.02  # head -> SIGSTOP
STOPPED_S = 3.0     # > --upstream-timeout


def run(stall):
    execs = []
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(16)
    lsock.settimeout(0.2)
    done = threading.Event()
    proxy = None

    def handle(c):
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    d = c.recv(65536)
                    if not d:
                        return
                    buf += d
                head, buf = buf.split(b"\r\n\r\n", 1)
                n = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        n = int(line.split(b":")[1])
                while len(buf) < n:
                    buf += c.recv(65536)
                buf = buf[n:]
                execs.append(time.time())
                body = json.dumps({"exec": len(execs)}).encode()
                c.sendall(b"HTTP/1.1 201 Created\r\nContent-Type: "
                          b"application/json\r\nContent-Length: %d\r\n\r\n"
                          % len(body))
                if stall:
                    threading.Timer(STOP_AFTER_S, proxy.send_signal,
                                    (signal.SIGSTOP,)).start()
                time.sleep(GAP_S)
                c.sendall(body)
        except OSError:
            pass
        finally:
            c.close()

    def serve():
        while not done.is_set():
            try:
                c, _ = lsock.accept()
            except OSError:
                continue
            threading.Thread(target=handle, args=(c,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    port, admin = free_port(), free_port()
    logf = tempfile.NamedTemporaryFile(prefix="stall-repro-", suffix=".log",
                                       delete=False)
    proxy = subprocess.Popen(
        [IDEMPROXY_BIN, "--upstream",
         f"http://127.0.0.1:{lsock.getsockname()[1]}",
         "--listen", f"127.0.0.1:{port}", "--admin-listen",
         f"127.0.0.1:{admin}", "--workers", "1", "--upstream-timeout", "2s",
         "--lease", "3s"], stdout=logf, stderr=subprocess.STDOUT,
        env=clean_env())
    out = {}
    try:
        for _ in range(200):
            try:
                if http_get(admin, "/healthz", timeout=1)[0] == 200:
                    break
            except OSError:
                time.sleep(0.05)

        def post(tag):
            with RawConn(port, timeout=15) as c:
                try:
                    r = c.request("POST", "/x", [("Idempotency-Key", "k1")],
                                  b"hello")
                    out[tag] = (r.status, r.header("Idempotent-Replayed"),
                                r.body)
                except (OSError, EOFError) as e:
                    out[tag] = (None, None, str(e).encode())

        first = threading.Thread(target=post, args=("first",))
        first.start()
        if stall:
            time.sleep(0.5 + STOPPED_S)
            proxy.send_signal(signal.SIGCONT)
        first.join(20)
        post("duplicate")
    finally:
        proxy.send_signal(signal.SIGCONT)
        proxy.send_signal(signal.SIGTERM)
        try:
            proxy.wait(30)
        except subprocess.TimeoutExpired:
            proxy.kill()
            proxy.wait()
        done.set()
        lsock.close()
    log = read_text(logf.name)
    os.unlink(logf.name)
    want = (201, None, b'{"exec": 1}')
    ok = out.get("first") == want and \
        out.get("duplicate") == (201, "true", b'{"exec": 1}') and \
        len(execs) == 1
    what = "stalled" if stall else "control"
    print(f"{what}: upstream executions {len(execs)}; first client "
          f"{out.get('first')}; duplicate {out.get('duplicate')}: "
          f"{'ok' if ok else 'WRONG'}")
    if not ok:
        print("  proxy log: " + " | ".join(
            line for line in log.splitlines() if "warn" in line))
    return ok


def main():
    if not os.access(IDEMPROXY_BIN, os.X_OK):
        print(f"IDEMPROXY_BIN {IDEMPROXY_BIN} is not an executable")
        return 2
    control = run(stall=False)
    stalled = run(stall=True)
    if not control:
        print("the control run failed: the reproduction itself is broken")
        return 2
    return 0 if stalled else 1


if __name__ == "__main__":
    sys.exit(main())
