#!/usr/bin/env bash
# tests/bench/accesslog.sh - what the access log costs (issue 45): the same
# idemproxy with --access-log off, and writing JSON and text lines to a
# file, side by side in one run, next to the stub upstream direct and nginx
# (its own access log off and on). Rows: GET pass-through, and a new key per
# request on the memory store (keyed_unique.lua: claim, forward, store). Not
# a test: it prints figures and the goal check (log on within 5 % of off).
#
#   tests/bench/accesslog.sh
#   REPEAT=7 DURATION=10s tests/bench/accesslog.sh
#
# Environment (defaults):
#   WORKERS=1 THREADS=1 CONNS=50 DURATION=8s WARMUP=2s REPEAT=5
#   MEMORY_MAX=4GiB --memory-max-bytes of each idemproxy (keys of a run stay)
#   PIN=            e.g. PIN=1: wrk on CPU 1, the servers on CPU 0
#   IDEMPROXY_BIN   use this binary instead of building build-bench/
#   STUB_BIN  BUILD_DIR  NGINX=nginx  WRK=wrk  PYTHON=/usr/bin/python3
#
# Rounds are interleaved (every target once per round, in turn) and the
# on/off ratio is taken round by round (lib.sh's paired): this machine's
# speed drifts between rounds by more than the log costs. Each row also
# shows the server's CPU time per request, which drifts less than req/s.
# The access log's own thread is counted in idemproxy's CPU time.
#
# Everything listens on 127.0.0.1; every process started here is stopped
# by PID on exit, failure or Ctrl-C.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=tests/bench/lib.sh
. "$HERE/lib.sh"

WORKERS=${WORKERS:-1}
THREADS=${THREADS:-1}
CONNS=${CONNS:-50}
DURATION=${DURATION:-8s}
WARMUP=${WARMUP:-2s}
REPEAT=${REPEAT:-5}
PIN=${PIN:-}
BUILD_DIR=${BUILD_DIR:-$ROOT/build-bench}
NGINX=${NGINX:-nginx}
WRK=${WRK:-wrk}
PYTHON=${PYTHON:-/usr/bin/python3}
# unique keys stay in the memory store for its --ttl (24h): 256MiB, the
# default bound, fills within a round
MEMORY_MAX=${MEMORY_MAX:-4GiB}

die() { echo "accesslog.sh: $*" >&2; exit 1; }
note() { echo "# $*" >&2; }

for tool in "$NGINX" "$WRK" "$PYTHON"; do
	command -v "$tool" >/dev/null || die "$tool not found (deploy/install-deps.sh installs it)"
done
[[ $REPEAT =~ ^[1-9][0-9]*$ ]] || die "REPEAT must be a positive integer"

bench_binaries
bench_tmp accesslog

server_cpu=()
wrk_cpu=()
if [[ -n $PIN ]]; then
	command -v taskset >/dev/null || die "PIN needs taskset"
	server_cpu=(taskset -c 0)
	wrk_cpu=(taskset -c "$PIN")
fi

declare -A PORT PID
start_proxy() {	# start_proxy NAME [flags...]
	local name=$1
	shift
	PORT[$name]=$(free_port)
	"${server_cpu[@]}" "$IDEMPROXY_BIN" --upstream "http://127.0.0.1:$STUB_PORT" \
		--listen "127.0.0.1:${PORT[$name]}" --admin-listen "127.0.0.1:$(free_port)" \
		--workers "$WORKERS" --log-level warn --drain-timeout 1s \
		--memory-max-bytes "$MEMORY_MAX" "$@" \
		>"$TMP/$name.log" 2>&1 &
	PID[$name]=$!
	PIDS+=("${PID[$name]}")
	wait_port "${PORT[$name]}" "${PID[$name]}"
}

start_nginx() {	# start_nginx NAME ACCESS_LOG (off, or a path)
	local name=$1 log=$2
	PORT[$name]=$(free_port)
	mkdir -p "$TMP/$name"
	sed -e "s|@WORKERS@|$WORKERS|g" -e "s|@PREFIX@|$TMP/$name|g" \
	    -e "s|@UPSTREAM_PORT@|$STUB_PORT|g" -e "s|@PORT@|${PORT[$name]}|g" \
	    -e "s|access_log off;|access_log $log;|" \
	    "$HERE/nginx.conf.in" >"$TMP/$name/nginx.conf"
	grep -q "access_log $log;" "$TMP/$name/nginx.conf" ||
		die "nginx.conf.in has no 'access_log off;' to replace"
	"${server_cpu[@]}" "$NGINX" -c "$TMP/$name/nginx.conf" -p "$TMP/$name" \
		-e "$TMP/$name/error.log" >"$TMP/$name.log" 2>&1 &
	PID[$name]=$!
	PIDS+=("${PID[$name]}")
	wait_port "${PORT[$name]}" "${PID[$name]}"
}

# the PIDs whose CPU time a row counts: nginx's workers, else the process
serving() {
	case $1 in
	nginx*) cat /proc/"${PID[$1]}"/task/*/children ;;
	*) echo "${PID[$1]}" ;;
	esac
}

git_rev=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [[ -n $(git -C "$ROOT" status --porcelain -- proxy common 2>/dev/null) ]]; then
	git_rev="$git_rev (proxy/ or common/ modified)"
fi
[[ $BIN_ORIGIN == built ]] || git_rev="n/a (binary given as IDEMPROXY_BIN)"
echo "== idemproxy access-log benchmark"
echo "command:   WORKERS=$WORKERS THREADS=$THREADS CONNS=$CONNS DURATION=$DURATION" \
     "WARMUP=$WARMUP REPEAT=$REPEAT PIN=$PIN $0"
echo "date:      $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "machine:   $(nproc) CPUs, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)," \
     "Linux $(uname -r)"
echo "idemproxy: $("$IDEMPROXY_BIN" --version 2>&1 | head -n1), git $git_rev"
echo "nginx:     $("$NGINX" -v 2>&1 | sed 's/^nginx version: //')"
echo

start_stub
PORT[stub]=$STUB_PORT
PID[stub]=$STUB_PID
start_nginx nginx off
start_nginx nginx-log "$TMP/nginx-log/access.log"
start_proxy off
start_proxy json --access-log "$TMP/access.json" --access-log-format json
start_proxy text --access-log "$TMP/access.txt" --access-log-format text

TARGETS=(stub nginx nginx-log off json text)
KEYED_TARGETS=(off json text)
declare -A R C
run_row() {	# run_row KIND TARGET: one measurement into R[KIND,TARGET] and C
	local kind=$1 t=$2 url lua= res
	url="http://127.0.0.1:${PORT[$t]}/"
	[[ $kind == keyed ]] && lua=$HERE/keyed_unique.lua
	# shellcheck disable=SC2046
	res=$(run_wrk "$url" "$DURATION" "$lua" "$(serving "$t" | tr '\n' ' ')")
	read -r rps _ _ err cpu <<<"$res"
	(( err == 0 )) || die "$err failed requests against $t ($kind)"
	R[$kind,$t]="${R[$kind,$t]:-} $rps"
	C[$kind,$t]="${C[$kind,$t]:-} $cpu"
}

note "warming up"
for t in "${TARGETS[@]}"; do
	run_wrk "http://127.0.0.1:${PORT[$t]}/" "$WARMUP" >/dev/null
done
for t in "${KEYED_TARGETS[@]}"; do
	run_wrk "http://127.0.0.1:${PORT[$t]}/" "$WARMUP" "$HERE/keyed_unique.lua" >/dev/null
done
for r in $(seq "$REPEAT"); do
	note "round $r of $REPEAT"
	for t in "${TARGETS[@]}"; do run_row get "$t"; done
	for t in "${KEYED_TARGETS[@]}"; do run_row keyed "$t"; done
done

printf '%-8s %-10s %10s %14s\n' row target "req/s" "cpu µs/req"
for kind in get keyed; do
	for t in "${TARGETS[@]}"; do
		[[ -n ${R[$kind,$t]:-} ]] || continue
		printf '%-8s %-10s %10.0f %14.2f\n' "$kind" "$t" \
			"$(median <<<"${R[$kind,$t]}")" "$(median <<<"${C[$kind,$t]}")"
	done
done
echo
lines_json=$(wc -l <"$TMP/access.json")
lines_text=$(wc -l <"$TMP/access.txt")
echo "lines written: json $lines_json, text $lines_text" \
     "(one per request, warm-up included)"
echo
echo "on/off, round by round (median [q1 q3]); goal: req/s ratio >= 0.95"
verdict=met
for kind in get keyed; do
	for t in json text; do
		read -r med q1 q3 _ n <<<"$(paired "${R[$kind,$t]}" "${R[$kind,off]}")"
		read -r cmed _ _ _ _ <<<"$(paired "${C[$kind,$t]}" "${C[$kind,off]}")"
		printf '%-6s %-5s req/s %s [%s %s]  cpu/req %s  (%d rounds)\n' \
			"$kind" "$t" "$med" "$q1" "$q3" "$cmed" "$n"
		awk -v m="$med" 'BEGIN { exit !(m < 0.95) }' && verdict="NOT met"
	done
	if [[ $kind == get ]]; then
		read -r med _ _ _ _ <<<"$(paired "${R[get,off]}" "${R[get,stub]}")"
		printf '%-6s idemproxy/stub req/s %s' "$kind" "$med"
		read -r nmed _ _ _ _ <<<"$(paired "${R[get,off]}" "${R[get,nginx]}")"
		read -r lmed _ _ _ _ <<<"$(paired "${R[get,nginx-log]}" "${R[get,nginx]}")"
		printf ', idemproxy/nginx %s; nginx log on/off %s\n' "$nmed" "$lmed"
	fi
done
echo "goal (issue 45: access log on within 5 % of off): $verdict"
