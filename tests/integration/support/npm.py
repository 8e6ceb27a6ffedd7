"""Pinned npm packages for the tests that run real node clients and
servers (test_sdk_errors.py's SDKs, otel_node.py's traced upstream).

Each package set is a directory of the source tree holding package.json
and package-lock.json; `npm ci --ignore-scripts` installs it into the
build directory (<build>/tests/support/NAME), or into $ENV_VAR, or
$XDG_CACHE_HOME/idemproxy/NAME (~/.cache by default) for a binary outside a
build directory; never the source tree, and again only when either file
changed. No node or npm: NodeUnavailable (callers skip); a failing `npm ci`:
AssertionError (callers fail).
"""
import os
import shutil
import subprocess
from pathlib import Path

from .procs import IDEMPROXY_BIN

PACKAGE_FILES = ("package.json", "package-lock.json")


class NodeUnavailable(RuntimeError):
    """node or npm is not installed."""


def tools():
    """(node, npm) paths; NodeUnavailable when either is missing."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        raise NodeUnavailable("node/npm are not installed "
                              "(deploy/install-deps.sh installs Debian's)")
    return node, npm


def install_dir(name, env_var):
    """Where the package set `name` is installed (see the module's text)."""
    if os.environ.get(env_var):
        return Path(os.environ[env_var])
    build = Path(IDEMPROXY_BIN).resolve().parent.parent
    if (build / "meson-info").is_dir():
        return build / "tests" / "support" / name
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "idemproxy" / name


def install(src, dest):
    """`npm ci` of the package set in directory `src` into `dest`, unless
    dest already holds that very install; returns dest."""
    _, npm = tools()
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    wanted = {n: (Path(src) / n).read_bytes() for n in PACKAGE_FILES}
    installed = (dest / "node_modules" / ".package-lock.json").is_file() and \
        all((dest / n).is_file() and (dest / n).read_bytes() == data
            for n, data in wanted.items())
    if not installed:
        for n, data in wanted.items():
            (dest / n).write_bytes(data)
        r = subprocess.run([npm, "ci", "--ignore-scripts", "--no-audit",
                            "--no-fund", "--loglevel=error"], cwd=dest,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, \
            f"npm ci in {dest} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return dest
