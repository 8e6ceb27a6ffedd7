#!/bin/sh
# Install everything idemproxy's build, tests, benchmarks and demo need on
# Debian 12 (bookworm). Safe to run any number of times: packages already
# present are left as they are, and apt is only asked when one is missing.
set -eu

PACKAGES="
  build-essential pkg-config meson ninja-build
  libevent-dev libpq-dev libhiredis-dev libssl-dev libinih-dev libjson-c-dev
  libjemalloc-dev
  node-llhttp
  postgresql redis-server nginx wrk
  python3 python3-pytest python3-yaml
  curl procps ca-certificates
  clang libclang-rt-14-dev
  prometheus
  patroni etcd-server
  pgbouncer
  python3-websockets haproxy
"

# npm, for tests/integration/test_sdk_errors.py (stripe-node and openai,
# installed with npm ci): Debian's package (it brings nodejs along), unless
# an npm is on PATH already: a NodeSource nodejs ships its own npm and
# conflicts with Debian's (apt would remove that nodejs to install it).
if ! command -v npm >/dev/null 2>&1; then
  PACKAGES="$PACKAGES npm"
fi

missing=""
for p in $PACKAGES; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing="$missing $p"
  fi
done

if [ -z "$missing" ]; then
  echo "install-deps: all packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi

echo "install-deps: installing:$missing"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
# The Debian packages start their system-wide services; idemproxy's demo and
# tests run their own private instances on free ports and never use these.
# prometheus is here for promtool only (deploy/prometheus tests): its
# service would take port 9090, the admin port of the demo, so a service
# this script brought in is stopped and disabled.
case " $missing " in
*" prometheus "*)
  if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
    echo "install-deps: prometheus installed for promtool; its service disabled"
  fi
  ;;
esac
# etcd-server and patroni are for tests/ha, which start their own etcd and
# Patroni nodes in a temp dir: the packages' services are not wanted.
case " $missing " in
*" etcd-server "*|*" patroni "*)
  if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now etcd patroni >/dev/null 2>&1 || true
    echo "install-deps: etcd and patroni installed for tests/ha; their services disabled"
  fi
  ;;
esac
# pgbouncer is for tests/integration/test_pgbouncer.py, which starts its
# own in front of the tests' PostgreSQL.
case " $missing " in
*" pgbouncer "*)
  if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now pgbouncer >/dev/null 2>&1 || true
    echo "install-deps: pgbouncer installed for the tests; its service disabled"
  fi
  ;;
esac
# haproxy is for tests/integration/test_proxy_protocol.py (send-proxy in
# front of idemproxy), python3-websockets for test_websocket.py; the tests
# start their own haproxy on free ports.
case " $missing " in
*" haproxy "*)
  if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now haproxy >/dev/null 2>&1 || true
    echo "install-deps: haproxy installed for the tests; its service disabled"
  fi
  ;;
esac
echo "install-deps: done"
