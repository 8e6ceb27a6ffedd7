#!/bin/sh
# The main job, in one command: install what is needed, build idemproxy,
# start a demo upstream and idemproxy in front of it, show a request going
# through and its duplicate replayed, replay the article's experiments
# directly and through idemproxy, and leave both running.
#
#   ./deploy/quickstart.sh           start (or restart) the demo (memory store)
#   ./deploy/quickstart.sh postgres  the same on the real store: a private
#                                    PostgreSQL and Redis, two idemproxy
#                                    instances sharing them, the article's
#                                    E1 split across both, a key inspected
#   ./deploy/quickstart.sh stop      stop what the last start left running
#
# Ports (override with the environment): IDEMPROXY_PORT=8080,
# UPSTREAM_PORT=9000, ADMIN_PORT=9090; with postgres also IDEMPROXY2_PORT=8081,
# ADMIN2_PORT=9091, PG_PORT=55432, REDIS_PORT=56379. Everything listens on
# 127.0.0.1. QUICKSTART_DIR (default .quickstart) holds logs and PIDs.
set -eu
cd "$(dirname "$0")/.."
ROOT=$(pwd)
RUN=${QUICKSTART_DIR:-$ROOT/.quickstart}
MODE=${1:-memory}
PROXY_PORT=${IDEMPROXY_PORT:-8080}
UPSTREAM_PORT=${UPSTREAM_PORT:-9000}
ADMIN_PORT=${ADMIN_PORT:-9090}
PROXY2_PORT=${IDEMPROXY2_PORT:-8081}
ADMIN2_PORT=${ADMIN2_PORT:-9091}
PG_PORT=${PG_PORT:-55432}
REDIS_PORT=${REDIS_PORT:-56379}
PGBIN=${PG_BINDIR:-/usr/lib/postgresql/15/bin}

# PostgreSQL refuses to run as root: its commands run as the postgres
# user, from a directory it can enter
as_pg() {
  if [ "$(id -u)" -eq 0 ]; then
    (cd / && runuser -u postgres -- "$@")
  else
    (cd / && "$@")
  fi
}

stop() {
  for name in idemproxy idemproxy2 upstream redis; do
    pidfile="$RUN/$name.pid"
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    # only a process we started: its command line names our binary or port
    if kill -0 "$pid" 2>/dev/null &&
       { grep -q "$ROOT" "/proc/$pid/cmdline" 2>/dev/null ||
         { [ "$name" = redis ] && grep -q redis "/proc/$pid/cmdline" 2>/dev/null; }; }; then
      kill -TERM "$pid"
      i=0
      while kill -0 "$pid" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
      echo "stopped $name (pid $pid)"
    fi
    rm -f "$pidfile"
  done
  if [ -f "$RUN/pg.dir" ]; then
    pgdir=$(cat "$RUN/pg.dir")
    if [ -f "$pgdir/data/postmaster.pid" ]; then
      as_pg "$PGBIN/pg_ctl" -D "$pgdir/data" -m fast -w stop >/dev/null 2>&1 &&
        echo "stopped postgresql ($pgdir)"
    fi
    case "$pgdir" in /tmp/idemproxy-quickstart-pg.*) rm -rf "$pgdir" ;; esac
    rm -f "$RUN/pg.dir"
  fi
}

case "$MODE" in
stop)
  stop
  exit 0
  ;;
memory|postgres) ;;
*)
  echo "usage: ./deploy/quickstart.sh [postgres|stop]" >&2
  exit 2
  ;;
esac

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
ports="$PROXY_PORT $UPSTREAM_PORT $ADMIN_PORT"
if [ "$MODE" = postgres ]; then
  ports="$ports $PROXY2_PORT $ADMIN2_PORT $PG_PORT $REDIS_PORT"
fi
for p in $ports; do
  if bash -c "exec 3<>/dev/tcp/127.0.0.1/$p" 2>/dev/null; then
    echo "quickstart: port $p on 127.0.0.1 is in use; set IDEMPROXY_PORT, UPSTREAM_PORT, ADMIN_PORT (postgres: also IDEMPROXY2_PORT, ADMIN2_PORT, PG_PORT, REDIS_PORT)" >&2
    exit 1
  fi
done

# The demo upstream: tests/support/stub_upstream, a small HTTP/1.1 server
# that echoes each request and counts executions (GET /__stats).
nohup "$ROOT/build/tests/support/stub_upstream" --listen "127.0.0.1:$UPSTREAM_PORT" \
  >"$RUN/upstream.log" 2>&1 &
echo $! >"$RUN/upstream.pid"

if [ "$MODE" = postgres ]; then
  # A private PostgreSQL (in /tmp: the postgres user must reach it) and
  # Redis, as the tests start theirs; gone with ./deploy/quickstart.sh stop.
  pgdir=$(mktemp -d /tmp/idemproxy-quickstart-pg.XXXXXX)
  echo "$pgdir" >"$RUN/pg.dir"
  [ "$(id -u)" -ne 0 ] || chown postgres "$pgdir"
  as_pg "$PGBIN/initdb" -D "$pgdir/data" -U postgres -A trust -E UTF8 \
    --no-instructions >"$RUN/initdb.log" 2>&1
  cat >>"$pgdir/data/postgresql.conf" <<CONF
port = $PG_PORT
listen_addresses = '127.0.0.1'
unix_socket_directories = '$pgdir'
CONF
  as_pg "$PGBIN/pg_ctl" -D "$pgdir/data" -l "$pgdir/postgresql.log" -w start \
    >/dev/null
  nohup redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' \
    --appendonly no >"$RUN/redis.log" 2>&1 &
  echo $! >"$RUN/redis.pid"
  STORE="postgres://postgres@127.0.0.1:$PG_PORT/postgres"
  REDIS="redis://127.0.0.1:$REDIS_PORT"
  build/proxy/idemproxy migrate --store "$STORE"
  # two instances sharing the store, as two replicas behind a balancer
  nohup "$ROOT/build/proxy/idemproxy" --upstream "http://127.0.0.1:$UPSTREAM_PORT" \
    --listen "127.0.0.1:$PROXY_PORT" --admin-listen "127.0.0.1:$ADMIN_PORT" \
    --store "$STORE" --redis "$REDIS" >"$RUN/idemproxy.log" 2>&1 &
  echo $! >"$RUN/idemproxy.pid"
  nohup "$ROOT/build/proxy/idemproxy" --upstream "http://127.0.0.1:$UPSTREAM_PORT" \
    --listen "127.0.0.1:$PROXY2_PORT" --admin-listen "127.0.0.1:$ADMIN2_PORT" \
    --store "$STORE" --redis "$REDIS" >"$RUN/idemproxy2.log" 2>&1 &
  echo $! >"$RUN/idemproxy2.pid"
  wait_http "http://127.0.0.1:$ADMIN_PORT/readyz"
  wait_http "http://127.0.0.1:$ADMIN2_PORT/readyz"

  KEY="order-$(date +%s)-$$"
  echo
  echo "== the article's E1 on two instances: 8 clicks on \"submit order\", 4 to each, at once =="
  e1_status=0
  /usr/bin/python3 - "$PROXY_PORT" "$PROXY2_PORT" "$UPSTREAM_PORT" "$KEY" <<'PY' || e1_status=$?
import http.client, json, sys, threading
p1, p2, up, key = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
body = b'{"item":"book","amount":100}'
ports = [p1, p2] * 4
barrier = threading.Barrier(len(ports))
out = [None] * len(ports)

def click(i):
    c = http.client.HTTPConnection("127.0.0.1", ports[i], timeout=30)
    c.connect()
    barrier.wait()
    c.request("POST", "/orders", body, {"Idempotency-Key": key,
                                        "Content-Type": "application/json"})
    r = c.getresponse()
    out[i] = (r.status, r.getheader("Idempotent-Replayed") == "true", r.read())
    c.close()

threads = [threading.Thread(target=click, args=(i,)) for i in range(len(ports))]
for t in threads: t.start()
for t in threads: t.join()
for i, (status, replayed, data) in enumerate(out):
    print(f"  click {i + 1} -> instance {1 + i % 2} (:{ports[i]}): {status}"
          f"{'  replayed' if replayed else '  executed'}")
c = http.client.HTTPConnection("127.0.0.1", up, timeout=10)
c.request("GET", "/__stats")
orders = json.loads(c.getresponse().read())["keys"].get(key, 0)
answers = {(s, d) for s, _, d in out}
print(f"orders created at the upstream: {orders}; distinct answers: {len(answers)} of {len(out)}")
sys.exit(0 if orders == 1 and len(answers) == 1 and out[0][0] == 200 else 1)
PY
  echo
  echo "== the key, as instance 2 sees it (its admin listener) =="
  echo "\$ curl -s http://127.0.0.1:$ADMIN2_PORT/keys/$KEY"
  curl -s "http://127.0.0.1:$ADMIN2_PORT/keys/$KEY"
  echo
  cat <<MSG
Running (logs and PIDs in $RUN/, PostgreSQL in $pgdir):
  idemproxy 1      http://127.0.0.1:$PROXY_PORT   admin http://127.0.0.1:$ADMIN_PORT  (pid $(cat "$RUN/idemproxy.pid"))
  idemproxy 2      http://127.0.0.1:$PROXY2_PORT   admin http://127.0.0.1:$ADMIN2_PORT  (pid $(cat "$RUN/idemproxy2.pid"))
  PostgreSQL       $STORE
  Redis            $REDIS  (pid $(cat "$RUN/redis.pid"))
  demo upstream    http://127.0.0.1:$UPSTREAM_PORT  (pid $(cat "$RUN/upstream.pid")), executions: /__stats
Inspect a key:     curl -s http://127.0.0.1:$ADMIN_PORT/keys/KEY
Stop everything:   ./deploy/quickstart.sh stop
MSG
  exit $e1_status
fi

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
