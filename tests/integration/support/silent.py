"""A TCP server on 127.0.0.1 that accepts connections and then neither
sends nor reads a byte: what a SIGSTOPped PostgreSQL looks like from
outside, or an upstream that takes a request and never reads it.

    s = SilentServer()          # s.port, s.url, s.held (accepted sockets)
    s = SilentServer(rcvbuf=4096)   # small receive buffers: what a peer
                                    # sends stays with the peer
    s.stop()

A thread accepts; stop() ends it and closes every socket.
"""
import socket
import threading


class SilentServer:
    def __init__(self, rcvbuf=None):
        self.sock = socket.socket()
        if rcvbuf is not None:      # accepted sockets inherit it
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.held = []
        self.stopping = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        self.sock.settimeout(0.2)
        while not self.stopping:
            try:
                c, _ = self.sock.accept()
                self.held.append(c)
            except socket.timeout:
                continue
            except OSError:
                return

    def stop(self):
        self.stopping = True
        self.thread.join(5)
        for c in self.held:
            c.close()
        self.sock.close()
