# tests/bench/lib.sh - what the shell benchmarks share: stopping a process
# they started, a free port, waiting for a server to listen, CPU time of
# processes and of the machine, medians and round-by-round ratios.
# Sourced, not run; the script that sources it defines die() and PYTHON.

# stop_pid PID: TERM, up to 5 s (STOP_WAIT tenths of a second), then KILL
stop_pid() {
	local pid=$1 i
	kill -0 "$pid" 2>/dev/null || return 0
	kill -TERM "$pid" 2>/dev/null || true
	for i in $(seq "${STOP_WAIT:-50}"); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
}

free_port() {
	"$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# wait_port PORT PID [SECONDS]: until something accepts on PORT (10 s)
wait_port() {
	local port=$1 pid=$2 secs=${3:-10} i
	for i in $(seq $((secs * 10))); do
		kill -0 "$pid" 2>/dev/null || die "process $pid exited during start-up"
		if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
			return 0
		fi
		sleep 0.1
	done
	die "nothing listens on port $port after $secs s"
}

# bench_binaries: IDEMPROXY_BIN, a release build in BUILD_DIR (under ROOT)
# unless given, with BIN_ORIGIN saying which, and STUB_BIN; both checked
bench_binaries() {
	BIN_ORIGIN="given as IDEMPROXY_BIN"
	if [[ -z ${IDEMPROXY_BIN:-} ]]; then
		BIN_ORIGIN=built
		if [[ ! -f $BUILD_DIR/build.ninja ]]; then
			echo "# configuring release build in $BUILD_DIR" >&2
			meson setup "$BUILD_DIR" "$ROOT" -Dbuildtype=release >/dev/null
		fi
		echo "# building $BUILD_DIR" >&2
		meson compile -C "$BUILD_DIR" >/dev/null
		IDEMPROXY_BIN=$BUILD_DIR/proxy/idemproxy
		STUB_BIN=${STUB_BIN:-$BUILD_DIR/tests/support/stub_upstream}
	fi
	STUB_BIN=${STUB_BIN:-$(dirname "$IDEMPROXY_BIN")/../tests/support/stub_upstream}
	[[ -x $IDEMPROXY_BIN ]] || die "no idemproxy binary at $IDEMPROXY_BIN"
	[[ -x $STUB_BIN ]] || die "no stub upstream at $STUB_BIN"
}

# start_stub: tests/support/stub_upstream on a free port (STUB_PORT,
# STUB_PID), behind the script's server_cpu prefix if it has one (taskset)
start_stub() {
	local i
	${server_cpu[@]+"${server_cpu[@]}"} "$STUB_BIN" --listen 127.0.0.1:0 \
		>"$TMP/stub.out" 2>"$TMP/stub.log" &
	STUB_PID=$!
	PIDS+=("$STUB_PID")
	for i in $(seq 100); do
		if grep -q '^listening ' "$TMP/stub.out" 2>/dev/null; then
			STUB_PORT=$(sed -n 's/^listening .*:\([0-9]*\)$/\1/p' "$TMP/stub.out")
			return 0
		fi
		kill -0 "$STUB_PID" 2>/dev/null || die "stub upstream exited"
		sleep 0.1
	done
	die "stub upstream did not start"
}

# bench_tmp NAME: TMP, a directory of the script's own, PIDS=(), and
# bench_trap
bench_tmp() {
	TMP=$(mktemp -d "/tmp/idemproxy-$1-bench.XXXXXX")
	PIDS=()
	bench_trap
}

# bench_trap: on exit (also Ctrl-C, TERM, a failure) run the script's
# bench_stop_first() if it has one, stop every PID in PIDS, last started
# first, then run its bench_stop_more(); after a failure show the last
# lines of TMP's logs; remove TMP. The script sets TMP and PIDS=() first
# (bench_tmp does all three).
bench_trap() {
	trap bench_exit EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
}

bench_exit() {
	local rc=$? i f
	trap - EXIT INT TERM
	if declare -F bench_stop_first >/dev/null; then
		bench_stop_first
	fi
	for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
		stop_pid "${PIDS[i]}"
	done
	if declare -F bench_stop_more >/dev/null; then
		bench_stop_more
	fi
	if [[ $rc -ne 0 && -d $TMP ]]; then
		for f in "$TMP"/*.log "$TMP"/nginx/error.log; do
			[[ -s $f ]] || continue
			echo "---- $f (last lines)" >&2
			tail -n 20 "$f" >&2
		done
	fi
	rm -rf "$TMP"
	exit "$rc"
}

# proc_ticks PID...: CPU time (user + system) in clock ticks, summed over
# the PIDs (the fields after the command, which may hold blanks)
proc_ticks() {
	local sum=0 pid v
	for pid in "$@"; do
		v=$(sed 's/^.*) //' "/proc/$pid/stat" | awk '{ print $12 + $13 }')
		sum=$((sum + v))
	done
	echo "$sum"
}

# busy_ticks: busy time of the whole machine (every CPU: user, nice,
# system, irq, softirq, steal; not idle nor iowait), in clock ticks
busy_ticks() {
	awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat
}

# median: of the numbers on standard input, separated by spaces
median() { tr ' ' '\n' | sort -g | awk '{ v[NR] = $1 } END {
	if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# paired "A1 A2 ..." "B1 B2 ..." [MIN]: the ratios Ai / Bi of rounds
# measured back to back, as "median q1 q3 met n" (met: rounds with
# Ai / Bi >= MIN, 1 unless given). The machine's speed drifts between
# rounds by more than two rows differ; within a round both see nearly the
# same machine.
paired() {
	awk -v a="$1" -v b="$2" -v min="${3:-1}" 'BEGIN {
		n = split(a, x, " "); split(b, y, " ")
		for (i = 1; i <= n; i++) { r[i] = y[i] > 0 ? x[i] / y[i] : 0; up += (r[i] >= min) }
		for (i = 2; i <= n; i++)	# insertion sort: n is small
			for (j = i; j > 1 && r[j - 1] > r[j]; j--) { t = r[j]; r[j] = r[j - 1]; r[j - 1] = t }
		printf "%.3f %.3f %.3f %d %d\n", (n % 2 ? r[(n + 1) / 2] : (r[n / 2] + r[n / 2 + 1]) / 2),
			r[int((n + 3) / 4)], r[n + 1 - int((n + 3) / 4)], up, n
	}'
}

# run_wrk URL DURATION [LUA] [PIDS]: prints "rps p50_ms p99_ms errors cpu_us_per_req";
# with the script's THREADS, CONNS, WRK and wrk_cpu (a taskset prefix, or ());
# the last is the CPU time the server PIDS used per request during the run
# (0 without PIDS), a figure much less sensitive to a busy machine than req/s.
run_wrk() {
	local url=$1 dur=$2 lua=${3:-} pids=${4:-} secs out t0 t1
	local args=(-t"$THREADS" -c"$CONNS" -d"$dur" --latency)
	[[ -n $lua ]] && args+=(-s "$lua")
	secs=${dur%s}
	# shellcheck disable=SC2086
	t0=$(proc_ticks $pids)
	out=$(timeout $((secs + 30)) "${wrk_cpu[@]}" "$WRK" "${args[@]}" "$url") ||
		die "wrk failed against $url"
	# shellcheck disable=SC2086
	t1=$(proc_ticks $pids)
	awk -v ticks=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" '
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
	END { printf "%.0f %.3f %.3f %d %.2f\n", rps, p50, p99, err,
		(n > 0 ? ticks * 1e6 / hz / n : 0) }
	' <<<"$out"
}
