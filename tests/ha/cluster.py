"""A real replicated PostgreSQL 15 cluster for high-availability tests:
one etcd and n Patroni nodes, all on 127.0.0.1, on free ports, in a temp
dir; usable as root (Patroni and PostgreSQL run as the postgres user).

    from tests.ha.cluster import Cluster
    with Cluster(n=3) as c:
        c.leader(); c.kill_postgres(c.leader()); c.wait_leader()

Every process is started under a small "reaper" (REAPER below, run with
/usr/bin/python3): it is a child subreaper, so the postmaster (which
Patroni daemonizes with setsid + double fork) and its children are reaped
by it. PID 1 on these machines reaps no orphan: without the reaper a
SIGKILLed postmaster stays a zombie, its pid still "exists" for kill(pid,
0) and psutil, and Patroni / PostgreSQL may take it for a live postmaster.
The reaper also asks for PR_SET_PDEATHSIG: if the process that made the
Cluster dies without stop() (SIGKILL of pytest), the reaper SIGKILLs
everything under it. (The parent-death signal follows the *thread* that
started the process: create the Cluster from a thread that outlives it.)

Settings (Cluster's defaults): ttl 10, loop_wait 1, retry_timeout 4
(Patroni wants ttl >= loop_wait + 2 * retry_timeout); synchronous_mode
and synchronous_mode_strict on; use_pg_rewind with
remove_data_directory_on_rewind_failure and
remove_data_directory_on_diverged_timelines, so that an old leader (killed,
frozen, or with local-only commits) always rejoins as a replica;
wal_sender_timeout / wal_receiver_timeout 5 s (a frozen peer is dropped
after 5 s, not 60); trust auth on 127.0.0.1 only. Measured here: up in
~10 s; kill -9 of the leader's postmaster: writable again in ~2.5 s
(Patroni restarts it in place; primary_start_timeout=0 fails over
instead, ~2.7 s); switchover ~4-4.7 s (~8 s to a replica that is not the
sync standby); leader host killed: ~13 s; leader frozen: ~15 s (ttl +
Patroni's fixed 2 s timeout on the frozen member's REST API + a new sync
standby).

The DCS is etcd's v2 API (etcd 3.4 with --enable-v2): Patroni 3.0.2's etcd3
client (Debian 12) overwrites the leader key unconditionally when its
lease expired, so a frozen-then-thawed leader takes the leader key back
from the promoted replica, which is demoted and rewound: the commits made
during the freeze are lost (upstream patroni PRs 2689/2693, fixed in
3.0.3). dcs_api="etcd3" is there only to show that.

Everything is stopped by PID only, and stop() runs at exit (atexit) too.
Only psql (from PG_BINDIR) and the Python standard library are needed on
the caller's side: no psycopg2, no yaml (Patroni reads the JSON config).
"""
import atexit
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

PG_BINDIR = os.environ.get("PG_BINDIR", "/usr/lib/postgresql/15/bin")
PSQL_BIN = os.path.join(PG_BINDIR, "psql")
PATRONI_BIN = os.environ.get("PATRONI_BIN", "/usr/bin/patroni")
ETCD_BIN = os.environ.get("ETCD_BIN", "/usr/bin/etcd")
# the reaper runs as postgres: a pyenv python under /root is not readable
SYS_PYTHON = "/usr/bin/python3"

SCOPE = "idem"
SUPERUSER = "postgres"
SUPERPASS = "postgres-pw"
REPLUSER = "replicator"
REPLPASS = "replicator-pw"
CLIENT_USER = "idem"          # superuser made for the clients
CLIENT_PASS = "idem"
CLIENT_DB = "idem"
PROBE_TABLE = "ha_probe"      # in database postgres, for wait_leader()


class ClusterError(RuntimeError):
    pass


# --------------------------------------------------------------------------
# The reaper: argv = pidfile cmd...; forks cmd, writes its pid, reaps every
# descendant that is re-parented to it, and exits with cmd's status once no
# descendant is left. SIGTERM/SIGINT are forwarded to cmd; the parent's
# death (SIGUSR1 by PR_SET_PDEATHSIG) SIGKILLs every descendant.
REAPER = r'''
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(36, 1, 0, 0, 0)                      # PR_SET_CHILD_SUBREAPER
libc.prctl(1, int(signal.SIGUSR1), 0, 0, 0)     # PR_SET_PDEATHSIG
pidfile, argv = sys.argv[1], sys.argv[2:]
me = os.getpid()

def descendants():
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as f:
                    s = f.read()
                ppid = int(s[s.rindex(")") + 2:].split()[1])
            except (OSError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [me]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k); todo.append(k)
    return out

def kill_all(*_):
    for _ in range(3):
        for p in descendants():
            for sig in (signal.SIGKILL, signal.SIGCONT):
                try:
                    os.kill(p, sig)
                except OSError:
                    pass

if os.getppid() != int(os.environ.pop("IHA_PARENT", "0")):
    sys.exit(70)                                # parent already gone
child = os.fork()
if child == 0:
    try:
        os.execvp(argv[0], argv)
    finally:
        os._exit(127)
with open(pidfile + ".tmp", "w") as f:
    f.write("%d\n" % child)
os.rename(pidfile + ".tmp", pidfile)

def forward(sig, _frame):
    try:
        os.kill(child, sig)
    except OSError:
        pass

signal.signal(signal.SIGTERM, forward)
signal.signal(signal.SIGINT, forward)
signal.signal(signal.SIGUSR1, kill_all)
status = 0
while True:
    try:
        pid, st = os.wait()
    except ChildProcessError:
        break
    if pid == child:
        status = os.waitstatus_to_exitcode(st)
sys.exit(status if status >= 0 else 128 - status)
'''


# --------------------------------------------------------------------------
# small helpers

_ports_given = set()


def free_port():
    """A TCP port on 127.0.0.1 free a moment ago, never handed out before
    in this process."""
    for _ in range(200):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        if port not in _ports_given:
            _ports_given.add(port)
            return port
    raise ClusterError("no fresh free port")


def read_text(path, tail=None):
    try:
        with open(path, "rb") as f:
            t = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return t[-tail:] if tail else t


def proc_state(pid):
    """One-letter state from /proc/PID/stat, or None when there is no such
    process. 'Z' (zombie) and 'X' count as dead for alive()."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
        return s[s.rindex(")") + 2:].split()[0]
    except (OSError, ValueError, IndexError):
        return None


def alive(pid):
    return pid is not None and proc_state(pid) not in (None, "Z", "X")


def process_tree():
    """{ppid: [pid, ...]} for every process now."""
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
            ppid = int(s[s.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    return kids


def descendants(pid, tree=None):
    tree = process_tree() if tree is None else tree
    out, todo = [], [pid]
    while todo:
        for k in tree.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def signal_pids(pids, sig):
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _clean_env(extra=None):
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith("PG") or k.startswith("PATRONI")
                   or k.startswith("IDEMPROXY_") or k.startswith("ETCD")
                   or k in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"))}
    env.setdefault("LANG", "C.UTF-8")
    env.update(extra or {})
    return env


def http_json(url, method="GET", body=None, timeout=1.0):
    """(status, parsed JSON or text); raises OSError when unreachable."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw.decode())
    except ValueError:
        return status, raw.decode("utf-8", "replace")


class _Proc:
    """A command under the reaper; .pid is the command's own pid."""

    def __init__(self, argv, pidfile, log_path, user=None, cwd="/",
                 env=None):
        self.pidfile = pidfile
        self.log_path = log_path
        try:
            os.unlink(pidfile)
        except FileNotFoundError:
            pass
        kw = {}
        if user is not None and os.geteuid() == 0:
            pw = pwd.getpwnam(user)
            kw = dict(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
        env = dict(env or _clean_env())
        env["IHA_PARENT"] = str(os.getpid())
        with open(log_path, "ab") as log:
            self.reaper = subprocess.Popen(
                [SYS_PYTHON, "-c", REAPER, pidfile] + list(argv),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=cwd, env=env, start_new_session=True, close_fds=True,
                **kw)
        deadline = time.monotonic() + 10
        self.pid = None
        while self.pid is None:
            try:
                with open(pidfile) as f:
                    self.pid = int(f.read().strip())
            except (OSError, ValueError):
                if self.reaper.poll() is not None:
                    raise ClusterError(f"{argv[0]} did not start: "
                                       f"{read_text(log_path, 3000)}")
                if time.monotonic() > deadline:
                    self.kill()
                    raise ClusterError(f"{argv[0]}: no pid file")
                time.sleep(0.01)

    def running(self):
        return alive(self.pid) and self.pid in self.tree()

    def finished(self):
        """True once the command and everything below it are gone."""
        return self.reaper.poll() is not None

    def tree(self):
        """Pids of the command and of every process under the reaper ([]
        once the reaper has exited: its pid may belong to another process
        by then)."""
        if self.reaper.poll() is not None:
            return []
        return descendants(self.reaper.pid)

    def signal(self, sig):
        """Signal the command itself, if it is still under the reaper (a
        dead command's pid may have been reused)."""
        if self.pid in self.tree():
            signal_pids([self.pid], sig)

    def kill(self):
        """SIGKILL (and SIGCONT, for stopped ones) of every process under
        the reaper; waits for the reaper to exit."""
        deadline = time.monotonic() + 10
        while self.reaper.poll() is None:
            pids = self.tree()
            signal_pids(pids, signal.SIGKILL)
            signal_pids(pids, signal.SIGCONT)
            try:
                self.reaper.wait(0.2)
            except subprocess.TimeoutExpired:
                if time.monotonic() > deadline:
                    self.reaper.kill()
                    self.reaper.wait(5)

    def terminate(self, timeout):
        """SIGCONT everything, SIGTERM the command, wait up to timeout for
        all to end, then kill()."""
        signal_pids(self.tree(), signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.reaper.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()


# --------------------------------------------------------------------------

class Node:
    """One Patroni member. pid is the patroni process (None when not
    started); postmaster_pid is read from DATA/postmaster.pid (None when
    there is no live postmaster)."""

    def __init__(self, cluster, idx):
        self.cluster = cluster
        self.name = f"pg{idx}"
        self.pg_port = free_port()
        self.api_port = free_port()
        self.dir = os.path.join(cluster.base, self.name)
        self.data_dir = os.path.join(self.dir, "data")
        self.config_path = os.path.join(self.dir, "patroni.json")
        self.log_path = os.path.join(self.dir, "patroni.log")
        self.sock_dir = os.path.join(cluster.sock_base, str(idx))
        self.proc = None
        self.frozen = False
        self.conf = None            # the Patroni config (set_tags)

    def __repr__(self):
        return (f"Node({self.name} pg={self.pg_port} api={self.api_port} "
                f"pid={self.pid} postmaster={self.postmaster_pid})")

    @property
    def pid(self):
        return self.proc.pid if self.proc is not None else None

    @property
    def postmaster_pid(self):
        """From DATA/postmaster.pid, if that process is alive and one of
        this node's (the file outlives a SIGKILLed postmaster)."""
        try:
            with open(os.path.join(self.data_dir, "postmaster.pid")) as f:
                pid = int(f.readline().strip())
        except (OSError, ValueError):
            return None
        if self.proc is None or pid not in self.proc.tree():
            return None
        return pid if alive(pid) else None

    @property
    def api_url(self):
        return f"http://127.0.0.1:{self.api_port}"

    def running(self):
        """The patroni process is alive (maybe frozen)."""
        return self.proc is not None and self.proc.running()


class Cluster:
    """etcd + n Patroni/PostgreSQL 15 nodes on 127.0.0.1 (see the module
    doc). The constructor returns once there is a leader, every replica
    streams from it, (synchronous=True) one is the sync standby, and the
    database CLIENT_DB exists."""

    def __init__(self, tmpdir=None, n=3, synchronous=True, strict=True,
                 ttl=10, loop_wait=1, retry_timeout=4,
                 primary_start_timeout=None, pg_parameters=None,
                 start_timeout=120.0, verbose=False, keep_dir=None,
                 dcs_api="etcd"):
        if n < 1:
            raise ValueError("n >= 1")
        if ttl < loop_wait + 2 * retry_timeout:
            raise ValueError("Patroni needs ttl >= loop_wait + "
                             "2 * retry_timeout")
        if n == 1 and synchronous and strict:
            raise ValueError("synchronous_mode_strict with one node: no "
                             "write could ever commit; pass strict=False")
        self.n = n
        self.synchronous = synchronous
        self.strict = strict
        self.ttl, self.loop_wait, self.retry_timeout = \
            ttl, loop_wait, retry_timeout
        self.primary_start_timeout = primary_start_timeout
        if dcs_api not in ("etcd", "etcd3"):
            raise ValueError("dcs_api: etcd (v2 API) or etcd3")
        self.dcs_api = dcs_api
        self.pg_parameters = dict(pg_parameters or {})
        self.verbose = verbose
        self.keep_dir = (os.environ.get("IDEM_HA_KEEP") == "1"
                         if keep_dir is None else keep_dir)
        self._stopped = False
        self._lock = threading.Lock()
        self._probe_seq = int(time.time() * 1000) * 1000
        self.last_probe = None      # (id, node) of the last probe committed
        self._killed = set()        # nodes killed or stopped on purpose
        self._last_leader = None
        self.etcd = None
        self.etcd_frozen = False
        self.nodes = []
        self.t0 = time.monotonic()

        self.user = "postgres" if os.geteuid() == 0 else None
        self.tmpdir = None if tmpdir is None else os.path.abspath(str(tmpdir))
        self.base = tempfile.mkdtemp(prefix="iha",
                                     dir=self._usable_dir(tmpdir))
        # Unix sockets need a short path (107 bytes)
        self.sock_base = tempfile.mkdtemp(prefix="ihs", dir="/tmp")
        atexit.register(self.stop)
        try:
            self._setup(start_timeout)
        except BaseException:
            self._dump_logs()
            self.stop()
            raise

    # ---------------------------------------------------------------- setup
    def _usable_dir(self, tmpdir):
        """tmpdir if the postgres user can reach it, else /tmp (pytest's
        /tmp/pytest-of-root is mode 0700)."""
        if tmpdir is None:
            return "/tmp"
        tmpdir = os.path.abspath(str(tmpdir))
        if self.user is None:
            return tmpdir
        p = tmpdir
        while True:
            st = os.stat(p)
            if not (st.st_mode & 0o001):        # others cannot traverse
                self._log(f"{p} is not reachable by postgres; using /tmp")
                return "/tmp"
            if p == "/":
                return tmpdir
            p = os.path.dirname(p)

    def _log(self, msg):
        if self.verbose:
            print(f"[ha {time.monotonic() - self.t0:7.2f}] {msg}",
                  file=sys.stderr, flush=True)

    def _chown(self, path):
        if self.user is not None:
            pw = pwd.getpwnam(self.user)
            os.chown(path, pw.pw_uid, pw.pw_gid)

    def _setup(self, start_timeout):
        deadline = time.monotonic() + start_timeout
        self._chown(self.base)
        os.chmod(self.base, 0o755)
        self._chown(self.sock_base)
        self._start_etcd(deadline)
        self.nodes = [Node(self, i) for i in range(self.n)]
        for node in self.nodes:
            os.makedirs(node.dir)
            os.makedirs(node.sock_dir)
            self._chown(node.dir)
            self._chown(node.sock_dir)
            self._write_config(node)
        for node in self.nodes:
            self._spawn(node)
        self.wait_healthy(timeout=max(1.0, deadline - time.monotonic()))
        leader = self.leader()
        self._log(f"healthy, leader {leader}")
        self.psql(leader, f"CREATE ROLE {CLIENT_USER} LOGIN SUPERUSER "
                          f"PASSWORD '{CLIENT_PASS}'")
        self.psql(leader, f"CREATE DATABASE {CLIENT_DB} OWNER {CLIENT_USER}")
        self.psql(leader, f"CREATE TABLE {PROBE_TABLE} (id bigint PRIMARY "
                          "KEY, node text, at timestamptz DEFAULT now())")
        # every replica must have the database: libpq stops at a host that
        # answers FATAL (no such database) instead of trying the next one
        self.wait_replicated(timeout=max(1.0, deadline - time.monotonic()))
        self._log(f"cluster up, leader {leader}, sync {self.sync_standby()}")

    def _start_etcd(self, deadline):
        d = os.path.join(self.base, "etcd")
        os.makedirs(d, mode=0o700)
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        cu = f"http://127.0.0.1:{self.etcd_port}"
        pu = f"http://127.0.0.1:{self.etcd_peer_port}"
        argv = [ETCD_BIN, "--name", "e0",
                "--data-dir", os.path.join(d, "data"),
                "--listen-client-urls", cu, "--advertise-client-urls", cu,
                "--listen-peer-urls", pu, "--initial-advertise-peer-urls", pu,
                "--initial-cluster", f"e0={pu}",
                "--initial-cluster-state", "new",
                "--initial-cluster-token", os.path.basename(self.base),
                "--heartbeat-interval", "100", "--election-timeout", "1000",
                "--logger", "zap", "--log-level", "warn",
                "--enable-v2=true"]
        self.etcd_log = os.path.join(d, "etcd.log")
        self.etcd = _Proc(argv, os.path.join(d, "etcd.pid"), self.etcd_log,
                          cwd=d)
        while True:
            try:
                st, body = http_json(cu + "/health", timeout=1)
                if st == 200 and isinstance(body, dict) and \
                        str(body.get("health")) == "true":
                    break
            except OSError:
                pass
            if not self.etcd.running():
                raise ClusterError("etcd exited: " +
                                   read_text(self.etcd_log, 3000))
            if time.monotonic() > deadline:
                raise ClusterError("etcd did not become healthy")
            time.sleep(0.05)
        self._log(f"etcd up on {self.etcd_port}")

    def _write_config(self, node):
        params = {
            "max_connections": 300,
            "max_wal_senders": 10,
            "max_replication_slots": 10,
            "wal_keep_size": "256MB",
            "hot_standby": "on",
            "wal_log_hints": "on",          # pg_rewind
            "wal_retrieve_retry_interval": "1s",   # replicas reconnect fast
            "wal_receiver_status_interval": "1s",
            # a frozen peer is noticed after 5 s instead of 60 s: the
            # primary drops a frozen sync standby's walsender (so Patroni
            # can pick another one), a replica drops a frozen primary
            "wal_sender_timeout": "5s",
            "wal_receiver_timeout": "5s",
            "log_min_messages": "warning",
            "log_checkpoints": "off",
        }
        params.update(self.pg_parameters)
        rewind = {"use_pg_rewind": True,
                  "remove_data_directory_on_rewind_failure": True,
                  "remove_data_directory_on_diverged_timelines": True}
        dcs = {"ttl": self.ttl, "loop_wait": self.loop_wait,
               "retry_timeout": self.retry_timeout,
               "maximum_lag_on_failover": 1048576,
               "synchronous_mode": bool(self.synchronous),
               "synchronous_mode_strict": bool(self.synchronous and
                                               self.strict),
               "postgresql": dict(rewind, use_slots=True,
                                  parameters=params)}
        if self.primary_start_timeout is not None:
            dcs["primary_start_timeout"] = self.primary_start_timeout
        hba = ["local all all trust",
               "host all all 127.0.0.1/32 trust",
               "host replication all 127.0.0.1/32 trust"]
        conf = {
            "scope": SCOPE,
            "name": node.name,
            "log": {"level": "INFO",
                    "format": "%(asctime)s %(levelname)s: %(message)s"},
            "restapi": {"listen": f"127.0.0.1:{node.api_port}",
                        "connect_address": f"127.0.0.1:{node.api_port}"},
            self.dcs_api: {"hosts": [f"127.0.0.1:{self.etcd_port}"],
                           "protocol": "http"},
            "bootstrap": {
                "dcs": dcs,
                "initdb": [{"encoding": "UTF8"}, {"locale": "C"}, "no-sync"],
                "pg_hba": hba,
            },
            "postgresql": dict(rewind, **{
                "listen": f"127.0.0.1:{node.pg_port}",
                "connect_address": f"127.0.0.1:{node.pg_port}",
                "data_dir": node.data_dir,
                "bin_dir": PG_BINDIR,
                "pgpass": os.path.join(node.dir, "pgpass"),
                "authentication": {
                    "superuser": {"username": SUPERUSER,
                                  "password": SUPERPASS},
                    "replication": {"username": REPLUSER,
                                    "password": REPLPASS},
                },
                "pg_hba": hba,
                "parameters": {"unix_socket_directories": node.sock_dir},
            }),
            "watchdog": {"mode": "off"},
            "tags": {"nofailover": False, "noloadbalance": False,
                     "clonefrom": False, "nosync": False},
        }
        node.conf = conf
        self._save_config(node)

    def _save_config(self, node):
        tmp = node.config_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(node.conf, f, indent=1)
        self._chown(tmp)
        os.rename(tmp, node.config_path)

    def _spawn(self, node):
        env = _clean_env({"HOME": node.dir})
        node.proc = _Proc([PATRONI_BIN, node.config_path],
                          os.path.join(node.dir, "patroni.pid"),
                          node.log_path, user=self.user, cwd=node.dir,
                          env=env)
        node.frozen = False
        self._log(f"started {node.name} patroni pid {node.pid}")

    # ------------------------------------------------------------- queries
    def node(self, name):
        if isinstance(name, Node):
            return name
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def _api_nodes(self):
        """Nodes worth asking: running and not frozen; the last leader seen
        first (its view of the sync standby is the freshest)."""
        up = [n for n in self.nodes if n.running() and not n.frozen]
        up.sort(key=lambda n: n.name != self._last_leader)
        return up

    def members(self, timeout=1.0):
        """The member list of GET /cluster from the first node answering
        (dicts with name, role, state, lag, timeline...); [] if none."""
        for n in self._api_nodes():
            try:
                st, body = http_json(n.api_url + "/cluster", timeout=timeout)
            except (OSError, ValueError):
                continue
            if st == 200 and isinstance(body, dict):
                members = body.get("members", [])
                for m in members:
                    if m.get("role") == "leader":
                        self._last_leader = m.get("name")
                return members
        return []

    def leader(self):
        """Name of the leader in the DCS (as a running node sees it), or
        None."""
        for m in self.members():
            if m.get("role") == "leader":
                return m["name"]
        return None

    def dcs_leader(self, timeout=1.0):
        """The leader key as etcd holds it now (authoritative; the REST
        views of the nodes lag by up to loop_wait), or None."""
        key = f"/service/{SCOPE}/leader"
        try:
            if self.dcs_api == "etcd":
                st, body = http_json(f"http://127.0.0.1:{self.etcd_port}"
                                     f"/v2/keys{key}", timeout=timeout)
                return body["node"]["value"] if st == 200 else None
            import base64
            st, body = http_json(
                f"http://127.0.0.1:{self.etcd_port}/v3/kv/range",
                method="POST", timeout=timeout,
                body={"key": base64.b64encode(key.encode()).decode()})
            kvs = body.get("kvs") if st == 200 else None
            return base64.b64decode(kvs[0]["value"]).decode() if kvs \
                else None
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def sync_standby(self):
        for m in self.members():
            if m.get("role") == "sync_standby":
                return m["name"]
        return None

    def replicas(self):
        return [m["name"] for m in self.members()
                if m.get("role") in ("replica", "sync_standby")]

    def dsn(self, target_session_attrs="read-write", hosts_order=None,
            dbname=CLIENT_DB, user=CLIENT_USER, connect_timeout=2):
        """libpq conninfo listing every node; hosts_order: a node name to
        put first, or a list of names giving the order (names left out
        follow in the cluster's order)."""
        order = []
        if hosts_order:
            order = [hosts_order] if isinstance(hosts_order, (str, Node)) \
                else list(hosts_order)
        nodes = [self.node(x) for x in order]
        nodes += [n for n in self.nodes if n not in nodes]
        s = (f"host={','.join('127.0.0.1' for _ in nodes)} "
             f"port={','.join(str(n.pg_port) for n in nodes)} "
             f"dbname={dbname} user={user} connect_timeout={connect_timeout}")
        if target_session_attrs:
            s += f" target_session_attrs={target_session_attrs}"
        return s

    def url(self, name, dbname=CLIENT_DB, user=CLIENT_USER):
        """postgres:// URL of one node."""
        return (f"postgres://{user}@127.0.0.1:{self.node(name).pg_port}"
                f"/{dbname}")

    def psql(self, name, sql, db="postgres", timeout=10.0, check=True,
             user=SUPERUSER, connect_timeout=2):
        """sql through psql -Atq on one node; returns stdout stripped.
        check=True raises ClusterError on a failure (exit != 0, or a
        synchronous-replication wait cancelled: that commit is local only).
        """
        node = self.node(name)
        env = _clean_env({"PGCONNECT_TIMEOUT": str(connect_timeout),
                          "PGAPPNAME": "ha-cluster"})
        try:
            r = subprocess.run(
                [PSQL_BIN, "-X", "-h", "127.0.0.1", "-p", str(node.pg_port),
                 "-U", user, "-d", db, "-v", "ON_ERROR_STOP=1", "-Atq",
                 "-c", sql], capture_output=True, timeout=timeout, env=env,
                stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            if check:
                raise ClusterError(f"psql on {node.name} timed out: {sql!r}")
            return None
        err = r.stderr.decode("utf-8", "replace")
        if check and (r.returncode != 0 or
                      "canceling wait for synchronous replication" in err):
            raise ClusterError(f"psql on {node.name} {sql!r}: "
                               f"rc={r.returncode} {err.strip()}")
        return r.stdout.decode("utf-8", "replace").strip()

    def try_write(self, name, timeout=3.0):
        """True when a probe row commits on the node (and, in synchronous
        mode, is confirmed by the sync standby) within timeout."""
        node = self.node(name)
        if node.frozen or not node.running():
            return False
        with self._lock:
            self._probe_seq += 1
            pid_ = self._probe_seq
        ms = max(100, int((timeout - 0.5) * 1000))
        sql = (f"SET statement_timeout = {ms}; "
               f"INSERT INTO {PROBE_TABLE} (id, node) VALUES "
               f"({pid_}, '{node.name}')")
        try:
            self.psql(node, sql, timeout=timeout + 1,
                      connect_timeout=max(1, int(timeout / 2)))
            self.last_probe = (pid_, node.name)
            return True
        except ClusterError:
            return False

    # ---------------------------------------------------------------- waits
    def wait_leader(self, exclude=None, timeout=60.0):
        """Wait until a node other than `exclude` (a name or a list) is the
        leader in the DCS and commits a write; returns its name."""
        excl = set([exclude] if isinstance(exclude, str) else exclude or ())
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            ld = self.leader()
            if ld is not None and ld not in excl:
                left = deadline - time.monotonic()
                if self.try_write(ld, timeout=max(0.5, min(3.0, left))):
                    # still the leader after the write?
                    if self.leader() == ld:
                        return ld
            last = ld
            time.sleep(0.1)
        raise ClusterError(f"no writable leader other than {sorted(excl)} "
                           f"within {timeout}s (last seen leader {last}); "
                           f"members {self.members()}")

    def wait_healthy(self, timeout=60.0):
        """Wait until every running, unfrozen node is in the cluster, the
        leader is running and all other such nodes stream from it; in
        synchronous mode one is sync standby (if there is a replica).
        Returns the leader's name."""
        deadline = time.monotonic() + timeout
        why = "?"
        while True:
            why = self._health()
            if why is None:
                return self.leader()
            dead = [n.name for n in self.nodes if n.proc is not None
                    and n.proc.finished() and not n.frozen
                    and n.name not in self._killed]
            if dead:
                why += f"; patroni of {dead} exited"
            if time.monotonic() > deadline:
                raise ClusterError(f"cluster not healthy within {timeout}s: "
                                   f"{why}")
            time.sleep(0.2)

    def wait_replicated(self, timeout=30.0):
        """Wait until every replica streaming from the leader has replayed
        the leader's WAL as of now (e.g. a table just created)."""
        deadline = time.monotonic() + timeout
        leader = self.wait_leader(timeout=timeout)
        lsn = self.psql(leader, "SELECT pg_current_wal_lsn()")
        want = [n.name for n in self.nodes
                if n.running() and not n.frozen and n.name != leader]
        while True:
            out = self.psql(leader, "SELECT application_name FROM "
                            "pg_stat_replication WHERE replay_lsn >= "
                            f"'{lsn}'::pg_lsn", check=False, timeout=3) or ""
            done = set(out.split())
            if all(w in done for w in want):
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"replicas {want} have not replayed "
                                   f"{lsn} within {timeout}s ({done})")
            time.sleep(0.05)

    def _health(self):
        up = [n for n in self.nodes if n.running() and not n.frozen]
        if not up:
            return "no node running"
        members = {m["name"]: m for m in self.members()}
        leader = [m for m in members.values() if m.get("role") == "leader"]
        if len(leader) != 1:
            return f"no leader: {members}"
        lname = leader[0]["name"]
        if members[lname].get("state") != "running":
            return f"leader {lname} state {members[lname].get('state')}"
        for n in up:
            if n.name not in members:
                return f"{n.name} not a member"
            if members[n.name].get("state") != "running":
                return f"{n.name} state {members[n.name].get('state')}"
        want = sorted(n.name for n in up if n.name != lname)
        out = self.psql(lname, "SELECT application_name, state, sync_state "
                               "FROM pg_stat_replication", check=False,
                        timeout=3)
        if out is None:
            return f"leader {lname} does not answer"
        streaming, sync = [], []
        for line in out.splitlines():
            app, state, sstate = (line.split("|") + ["", "", ""])[:3]
            if state == "streaming":
                streaming.append(app)
                if sstate in ("sync", "quorum"):
                    sync.append(app)
        missing = [w for w in want if w not in streaming]
        if missing:
            return f"not streaming from {lname}: {missing} ({out!r})"
        if self.synchronous and want:
            ss = [m for m in members.values()
                  if m.get("role") == "sync_standby"]
            if not ss or not sync:
                return f"no sync standby yet ({out!r})"
        return None

    # --------------------------------------------------------------- faults
    def kill_postgres(self, name):
        """SIGKILL the node's postmaster (its children die by themselves,
        as after a crash); Patroni restarts it or fails over. Returns the
        pid killed."""
        node = self.node(name)
        pid = node.postmaster_pid
        if pid is None:
            raise ClusterError(f"{node.name}: no postmaster running")
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        self._log(f"killed postmaster {pid} of {node.name}")
        return pid

    def kill_node(self, name):
        """SIGKILL patroni, the postmaster and every process of the node
        (a host crash). start_node() brings it back."""
        node = self.node(name)
        if node.proc is None:
            return
        node.proc.kill()
        node.frozen = False
        self._killed.add(node.name)
        self._log(f"killed node {node.name}")

    def kill_patroni(self, name):
        """SIGKILL the node's Patroni alone (an OOM kill, no watchdog): its
        PostgreSQL keeps running as it was, a primary included, until
        kill_node() and start_node() bring the node back."""
        node = self.node(name)
        node.proc.signal(signal.SIGKILL)
        self._log(f"killed patroni of {node.name}; its postgres runs on")

    def start_node(self, name, wait=True, timeout=60.0):
        """Start patroni again on a killed or stopped node (same ports and
        data dir); with wait, return once the cluster is healthy again."""
        node = self.node(name)
        if node.running() or (node.proc is not None and
                              not node.proc.finished()):
            raise ClusterError(f"{node.name} is still running")
        self._killed.discard(node.name)
        self._spawn(node)
        if wait:
            self.wait_healthy(timeout)

    def stop_node(self, name, timeout=30.0):
        """A clean stop of one node (SIGTERM to patroni, which stops
        PostgreSQL)."""
        node = self.node(name)
        if node.proc is not None:
            node.proc.terminate(timeout)
        node.frozen = False
        self._killed.add(node.name)

    def set_tags(self, name, **tags):
        """Change Patroni tags of a node (nofailover, nosync, ...): rewrite
        its config and SIGHUP its patroni (it must not be frozen). Other
        members see the change after that node's next loop."""
        node = self.node(name)
        node.conf["tags"].update(tags)
        self._save_config(node)
        if node.proc is not None:
            node.proc.signal(signal.SIGHUP)

    def _member_tags(self, name):
        for m in self.members():
            if m["name"] == name:
                return m.get("tags", {})
        return None

    def _make_sync_standby(self, to, deadline):
        """In synchronous mode Patroni only switches over to the sync
        standby: tag every other replica nosync until `to` is the sync
        standby. Returns the names tagged (to be untagged afterwards)."""
        leader = self.leader()
        others = [n.name for n in self.nodes if n.name not in (to, leader)
                  and n.running() and not n.frozen]
        for o in others:
            self.set_tags(o, nosync=True)
        while True:
            if self.sync_standby() == to:
                return others
            if time.monotonic() > deadline:
                raise ClusterError(f"{to} did not become the sync standby "
                                   f"(members {self.members()})")
            time.sleep(0.1)

    def _freeze_pids(self, node):
        """patroni first, then the postmaster, then everything else under
        the node's reaper (backends, walsenders, pg_rewind, ...)."""
        if node.proc is None:
            return []
        tree = node.proc.tree()
        first = [p for p in (node.pid, node.postmaster_pid) if p in tree]
        return first + [p for p in tree if p not in first]

    def freeze(self, name):
        """SIGSTOP patroni, the postmaster and all its children: a host
        that hangs while its kernel still accepts TCP connections."""
        node = self.node(name)
        node.frozen = True
        for _ in range(3):          # twice more for processes forked meanwhile
            signal_pids(self._freeze_pids(node), signal.SIGSTOP)
        self._log(f"froze {node.name}")

    def thaw(self, name):
        node = self.node(name)
        pids = self._freeze_pids(node)
        signal_pids(pids, signal.SIGCONT)
        node.frozen = False
        self._log(f"thawed {node.name}")

    def freeze_etcd(self):
        """SIGSTOP etcd: the DCS stops answering. Past the ttl Patroni 3.0
        (no failsafe_mode) demotes the leader to a read-only standby."""
        signal_pids([self.etcd.pid], signal.SIGSTOP)
        self.etcd_frozen = True
        self._log("froze etcd")

    def thaw_etcd(self):
        signal_pids([self.etcd.pid], signal.SIGCONT)
        self.etcd_frozen = False
        self._log("thawed etcd")

    def stop_postgres_immediate(self, name, timeout=30.0):
        """pg_ctl stop -m immediate on one node: PostgreSQL crashes alone
        (no shutdown checkpoint); Patroni starts it again or fails over."""
        node = self.node(name)
        as_user = ["runuser", "-u", self.user, "--"] if self.user else []
        subprocess.run(as_user + [os.path.join(PG_BINDIR, "pg_ctl"), "stop",
                                  "-m", "immediate", "-D", node.data_dir],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       stdin=subprocess.DEVNULL, timeout=timeout)
        self._log(f"pg_ctl stop -m immediate on {node.name}")

    def _signal_backends(self, name, func, where, seconds):
        """func (pg_terminate_backend or pg_cancel_backend) on every backend
        of one node that matches `where`, again and again for `seconds`;
        returns how many were signalled."""
        n = 0
        t_end = time.monotonic() + seconds
        while time.monotonic() < t_end:
            out = self.psql(name, f"select count({func}(pid)) from "
                            f"pg_stat_activity where {where}", check=False)
            n += int(out or 0)
        self._log(f"{func}: {n} backends on {name} ({where})")
        return n

    def terminate_backends(self, name, user, seconds):
        """Every backend of `user` on one node terminated, for `seconds`:
        transactions cut at every point, commits among them."""
        return self._signal_backends(name, "pg_terminate_backend",
                                     f"usename = '{user}'", seconds)

    def cancel_sync_waits(self, name, seconds):
        """Every wait for the synchronous standby on one node cancelled,
        for `seconds`: those commits are then local only."""
        return self._signal_backends(name, "pg_cancel_backend",
                                     "wait_event = 'SyncRep'", seconds)

    def switchover(self, to=None, timeout=60.0):
        """Planned switchover from the current leader to `to` (default: the
        sync standby in synchronous mode, else Patroni's choice). Patroni
        3.0 only switches over to the sync standby in synchronous mode, so
        for another `to` the other replicas are tagged nosync until `to` is
        the sync standby, and untagged after. Returns the new leader's name
        once it commits a write."""
        deadline = time.monotonic() + timeout
        old = self.leader()
        if old is None:
            raise ClusterError("switchover: no leader")
        if to is not None:
            to = self.node(to).name
            if to == old:
                raise ClusterError(f"switchover: {to} is the leader already")
        tagged = []
        try:
            if self.synchronous and to is not None and \
                    self.sync_standby() != to:
                tagged = self._make_sync_standby(to, deadline)
            if to is None and self.synchronous:
                to = self.sync_standby()
            return self._switchover(old, to, deadline)
        finally:
            for o in tagged:
                self.set_tags(o, nosync=False)

    def _switchover(self, old, to, deadline):
        timeout = max(1.0, deadline - time.monotonic())
        body = {"leader": old}
        if to is not None:
            body["candidate"] = to
        result = {}

        def post():
            try:
                result["r"] = http_json(self.node(old).api_url + "/switchover",
                                        method="POST", body=body,
                                        timeout=timeout)
            except OSError as e:
                result["r"] = (None, str(e))

        t = threading.Thread(target=post, daemon=True)
        t.start()
        try:
            new = self.wait_leader(exclude=old, timeout=timeout)
        finally:
            t.join(timeout)
        st, msg = result.get("r", (None, "no answer"))
        if st != 200:
            raise ClusterError(f"switchover {body}: {st} {msg}")
        if to is not None and new != to:
            raise ClusterError(f"switchover to {to} made {new} leader")
        self._log(f"switchover {old} -> {new}: {msg}")
        return new

    # ----------------------------------------------------------------- stop
    def stop(self, timeout=20.0):
        """Stop everything this Cluster started (by PID: SIGCONT, then
        SIGTERM to patroni, SIGKILL after timeout), etcd last, and remove
        the temp dirs. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        try:
            atexit.unregister(self.stop)
        except Exception:
            pass
        procs = [n.proc for n in self.nodes if n.proc is not None]
        for p in procs:
            signal_pids(p.tree(), signal.SIGCONT)
            p.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                p.reaper.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in procs:
            p.kill()
        for n in self.nodes:
            n.frozen = False
        if self.etcd is not None and self.etcd_frozen:
            self.thaw_etcd()
        if self.etcd is not None:
            self.etcd.terminate(5)
        self._save_logs()
        if not self.keep_dir:
            shutil.rmtree(self.base, ignore_errors=True)
        else:
            print(f"[ha] kept {self.base}", file=sys.stderr)
        shutil.rmtree(self.sock_base, ignore_errors=True)

    close = stop

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is not None:
            self._dump_logs()
        self.stop()

    def _save_logs(self):
        """When the caller gave a tmpdir and the cluster lived elsewhere
        (or is about to be removed), copy the logs to TMPDIR/ha-logs."""
        if self.tmpdir is None or self.keep_dir:
            return
        try:
            dst = os.path.join(self.tmpdir, "ha-logs")
            os.makedirs(dst, exist_ok=True)
            for n in self.nodes:
                if os.path.exists(n.log_path):
                    shutil.copyfile(n.log_path,
                                    os.path.join(dst, f"{n.name}.log"))
            if self.etcd is not None and os.path.exists(self.etcd_log):
                shutil.copyfile(self.etcd_log, os.path.join(dst, "etcd.log"))
        except OSError:
            pass

    def _dump_logs(self, chars=4000):
        if not self.verbose:
            return
        for n in self.nodes:
            print(f"----- {n.name} {n.log_path}\n"
                  f"{read_text(n.log_path, chars)}", file=sys.stderr)
        if self.etcd is not None:
            print(f"----- etcd\n{read_text(self.etcd_log, chars)}",
                  file=sys.stderr)

    def logs(self, name, chars=20000):
        """Tail of a node's patroni + postgres log."""
        return read_text(self.node(name).log_path, chars)
