"""PostgreSQL 15 and Redis started by the tests in a temp dir (issue 4
"Tests"); the fixtures pg_server, pg_db, redis_server and redis in
conftest.py hold them. A pgbouncer in front of the PostgreSQL (Bouncer)
for the tests that need one. Every server is stopped by PID
(.shutdown()).
"""
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time

from .procs import clean_env, free_port, read_text

PG_BINDIR = os.environ.get("PG_BINDIR", "/usr/lib/postgresql/15/bin")
REDIS_BIN = os.environ.get("REDIS_SERVER_BIN",
                           shutil.which("redis-server") or
                           "/usr/bin/redis-server")
PSQL_BIN = os.path.join(PG_BINDIR, "psql")
PGBOUNCER_BIN = os.environ.get("PGBOUNCER_BIN",
                               shutil.which("pgbouncer") or
                               "/usr/sbin/pgbouncer")


class PgServer:
    """A private PostgreSQL cluster. As root, every pg binary runs as the
    postgres user through runuser, from cwd /; clients connect over TCP
    with trust auth as user postgres."""

    def __init__(self, extra_conf="", standby_of=None):
        """standby_of: a streaming standby of that PgServer instead of a
        new cluster (pg_basebackup -R: its settings and databases, this
        one's port and socket)."""
        self.base = tempfile.mkdtemp(prefix="ipg", dir="/tmp")   # short
        self.data = os.path.join(self.base, "d")
        self.sock = os.path.join(self.base, "s")
        self.log_path = os.path.join(self.base, "pg.log")
        self.port = free_port()
        self.as_pg = []
        self.paused = []        # pids SIGSTOPped by pause()
        os.makedirs(self.data)
        os.makedirs(self.sock)
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            for d in (self.base, self.data, self.sock):
                os.chown(d, pw.pw_uid, pw.pw_gid)
            self.as_pg = ["runuser", "-u", "postgres", "--"]
        os.chmod(self.data, 0o700)
        if standby_of is not None:
            self._run([os.path.join(PG_BINDIR, "pg_basebackup"), "-h",
                       "127.0.0.1", "-p", str(standby_of.port), "-U",
                       "postgres", "-D", self.data, "-R", "-X", "stream",
                       "-c", "fast", "--no-sync"], timeout=120)
            with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
                f.write(f"\nport = {self.port}\n"
                        f"unix_socket_directories = '{self.sock}'\n")
            self.start()
            return
        self._run([os.path.join(PG_BINDIR, "initdb"), "-D", self.data,
                   "-U", "postgres", "-A", "trust", "-E", "UTF8",
                   "--no-sync", "--no-instructions"], timeout=120)
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            f.write(f"\nport = {self.port}\n"
                    "listen_addresses = '127.0.0.1'\n"
                    f"unix_socket_directories = '{self.sock}'\n"
                    "max_connections = 300\n"
                    # fsync off survives a server crash (not an OS
                    # crash); synchronous_commit stays on so that an
                    # immediate stop loses no committed claim
                    "fsync = off\n"
                    "full_page_writes = off\n"
                    "log_min_messages = warning\nlog_checkpoints = off\n"
                    + extra_conf)
        self.start()

    def _run(self, argv, timeout=60, check=True):
        r = subprocess.run(self.as_pg + argv, cwd="/", capture_output=True,
                           timeout=timeout, env=clean_env())
        if check and r.returncode != 0:
            raise RuntimeError(f"{argv[0]} exited {r.returncode}: "
                               f"{r.stdout.decode()}{r.stderr.decode()}"
                               f"{read_text(self.log_path)[-3000:]}")
        return r

    def _pg_ctl(self, *args, timeout=60, check=True):
        return self._run([os.path.join(PG_BINDIR, "pg_ctl"), "-D", self.data,
                          *args], timeout=timeout, check=check)

    def postmaster_pid(self):
        try:
            with open(os.path.join(self.data, "postmaster.pid")) as f:
                return int(f.readline().strip())
        except (OSError, ValueError):
            return None

    def running(self):
        pid = self.postmaster_pid()
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False

    def start(self):
        """Start (or restart) on the same port; returns once it accepts."""
        self._pg_ctl("-w", "-t", "60", "-l", self.log_path, "start")
        deadline = time.monotonic() + 30
        while True:          # pg_ctl -w checks the socket; wait for TCP too
            try:
                socket.create_connection(("127.0.0.1", self.port), 1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self, mode="fast"):
        """pg_ctl stop: fast (disconnects clients, clean) or immediate
        (a crash: no shutdown checkpoint, recovery at the next start)."""
        self._pg_ctl("-w", "-t", "60", "-m", mode, "stop")

    def crash(self):
        self.stop("immediate")

    def promote(self):
        """A standby becomes a primary (pg_ctl promote, waits)."""
        self._pg_ctl("-w", "-t", "60", "promote")

    def _cluster_pids(self):
        """The postmaster, then every process it forked (backends,
        checkpointer, walwriter, ...), read from /proc."""
        pm = self.postmaster_pid()
        if pm is None:
            return []
        pids = [pm]
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == pm:
                pids.append(int(d))
        return pids

    def pause(self):
        """SIGSTOP to the postmaster first (it forks no more), then to
        every child: connections stay open and nothing answers, not even
        the server's own statement_timeout (a frozen host or VM)."""
        self.paused = self._cluster_pids()
        for pid in self.paused:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass

    def resume(self):
        for pid in reversed(self.paused):
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.paused = []

    def ensure_running(self):
        if not self.running():
            self.start()

    def psql(self, sql, db="postgres", timeout=30, check=True):
        """Run sql with psql -Atc; returns stdout stripped."""
        r = subprocess.run(
            [PSQL_BIN, "-h", "127.0.0.1", "-p", str(self.port),
             "-U", "postgres", "-d", db, "-v", "ON_ERROR_STOP=1", "-Atqc",
             sql], capture_output=True, timeout=timeout,
            env=clean_env({"PGCONNECT_TIMEOUT": "5"}))
        if check and r.returncode != 0:
            raise RuntimeError(f"psql {sql!r}: {r.stderr.decode()}")
        return r.stdout.decode().strip()

    def url(self, db):
        return f"postgres://postgres@127.0.0.1:{self.port}/{db}"

    def shutdown(self):
        self.resume()       # a stopped child would outlive the postmaster
        try:
            if self.running():
                self._pg_ctl("-w", "-t", "30", "-m", "immediate", "stop",
                             check=False)
        except subprocess.TimeoutExpired:
            pass
        pid = self.postmaster_pid()
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.base, ignore_errors=True)


class PgDb:
    def __init__(self, server, name):
        self.server = server
        self.name = name
        self.url = server.url(name)

    def psql(self, sql, **kw):
        return self.server.psql(sql, db=self.name, **kw)

    def count(self, where="true"):
        return int(self.psql(
            f"select count(*) from idempotency_keys where {where}"))

    def table_exists(self):
        return self.psql("select to_regclass('idempotency_keys') "
                         "is not null") == "t"


def resp_command(port, *args, timeout=5.0, host="127.0.0.1"):
    """One Redis command over a fresh connection (RESP2); returns the
    decoded reply (str/int/list/None); an error reply raises."""
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    with socket.create_connection((host, port), timeout) as s:
        s.sendall(out)
        f = s.makefile("rb")

        def parse():
            line = f.readline()
            if not line:
                raise EOFError("redis closed the connection")
            kind, rest = line[:1], line[1:-2]
            if kind == b"+":
                return rest.decode()
            if kind == b"-":
                raise RuntimeError(rest.decode())
            if kind == b":":
                return int(rest)
            if kind == b"$":
                n = int(rest)
                if n < 0:
                    return None
                data = f.read(n + 2)[:-2]
                return data
            if kind == b"*":
                n = int(rest)
                return None if n < 0 else [parse() for _ in range(n)]
            raise RuntimeError(f"bad RESP: {line!r}")

        return parse()


class RedisServer:
    def __init__(self, bind="127.0.0.1", extra=()):
        self.bind = bind
        self.extra = list(extra)
        self.dir = tempfile.mkdtemp(prefix="irds", dir="/tmp")
        self.log_path = os.path.join(self.dir, "redis.log")
        self.port = free_port()
        self.proc = None
        self.start()

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def start(self, timeout=15.0):
        assert self.proc is None or self.proc.poll() is not None
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [REDIS_BIN, "--port", str(self.port), "--bind", self.bind,
             "--save", "", "--appendonly", "no", "--daemonize", "no",
             "--dir", self.dir] + self.extra,
            stdout=self._log, stderr=subprocess.STDOUT, cwd=self.dir)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited "
                                   f"{self.proc.returncode}: "
                                   f"{read_text(self.log_path)[-2000:]}")
            try:
                if self.cmd("PING", timeout=1) == "PONG":
                    return
            except (OSError, EOFError, RuntimeError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not answer PING")
            time.sleep(0.02)

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def ensure_running(self):
        if not self.running():
            self.start()

    def _end(self, sig, timeout=15):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGCONT)   # in case it is paused
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()

    def stop(self):
        """SIGTERM (a clean shutdown; no persistence: data gone)."""
        self._end(signal.SIGTERM)

    def kill(self):
        self._end(signal.SIGKILL)

    def pause(self):
        """SIGSTOP: connections stay open, nothing answers (a slow Redis)."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self):
        self.proc.send_signal(signal.SIGCONT)

    def cmd(self, *args, timeout=5.0):
        return resp_command(self.port, *args, timeout=timeout, host=self.bind)

    def shutdown(self):
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class Bouncer:
    """A pgbouncer in front of server (a PgServer), every database name
    passed through, trust auth, in pool_mode mode with pool_size server
    connections per database. It retries a failed server login after 1 s
    (the default, 15 s, would hold every client that long after a
    PostgreSQL restart). As root it switches to the postgres user itself
    (-u; it refuses to run as root). kill() and start() keep the port."""

    def __init__(self, server, mode, pool_size=20):
        self.base = tempfile.mkdtemp(prefix="ibnc", dir="/tmp")
        self.port = free_port()
        self.log_path = os.path.join(self.base, "pgbouncer.log")
        self.ini = os.path.join(self.base, "pgbouncer.ini")
        self.proc = None
        with open(os.path.join(self.base, "users.txt"), "w") as f:
            f.write('"postgres" ""\n')
        with open(self.ini, "w") as f:
            f.write(f"""[databases]
* = host=127.0.0.1 port={server.port} user=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.base}/users.txt
pool_mode = {mode}
default_pool_size = {pool_size}
max_client_conn = 500
server_login_retry = 1
logfile = {self.log_path}
""")
        self.user = []
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            for name in [""] + os.listdir(self.base):
                os.chown(os.path.join(self.base, name), pw.pw_uid,
                         pw.pw_gid)
            self.user = ["-u", "postgres"]
        self.start()

    def start(self):
        """Start on the port; returns once it accepts."""
        self.proc = subprocess.Popen([PGBOUNCER_BIN, *self.user, self.ini],
                                     cwd="/", env=clean_env(),
                                     stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 1).close()
                return
            except OSError:
                if self.proc.poll() is not None or \
                        time.monotonic() > deadline:
                    raise RuntimeError("pgbouncer did not start: " +
                                       read_text(self.log_path)[-2000:])
                time.sleep(0.05)

    def kill(self):
        """SIGKILL: every client and server connection cut at once."""
        self.proc.kill()
        self.proc.wait(10)

    def pause(self):
        """SIGSTOP: connections stay open and nothing moves (a frozen
        pooler)."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self):
        self.proc.send_signal(signal.SIGCONT)

    def url(self, db):
        return f"postgres://postgres@127.0.0.1:{self.port}/{db}"

    def shutdown(self):
        if self.proc is not None and self.proc.poll() is None:
            self.resume()       # a stopped one dies only once continued
            self.kill()
        shutil.rmtree(self.base, ignore_errors=True)
