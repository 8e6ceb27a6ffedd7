#!/usr/bin/env bash
# tests/bench/passthrough.sh - pass-through benchmark: stub upstream direct,
# nginx proxy_pass (upstream keepalive) and idemproxy, same worker count,
# GET / and a 1 KiB POST, measured with wrk on 127.0.0.1; then memory per
# idle keep-alive connection for idemproxy and nginx. Not a test: it prints
# figures and the goal check of issue 2, and exits 0 unless something broke.
#
#   tests/bench/passthrough.sh            # defaults below
#   REPEAT=5 DURATION=10s tests/bench/passthrough.sh
#
# Environment (defaults):
#   WORKERS=1         idemproxy --workers and nginx worker_processes
#   THREADS=1         wrk -t
#   CONNS=50          wrk -c
#   DURATION=10s      wrk -d per measurement
#   WARMUP=2s         one unmeasured wrk run per target and request kind
#   REPEAT=3          measurements per target and kind; the median is shown
#                     (runs are interleaved stub/nginx/idemproxy, so slow
#                     phases of a noisy machine hit every target alike)
#   IDLE_CONNS=5000   idle keep-alive connections for the memory figure
#   PIN=              e.g. PIN=1: run wrk on CPU 1 and the servers on CPU 0
#                     (taskset); empty: let the scheduler place them
#   IDEMPROXY_BIN     use this binary instead of building build-bench/
#   STUB_BIN          stub upstream binary (default: from the same build)
#   BUILD_DIR         release build directory (default: build-bench)
#   NGINX=nginx  WRK=wrk  PYTHON=/usr/bin/python3
#
# Besides req/s and latency, each row shows the server's CPU time per request
# (user + system of the serving processes, from /proc/PID/stat, over the
# run): on a machine shared with other work req/s swings by 30% between runs,
# CPU per request much less; idemproxy/nginx is given for both.
#
# Everything listens on 127.0.0.1 (free ports picked at start); every process
# started here is stopped by PID on exit, failure or Ctrl-C.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=tests/bench/lib.sh
. "$HERE/lib.sh"

WORKERS=${WORKERS:-1}
THREADS=${THREADS:-1}
CONNS=${CONNS:-50}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-2s}
REPEAT=${REPEAT:-3}
IDLE_CONNS=${IDLE_CONNS:-5000}
PIN=${PIN:-}
BUILD_DIR=${BUILD_DIR:-$ROOT/build-bench}
NGINX=${NGINX:-nginx}
WRK=${WRK:-wrk}
PYTHON=${PYTHON:-/usr/bin/python3}

die() { echo "passthrough.sh: $*" >&2; exit 1; }
note() { echo "# $*" >&2; }

for tool in "$NGINX" "$WRK" "$PYTHON"; do
	command -v "$tool" >/dev/null || die "$tool not found (deploy/install-deps.sh installs it)"
done
[[ $REPEAT =~ ^[1-9][0-9]*$ ]] || die "REPEAT must be a positive integer"
[[ $WORKERS =~ ^[1-9][0-9]*$ ]] || die "WORKERS must be a positive integer"

# ---- build --------------------------------------------------------------
bench_binaries

# ---- file descriptors -------------------------------------------------------
need_fds=$((IDLE_CONNS * 2 + 1024))
if (( $(ulimit -n) < need_fds )); then
	ulimit -Hn 65536 2>/dev/null || true
	ulimit -n "$(( $(ulimit -Hn) < 65536 ? $(ulimit -Hn) : 65536 ))" 2>/dev/null || true
fi
if (( $(ulimit -n) < IDLE_CONNS + 256 )); then
	note "ulimit -n is $(ulimit -n): lowering IDLE_CONNS from $IDLE_CONNS"
	IDLE_CONNS=$(( $(ulimit -n) - 256 ))
fi

# ---- processes --------------------------------------------------------------
bench_tmp passthrough

bench_stop_first() { exec 9>&- 2>/dev/null || true; }	# the idle connections' fifo

server_cpu=()
wrk_cpu=()
if [[ -n $PIN ]]; then
	command -v taskset >/dev/null || die "PIN needs taskset"
	server_cpu=(taskset -c 0)
	wrk_cpu=(taskset -c "$PIN")
fi

start_nginx() {
	NGINX_PORT=$(free_port)
	mkdir -p "$TMP/nginx"
	sed -e "s|@WORKERS@|$WORKERS|g" -e "s|@PREFIX@|$TMP/nginx|g" \
	    -e "s|@UPSTREAM_PORT@|$STUB_PORT|g" -e "s|@PORT@|$NGINX_PORT|g" \
	    "$HERE/nginx.conf.in" >"$TMP/nginx/nginx.conf"
	"${server_cpu[@]}" "$NGINX" -c "$TMP/nginx/nginx.conf" -p "$TMP/nginx" \
		-e "$TMP/nginx/error.log" >"$TMP/nginx.log" 2>&1 &
	NGINX_PID=$!
	PIDS+=("$NGINX_PID")
	wait_port "$NGINX_PORT" "$NGINX_PID"
}

start_idemproxy() {
	PROXY_PORT=$(free_port)
	ADMIN_PORT=$(free_port)
	"${server_cpu[@]}" "$IDEMPROXY_BIN" --upstream "http://127.0.0.1:$STUB_PORT" \
		--listen "127.0.0.1:$PROXY_PORT" --admin-listen "127.0.0.1:$ADMIN_PORT" \
		--workers "$WORKERS" --log-level warn --drain-timeout 1s \
		>"$TMP/idemproxy.log" 2>&1 &
	PROXY_PID=$!
	PIDS+=("$PROXY_PID")
	wait_port "$PROXY_PORT" "$PROXY_PID"
}

# VmRSS in KiB, summed over the given PIDs.
rss_kib() {
	local sum=0 pid v
	for pid in "$@"; do
		v=$(awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status")
		sum=$((sum + v))
	done
	echo "$sum"
}

# The PIDs that serve connections: idemproxy's single process; nginx's
# workers (the children of the master).
serving_pids() {
	case $1 in
	idemproxy) echo "$PROXY_PID" ;;
	nginx) cat /proc/"$NGINX_PID"/task/*/children ;;
	esac
}

# ---- machine facts --------------------------------------------------------------
git_rev=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [[ -n $(git -C "$ROOT" status --porcelain -- proxy common 2>/dev/null) ]]; then
	git_rev="$git_rev (proxy/ or common/ modified)"
fi
[[ $BIN_ORIGIN == built ]] || git_rev="n/a (binary given as IDEMPROXY_BIN)"
echo "== idemproxy pass-through benchmark"
echo "command:   WORKERS=$WORKERS THREADS=$THREADS CONNS=$CONNS DURATION=$DURATION" \
     "WARMUP=$WARMUP REPEAT=$REPEAT IDLE_CONNS=$IDLE_CONNS PIN=$PIN $0 $*"
echo "date:      $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "machine:   $(nproc) CPUs, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)," \
     "$(awk '/^MemTotal:/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo), Linux $(uname -r)"
echo "idemproxy: $("$IDEMPROXY_BIN" --version 2>&1 | head -n1), git $git_rev, $IDEMPROXY_BIN"
echo "nginx:     $("$NGINX" -v 2>&1 | sed 's/^nginx version: //')"
echo "wrk:       $("$WRK" -v 2>&1 | head -n1 | awk '{ print $1, $2 }')"
echo "libevent:  $(pkg-config --modversion libevent 2>/dev/null || echo '?')," \
     "cc: $(cc --version | head -n1)"
echo "load:      wrk -t$THREADS -c$CONNS -d$DURATION --latency, median of $REPEAT," \
     "workers $WORKERS, ${PIN:+wrk on CPU $PIN / servers on CPU 0}${PIN:-no CPU pinning}"
echo

start_stub
start_nginx
start_idemproxy
note "stub :$STUB_PORT (pid $STUB_PID), nginx :$NGINX_PORT (pid $NGINX_PID)," \
     "idemproxy :$PROXY_PORT admin :$ADMIN_PORT (pid $PROXY_PID)"

# ---- memory per idle keep-alive connection (fresh processes, first) ----------
declare -A MEM
measure_idle() {	# measure_idle NAME PORT
	local name=$1 port=$2 before after i pids
	# one request first, so that per-process lazy set-up (upstream pool,
	# first buffers) is not counted per connection
	curl -s -o /dev/null "http://127.0.0.1:$port/" || die "GET / via $name failed"
	sleep 0.5
	pids=$(serving_pids "$name")
	# shellcheck disable=SC2086
	before=$(rss_kib $pids)
	rm -f "$TMP/idle.fifo"
	mkfifo "$TMP/idle.fifo"
	"$PYTHON" "$HERE/idle_conns.py" 127.0.0.1 "$port" "$IDLE_CONNS" \
		<"$TMP/idle.fifo" >"$TMP/idle.out" 2>"$TMP/idle.log" &
	local idle_pid=$!
	PIDS+=("$idle_pid")
	exec 9>"$TMP/idle.fifo"
	for i in $(seq 900); do
		grep -q '^ready' "$TMP/idle.out" && break
		kill -0 "$idle_pid" 2>/dev/null || die "idle_conns.py failed: $(cat "$TMP/idle.log")"
		sleep 0.1
	done
	grep -q '^ready' "$TMP/idle.out" || die "idle connections not ready after 90 s"
	sleep 1
	# shellcheck disable=SC2086
	after=$(rss_kib $pids)
	local extra=""
	if [[ $name == idemproxy ]]; then
		extra=$(curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" |
			awk '/^idemproxy_connections[ {]/ { printf " (metrics: %s connections)", $NF }')
	fi
	exec 9>&-
	wait "$idle_pid" 2>/dev/null || true
	MEM[$name]=$(awk -v b="$before" -v a="$after" -v n="$IDLE_CONNS" \
		'BEGIN { printf "%.1f", (a - b) / n }')
	printf '%-10s VmRSS %7d KiB -> %7d KiB with %d idle connections: %5s KiB per connection%s\n' \
		"$name" "$before" "$after" "$IDLE_CONNS" "${MEM[$name]}" "$extra"
}
echo "== memory per idle keep-alive connection (one GET / each, then idle)"
measure_idle idemproxy "$PROXY_PORT"
measure_idle nginx "$NGINX_PORT"
sleep 1
echo

# ---- throughput and latency ----------------------------------------------------------
declare -A URL=(
	[stub]="http://127.0.0.1:$STUB_PORT/"
	[nginx]="http://127.0.0.1:$NGINX_PORT/"
	[idemproxy]="http://127.0.0.1:$PROXY_PORT/"
)
TARGETS=(stub nginx idemproxy)
KINDS=(GET POST1K)
declare -A LUA=([GET]="" [POST1K]="$HERE/post1k.lua")
declare -A RPS P50 P99 ERR CPU
declare -A SPIDS=([stub]="$STUB_PID" [nginx]="$(serving_pids nginx | tr '\n' ' ')"
	[idemproxy]="$PROXY_PID")

for kind in "${KINDS[@]}"; do
	for t in "${TARGETS[@]}"; do
		note "warm-up $kind $t ($WARMUP)"
		run_wrk "${URL[$t]}" "$WARMUP" "${LUA[$kind]}" >/dev/null || exit 1
	done
done
for ((r = 1; r <= REPEAT; r++)); do
	for kind in "${KINDS[@]}"; do
		for t in "${TARGETS[@]}"; do
			res=$(run_wrk "${URL[$t]}" "$DURATION" "${LUA[$kind]}" "${SPIDS[$t]}") || exit 1
			read -r rps p50 p99 err cpu <<<"$res"
			[[ -n $rps && $rps != 0 ]] || die "no figures from wrk against ${URL[$t]}"
			note "run $r/$REPEAT $kind $t: $rps req/s, p50 $p50 ms, p99 $p99 ms, errors $err, CPU $cpu us/req"
			CPU[$kind/$t]+="$cpu "
			RPS[$kind/$t]+="$rps "
			P50[$kind/$t]+="$p50 "
			P99[$kind/$t]+="$p99 "
			ERR[$kind/$t]=$(( ${ERR[$kind/$t]:-0} + err ))
		done
	done
done

echo "== throughput and latency (median of $REPEAT x $DURATION, wrk -t$THREADS -c$CONNS)"
printf '%-7s %-10s %10s %9s %9s %11s %7s   %s\n' request target "req/s" "p50 ms" "p99 ms" "CPU us/req" errors "all runs req/s"
declare -A MRPS MP99 MCPU
for kind in "${KINDS[@]}"; do
	for t in "${TARGETS[@]}"; do
		MRPS[$kind/$t]=$(median <<<"${RPS[$kind/$t]% }")
		MP99[$kind/$t]=$(median <<<"${P99[$kind/$t]% }")
		MCPU[$kind/$t]=$(median <<<"${CPU[$kind/$t]% }")
		printf '%-7s %-10s %10.0f %9.3f %9.3f %11.2f %7d   %s\n' "$kind" "$t" \
			"${MRPS[$kind/$t]}" "$(median <<<"${P50[$kind/$t]% }")" \
			"${MP99[$kind/$t]}" "${MCPU[$kind/$t]}" "${ERR[$kind/$t]}" "${RPS[$kind/$t]% }"
	done
done
echo

echo "== idemproxy / nginx, and the goals of issue 2"
printf '%-7s %12s %12s %12s   %s\n' request "rps ratio" "p99 ratio" "CPU ratio" "goal: rps >= 1.00x nginx, p99 <= nginx"
for kind in "${KINDS[@]}"; do
	awk -v k="$kind" -v pr="${MRPS[$kind/idemproxy]}" -v nr="${MRPS[$kind/nginx]}" \
	    -v pp="${MP99[$kind/idemproxy]}" -v np="${MP99[$kind/nginx]}" \
	    -v pc="${MCPU[$kind/idemproxy]}" -v nc="${MCPU[$kind/nginx]}" 'BEGIN {
		rr = pr / nr; lr = pp / np; cr = nc > 0 ? pc / nc : 0
		printf "%-7s %11.2fx %11.2fx %11.2fx   rps %s, p99 %s\n", k, rr, lr, cr,
			(rr >= 1.0 ? "MET" : sprintf("NOT MET (%.1f%% short)", (1 - rr) * 100)),
			(lr <= 1.0 ? "MET" : sprintf("NOT MET (%.1f%% higher)", (lr - 1) * 100))
	}'
done
awk -v m="${MEM[idemproxy]}" -v n="${MEM[nginx]}" 'BEGIN {
	printf "memory  idemproxy %.1f KiB/conn (nginx %.1f): goal <= 16 KiB %s\n", m, n,
		(m <= 16 ? "MET" : "NOT MET")
}'
