#!/usr/bin/env bash
# tests/bench/instructions.sh - user-space instructions per request, counted
# by valgrind's callgrind, for idemproxy and for nginx in front of the same
# stub upstream: plain and TLS, GET and a 1 KiB POST, and (idemproxy only)
# a new key per request on the memory store.
#
# Why: on this kind of machine req/s and even CPU time per request move by
# a fifth from one round to the next, more than most changes to the proxy.
# An instruction count is the same on every run of the same binaries with
# the same requests, whatever else the machine does. It leaves out what
# the kernel does for each system call (see docs/benchmarks.md for those
# counts), and valgrind's CPU has no SHA extensions, so OpenSSL hashes a
# keyed body with its slower generic code there: the KEYED row is high by
# about 30,000 instructions for a 1 KiB body.
#
# One client, one keep-alive connection, one request at a time (ka_client.py):
# every request is a loop turn of its own, which is the most a request can
# cost; under load a turn serves several. Not a test: it prints figures.
#
#   tests/bench/instructions.sh
#   COUNT=1000 ROWS="tls-GET" tests/bench/instructions.sh
#
# Environment (defaults):
#   COUNT=3000 WARM=50   requests counted, and sent before counting
#   ROWS="plain-GET plain-POST tls-GET tls-POST plain-KEYED"
#   IDEMPROXY_BIN        release binary (default: build BUILD_DIR)
#   KEEP_PROFILE=PREFIX  keep each callgrind profile as PREFIX.SERVER.ROW
#   IDEMPROXY_FLAGS      more flags for idemproxy, split on blanks (e.g.
#                        "--access-log /tmp/a.log --access-log-format json")
#   BUILD_DIR            default build-bench;  STUB_BIN, NGINX, PYTHON
#
# Everything listens on 127.0.0.1; every process started here is stopped by
# PID on exit.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=tests/bench/lib.sh
. "$HERE/lib.sh"

COUNT=${COUNT:-3000}
WARM=${WARM:-50}
STOP_WAIT=100	# valgrind writes its profile on the way out
ROWS=${ROWS:-"plain-GET plain-POST tls-GET tls-POST plain-KEYED"}
BUILD_DIR=${BUILD_DIR:-$ROOT/build-bench}
NGINX=${NGINX:-nginx}
PYTHON=${PYTHON:-/usr/bin/python3}

die() { echo "instructions.sh: $*" >&2; exit 1; }

for tool in valgrind callgrind_control "$NGINX" "$PYTHON" openssl; do
	command -v "$tool" >/dev/null || die "$tool not found (apt-get install valgrind nginx)"
done
[[ $COUNT =~ ^[1-9][0-9]*$ ]] || die "COUNT must be a positive integer"

bench_binaries

bench_tmp instr

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
	-keyout "$TMP/key.pem" -out "$TMP/cert.pem" -days 2 -subj /CN=localhost \
	-addext "subjectAltName=DNS:localhost,IP:127.0.0.1" >/dev/null 2>&1 ||
	die "openssl req failed"

start_stub

# fail PID MESSAGE: stop the server being counted, then die
fail() { stop_pid "$1"; die "$2"; }

# count SERVER TRANSPORT KIND: sets COUNTED to the instructions per request
count() {
	local server=$1 transport=$2 kind=$3 port out pid total tls=()
	port=$(free_port)
	out=$TMP/cg.$server.$transport.$kind
	[[ $transport == tls ]] && tls=(--tls)
	if [[ $server == idemproxy ]]; then
		local args=(--upstream "http://127.0.0.1:$STUB_PORT" --listen "127.0.0.1:$port"
			    --admin-listen "127.0.0.1:$(free_port)" --workers 1 --log-level warn)
		[[ $transport == tls ]] && args+=(--tls-cert "$TMP/cert.pem" --tls-key "$TMP/key.pem")
		# shellcheck disable=SC2206
		args+=(${IDEMPROXY_FLAGS:-})
		valgrind --tool=callgrind --callgrind-out-file="$out" \
			"$IDEMPROXY_BIN" "${args[@]}" >"$TMP/$server.log" 2>&1 &
	else
		local conf=nginx.conf.in
		[[ $transport == tls ]] && conf=nginx-tls.conf.in
		mkdir -p "$TMP/nginx"
		sed -e "s|@WORKERS@|1|g" -e "s|@PREFIX@|$TMP/nginx|g" \
		    -e "s|@UPSTREAM_PORT@|$STUB_PORT|g" -e "s|@PORT@|$port|g" \
		    -e "s|@CERT@|$TMP/cert.pem|g" -e "s|@KEY@|$TMP/key.pem|g" \
		    -e "s|^master_process on;|master_process off;|" \
		    "$HERE/$conf" >"$TMP/nginx/nginx.conf"
		valgrind --tool=callgrind --callgrind-out-file="$out" \
			"$NGINX" -c "$TMP/nginx/nginx.conf" -p "$TMP/nginx" \
			-e "$TMP/nginx/error.log" >"$TMP/$server.log" 2>&1 &
	fi
	pid=$!
	PIDS+=("$pid")
	wait_port "$port" "$pid" 60	# valgrind starts slowly
	"$PYTHON" "$HERE/ka_client.py" "$port" "$WARM" "$kind" "${tls[@]}" ||
		fail "$pid" "$server $transport $kind: warm-up failed"
	callgrind_control -z "$pid" >/dev/null 2>&1 || fail "$pid" "callgrind_control -z failed"
	"$PYTHON" "$HERE/ka_client.py" "$port" "$COUNT" "$kind" "${tls[@]}" ||
		fail "$pid" "$server $transport $kind: requests failed"
	callgrind_control -d "$pid" >/dev/null 2>&1 || fail "$pid" "callgrind_control -d failed"
	stop_pid "$pid"
	[[ -z ${KEEP_PROFILE:-} ]] || cp "$out.1" "$KEEP_PROFILE.$server.$transport.$kind"
	total=$(sed -n 's/^summary: //p' "$out.1")
	[[ -n $total ]] || die "$server $transport $kind: no callgrind summary"
	COUNTED=$((total / COUNT))
}

echo "idemproxy: $IDEMPROXY_BIN ($(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'))"
echo "nginx:     $("$NGINX" -v 2>&1 | sed 's/^nginx version: //'); $(openssl version)"
echo "counted:   $COUNT requests after $WARM, one keep-alive connection, one at a time"
echo
printf '%-12s %12s %12s %8s\n' row idemproxy nginx ratio
for row in $ROWS; do
	transport=${row%%-*}
	kind=${row#*-}
	[[ $transport == plain || $transport == tls ]] || die "row $row: plain-* or tls-*"
	count idemproxy "$transport" "$kind"
	a=$COUNTED
	if [[ $kind == KEYED ]]; then
		printf '%-12s %12d %12s %8s\n' "$row" "$a" - -
		continue
	fi
	count nginx "$transport" "$kind"
	printf '%-12s %12d %12d %7.2fx\n' "$row" "$a" "$COUNTED" \
		"$(awk -v a="$a" -v b="$COUNTED" 'BEGIN { print a / b }')"
done
