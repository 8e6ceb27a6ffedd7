#!/usr/bin/env bash
# tests/bench/keyed.sh - keyed-request benchmark (issues 3, 4 and 9), in one run:
#
#  A. memory store: 1 KiB POST through idemproxy --store memory
#       pass        no key (post1k.lua: request built once)
#       pass-lua    no key, built per request by keyed_unique.lua
#                   (KEYED_NOKEY=1): same wrk cost as the unique-key row
#       unique      a new Idempotency-Key per request: claim, forward,
#                   capture, complete (keyed_unique.lua)
#       same        one key: the first request wins, every later one is a
#                   replay with no upstream hop (keyed_same.lua)
#     goals: same / pass >= 1.5x, unique / pass-lua >= 0.9x
#  B. PostgreSQL 15 (private cluster, fsync on, synchronous_commit on)
#       nginx        proxy_pass of the same POST (tests/bench/nginx.conf.in)
#       pgbench      the exact claim and complete statements of a new key
#                    (pgbench_claim.py, -M prepared), two implicit
#                    transactions per key, as many clients as wrk has
#                    connections
#       app          the application's ceiling (issue 22): what doing it in
#                    the application costs, one INSERT claiming the key and
#                    one UPDATE storing the response, two implicit
#                    transactions, no NOTIFY, on a plain table
#                    (app_keys.sql, -M prepared, same clients)
#       pg-unique    idemproxy --store postgres://..., unique keys
#                    (response cache at its default)
#       pg-pass      the same idemproxy, no key (post1k.lua)
#       pg-same-nc   idemproxy --store postgres://... --response-cache 0,
#                    one key: every replay is a claim read from PostgreSQL
#       pg-same      idemproxy --store postgres://... (response cache at its
#                    default, 64MiB), one key: replays from the cache
#       pgr-same-nc  idemproxy --store postgres://... --redis ...
#                    --response-cache 0, one key: replays from Redis
#       pgr-same     the same with the response cache: replays from the cache
#     goals: pg-unique >= 0.8x pgbench tps (issue 4); pgr-same >= 1.0x nginx;
#     issue 9: pg-unique / pgbench >= 1.0x at c=8 and >= 1.5x at c=32;
#     issue 22: pg-unique / app >= 1.0x at c=8 and >= 1.5x at c=32;
#     replays from PostgreSQL without Redis (pg-same-nc; pg-same shown too)
#     >= 1.0x pg-pass at c=32 (moonshot: >= mem-same)
#  C. PostgreSQL work per new key: one more run of pgbench, of app, of pgbench-wk
#     (the same with the wake-up transaction, pgbench_claim.py --wake: what
#     a completion somebody waited for costs more) and of pg-unique per
#     concurrency, with pg_stat_database (database bench) and pg_stat_wal
#     read STATS_SETTLE seconds after the previous activity (PostgreSQL 15
#     backends publish their counters at most once a second while busy, and
#     10 s after going idle): commits, WAL writes, WAL syncs (fdatasync),
#     WAL bytes, rows inserted and updated, per key; and where bench's
#     backends were (pg_stat_activity wait events, every 50 ms).
#
# Not a test: prints figures and the goal checks; exits 0 unless something
# broke (a run with errors, or requests that did not take the path the row
# is about, is flagged in the output).
#
#   tests/bench/keyed.sh
#   CONNS_LIST="8 32" REPEAT=3 DURATION=5s tests/bench/keyed.sh   # defaults
#
# Environment (defaults):
#   CONNS_LIST="8 32"  wrk -c and pgbench -c, each measured
#   WORKERS=1          idemproxy --workers, nginx worker_processes
#   THREADS=1          wrk -t
#   PGBENCH_JOBS=2     pgbench -j
#   DURATION=5s        per measurement (wrk -d, pgbench -T)
#   WARMUP=2s          one unmeasured run per target and concurrency
#   REPEAT=3           measurements per target; median shown; targets are
#                      interleaved in every round
#   PG=1               0: part A only (no PostgreSQL, Redis, pgbench)
#   ACCOUNT=1          0: skip part C
#   ONLY=""            the targets to measure, e.g. ONLY="app pg-unique"
#                      (default: all; goals need both of their rows)
#   STATS_SETTLE=11    seconds to wait before reading PostgreSQL's counters
#   STORE_CONNECTIONS  idemproxy --store-connections (unset: its default, 4)
#   REDO_OTHER=10      a run during which more than this % of the machine's
#   REDO_MAX=12        CPU went to other processes (another session's tests)
#                      or to hypervisor steal is measured again, at most
#                      REDO_MAX times in all (0: never); the last one counts
#   MEMORY_MAX=6GiB    idemproxy --memory-max-bytes: unique keys stay in the
#                      store for --ttl (24h); 256MiB would fill in seconds
#   MEMORY_TTL         the memory store's --ttl (unset: its default, 24h). A
#                      short one with a small MEMORY_MAX (MEMORY_TTL=1s
#                      MEMORY_MAX=64MiB) measures the store as a process that
#                      has run longer than --ttl has it: full, every new key
#                      in the memory of one that expired, where the default
#                      measures a store that only grows
#   PG_BINDIR=/usr/lib/postgresql/15/bin  REDIS=redis-server
#   IDEMPROXY_BIN, STUB_BIN, BUILD_DIR (default build-bench, release)
#   NGINX=nginx WRK=wrk PYTHON=/usr/bin/python3
#
# Every row shows the CPU time per request of the proxy (idemproxy, nginx;
# for pgbench: pgbench itself) and of the store (the PostgreSQL server and
# its backends, plus redis-server), from /proc over the run.
#
# Each idemproxy on PostgreSQL has a database of its own (bench: pg and
# pgbench; bench0: pg0; benchr: pgr; benchr0: pgr0), so that completions
# NOTIFY only the listener of the instance that made them (and pgbench's
# those of pg, as pg-unique's do) and part C counts one instance's work.
#
# Everything listens on 127.0.0.1 on free ports; every process started here
# is stopped by PID on exit, failure or Ctrl-C (PostgreSQL by pg_ctl, then
# its postmaster PID).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=tests/bench/lib.sh
. "$HERE/lib.sh"

CONNS_LIST=${CONNS_LIST:-8 32}
WORKERS=${WORKERS:-1}
THREADS=${THREADS:-1}
PGBENCH_JOBS=${PGBENCH_JOBS:-2}
DURATION=${DURATION:-5s}
WARMUP=${WARMUP:-2s}
REPEAT=${REPEAT:-3}
PG=${PG:-1}
ACCOUNT=${ACCOUNT:-1}
STATS_SETTLE=${STATS_SETTLE:-11}
STORE_CONNECTIONS=${STORE_CONNECTIONS:-}
REDO_OTHER=${REDO_OTHER:-10}
REDO_MAX=${REDO_MAX:-12}
MEMORY_MAX=${MEMORY_MAX:-6GiB}
MEMORY_TTL=${MEMORY_TTL:-}
PG_BINDIR=${PG_BINDIR:-/usr/lib/postgresql/15/bin}
REDIS=${REDIS:-redis-server}
BUILD_DIR=${BUILD_DIR:-$ROOT/build-bench}
NGINX=${NGINX:-nginx}
WRK=${WRK:-wrk}
PYTHON=${PYTHON:-/usr/bin/python3}
LEASE_MS=30000		# idemproxy's default --lease
TTL_MS=86400000		# idemproxy's default --ttl

die() { echo "keyed.sh: $*" >&2; exit 1; }
note() { echo "# $*" >&2; }

for tool in "$NGINX" "$WRK" "$PYTHON" curl; do
	command -v "$tool" >/dev/null || die "$tool not found (deploy/install-deps.sh installs it)"
done
[[ $REPEAT =~ ^[1-9][0-9]*$ ]] || die "REPEAT must be a positive integer"
[[ $DURATION =~ ^[1-9][0-9]*s$ ]] || die "DURATION must be seconds, e.g. 5s"
[[ $WARMUP =~ ^[1-9][0-9]*s$ ]] || die "WARMUP must be seconds, e.g. 2s"
[[ $STATS_SETTLE =~ ^[0-9]+$ ]] || die "STATS_SETTLE must be seconds, e.g. 11"
[[ $REDO_OTHER =~ ^[0-9]+$ && $REDO_MAX =~ ^[0-9]+$ ]] || die "REDO_OTHER, REDO_MAX: integers"
[[ -z $STORE_CONNECTIONS || $STORE_CONNECTIONS =~ ^[1-9][0-9]*$ ]] ||
	die "STORE_CONNECTIONS must be a positive integer"
if [[ $PG == 1 ]]; then
	for b in initdb pg_ctl pgbench psql; do
		[[ -x $PG_BINDIR/$b ]] || die "$PG_BINDIR/$b missing (PostgreSQL 15)"
	done
	command -v "$REDIS" >/dev/null || die "$REDIS not found"
	if [[ $(id -u) == 0 ]]; then
		command -v runuser >/dev/null || die "runuser missing: PostgreSQL refuses root"
		id postgres >/dev/null 2>&1 || die "no postgres user"
	fi
fi

# ---- build --------------------------------------------------------------
bench_binaries

# ---- processes --------------------------------------------------------------
TMP=$(mktemp -d /tmp/ikb.XXXXXX)	# short: PostgreSQL's socket lives here
chmod 711 "$TMP"			# the postgres user must reach $TMP/pg
ulimit -Hn 65536 2>/dev/null || true	# nginx asks for 65536 (nginx.conf.in)
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
PIDS=()
PG_DATA=""

AS_PG=()
pg_stop() {
	[[ -n $PG_DATA && -f $PG_DATA/postmaster.pid ]] || return 0
	local pid
	pid=$(head -n1 "$PG_DATA/postmaster.pid" 2>/dev/null || true)
	(cd / && timeout 60 "${AS_PG[@]}" "$PG_BINDIR/pg_ctl" -D "$PG_DATA" -w -t 30 \
		-m fast stop >/dev/null 2>&1) || true
	if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
		kill -KILL "$pid" 2>/dev/null || true
	fi
}

bench_stop_more() { pg_stop; }
bench_trap

# The same nginx as tests/bench/passthrough.sh (tests/bench/nginx.conf.in).
start_nginx() {
	NGINX_PORT=$(free_port)
	mkdir -p "$TMP/nginx"
	sed -e "s|@WORKERS@|$WORKERS|g" -e "s|@PREFIX@|$TMP/nginx|g" \
	    -e "s|@UPSTREAM_PORT@|$STUB_PORT|g" -e "s|@PORT@|$NGINX_PORT|g" \
	    "$HERE/nginx.conf.in" >"$TMP/nginx/nginx.conf"
	"$NGINX" -c "$TMP/nginx/nginx.conf" -p "$TMP/nginx" \
		-e "$TMP/nginx/error.log" >"$TMP/nginx.log" 2>&1 &
	NGINX_PID=$!
	PIDS+=("$NGINX_PID")
	wait_port "$NGINX_PORT" "$NGINX_PID"
}

declare -A PPORT APORT PPID_OF
start_idemproxy() {	# start_idemproxy NAME [flags...]
	local name=$1
	shift
	PPORT[$name]=$(free_port)
	APORT[$name]=$(free_port)
	"$IDEMPROXY_BIN" --upstream "http://127.0.0.1:$STUB_PORT" \
		--listen "127.0.0.1:${PPORT[$name]}" \
		--admin-listen "127.0.0.1:${APORT[$name]}" \
		--workers "$WORKERS" --log-level warn --drain-timeout 1s "$@" \
		>"$TMP/idemproxy-$name.log" 2>&1 &
	PPID_OF[$name]=$!
	PIDS+=("${PPID_OF[$name]}")
	wait_port "${PPORT[$name]}" "${PPID_OF[$name]}"
	local i
	for i in $(seq 100); do	# /readyz: the store is up
		[[ $(curl -s -o /dev/null -w '%{http_code}' \
			"http://127.0.0.1:${APORT[$name]}/readyz") == 200 ]] && return 0
		sleep 0.1
	done
	die "idemproxy $name not ready after 10 s"
}

pg_sh() { (cd / && "${AS_PG[@]}" "$@"); }
psql_c() {	# psql_c DB SQL
	"$PG_BINDIR/psql" -h 127.0.0.1 -p "$PG_PORT" -U postgres -d "$1" \
		-v ON_ERROR_STOP=1 -Atqc "$2"
}

start_pg() {
	PG_PORT=$(free_port)
	mkdir -p "$TMP/pg" "$TMP/pg/d" "$TMP/pg/s"
	if [[ $(id -u) == 0 ]]; then
		chown -R postgres: "$TMP/pg"
		AS_PG=(runuser -u postgres --)
	fi
	chmod 700 "$TMP/pg/d"
	PG_DATA=$TMP/pg/d
	pg_sh "$PG_BINDIR/initdb" -D "$PG_DATA" -U postgres -A trust -E UTF8 \
		--no-instructions >"$TMP/initdb.log" 2>&1 || die "initdb failed: $(tail -5 "$TMP/initdb.log")"
	# Durable defaults: fsync, synchronous_commit and full_page_writes stay
	# ON. Bigger WAL and buffers than the 128MB/1GB defaults only keep a
	# checkpoint out of a 5-minute benchmark, as a production server would.
	cat >>"$PG_DATA/postgresql.conf" <<-EOF
	port = $PG_PORT
	listen_addresses = '127.0.0.1'
	unix_socket_directories = '$TMP/pg/s'
	max_connections = 300
	shared_buffers = 512MB
	max_wal_size = 8GB
	checkpoint_timeout = 30min
	log_min_messages = warning
	EOF
	pg_sh "$PG_BINDIR/pg_ctl" -D "$PG_DATA" -w -t 60 -l "$TMP/pg/pg.log" start \
		>/dev/null || die "pg_ctl start failed: $(tail -5 "$TMP/pg/pg.log")"
	PG_PID=$(head -n1 "$PG_DATA/postmaster.pid")
	local db
	for db in bench bench0 benchr benchr0; do
		psql_c postgres "CREATE DATABASE $db" >/dev/null
	done
	# the application's own table (row app, app_keys.sql)
	psql_c bench "CREATE TABLE app_keys (scope text NOT NULL, key text NOT NULL,
		fingerprint bytea NOT NULL, state text NOT NULL, status int,
		headers bytea, body bytea, locked_until timestamptz,
		created_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (scope, key))" >/dev/null
	PG_SETTINGS=$(psql_c postgres "SELECT string_agg(name || '=' || setting, ' ' ORDER BY name)
		FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit',
		'full_page_writes', 'wal_sync_method', 'commit_delay')")
	PG_SETTINGS+=" shared_buffers=$(psql_c postgres "SHOW shared_buffers")"
	PG_VERSION=$(psql_c postgres "SHOW server_version")
	# what one commit's WAL flush costs on this disk (wal_sync_method)
	FSYNC=$("$PG_BINDIR/pg_test_fsync" -s 1 -f "$TMP/pg/fsync.test" 2>/dev/null |
		awk '/one 8kB write/ { s = 1 } s && $1 == "fdatasync" { print $(NF - 1), "us/op"; exit }')
}

start_redis() {
	REDIS_PORT=$(free_port)
	"$REDIS" --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
		--daemonize no --dir "$TMP" >"$TMP/redis.log" 2>&1 &
	REDIS_PID=$!
	PIDS+=("$REDIS_PID")
	wait_port "$REDIS_PORT" "$REDIS_PID"
}

# CPU time (user + system) in clock ticks of PIDS; for the postmaster, also
# its live children and the ones it reaped (cutime/cstime), so backends
# that ended during the run (pgbench's) are counted.
cpu_ticks() {
	local sum=0 pid v c
	for pid in "$@"; do
		[[ -r /proc/$pid/stat ]] || continue
		if [[ -n ${PG_PID:-} && $pid == "$PG_PID" ]]; then
			v=$(sed 's/^.*) //' "/proc/$pid/stat" | awk '{ print $12 + $13 + $14 + $15 }')
			for c in $(cat /proc/"$pid"/task/*/children 2>/dev/null); do
				v=$((v + $(sed 's/^.*) //' "/proc/$c/stat" 2>/dev/null |
					awk '{ print $12 + $13 }' || echo 0)))
			done
		else
			v=$(sed 's/^.*) //' "/proc/$pid/stat" | awk '{ print $12 + $13 }')
		fi
		sum=$((sum + v))
	done
	echo "$sum"
}

metric() {	# metric NAME 'outcome="replayed"'-style label or ''
	curl -s "http://127.0.0.1:${APORT[$1]}/metrics" | awk -v m="$2" '
		index($0, m) == 1 { sub(/.* /, ""); s += $0 } END { print s + 0 }'
}

HZ=$(getconf CLK_TCK)
NCPU=$(nproc)

# Disturbance: the CPU that neither this run's processes nor its load
# generator used (another session's tests, say), plus the hypervisor's
# steal, as a share of the machine over the run. Interrupt time is left
# out: it is mostly this run's own disk flushes and loopback traffic.
machine_ticks() {	# user + nice + system + steal ticks of the machine
	local u n sy st
	read -r _ u n sy _ _ _ _ st _ </proc/stat
	echo $((u + n + sy + st))
}
# `times >FILE0` ... `times >FILE1` in the shell that waits for the load
# generator (not in a $(...) subshell, which has children of its own):
child_ticks() {	# child_ticks FILE0 FILE1: CPU of the children waited for between
	awk -v hz="$HZ" 'FNR == 2 { t = 0
		for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); t += a[1] * 60 + a[2] }
		v[++f] = t }
		END { printf "%d\n", (v[2] - v[1]) * hz + 0.5 }' "$1" "$2"
}
other_pct() {	# other_pct MACHINE_TICKS OUR_TICKS WALL_S
	awk -v m="$1" -v o="$2" -v w="$3" -v hz="$HZ" -v n="$NCPU" 'BEGIN {
		v = w > 0 ? (m - o) / hz / (w * n) * 100 : 0; printf "%.1f", (v < 0 ? 0 : v) }'
}

# ---- one measurement ------------------------------------------------------
# run_wrk URL DUR LUA "PROXY_PIDS" "STORE_PIDS" [VAR=VALUE...]:
# prints "rps p50_ms p99_ms errors proxy_us store_us requests"
run_wrk() {
	local url=$1 dur=$2 lua=$3 ppids=$4 spids=$5 out p0 p1 s0 s1 k0 k1 c0 c1 m0 m1 w0 w1 oth
	shift 5
	local args=(-t"$THREADS" -c"$CONNS" -d"$dur" --latency -s "$lua")
	# shellcheck disable=SC2086
	p0=$(cpu_ticks $ppids); s0=$(cpu_ticks $spids); k0=$(cpu_ticks "$STUB_PID")
	m0=$(machine_ticks); times >"$TMP/times0"; w0=$EPOCHREALTIME
	out=$(env "$@" timeout $((${dur%s} + 30)) "$WRK" "${args[@]}" "$url") ||
		die "wrk failed against $url"
	w1=$EPOCHREALTIME; times >"$TMP/times1"; m1=$(machine_ticks)
	c1=$(child_ticks "$TMP/times0" "$TMP/times1"); c0=0
	# shellcheck disable=SC2086
	p1=$(cpu_ticks $ppids); s1=$(cpu_ticks $spids); k1=$(cpu_ticks "$STUB_PID")
	oth=$(other_pct $((m1 - m0)) $((p1 - p0 + s1 - s0 + k1 - k0 + c1 - c0)) \
		"$(awk -v a="$w0" -v b="$w1" 'BEGIN { print b - a }')")
	awk -v pt=$((p1 - p0)) -v st=$((s1 - s0)) -v hz="$HZ" -v oth="$oth" '
	function ms(v) {
		if (v ~ /us$/) return substr(v, 1, length(v) - 2) / 1000
		if (v ~ /ms$/) return substr(v, 1, length(v) - 2) + 0
		if (v ~ /m$/)  return substr(v, 1, length(v) - 1) * 60000
		if (v ~ /s$/)  return substr(v, 1, length(v) - 1) * 1000
		return v + 0
	}
	/^Requests\/sec:/ { rps = $2 }
	/ requests in / { n = $1 }
	/^ +50%/ { p50 = ms($2) }
	/^ +99%/ { p99 = ms($2) }
	/Non-2xx or 3xx responses:/ { err += $NF }
	/Socket errors:/ {
		for (i = 3; i <= NF; i++) if ($i ~ /^[0-9]+,?$/) err += $i + 0
	}
	END { printf "%.0f %.3f %.3f %d %.2f %.2f %d %s\n", rps, p50, p99, err,
		(n > 0 ? pt * 1e6 / hz / n : 0), (n > 0 ? st * 1e6 / hz / n : 0), n, oth }
	' <<<"$out"
}

# run_pgbench DUR [SCRIPT]: same output; latency percentiles from pgbench's
# per-transaction log (-l), proxy CPU = pgbench itself.
run_pgbench() {
	local dur=${1%s} script=${2:-$TMP/claim.sql} s0 s1 pid rc=0 c0 c1 m0 m1 w0 w1 oth
	rm -f "$TMP"/pgb.*
	s0=$(cpu_ticks "$PG_PID")
	m0=$(machine_ticks); times >"$TMP/times0"; w0=$EPOCHREALTIME
	"$PG_BINDIR/pgbench" -h 127.0.0.1 -p "$PG_PORT" -U postgres \
		-n -M prepared -f "$script" -c "$CONNS" -j "$PGBENCH_JOBS" -T "$dur" \
		-l --log-prefix="$TMP/pgb" \
		-D scope=- -D "fp=\\x$FP_HEX" -D "lease=$LEASE_MS" -D "ttl=$TTL_MS" \
		-D "status=$ST_STATUS" -D "headers=\\x$ST_HEADERS" -D "body=\\x$ST_BODY" \
		bench >"$TMP/pgbench.out" 2>"$TMP/pgbench.log" &
	pid=$!
	# pgbench's own CPU: sampled just before it exits
	local pt=0 v
	while kill -0 "$pid" 2>/dev/null; do
		v=$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | awk '{ print $12 + $13 }' || true)
		[[ -n $v ]] && pt=$v
		sleep 0.2
	done
	wait "$pid" || rc=$?
	w1=$EPOCHREALTIME; times >"$TMP/times1"; m1=$(machine_ticks)
	c1=$(child_ticks "$TMP/times0" "$TMP/times1"); c0=0
	[[ $rc == 0 ]] || die "pgbench failed: $(tail -5 "$TMP/pgbench.log")"
	s1=$(cpu_ticks "$PG_PID")
	# ours: PostgreSQL, pgbench and this loop's samplers (children waited for)
	oth=$(other_pct $((m1 - m0)) $((s1 - s0 + c1 - c0)) \
		"$(awk -v a="$w0" -v b="$w1" 'BEGIN { print b - a }')")
	local n tps fails
	n=$(awk '/^number of transactions actually processed:/ { print $NF }' "$TMP/pgbench.out")
	tps=$(awk '/^tps = / { print $3; exit }' "$TMP/pgbench.out")
	fails=$(awk '/^number of failed transactions:/ { print $5 }' "$TMP/pgbench.out")
	cat "$TMP"/pgb.* | awk '{ print $3 }' | sort -n | awk -v n="$n" -v tps="$tps" \
		-v f="${fails:-0}" -v pt="$pt" -v st=$((s1 - s0)) -v hz="$HZ" -v oth="$oth" '
		{ v[NR] = $1 }
		END {
			p50 = v[int(NR * 0.50) > 0 ? int(NR * 0.50) : 1] / 1000
			p99 = v[int(NR * 0.99) > 0 ? int(NR * 0.99) : 1] / 1000
			printf "%.0f %.3f %.3f %d %.2f %.2f %d %s\n", tps, p50, p99, f,
				(n > 0 ? pt * 1e6 / hz / n : 0), (n > 0 ? st * 1e6 / hz / n : 0), n, oth
		}'
}

# ---- machine facts --------------------------------------------------------------
git_rev=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [[ -n $(git -C "$ROOT" status --porcelain -- proxy common 2>/dev/null) ]]; then
	git_rev="$git_rev (proxy/ or common/ modified)"
fi
[[ $BIN_ORIGIN == built ]] || git_rev="n/a (binary given as IDEMPROXY_BIN)"
echo "== idemproxy keyed-request benchmark"
echo "command:   CONNS_LIST=\"$CONNS_LIST\" WORKERS=$WORKERS THREADS=$THREADS" \
     "PGBENCH_JOBS=$PGBENCH_JOBS DURATION=$DURATION WARMUP=$WARMUP REPEAT=$REPEAT PG=$PG $0 $*"
echo "date:      $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "machine:   $(nproc) CPUs (shared by wrk/pgbench, the proxy, the stub, PostgreSQL, Redis)," \
     "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)," \
     "$(awk '/^MemTotal:/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo), Linux $(uname -r)"
echo "disk:      $(df -T "$TMP" | awk 'NR == 2 { print $2, $1 }') ($TMP)"
echo "idemproxy: $("$IDEMPROXY_BIN" --version 2>&1 | head -n1), git $git_rev, $IDEMPROXY_BIN"
echo "nginx:     $("$NGINX" -v 2>&1 | sed 's/^nginx version: //'), wrk: $("$WRK" -v 2>&1 | head -n1 | awk '{ print $2 }')"

start_stub
start_nginx
start_idemproxy mem --store memory --memory-max-bytes "$MEMORY_MAX" \
	${MEMORY_TTL:+--ttl "$MEMORY_TTL"}
echo "memory:    --memory-max-bytes $MEMORY_MAX, --ttl ${MEMORY_TTL:-default (24h)}"
if [[ $PG == 1 ]]; then
	start_pg
	start_redis
	echo "postgres:  $PG_VERSION, $PG_SETTINGS"
	echo "           pg_test_fsync: one 8kB write + fdatasync ${FSYNC:-?} on this disk"
	echo "redis:     $("$REDIS" --version | awk '{ print $3 }'), --save '' --appendonly no"
	# pg and pgr: the response cache at its default (64MiB); pg0, pgr0:
	# --response-cache 0, every replay from PostgreSQL or Redis
	PGC=()
	[[ -n $STORE_CONNECTIONS ]] && PGC=(--store-connections "$STORE_CONNECTIONS")
	start_idemproxy pg --store "postgres://postgres@127.0.0.1:$PG_PORT/bench" "${PGC[@]}"
	start_idemproxy pg0 --store "postgres://postgres@127.0.0.1:$PG_PORT/bench0" "${PGC[@]}" \
		--response-cache 0
	start_idemproxy pgr --store "postgres://postgres@127.0.0.1:$PG_PORT/benchr" "${PGC[@]}" \
		--redis "redis://127.0.0.1:$REDIS_PORT/0"
	start_idemproxy pgr0 --store "postgres://postgres@127.0.0.1:$PG_PORT/benchr0" "${PGC[@]}" \
		--redis "redis://127.0.0.1:$REDIS_PORT/1" --response-cache 0
	echo "stores:    --store-connections ${STORE_CONNECTIONS:-default (4)};" \
	     "response cache: pg, pgr default (64MiB); pg0, pgr0 --response-cache 0"
	# What idemproxy stores for this request (status, head, body), so that
	# pgbench writes the same bytes; and the exact statements.
	curl -s -o /dev/null -X POST -H 'Idempotency-Key: pgbench-sample' \
		-H 'Content-Type: application/octet-stream' \
		--data-binary "$(head -c 1024 /dev/zero | tr '\0' x)" \
		"http://127.0.0.1:${PPORT[pg]}/" || die "sample request failed"
	IFS="|" read -r ST_STATUS ST_HEADERS ST_BODY FP_HEX < <(psql_c bench "SELECT status,
		encode(headers, 'hex'), encode(body, 'hex'), encode(fingerprint, 'hex')
		FROM idempotency_keys WHERE key = 'pgbench-sample' AND state = 'completed'")
	[[ -n ${ST_BODY:-} ]] || die "idemproxy stored no sample row"
	"$PYTHON" "$HERE/pgbench_claim.py" "$ROOT/common/store/store_pg.c" >"$TMP/claim.sql"
	"$PYTHON" "$HERE/pgbench_claim.py" --wake "$ROOT/common/store/store_pg.c" \
		>"$TMP/claim-wake.sql"
	echo "stored:    status $ST_STATUS, head $(( ${#ST_HEADERS} / 2 )) B, body $(( ${#ST_BODY} / 2 )) B per key (pgbench writes the same)"
fi
echo "load:      wrk -t$THREADS -c{$CONNS_LIST} --latency, pgbench -M prepared -j$PGBENCH_JOBS" \
     "-c{$CONNS_LIST}, $DURATION each, median of $REPEAT, workers $WORKERS"
echo

# ---- targets -------------------------------------------------------------------
# name | kind (wrk/pgbench) | url | lua | proxy pids | store pids | env | check
NGINX_WORKERS=$(cat /proc/"$NGINX_PID"/task/*/children | tr '\n' ' ')
TARGETS=(mem-pass mem-pass-lua mem-unique mem-same)
[[ $PG == 1 ]] && TARGETS+=(nginx pgbench app pg-unique pg-pass pg-same-nc pg-same pgr-same-nc pgr-same)
if [[ -n ${ONLY:-} ]]; then
	for t in $ONLY; do
		[[ " ${TARGETS[*]} " == *" $t "* ]] || die "ONLY: no target $t"
	done
	read -r -a TARGETS <<<"$ONLY"
fi
declare -A T_URL T_LUA T_PP T_SP T_ENV T_SRV T_CHECK T_DESC
def() { T_SRV[$1]=$2; T_LUA[$1]=$3; T_ENV[$1]=$4; T_CHECK[$1]=$5; T_DESC[$1]=$6; }
def mem-pass     mem "$HERE/post1k.lua"       ""            passthrough "memory, no key (static request)"
def mem-pass-lua mem "$HERE/keyed_unique.lua" KEYED_NOKEY=1 passthrough "memory, no key (per-request Lua)"
def mem-unique   mem "$HERE/keyed_unique.lua" ""            forwarded   "memory, unique keys (all win)"
def mem-same     mem "$HERE/keyed_same.lua"   "KEYED_KEY=same-mem-$RANDOM$RANDOM" replayed "memory, one key (replays)"
if [[ $PG == 1 ]]; then
	def nginx     nginx "$HERE/post1k.lua"       ""  "" "nginx proxy_pass, no key"
	def pgbench   -     ""                       ""  "" "pgbench claim+complete"
	def app       -     ""                       ""  "" "application: INSERT + UPDATE"
	def pg-unique   pg   "$HERE/keyed_unique.lua" "" forwarded "postgres, unique keys (all win)"
	def pg-pass     pg   "$HERE/post1k.lua"       "" passthrough "postgres, no key (static request)"
	def pg-same-nc  pg0  "$HERE/keyed_same.lua"   "KEYED_KEY=same-pg0-$RANDOM$RANDOM" replayed "postgres, no cache, one key (replays)"
	def pg-same     pg   "$HERE/keyed_same.lua"   "KEYED_KEY=same-pg-$RANDOM$RANDOM" cache "postgres+cache, one key (replays)"
	def pgr-same-nc pgr0 "$HERE/keyed_same.lua"   "KEYED_KEY=same-pgr0-$RANDOM$RANDOM" redis "postgres+redis, no cache, one key"
	def pgr-same    pgr  "$HERE/keyed_same.lua"   "KEYED_KEY=same-pgr-$RANDOM$RANDOM" cache "postgres+redis+cache, one key"
fi
# every defined target, not only ONLY's: part C runs pg-unique whatever ONLY says
for t in "${!T_SRV[@]}"; do
	case ${T_SRV[$t]} in
	nginx) T_URL[$t]="http://127.0.0.1:$NGINX_PORT/"; T_PP[$t]=$NGINX_WORKERS; T_SP[$t]="" ;;
	-) ;;
	*) T_URL[$t]="http://127.0.0.1:${PPORT[${T_SRV[$t]}]}/"; T_PP[$t]=${PPID_OF[${T_SRV[$t]}]}
	   case ${T_SRV[$t]} in
	   mem) T_SP[$t]="" ;;
	   pg|pg0) T_SP[$t]="$PG_PID" ;;
	   pgr|pgr0) T_SP[$t]="$PG_PID $REDIS_PID" ;;
	   esac ;;
	esac
done

# share CHECK: the fraction of the run's requests that took the row's path,
# from the idemproxy's /metrics (forwarded = won and executed, replayed,
# redis = replayed from Redis without PostgreSQL, cache = replayed from the
# in-process response cache)
counter_of() {	# counter_of SRV CHECK
	case $2 in
	passthrough|forwarded|replayed) metric "$1" "idemproxy_requests_total{outcome=\"$2\"}" ;;
	redis) metric "$1" "idemproxy_redis_hits_total" ;;
	cache) metric "$1" "idemproxy_response_cache_hits_total" ;;
	*) echo 0 ;;
	esac
}

measure() {	# measure TARGET DUR: prints the result line plus the share
	local t=$1 dur=$2 c0=0 c1=0 res share=-
	if [[ $t == pgbench ]]; then
		run_pgbench "$dur"
		return
	fi
	if [[ $t == app ]]; then
		run_pgbench "$dur" "$HERE/app_keys.sql"
		return
	fi
	if [[ $t == pgbench-wk ]]; then
		run_pgbench "$dur" "$TMP/claim-wake.sql"
		return
	fi
	[[ -n ${T_CHECK[$t]} ]] && c0=$(counter_of "${T_SRV[$t]}" "${T_CHECK[$t]}")
	# shellcheck disable=SC2086
	res=$(run_wrk "${T_URL[$t]}" "$dur" "${T_LUA[$t]}" "${T_PP[$t]}" "${T_SP[$t]}" ${T_ENV[$t]}) || exit 1
	if [[ -n ${T_CHECK[$t]} ]]; then
		c1=$(counter_of "${T_SRV[$t]}" "${T_CHECK[$t]}")
		share=$(awk -v d=$((c1 - c0)) -v n="$(cut -d' ' -f7 <<<"$res")" 'BEGIN { printf "%.4f", (n > 0 ? d / n : 0) }')
	fi
	echo "$res $share"
}

declare -A RPS P50 P99 ERR PCPU SCPU SHARE OTH
REDONE=0
for c in $CONNS_LIST; do
	CONNS=$c
	for t in "${TARGETS[@]}"; do
		note "warm-up c=$c $t ($WARMUP)"
		measure "$t" "$WARMUP" >/dev/null || exit 1
	done
done
for ((r = 1; r <= REPEAT; r++)); do
	for c in $CONNS_LIST; do
		CONNS=$c
		for t in "${TARGETS[@]}"; do
			while :; do
				res=$(measure "$t" "$DURATION") || exit 1
				read -r rps p50 p99 err pc sc n oth share <<<"$res"
				[[ -n $rps && $rps != 0 ]] || die "no figures for $t"
				note "run $r/$REPEAT c=$c $t: $rps req/s, p50 $p50 ms, p99 $p99 ms," \
				     "errors $err, CPU proxy $pc / store $sc us/req, path share ${share:--}," \
				     "other load ${oth}%"
				awk -v o="$oth" -v m="$REDO_OTHER" 'BEGIN { exit !(o > m) }' || break
				((REDONE < REDO_MAX)) || break
				REDONE=$((REDONE + 1))
				note "  disturbed (other load ${oth}% > ${REDO_OTHER}%): measuring again" \
				     "($REDONE of at most $REDO_MAX)"
			done
			k=$c/$t
			RPS[$k]+="$rps "; P50[$k]+="$p50 "; P99[$k]+="$p99 "
			PCPU[$k]+="$pc "; SCPU[$k]+="$sc "; OTH[$k]+="$oth "
			ERR[$k]=$(( ${ERR[$k]:-0} + err ))
			[[ ${share:--} == - ]] || SHARE[$k]+="$share "
		done
	done
done

# ---- report -------------------------------------------------------------------
declare -A M Q
echo "== median of $REPEAT x $DURATION (wrk -t$THREADS; pgbench -j$PGBENCH_JOBS: req/s = tps," \
     "one claim + one complete per transaction)"
printf '%-4s %-13s %-35s %9s %8s %8s %9s %9s %6s %8s %6s   %s\n' c target what "req/s" "p50 ms" \
	"p99 ms" "proxy us" "store us" errors "path" "other" "all runs req/s"
for c in $CONNS_LIST; do
	for t in "${TARGETS[@]}"; do
		k=$c/$t
		M[$k]=$(median <<<"${RPS[$k]% }")
		Q[$k]=$(median <<<"${P99[$k]% }")
		path=-
		[[ -n ${SHARE[$k]:-} ]] && path=$(awk -v s="${SHARE[$k]% }" 'BEGIN {
			n = split(s, a, " "); m = 1; for (i = 1; i <= n; i++) if (a[i] < m) m = a[i]
			printf "%.1f%%", m * 100 }')
		oth=$(tr ' ' '\n' <<<"${OTH[$k]% }" | sort -g | tail -n1)
		printf '%-4s %-13s %-35s %9.0f %8.3f %8.3f %9.2f %9.2f %6d %8s %5.0f%%   %s\n' "$c" "$t" \
			"${T_DESC[$t]}" "${M[$k]}" "$(median <<<"${P50[$k]% }")" "${Q[$k]}" \
			"$(median <<<"${PCPU[$k]% }")" "$(median <<<"${SCPU[$k]% }")" \
			"${ERR[$k]}" "$path" "$oth" "${RPS[$k]% }"
	done
done
echo "(proxy us: CPU per request of idemproxy / nginx workers / pgbench; store us: of the"
echo " PostgreSQL server with its backends, plus redis-server; path: lowest share of a run's"
echo " requests that took the row's path per /metrics: passthrough, forwarded after a won"
echo " claim, replayed, replayed from Redis, or from the response cache; other: the most,"
echo " over the runs, of the machine's CPU (and hypervisor steal) that went to processes"
echo " other than this row's, as a share of both CPUs: a disturbed run shows here; runs above"
echo " REDO_OTHER=$REDO_OTHER% were measured again, $REDONE times in all, REDO_MAX=$REDO_MAX)"
echo

goal() {	# goal LABEL C NUM_TARGET DEN_TARGET MIN: req/s ratio and both p99s,
		# then the same ratio round by round (both rows run in every round)
	local k1=$2/$3 k2=$2/$4 pm pq1 pq3 pmet pn
	[[ -n ${M[$k1]:-} && -n ${M[$k2]:-} ]] || return 0	# ONLY left one out
	awk -v l="$1" -v a="${M[$k1]}" -v b="${M[$k2]}" -v g="$5" \
	    -v qa="${Q[$k1]}" -v qb="${Q[$k2]}" 'BEGIN {
		r = b > 0 ? a / b : 0
		printf "  %-62s %6.2fx  goal >= %.1fx  %-22s p99 %7.3f vs %7.3f ms\n", l, r, g,
			(r >= g ? "MET" : sprintf("NOT MET (%.0f%% short)", (1 - r / g) * 100)), qa, qb }'
	read -r pm pq1 pq3 pmet pn <<<"$(paired "${RPS[$k1]% }" "${RPS[$k2]% }" "$5")"
	printf '  %-62s %6.2fx  (q1-q3 %.2f-%.2f), goal met in %d of %d rounds\n' \
		"  round by round: median" "$pm" "$pq1" "$pq3" "$pmet" "$pn"
}
echo "== goals (req/s ratio of the medians; p99 of the first row vs the second; then the"
echo "   ratio of the two rows in each round, where both ran back to back)"
for c in $CONNS_LIST; do
	echo "c=$c"
	goal "memory: replays / pass-through (issue 3)" "$c" mem-same mem-pass 1.5
	goal "memory: unique-key writes / pass-through, same Lua" "$c" mem-unique mem-pass-lua 0.9
	goal "memory: unique-key writes / pass-through (static; issue 22)" "$c" mem-unique mem-pass 0.9
	if [[ $PG == 1 ]]; then
		goal "postgres: unique-key writes / pgbench (issue 4)" "$c" pg-unique pgbench 0.8
		case $c in
		8) g=1.0 l="postgres: new keys / pgbench, 2 txns per key (issue 9 b)" ;;
		32) g=1.5 l="postgres: new keys / pgbench, 2 txns per key (issue 9 b)" ;;
		*) g=1.0 l="(info) postgres: new keys / pgbench, 2 txns per key" ;;
		esac
		goal "$l" "$c" pg-unique pgbench "$g"
		case $c in
		8) g=1.0 l="postgres: new keys / the application's pair (issue 22)" ;;
		32) g=1.5 l="postgres: new keys / the application's pair (issue 22)" ;;
		*) g=1.0 l="(info) postgres: new keys / the application's pair" ;;
		esac
		goal "$l" "$c" pg-unique app "$g"
		l="(info) "
		[[ $c == 32 ]] && l=""
		goal "${l}postgres, cache off: replays / pass-through (issues 9 a, 22)" "$c" pg-same-nc pg-pass 1.0
		goal "${l}postgres, cache on: replays / pass-through (issue 9 a)" "$c" pg-same pg-pass 1.0
		goal "(moonshot) postgres, cache off: replays / memory replays" "$c" pg-same-nc mem-same 1.0
		goal "(moonshot) postgres, cache on: replays / memory replays" "$c" pg-same mem-same 1.0
		goal "postgres+redis, cache off: replays / nginx pass-through" "$c" pgr-same-nc nginx 1.0
		goal "postgres+redis, cache on: replays / nginx pass-through" "$c" pgr-same nginx 1.0
		goal "(info) postgres pass-through / memory pass-through" "$c" pg-pass mem-pass 1.0
		goal "(info) idemproxy memory pass-through / nginx" "$c" mem-pass nginx 1.0
	fi
done

# ---- part C: what a new key costs PostgreSQL ---------------------------------
# pg_stat_database of bench (pgbench and the pg instance only) and pg_stat_wal
# (the cluster; nothing else writes meanwhile) around one run. Backends
# publish their counters at most once a second while busy and 10 s after
# going idle (PostgreSQL 15, PGSTAT_IDLE_INTERVAL): read STATS_SETTLE s
# after the previous activity, so that every run is counted whole.
pg_counters() {	# commits rollbacks ins upd wal_records wal_bytes wal_write wal_sync
	psql_c postgres "SELECT d.xact_commit, d.xact_rollback, d.tup_inserted, d.tup_updated,
		w.wal_records, w.wal_bytes, w.wal_write, w.wal_sync
		FROM pg_stat_database d, pg_stat_wal w WHERE d.datname = 'bench'" | tr '|' ' '
}
# Where bench's client backends are, every 50 ms during a run (psql \watch on
# the postgres database): "<snapshot> <wait event or CPU> <state>" lines.
sampler_start() {	# sampler_start FILE
	printf '%s\n' "SELECT now()::text, coalesce(wait_event_type || ':' || wait_event, 'CPU'),
		replace(state, ' ', '_') FROM pg_stat_activity
		WHERE datname = 'bench' AND backend_type = 'client backend' \\watch 0.05" |
		"$PG_BINDIR/psql" -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -Atq -F'|' \
		>"$1" 2>/dev/null &
	SAMPLER_PID=$!
	PIDS+=("$SAMPLER_PID")
}
sampler_stop() { stop_pid "$SAMPLER_PID"; }

if [[ $PG == 1 && $ACCOUNT == 1 ]]; then
	echo
	echo "== PostgreSQL work per new key (database bench; one more run of $DURATION per row;"
	echo "   pg_stat_database and pg_stat_wal read ${STATS_SETTLE} s after the previous activity)"
	printf '%-4s %-10s %8s %7s %6s %8s %9s %9s %9s %9s %8s %8s %6s %6s\n' c target "keys/s" keys \
		errors "commits" "keys per" "WAL wri-" "WAL syncs" "WAL B" "rows ins" "rows upd" "roll-" other
	printf '%-4s %-10s %8s %7s %6s %8s %9s %9s %9s %9s %8s %8s %6s %6s\n' "" "" "" "" "" \
		"per key" "commit" "tes/key" "per key" "per key" "per key" "per key" "backs" load
	note "part C: waiting ${STATS_SETTLE} s for PostgreSQL's counters to settle"
	sleep "$STATS_SETTLE"
	before=$(pg_counters)
	for c in $CONNS_LIST; do
		CONNS=$c
		for t in pgbench app pgbench-wk pg-unique; do
			sampler_start "$TMP/waits.$c.$t"
			res=$(measure "$t" "$DURATION") || exit 1
			sampler_stop
			read -r rps p50 p99 err pc sc n oth share <<<"$res"
			note "part C c=$c $t: $rps keys/s, $n keys, errors $err, CPU proxy $pc / store $sc us/key," \
			     "other load ${oth}%; waiting ${STATS_SETTLE} s"
			sleep "$STATS_SETTLE"
			after=$(pg_counters)
			awk -v c="$c" -v t="$t" -v rps="$rps" -v n="$n" -v err="$err" \
			    -v b="$before" -v a="$after" -v oth="$oth" 'BEGIN {
				split(b, x, " "); split(a, y, " ")
				for (i = 1; i <= 8; i++) d[i] = y[i] - x[i]
				if (n <= 0) n = 1
				printf "%-4s %-10s %8.0f %7d %6d %8.3f %9.2f %9.3f %9.3f %9.0f %8.3f %8.3f %6d %5.0f%%\n",
					c, t, rps, n, err, d[1] / n, (d[1] > 0 ? n / d[1] : 0), d[7] / n,
					d[8] / n, d[6] / n, d[3] / n, d[4] / n, d[2], oth
			}'
			before=$after
		done
	done
	echo "(keys: requests wrk counted / pgbench transactions. A key is 2 statements: a claim"
	echo " (rows ins 1) and a complete (rows upd 1). commits: pg_stat_database.xact_commit of"
	echo " bench; pgbench runs each statement as its own implicit transaction (2 commits per key);"
	echo " idemproxy sends what queued while its connections were busy as one pipeline = one"
	echo " transaction. WAL writes/syncs: pg_stat_wal wal_write/wal_sync (all processes); a"
	echo " sync is one fdatasync that group commit shares among the commits waiting for it."
	echo " app: the application's INSERT + UPDATE on a plain table, 2 commits per key, no NOTIFY."
	echo " pgbench: claim and complete as 2 transactions. pgbench-wk: the same and the wake-up"
	echo " (pg_notify, no WAL flush waited for) as a third: what idemproxy adds after a batch"
	echo " whose completions a waiter marked; a key nobody waits for wakes nobody.)"
	echo
	echo "== where bench's backends were during those runs (pg_stat_activity every 50 ms;"
	echo "   average number of backends per snapshot; CPU = active with no wait event)"
	for c in $CONNS_LIST; do
		for t in pgbench app pgbench-wk pg-unique; do
			awk -F'|' -v c="$c" -v t="$t" '
			{ snap[$1] = 1; if ($3 == "active") k = $2; else k = $3 ":" $2; n[k]++ }
			END {
				ns = 0; for (s in snap) ns++
				if (ns == 0) { printf "%-4s %-10s no samples\n", c, t; exit }
				line = ""
				# busiest first
				while (1) {
					best = ""; for (k in n) if (best == "" || n[k] > n[best]) best = k
					if (best == "") break
					line = line sprintf("  %s %.2f", best, n[best] / ns); delete n[best]
				}
				printf "%-4s %-10s %3d snapshots:%s\n", c, t, ns, line
			}' "$TMP/waits.$c.$t"
		done
	done
	echo "(idle:ClientRead = waiting for the client (pgbench, idemproxy); IO:WALSync = in"
	echo " fdatasync; LWLock:WALWrite = waiting for another backend's WAL write/flush;"
	echo " Lock:object = the cluster-wide lock a transaction that ran NOTIFY holds from its"
	echo " pre-commit to the end of its commit, a WAL flush included unless it waits for none)"
fi

if [[ $PG == 1 ]]; then
	echo
	echo "== PostgreSQL after the run"
	echo "WAL:    $(psql_c postgres "SELECT pg_size_pretty(pg_current_wal_lsn() - '0/0'::pg_lsn)
		|| ' written; ' || (SELECT sum(xact_commit) FROM pg_stat_database) || ' commits'")"
	echo "bench:  $(psql_c bench "SELECT count(*) || ' rows, ' || pg_size_pretty(pg_total_relation_size('idempotency_keys')) FROM idempotency_keys")"
fi
