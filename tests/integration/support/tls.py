"""TLS for the integration tests: a private PKI made with the openssl CLI
and an HTTPS front for the C stub upstream.

  Pki(dir)      a CA and certificates signed by it (PEM, unencrypted keys):
                  server      CN=localhost, SAN DNS:localhost, IP:127.0.0.1
                  server2     the same names, another key (rotation)
                  wronghost   SAN DNS:wrong.example only
                  expired     localhost/127.0.0.1, valid 2020-01-01..2020-01-02
                                (openssl ca -startdate/-enddate: OpenSSL 3.0's
                                x509 has no -not_before)
                  client      CN=idemproxy client, extendedKeyUsage clientAuth
                  other_ca    a second, unrelated CA (wrong trust anchor)
                .cert(name) / .key(name) -> path; .ca -> CA PEM path
  TlsFront      a threaded Python ssl terminator: accepts TLS on a free port
                of 127.0.0.1 and pipes bytes both ways to a plain port (the
                stub); optionally requires a client certificate; counts
                accepted TCP connections and finished handshakes; bounded
                (at most `max_conns` at once); max_version caps the TLS
                version (ssl.TLSVersion); stopped at teardown.
  TlsConn       support.http.RawConn over TLS (same request/read API)
  peer_fingerprint(port) -> SHA-256 of the certificate a new connection sees
"""
import hashlib
import socket
import ssl
import subprocess
import threading

from .http import RawConn

CA_CONF = """\
[ ca ]
default_ca = the_ca
[ the_ca ]
dir = {d}
database = {d}/index.txt
new_certs_dir = {d}/newcerts
serial = {d}/serial
certificate = {d}/ca.pem
private_key = {d}/ca.key
default_md = sha256
policy = any
copy_extensions = none
unique_subject = no
[ any ]
commonName = supplied
"""


class Pki:
    def __init__(self, d):
        self.dir = d
        self.ca = str(d / "ca.pem")
        self._ossl("req", "-x509", "-newkey", "rsa:2048", "-nodes",
                   "-keyout", "ca.key", "-out", "ca.pem", "-days", "3",
                   "-subj", "/CN=idemproxy test CA")
        self._ossl("req", "-x509", "-newkey", "rsa:2048", "-nodes",
                   "-keyout", "other_ca.key", "-out", "other_ca.pem",
                   "-days", "3", "-subj", "/CN=unrelated CA")
        self.other_ca = str(d / "other_ca.pem")
        srv = "subjectAltName=DNS:localhost,IP:127.0.0.1\n" \
              "extendedKeyUsage=serverAuth\n"
        self._leaf("server", "/CN=localhost", srv)
        self._leaf("server2", "/CN=localhost rotated", srv)
        self._leaf("wronghost", "/CN=wrong.example",
                   "subjectAltName=DNS:wrong.example\n")
        self._leaf("client", "/CN=idemproxy client",
                   "extendedKeyUsage=clientAuth\n")
        # expired: openssl ca with explicit dates in the past
        (d / "newcerts").mkdir()
        (d / "index.txt").write_text("")
        (d / "serial").write_text("1000\n")
        (d / "ca.cnf").write_text(CA_CONF.format(d=d))
        (d / "expired.ext").write_text(srv)
        self._ossl("req", "-newkey", "rsa:2048", "-nodes", "-keyout",
                   "expired.key", "-out", "expired.csr", "-subj",
                   "/CN=localhost")
        self._ossl("ca", "-batch", "-config", "ca.cnf", "-in", "expired.csr",
                   "-out", "expired.pem", "-startdate", "20200101000000Z",
                   "-enddate", "20200102000000Z", "-extfile", "expired.ext",
                   "-notext")

    def _ossl(self, *args):
        r = subprocess.run(["openssl", *args], cwd=self.dir,
                           capture_output=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"openssl {args}: {r.stderr.decode()}")
        return r.stdout

    def _leaf(self, name, subj, ext):
        (self.dir / f"{name}.ext").write_text(ext)
        self._ossl("req", "-newkey", "rsa:2048", "-nodes", "-keyout",
                   f"{name}.key", "-out", f"{name}.csr", "-subj", subj)
        self._ossl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem",
                   "-CAkey", "ca.key", "-CAcreateserial", "-out",
                   f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")

    def cert(self, name):
        return str(self.dir / f"{name}.pem")

    def key(self, name):
        return str(self.dir / f"{name}.key")

    def fingerprint(self, name):
        der = ssl.PEM_cert_to_DER_cert(open(self.cert(name)).read())
        return hashlib.sha256(der).hexdigest()


def client_context(pki):
    ctx = ssl.create_default_context(cafile=pki.ca)
    return ctx


class TlsConn(RawConn):
    """RawConn over TLS to 127.0.0.1:port, server name localhost."""

    def __init__(self, port, pki, timeout=10.0, context=None,
                 server_hostname="localhost"):
        ctx = context or client_context(pki)
        raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = ctx.wrap_socket(raw, server_hostname=server_hostname)
        self.buf = b""
        self.eof = False

    def fingerprint(self):
        return hashlib.sha256(self.sock.getpeercert(True)).hexdigest()


def peer_fingerprint(port, pki):
    with TlsConn(port, pki, timeout=5) as c:
        return c.fingerprint()


class TlsFront:
    """HTTPS in front of a plain TCP port (the stub)."""

    def __init__(self, pki, backend_port, cert="server", require_client=False,
                 max_conns=64, max_version=None):
        self.backend_port = backend_port
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(pki.cert(cert), pki.key(cert))
        if max_version is not None:
            self.ctx.maximum_version = max_version
        if require_client:
            self.ctx.verify_mode = ssl.CERT_REQUIRED
            self.ctx.load_verify_locations(pki.ca)
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(64)
        self.lsock.settimeout(0.2)
        self.port = self.lsock.getsockname()[1]
        self.accepted = 0       # TCP connections accepted
        self.handshakes = 0     # TLS handshakes completed
        self.resumed = 0        # of which resumed a session
        self.failed = 0         # handshakes that failed
        self.lock = threading.Lock()
        self.slots = threading.BoundedSemaphore(max_conns)
        self.stopping = threading.Event()
        self.socks = set()
        self.threads = []
        self.acceptor = threading.Thread(target=self._accept, daemon=True)
        self.acceptor.start()

    @property
    def url(self):
        return f"https://127.0.0.1:{self.port}"

    def _accept(self):
        while not self.stopping.is_set():
            try:
                s, _ = self.lsock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with self.lock:
                self.accepted += 1
            if not self.slots.acquire(timeout=5):
                s.close()
                continue
            t = threading.Thread(target=self._serve, args=(s,), daemon=True)
            self.threads.append(t)
            t.start()

    def _serve(self, s):
        back = None
        tls = None
        try:
            s.settimeout(10)
            try:
                tls = self.ctx.wrap_socket(s, server_side=True)
            except (ssl.SSLError, OSError):
                with self.lock:
                    self.failed += 1
                return
            with self.lock:
                self.handshakes += 1
                if tls.session_reused:
                    self.resumed += 1
            back = socket.create_connection(("127.0.0.1", self.backend_port),
                                            timeout=10)
            with self.lock:
                self.socks.update((tls, back))
            tls.settimeout(None)
            back.settimeout(None)
            t = threading.Thread(target=self._pipe, args=(back, tls),
                                 daemon=True)
            t.start()
            self._pipe(tls, back)
            t.join(30)
        finally:
            for x in (tls, back, s):
                if x is not None:
                    with self.lock:
                        self.socks.discard(x)
                    try:
                        x.close()
                    except OSError:
                        pass
            self.slots.release()

    @staticmethod
    def _pipe(src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except (OSError, ssl.SSLError):
            pass
        for x in (dst, src):
            try:
                socket.socket.shutdown(x, socket.SHUT_RDWR)
            except OSError:
                pass

    def stop(self):
        self.stopping.set()
        self.lsock.close()
        self.acceptor.join(5)
        with self.lock:
            socks = list(self.socks)
        for x in socks:
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in self.threads:
            t.join(5)
