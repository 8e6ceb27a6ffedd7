"""Redis that fails over (issue 19, item 5): --redis redis-sentinel://...

A master, a replica and one sentinel (quorum 1), all private, on
127.0.0.1. The proxy asks the sentinel for the master, writes its copies
there, and after `SENTINEL FAILOVER` writes them to the promoted replica;
a promoted master that lost every copy (flushed) costs misses, never an
execution: PostgreSQL stays the authority.
"""
import os
import shutil
import subprocess
import tempfile
import time

import pytest

from support.http import RawConn
from support.procs import free_port, metric_value, read_text
from support.stores import REDIS_BIN, RedisServer, resp_command


class Sentinel:
    def __init__(self, master_port, name="m"):
        self.dir = tempfile.mkdtemp(prefix="isnt", dir="/tmp")
        self.port = free_port()
        self.conf = os.path.join(self.dir, "sentinel.conf")
        self.log_path = os.path.join(self.dir, "sentinel.log")
        with open(self.conf, "w") as f:
            f.write(f"port {self.port}\nbind 127.0.0.1\ndir {self.dir}\n"
                    f"sentinel monitor {name} 127.0.0.1 {master_port} 1\n"
                    f"sentinel down-after-milliseconds {name} 1000\n"
                    f"sentinel failover-timeout {name} 5000\n")
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([REDIS_BIN, self.conf, "--sentinel"],
                                     stdout=self._log,
                                     stderr=subprocess.STDOUT, cwd=self.dir)

    def cmd(self, *args):
        return resp_command(self.port, *args)

    def master_port(self, name="m"):
        try:
            r = self.cmd("SENTINEL", "get-master-addr-by-name", name)
        except (OSError, RuntimeError, EOFError):
            return None
        return int(text(r[1])) if r else None

    def stop(self):
        """Kill it and remove its dir (its log is printed before)."""
        self.proc.kill()
        self.proc.wait()
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def wait_for(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def sentinel_setup():
    if not os.access(REDIS_BIN, os.X_OK):
        pytest.skip(f"redis-server not installed ({REDIS_BIN})")
    master = RedisServer()
    replica = RedisServer(extra=["--replicaof", "127.0.0.1",
                                 str(master.port)])
    sentinel = Sentinel(master.port)
    try:
        wait_for(lambda: sentinel.master_port() == master.port, 15,
                 "the sentinel to know the master")
        wait_for(lambda: sentinel.cmd("SENTINEL", "replicas", "m"), 15,
                 "the sentinel to see the replica")
        wait_for(lambda: "master_link_status:up" in
                 text(replica.cmd("INFO", "replication")), 15, "replication")
        yield master, replica, sentinel
    finally:
        print(f"--- sentinel log ---\n{read_text(sentinel.log_path)[-3000:]}")
        sentinel.stop()
        replica.shutdown()
        master.shutdown()


def keyed_post(port, key):
    with RawConn(port) as c:
        return c.request("POST", "/orders", headers=[("Idempotency-Key", key)],
                         body=f"order {key}".encode())


def copies(server):
    return [text(k) for k in server.cmd("KEYS", "idemproxy:*") or []]


def test_sentinel_failover_is_followed(make_proxy, stub, pg_db,
                                       sentinel_setup):
    master, replica, sentinel = sentinel_setup
    # a dead sentinel first: the next one is asked
    dead = free_port()
    p = make_proxy("--store", pg_db.url, "--response-cache", "0", "--redis",
                   f"redis-sentinel://127.0.0.1:{dead},127.0.0.1:"
                   f"{sentinel.port}/m")
    first = keyed_post(p.port, "before")
    assert first.status == 200, first
    wait_for(lambda: any("before" in k for k in copies(master)), 10,
             "the copy on the master")
    r = keyed_post(p.port, "before")
    assert r.status == 200 and r.header("Idempotent-Replayed") == "true"
    assert r.body == first.body
    hits = metric_value(p.metrics(), "idemproxy_redis_hits_total")
    assert hits >= 1, p.log()

    sentinel.cmd("SENTINEL", "FAILOVER", "m")
    wait_for(lambda: sentinel.master_port() == replica.port, 20,
             "the sentinel to promote the replica")
    wait_for(lambda: "role:master" in text(replica.cmd("INFO",
                                                        "replication")),
             20, "the replica to be master")

    # new keys reach the promoted master (a write to the demoted one is
    # READONLY: the proxy looks for the master again)
    def copied_after_failover():
        keyed_post(p.port, f"after-{time.monotonic_ns()}")
        return any("after-" in k for k in copies(replica))
    wait_for(copied_after_failover, 20, "a copy on the promoted master")
    assert "redis master m" in p.log()

    # the promoted master loses every copy: misses, no execution
    replica.cmd("FLUSHALL")
    r = keyed_post(p.port, "before")
    assert r.status == 200 and r.body == first.body
    assert stub.stats()["keys"].get("before") == 1
    assert all(n == 1 for n in stub.stats()["keys"].values()), stub.stats()
