# tests/bench/lib.sh - what the shell benchmarks share: stopping a process
# they started, a free port, waiting for a server to listen. Sourced, not
# run; the script that sources it defines die() and PYTHON.

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
