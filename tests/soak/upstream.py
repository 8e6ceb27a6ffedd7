#!/usr/bin/python3
"""The soak's recording upstream: every request it executes is one line.

    upstream.py --listen 127.0.0.1:PORT --log FILE

A threaded HTTP/1.1 server (keep-alive, one thread per connection). Each
POST is an *execution*: it gets a unique id, and the moment it is read one
JSON line goes to FILE, before anything is answered:

  {"ev":"exec","exec":"E17","t":<time.time() when the body was read>,
   "key":<Idempotency-Key>,"req":<X-Soak-Req>,"method":"POST",
   "target":"/soak/3","body_sha":<hex>,"fp":<idemproxy's fingerprint>,
   "status":S,"delay_ms":D,"drop":false,"cut":false,"resp_sha":<hex>,
   "resp_len":N}

and once it is answered (or dropped, or cut, or the write failed):

  {"ev":"end","exec":"E17","t":<time.time() just before the write>,
   "sent":true|false[,"dropped":true][,"cut":true]}

The response is decided before the line is written, so the line holds the
sha256 of the exact body the upstream sends: status S, headers
Content-Type: application/json and X-Soak-Exec: <exec>, and a JSON body
that names the execution:

  {"exec":"E17","key":...,"req":...,"status":S,"pad":"<size bytes>"}

A response that reaches a client therefore says which execution produced
it, and a replay says which execution it replays.

What the execution does is chosen by request headers, which are not part
of idemproxy's fingerprint (so a retry of the same request may behave
differently): X-Soak-Status (default 200), X-Soak-Delay-Ms (wait before
answering), X-Soak-Drop: 1 (close without answering), X-Soak-Cut: 1 (send
the head and half the body, then close: a response cut short after its
status), X-Soak-Size (pad bytes). A dropped or cut execution is "sent":
false, "dropped": true: it may have acted, and no response says so.
GET /__stats answers {"execs":N,"inflight":N} and is not an execution.
SIGTERM: stop accepting, wait up to 10 s for executions in progress,
exit 0.
"""
import argparse
import hashlib
import json
import signal
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def fingerprint(method, target, body):
    """idemproxy's request fingerprint (docs/protocol.md)."""
    h = hashlib.sha256(b"idemproxy-fingerprint-v1\0")
    for f in (method, target, body):
        h.update(struct.pack(">Q", len(f)) + f)
    return h.hexdigest()


class Recorder:
    def __init__(self, path):
        self.f = open(path, "a", encoding="utf-8")
        self.lock = threading.Lock()
        self.n = 0
        self.inflight = 0

    def next_id(self):
        with self.lock:
            self.n += 1
            self.inflight += 1
            return f"E{self.n}"

    def done(self):
        with self.lock:
            self.inflight -= 1

    def write(self, obj):
        line = json.dumps(obj, separators=(",", ":")) + "\n"
        with self.lock:
            if not self.f.closed:
                self.f.write(line)
                self.f.flush()

    def close(self):
        with self.lock:
            self.f.close()


REC = None


def pad_bytes(exec_id, n):
    seed = hashlib.sha256(exec_id.encode()).hexdigest().encode()
    return (seed * (n // len(seed) + 1))[:n].decode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "soak-upstream"

    def log_message(self, fmt, *args):
        pass

    def _read_body(self):
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            out = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(out)
                out.append(self.rfile.read(size))
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n)
        if len(body) < n:
            # the proxy went away mid-body (SIGKILL): not an execution
            raise ConnectionResetError("request body cut short")
        return body

    def do_GET(self):
        if self.path == "/__stats":
            with REC.lock:
                body = json.dumps({"execs": REC.n,
                                   "inflight": REC.inflight}).encode()
            self.send_response(200)
        else:
            body = b"soak upstream\n"
            self.send_response(200 if self.path == "/" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _execute(self):
        body = self._read_body()
        t = time.time()
        exec_id = REC.next_id()
        try:
            h = self.headers
            status = int(h.get("X-Soak-Status") or 200)
            delay_ms = int(h.get("X-Soak-Delay-Ms") or 0)
            drop = h.get("X-Soak-Drop") == "1"
            cut = h.get("X-Soak-Cut") == "1" and not drop
            size = int(h.get("X-Soak-Size") or 16)
            key = h.get("Idempotency-Key")
            req = h.get("X-Soak-Req")
            resp = json.dumps({"exec": exec_id, "key": key, "req": req,
                               "status": status,
                               "pad": pad_bytes(exec_id, size)},
                              separators=(",", ":")).encode()
            REC.write({"ev": "exec", "exec": exec_id, "t": t, "key": key,
                       "req": req, "method": self.command,
                       "target": self.path,
                       "body_sha": hashlib.sha256(body).hexdigest(),
                       "fp": fingerprint(self.command.encode(),
                                         self.path.encode(), body),
                       "status": status, "delay_ms": delay_ms, "drop": drop,
                       "cut": cut,
                       "resp_sha": hashlib.sha256(resp).hexdigest(),
                       "resp_len": len(resp)})
            if delay_ms:
                time.sleep(delay_ms / 1000.0)
            te = time.time()
            if drop:
                self.close_connection = True
                REC.write({"ev": "end", "exec": exec_id, "t": te,
                           "sent": False, "dropped": True})
                return
            sent = True
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("X-Soak-Exec", exec_id)
                self.send_header("Content-Length", str(len(resp)))
                self.end_headers()
                self.wfile.write(resp[:len(resp) // 2] if cut else resp)
                self.wfile.flush()
            except OSError:
                sent = False
                self.close_connection = True
            if cut and sent:    # the head and half the body went out
                self.close_connection = True
                REC.write({"ev": "end", "exec": exec_id, "t": te,
                           "sent": False, "dropped": True, "cut": True})
                return
            REC.write({"ev": "end", "exec": exec_id, "t": te, "sent": sent})
        finally:
            REC.done()

    do_POST = _execute
    do_PATCH = _execute
    do_PUT = _execute


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def handle_error(self, request, client_address):
        # a proxy killed or timing out resets its connections: expected
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


def main():
    global REC
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen", default="127.0.0.1:0")
    ap.add_argument("--log", required=True)
    a = ap.parse_args()
    host, _, port = a.listen.rpartition(":")
    REC = Recorder(a.log)
    srv = Server((host, int(port)), Handler)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    print(f"listening {srv.server_address[0]}:{srv.server_address[1]}",
          flush=True)
    while not stop.wait(0.5):
        pass
    srv.shutdown()
    srv.server_close()
    deadline = time.monotonic() + 10
    while REC.inflight > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    REC.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
