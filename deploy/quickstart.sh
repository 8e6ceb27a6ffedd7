#!/bin/sh
# The main job, in one command: install what is needed, build idemproxy,
# start a demo upstream and idemproxy in front of it, show a request going
# through and its duplicate replayed, replay the article's experiments
# directly and through idemproxy, and leave both running.
#
#   ./deploy/quickstart.sh          start (or restart) the demo
#   ./deploy/quickstart.sh stop     stop what the last start left running
#
# Ports (override with the environment): IDEMPROXY_PORT=8080,
# UPSTREAM_PORT=9000, ADMIN_PORT=9090. Everything listens on 127.0.0.1.
set -eu
cd "$(dirname "$0")/.."
ROOT=$(pwd)
RUN="$ROOT/.quickstart"
PROXY_PORT=${IDEMPROXY_PORT:-8080}
UPSTREAM_PORT=${UPSTREAM_PORT:-9000}
ADMIN_PORT=${ADMIN_PORT:-9090}

stop() {
  for name in idemproxy upstream; do
    pidfile="$RUN/$name.pid"
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    # only a process we started: its command line names our binary
    if kill -0 "$pid" 2>/dev/null && grep -q "$ROOT" "/proc/$pid/cmdline" 2>/dev/null; then
      kill -TERM "$pid"
      i=0
      while kill -0 "$pid" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
      echo "stopped $name (pid $pid)"
    fi
    rm -f "$pidfile"
  done
}

if [ "${1:-}" = "stop" ]; then
  stop
  exit 0
fi

wait_http() {
  i=0
  until curl -fsS -o /dev/null "$1" 2>/dev/null; do
    i=$((i + 1))
    if [ $i -gt 100 ]; then echo "quickstart: $1 did not come up" >&2; return 1; fi
    sleep 0.1
  done
}

./deploy/install-deps.sh
if [ ! -f build/build.ninja ]; then
  meson setup build -Dbuildtype=release >/dev/null
fi
meson compile -C build >/dev/null
echo "quickstart: built build/proxy/idemproxy ($(build/proxy/idemproxy --version))"

stop >/dev/null
mkdir -p "$RUN"
for p in "$PROXY_PORT" "$UPSTREAM_PORT" "$ADMIN_PORT"; do
  if bash -c "exec 3<>/dev/tcp/127.0.0.1/$p" 2>/dev/null; then
    echo "quickstart: port $p on 127.0.0.1 is in use; set IDEMPROXY_PORT, UPSTREAM_PORT or ADMIN_PORT" >&2
    exit 1
  fi
done

# The demo upstream: tests/support/stub_upstream, a small HTTP/1.1 server
# that echoes each request and counts executions (GET /__stats).
nohup "$ROOT/build/tests/support/stub_upstream" --listen "127.0.0.1:$UPSTREAM_PORT" \
  >"$RUN/upstream.log" 2>&1 &
echo $! >"$RUN/upstream.pid"
nohup "$ROOT/build/proxy/idemproxy" \
  --upstream "http://127.0.0.1:$UPSTREAM_PORT" \
  --listen "127.0.0.1:$PROXY_PORT" \
  --admin-listen "127.0.0.1:$ADMIN_PORT" \
  >"$RUN/idemproxy.log" 2>&1 &
echo $! >"$RUN/idemproxy.pid"
wait_http "http://127.0.0.1:$ADMIN_PORT/healthz"

echo
echo "== a request through idemproxy =="
echo "\$ curl -si -X POST http://127.0.0.1:$PROXY_PORT/orders -H 'Idempotency-Key: demo-1' -d '{\"item\":42}'"
curl -si -X POST "http://127.0.0.1:$PROXY_PORT/orders" -H 'Idempotency-Key: demo-1' \
  -H 'Content-Type: application/json' -d '{"item":42}'
echo
echo
echo
echo "== the same request again: replayed, not executed =="
curl -si -X POST "http://127.0.0.1:$PROXY_PORT/orders" -H 'Idempotency-Key: demo-1' \
  -H 'Content-Type: application/json' -d '{"item":42}' | grep -E '^HTTP|^Idempotent-Replayed'
echo
echo "== the article's experiments (E1-E3), direct and through idemproxy =="
seed_status=0
./tests/bench/seed_experiments --upstream "http://127.0.0.1:$UPSTREAM_PORT" \
  --proxy "http://127.0.0.1:$PROXY_PORT" || seed_status=$?
echo
cat <<MSG
Running (logs and PIDs in $RUN/):
  idemproxy        http://127.0.0.1:$PROXY_PORT   (pid $(cat "$RUN/idemproxy.pid"))
  admin            http://127.0.0.1:$ADMIN_PORT/metrics  /healthz  /readyz
  demo upstream    http://127.0.0.1:$UPSTREAM_PORT  (pid $(cat "$RUN/upstream.pid")), executions: /__stats
Stop both with:    ./deploy/quickstart.sh stop
MSG
exit $seed_status
