"""A Citus cluster for the tests (issue 47): a coordinator and workers, each
a private PostgreSQL 15 (support.stores.PgServer) with citus preloaded, on
127.0.0.1 and free ports; every node is stopped by PID at .shutdown().

Citus itself is built from its source tarball by deploy/build-citus.sh
(cached); a machine where that fails fails the tests that need it, with
the build's reason (CitusUnavailable), it does not skip them.
"""
import os
import subprocess

from .stores import PG_BINDIR, PgServer

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..",
                                    ".."))
CITUS_CONF = ("shared_preload_libraries = 'citus'\n"
              "max_prepared_transactions = 100\n"
              "citus.log_remote_commands = off\n")


class CitusUnavailable(RuntimeError):
    pass


def ensure_built():
    """deploy/build-citus.sh: nothing when citus 13.2.2 is installed."""
    r = subprocess.run([os.path.join(ROOT, "deploy", "build-citus.sh")],
                       capture_output=True, text=True, timeout=1800)
    if r.returncode != 0 or not os.path.exists(
            os.path.join(PG_BINDIR, "..", "lib", "citus.so")):
        raise CitusUnavailable(
            f"deploy/build-citus.sh exited {r.returncode}: {r.stdout}"
            f"{r.stderr}")


class CitusCluster:
    """nodes[0] is the coordinator, nodes[1:] the workers. Databases are
    made with .create_db(name): on every node, the extension created,
    the workers added."""

    def __init__(self, workers=2):
        ensure_built()
        self.nodes = []
        try:
            for _ in range(workers + 1):
                self.nodes.append(PgServer(extra_conf=CITUS_CONF))
        except Exception:
            self.shutdown()
            raise

    @property
    def coordinator(self):
        return self.nodes[0]

    @property
    def workers(self):
        return self.nodes[1:]

    def create_db(self, name):
        for n in self.nodes:
            n.ensure_running()
            n.psql(f"create database {name}")
            n.psql("create extension citus", db=name)
        c = self.coordinator
        c.psql(f"select citus_set_coordinator_host('127.0.0.1', {c.port})",
               db=name)
        for w in self.workers:
            c.psql(f"select citus_add_node('127.0.0.1', {w.port})", db=name)
        return c.url(name)

    def drop_db(self, name):
        for n in self.nodes:
            if n.running():
                n.psql(f"drop database if exists {name} with (force)",
                       check=False)

    def shutdown(self):
        for n in self.nodes:
            n.shutdown()
