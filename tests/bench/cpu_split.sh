#!/usr/bin/env bash
# tests/bench/cpu_split.sh - where the machine's CPU goes, per request, in
# the memory store's two rows of issue 22: a 1 KiB POST without a key and
# one with a new key (keyed_unique.lua, KEYED_NOKEY=1 or not), against one
# idemproxy, alternately, round by round. For each run: req/s, and the CPU
# time per request of idemproxy, of the stub (the test upstream, which does
# the same work for both rows), of wrk, and of the rest of the machine
# (/proc/stat less those three: the kernel's own threads, anything else).
#
# The stub's figure is the machine's speed at that moment: it answers the
# same requests in both rows, so when it moves between rounds the whole
# machine moved, not idemproxy. Not a test: prints figures, exits 0.
#
#   tests/bench/cpu_split.sh
#   ROUNDS=6 DURATION=5 MEMORY_TTL=1s MEMORY_MAX=64MiB tests/bench/cpu_split.sh
#
# Environment (defaults):
#   ROUNDS=4  DURATION=5 (seconds)  CONNS=32  THREADS=1
#   MEMORY_MAX=6GiB  MEMORY_TTL (unset: the store's default, 24h; see keyed.sh)
#   IDEMPROXY_BIN (default: build BUILD_DIR, default build-bench)
#   STUB_BIN, WRK, PYTHON
#
# Everything listens on 127.0.0.1; every process started here is stopped by
# PID on exit.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=tests/bench/lib.sh
. "$HERE/lib.sh"

ROUNDS=${ROUNDS:-4}
DURATION=${DURATION:-5}
CONNS=${CONNS:-32}
THREADS=${THREADS:-1}
MEMORY_MAX=${MEMORY_MAX:-6GiB}
MEMORY_TTL=${MEMORY_TTL:-}
BUILD_DIR=${BUILD_DIR:-$ROOT/build-bench}
WRK=${WRK:-wrk}
PYTHON=${PYTHON:-/usr/bin/python3}

die() { echo "cpu_split.sh: $*" >&2; exit 1; }

[[ $DURATION =~ ^[1-9][0-9]*$ && $DURATION -ge 3 ]] ||
	die "DURATION is whole seconds, at least 3"
command -v "$WRK" >/dev/null || die "$WRK not found"
bench_binaries
bench_tmp split

start_stub
PROXY_PORT=$(free_port)
ADMIN_PORT=$(free_port)
"$IDEMPROXY_BIN" --upstream "http://127.0.0.1:$STUB_PORT" \
	--listen "127.0.0.1:$PROXY_PORT" --admin-listen "127.0.0.1:$ADMIN_PORT" \
	--workers 1 --log-level warn --store memory --memory-max-bytes "$MEMORY_MAX" \
	${MEMORY_TTL:+--ttl "$MEMORY_TTL"} >"$TMP/idemproxy.log" 2>&1 &
PROXY_PID=$!
PIDS+=("$PROXY_PID")
wait_port "$PROXY_PORT" "$PROXY_PID"

echo "== CPU per request: memory store, 1 KiB POST, wrk -t$THREADS -c$CONNS, ${DURATION} s per run"
echo "idemproxy: $("$IDEMPROXY_BIN" --version 2>&1 | head -n1), $IDEMPROXY_BIN;" \
     "--memory-max-bytes $MEMORY_MAX, --ttl ${MEMORY_TTL:-default (24h)}"
echo "(wrk's CPU is read from 0.5 s after its start to 0.5 s before its end, and scaled)"
printf '%-6s %-7s %8s %10s %8s %8s %8s %10s\n' round row "req/s" "idemproxy" stub wrk rest machine
declare -A RPS
for ((r = 1; r <= ROUNDS; r++)); do
	for nokey in 1 0; do
		row=new-key
		[[ $nokey == 1 ]] && row=no-key
		p0=$(proc_ticks "$PROXY_PID"); s0=$(proc_ticks "$STUB_PID"); m0=$(busy_ticks)
		KEYED_NOKEY=$nokey "$WRK" -t"$THREADS" -c"$CONNS" -d"${DURATION}s" \
			-s "$HERE/keyed_unique.lua" "http://127.0.0.1:$PROXY_PORT/" >"$TMP/wrk.out" 2>&1 &
		wp=$!
		sleep 0.5
		w0=$(proc_ticks "$wp")
		sleep $((DURATION - 1))
		w1=$(proc_ticks "$wp")
		wait "$wp" || die "wrk failed: $(tail -3 "$TMP/wrk.out")"
		p1=$(proc_ticks "$PROXY_PID"); s1=$(proc_ticks "$STUB_PID"); m1=$(busy_ticks)
		n=$(awk '/ requests in / { print $1 }' "$TMP/wrk.out")
		[[ -n $n && $n -gt 0 ]] || die "wrk counted no requests"
		RPS[$row]+="$(awk -v n="$n" -v d="$DURATION" 'BEGIN { printf "%.0f", n / d }') "
		awk -v r="$r" -v row="$row" -v n="$n" -v d="$DURATION" -v hz="$(getconf CLK_TCK)" \
		    -v p=$((p1 - p0)) -v s=$((s1 - s0)) -v w=$((w1 - w0)) -v m=$((m1 - m0)) 'BEGIN {
			us = 1e6 / hz / n; ws = us * d / (d - 1)
			printf "%-6s %-7s %8.0f %10.1f %8.1f %8.1f %8.1f %10.1f\n", r, row, n / d,
				p * us, s * us, w * ws, m * us - p * us - s * us - w * ws, m * us }'
	done
done
echo "(CPU columns: microseconds per request; rest: the machine's CPU less the three"
echo " processes'; CLK_TCK ticks, so a column is good to about 1e6 / CLK_TCK / requests)"
read -r pm pq1 pq3 pmet pn <<<"$(paired "${RPS[new-key]% }" "${RPS[no-key]% }" 0.9)"
echo "new key / no key, req/s round by round: median ${pm}x (q1-q3 $pq1-$pq3)," \
     "at least 0.9x in $pmet of $pn rounds"
