"""A TCP relay on 127.0.0.1 that can hold what clients send: a network
that delays a connection's bytes (a stalled path, a paused process's
socket buffer) without closing it.

    r = Relay(target_port)      # listen on r.port, forward to the target
    r = Relay(port, delay=0.02) # ... each piece of either direction late
    r.hold()                    # from now on, client bytes wait here
    r.release()                 # ... and go on, in order
    r.cut(b"LISTEN idemproxy")  # connections whose client sent this
                                # become black holes
    r.retarget(other_port)      # new connections go to another server
    r.reset()                   # every connection open now is closed
    r.close()

Bytes from the target to the client are never held. A thread per
direction per connection; the relay stops its threads on close().
"""
import socket
import threading
import time

from support.procs import free_port


class Relay:
    def __init__(self, target_port, delay=0.0):
        self.target_port = target_port
        self.delay = delay
        self.port = free_port()
        self._lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._lsock.bind(("127.0.0.1", self.port))
        self._lsock.listen(64)
        self._open = threading.Event()
        self._open.set()
        self._closed = False
        self._socks = []
        self._lock = threading.Lock()
        self.held = 0           # bytes that waited
        self._conns = []        # per connection: {"head", "cut"}
        threading.Thread(target=self._accept, daemon=True).start()

    def hold(self):
        self._open.clear()

    def release(self):
        self._open.set()

    def cut(self, marker):
        """The connections open now whose client sent `marker` (in its
        first 64 KiB) turn into black holes: from now on the bytes of
        either direction are read and dropped, and nothing is closed - a
        flow a NAT or a load balancer forgot. Returns how many."""
        n = 0
        with self._lock:
            for conn in self._conns:
                if marker in conn["head"]:
                    conn["cut"] = True
                    n += 1
        return n

    def retarget(self, port):
        """Connections accepted from now on go to port (a failover behind
        a VIP); the open ones stay where they are."""
        self.target_port = port

    def reset(self):
        """Close both ends of every connection open now. Returns how
        many."""
        with self._lock:
            socks, self._socks = self._socks, []
            self._conns = []
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        return len(socks) // 2

    def _accept(self):
        while not self._closed:
            try:
                c, _ = self._lsock.accept()
            except OSError:
                return
            try:
                t = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                c.close()
                continue
            conn = {"head": b"", "cut": False}
            with self._lock:
                self._socks += [c, t]
                self._conns.append(conn)
            threading.Thread(target=self._pump, args=(c, t, True, conn),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(t, c, False, conn),
                             daemon=True).start()

    def _pump(self, src, dst, holdable, conn):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if holdable and len(conn["head"]) < 65536:
                    conn["head"] += data
                if conn["cut"]:
                    continue
                if holdable and not self._open.is_set():
                    self.held += len(data)
                    self._open.wait()
                if self.delay:
                    time.sleep(self.delay)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self._closed = True
        self._open.set()
        self._lsock.close()
        with self._lock:
            for s in self._socks:
                s.close()
