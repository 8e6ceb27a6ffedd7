#!/usr/bin/env bash
# tests/bench/tls.sh - TLS termination benchmark (issue 12): idemproxy
# terminating TLS vs nginx terminating TLS (nginx-tls.conf.in) in front of
# the same stub upstream, same worker count, wrk over HTTPS on 127.0.0.1:
# GET / and a 1 KiB POST (post1k.lua) on keep-alive connections, then new
# connections per second (wrk -H 'Connection: close': one full handshake
# per request; wrk does not resume sessions). Runs alternate the two
# servers; the median of REPEAT rounds is shown, with CPU time per
# request of the server, of the stub, and of the whole machine (wrk and the
# kernel included). Not a test: it prints figures and the goal check
# (idemproxy >= 1.00x nginx req/s, p99 <= nginx's) and exits 0 unless
# something broke. Then the ratios round by round: a round measures both
# servers back to back, so its ratio is less disturbed by the machine's
# drift than the ratio of medians; with REPEAT=21 or so, how many rounds
# idemproxy was ahead tells whether a difference is real.
#
#   tests/bench/tls.sh
#   WORKERS_LIST="1 2" DURATION=3s REPEAT=3 tests/bench/tls.sh
#
# Environment (defaults):
#   WORKERS_LIST="1 2"  idemproxy --workers = nginx worker_processes, each
#   THREADS=1  CONNS=50  DURATION=3s  WARMUP=1s  REPEAT=3
#   KINDS="GET POST1K NEWCONN"  the rows to run
#   KEY_TYPE=ec         certificate key: ec (P-256) or rsa (2048 bits)
#   IDEMPROXY_BIN       release binary (default: build BUILD_DIR)
#   BUILD_DIR           default build-bench;  STUB_BIN, NGINX, WRK, PYTHON
#
# Everything listens on 127.0.0.1; every process started here is stopped by
# PID on exit.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=tests/bench/lib.sh
. "$HERE/lib.sh"

WORKERS_LIST=${WORKERS_LIST:-"1 2"}
THREADS=${THREADS:-1}
CONNS=${CONNS:-50}
DURATION=${DURATION:-3s}
WARMUP=${WARMUP:-1s}
REPEAT=${REPEAT:-3}
KEY_TYPE=${KEY_TYPE:-ec}
BUILD_DIR=${BUILD_DIR:-$ROOT/build-bench}
NGINX=${NGINX:-nginx}
WRK=${WRK:-wrk}
PYTHON=${PYTHON:-/usr/bin/python3}
wrk_cpu=()

die() { echo "tls.sh: $*" >&2; exit 1; }
note() { echo "# $*" >&2; }

for tool in "$NGINX" "$WRK" "$PYTHON" openssl; do
	command -v "$tool" >/dev/null || die "$tool not found"
done
[[ $REPEAT =~ ^[1-9][0-9]*$ ]] || die "REPEAT must be a positive integer"

bench_binaries

bench_tmp tls

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

# ---- wrk ----------------------------------------------------------------------
# run_wrk URL DURATION [LUA] [PIDS]: prints "rps p50_ms p99_ms errors
# cpu_us_per_req stub_us_per_req machine_us_per_req"; cpu is the CPU time
# the server PIDS used per request during the run (0 without PIDS), a
# figure much less sensitive to a busy machine than req/s; stub is the
# upstream's, machine every CPU's busy time (wrk, the kernel, the rest).
run_wrk() {
	local url=$1 dur=$2 lua=${3:-} pids=${4:-} secs out t0 t1 s0 s1 m0 m1
	local args=(-t"$THREADS" -c"$CONNS" -d"$dur" --latency "${EXTRA[@]}")
	[[ -n $lua ]] && args+=(-s "$lua")
	secs=${dur%s}
	# shellcheck disable=SC2086
	t0=$(proc_ticks $pids); s0=$(proc_ticks "$STUB_PID"); m0=$(busy_ticks)
	out=$(timeout $((secs + 30)) "${wrk_cpu[@]}" "$WRK" "${args[@]}" "$url") ||
		die "wrk failed against $url"
	# shellcheck disable=SC2086
	t1=$(proc_ticks $pids); s1=$(proc_ticks "$STUB_PID"); m1=$(busy_ticks)
	awk -v ticks=$((t1 - t0)) -v sticks=$((s1 - s0)) -v mticks=$((m1 - m0)) \
	    -v hz="$(getconf CLK_TCK)" '
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
	END { printf "%.0f %.3f %.3f %d %.2f %.2f %.2f\n", rps, p50, p99, err,
		(n > 0 ? ticks * 1e6 / hz / n : 0), (n > 0 ? sticks * 1e6 / hz / n : 0),
		(n > 0 ? mticks * 1e6 / hz / n : 0) }
	' <<<"$out"
}

declare -A M PR PC PM
EXTRA=()

# ---- certificate (one, used by both servers) ---------------------------------
case $KEY_TYPE in
ec) newkey=(-newkey ec -pkeyopt ec_paramgen_curve:P-256) ;;
rsa) newkey=(-newkey rsa:2048) ;;
*) die "KEY_TYPE must be ec or rsa" ;;
esac
openssl req -x509 "${newkey[@]}" -nodes -keyout "$TMP/key.pem" -out "$TMP/cert.pem" \
	-days 2 -subj /CN=localhost -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
	>/dev/null 2>&1 || die "openssl req failed"

start_nginx() {	# start_nginx WORKERS
	NGINX_PORT=$(free_port)
	rm -rf "$TMP/nginx"; mkdir -p "$TMP/nginx"
	sed -e "s|@WORKERS@|$1|g" -e "s|@PREFIX@|$TMP/nginx|g" \
	    -e "s|@UPSTREAM_PORT@|$STUB_PORT|g" -e "s|@PORT@|$NGINX_PORT|g" \
	    -e "s|@CERT@|$TMP/cert.pem|g" -e "s|@KEY@|$TMP/key.pem|g" \
	    "$HERE/nginx-tls.conf.in" >"$TMP/nginx/nginx.conf"
	"$NGINX" -c "$TMP/nginx/nginx.conf" -p "$TMP/nginx" \
		-e "$TMP/nginx/error.log" >"$TMP/nginx.log" 2>&1 &
	NGINX_PID=$!
	PIDS+=("$NGINX_PID")
	wait_port "$NGINX_PORT" "$NGINX_PID"
}

start_idemproxy() {	# start_idemproxy WORKERS
	PROXY_PORT=$(free_port)
	ADMIN_PORT=$(free_port)
	"$IDEMPROXY_BIN" --upstream "http://127.0.0.1:$STUB_PORT" \
		--listen "127.0.0.1:$PROXY_PORT" --admin-listen "127.0.0.1:$ADMIN_PORT" \
		--tls-cert "$TMP/cert.pem" --tls-key "$TMP/key.pem" \
		--workers "$1" --log-level warn --drain-timeout 1s \
		>"$TMP/idemproxy.log" 2>&1 &
	PROXY_PID=$!
	PIDS+=("$PROXY_PID")
	wait_port "$PROXY_PORT" "$PROXY_PID"
}

git_rev=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
[[ $BIN_ORIGIN == built ]] || git_rev="$git_rev (binary given as IDEMPROXY_BIN)"
echo "== idemproxy TLS termination benchmark"
echo "command:   WORKERS_LIST=\"$WORKERS_LIST\" THREADS=$THREADS CONNS=$CONNS DURATION=$DURATION" \
     "WARMUP=$WARMUP REPEAT=$REPEAT KEY_TYPE=$KEY_TYPE $0 $*"
echo "date:      $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "machine:   $(nproc) CPUs, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)," \
     "$(awk '/^MemTotal:/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo), Linux $(uname -r)," \
     "load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "idemproxy: $("$IDEMPROXY_BIN" --version 2>&1 | head -n1), git $git_rev, $IDEMPROXY_BIN"
echo "nginx:     $("$NGINX" -v 2>&1 | sed 's/^nginx version: //')"
echo "openssl:   $(openssl version), certificate key $KEY_TYPE"
echo "load:      wrk -t$THREADS -c$CONNS -d$DURATION --latency over HTTPS, median of $REPEAT rounds"
echo

read -r -a KINDS <<<"${KINDS:-GET POST1K NEWCONN}"
declare -A LUA=([GET]="" [POST1K]="$HERE/post1k.lua" [NEWCONN]="")
start_stub
for W in $WORKERS_LIST; do
	start_nginx "$W"
	start_idemproxy "$W"
	note "workers $W: stub :$STUB_PORT, nginx :$NGINX_PORT (pid $NGINX_PID), idemproxy :$PROXY_PORT (pid $PROXY_PID)"
	declare -A URL=([nginx]="https://127.0.0.1:$NGINX_PORT/" [idemproxy]="https://127.0.0.1:$PROXY_PORT/")
	declare -A SPIDS=([nginx]="$(serving_pids nginx | tr '\n' ' ')" [idemproxy]="$PROXY_PID")
	declare -A RPS=() P50=() P99=() ERR=() CPU=() SCPU=() MCPU=()
	for kind in "${KINDS[@]}"; do
		for t in idemproxy nginx; do
			EXTRA=(); [[ $kind == NEWCONN ]] && EXTRA=(-H "Connection: close")
			run_wrk "${URL[$t]}" "$WARMUP" "${LUA[$kind]}" >/dev/null || exit 1
		done
	done
	for ((r = 1; r <= REPEAT; r++)); do
		order=(idemproxy nginx); (( r % 2 == 0 )) && order=(nginx idemproxy)
		for kind in "${KINDS[@]}"; do
			EXTRA=(); [[ $kind == NEWCONN ]] && EXTRA=(-H "Connection: close")
			for t in "${order[@]}"; do
				res=$(run_wrk "${URL[$t]}" "$DURATION" "${LUA[$kind]}" "${SPIDS[$t]}") || exit 1
				read -r rps p50 p99 err cpu scpu mcpu <<<"$res"
				[[ -n $rps && $rps != 0 ]] || die "no figures from wrk against ${URL[$t]}"
				note "w$W run $r/$REPEAT $kind $t: $rps req/s, p99 $p99 ms, errors $err, CPU $cpu us/req"
				RPS[$kind/$t]+="$rps "; P50[$kind/$t]+="$p50 "; P99[$kind/$t]+="$p99 "
				CPU[$kind/$t]+="$cpu "; SCPU[$kind/$t]+="$scpu "; MCPU[$kind/$t]+="$mcpu "
				ERR[$kind/$t]=$(( ${ERR[$kind/$t]:-0} + err ))
			done
		done
	done
	if [[ $W == "${WORKERS_LIST%% *}" ]]; then
		printf '%-3s %-8s %-10s %10s %9s %9s %11s %8s %8s %7s   %s\n' W request server "req/s" "p50 ms" \
			"p99 ms" "CPU us/req" "stub us" "all us" errors "all runs req/s"
	fi
	for kind in "${KINDS[@]}"; do
		for t in idemproxy nginx; do
			M[$W/$kind/$t]="$(median <<<"${RPS[$kind/$t]% }") $(median <<<"${P99[$kind/$t]% }")"
			printf '%-3s %-8s %-10s %10.0f %9.3f %9.3f %11.2f %8.2f %8.2f %7d   %s\n' "$W" "$kind" "$t" \
				"$(median <<<"${RPS[$kind/$t]% }")" "$(median <<<"${P50[$kind/$t]% }")" \
				"$(median <<<"${P99[$kind/$t]% }")" "$(median <<<"${CPU[$kind/$t]% }")" \
				"$(median <<<"${SCPU[$kind/$t]% }")" "$(median <<<"${MCPU[$kind/$t]% }")" \
				"${ERR[$kind/$t]}" "${RPS[$kind/$t]% }"
		done
	done
	for kind in "${KINDS[@]}"; do
		PR[$W/$kind]=$(paired "${RPS[$kind/idemproxy]}" "${RPS[$kind/nginx]}")
		PC[$W/$kind]=$(paired "${CPU[$kind/nginx]}" "${CPU[$kind/idemproxy]}")
		PM[$W/$kind]=$(paired "${MCPU[$kind/nginx]}" "${MCPU[$kind/idemproxy]}")
	done
	hs=$(curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" | awk '/^idemproxy_tls_handshakes_total[ {]/ { s += $NF } END { print s + 0 }')
	note "workers $W: idemproxy_tls_handshakes_total $hs"
	stop_pid "$PROXY_PID"
	stop_pid "$NGINX_PID"
done
echo
echo "== idemproxy / nginx (goal: req/s >= 1.00x nginx, p99 <= nginx)"
printf '%-3s %-8s %10s %10s   %s\n' W request "rps ratio" "p99 ratio" verdict
for W in $WORKERS_LIST; do
	for kind in "${KINDS[@]}"; do
		read -r pr pp <<<"${M[$W/$kind/idemproxy]}"
		read -r nr np <<<"${M[$W/$kind/nginx]}"
		awk -v w="$W" -v k="$kind" -v pr="$pr" -v nr="$nr" -v pp="$pp" -v np="$np" 'BEGIN {
			rr = pr / nr; lr = np > 0 ? pp / np : 0
			printf "%-3s %-8s %9.2fx %9.2fx   rps %s, p99 %s\n", w, k, rr, lr,
				(rr >= 1.0 ? "MET" : sprintf("NOT MET (%.1f%% short)", (1 - rr) * 100)),
				(lr <= 1.0 ? "MET" : sprintf("NOT MET (%.1f%% higher)", (lr - 1) * 100))
		}'
	done
done
echo
echo "== round by round: each round measures both servers back to back"
echo "(req/s: idemproxy / nginx; CPU, all: nginx's CPU per request / idemproxy's, the server's and"
echo " the whole machine's; > 1: idemproxy's run spent less)"
printf '%-3s %-8s %-32s %-32s %-32s\n' W request "req/s ratio: median (q1-q3)" \
	"CPU ratio: median (q1-q3)" "all ratio: median (q1-q3)"
for W in $WORKERS_LIST; do
	for kind in "${KINDS[@]}"; do
		read -r rm rq1 rq3 rup rn <<<"${PR[$W/$kind]}"
		read -r cm cq1 cq3 cup cn <<<"${PC[$W/$kind]}"
		read -r am aq1 aq3 aup an <<<"${PM[$W/$kind]}"
		printf '%-3s %-8s %-32s %-32s %-32s\n' "$W" "$kind" \
			"${rm}x (${rq1}-${rq3}), $rup/$rn ahead" "${cm}x (${cq1}-${cq3}), $cup/$cn ahead" \
			"${am}x (${aq1}-${aq3}), $aup/$an ahead"
	done
done
