#!/bin/sh
# Run the libFuzzer harnesses of tests/fuzz (docs/fuzzing.md).
#
#   tests/fuzz/run.sh SECONDS [TARGET...]   build if needed, run each target
#                                           for SECONDS, one at a time
#   tests/fuzz/run.sh --setup               only install clang and build
#   tests/fuzz/run.sh --meson TARGET        one short run, as meson test of
#                                           suite 'fuzz' calls it
#                                           (IDEMPROXY_FUZZ_SECONDS, default 5)
#
# The build is build-fuzz (IDEMPROXY_FUZZ_BUILD): clang, ASan+UBSan, every
# library instrumented for coverage (-fsanitize=fuzzer-no-link). Each run
# starts from a copy of tests/fuzz/corpus/TARGET in BUILD/fuzz/TARGET/corpus,
# so the tree is never written (IDEMPROXY_FUZZ_RESUME=1: from the corpus the
# last run left there, to add up long runs); what a run finds is kept in
# BUILD/fuzz/TARGET too (crash-*, leak-*, timeout-*) and the run fails.
# The last line of each target is
# "fuzz_TARGET: N runs in S s (N/s), cov C, ft F, corpus K: ok".
set -eu
cd "$(dirname "$0")/../.."

ALL="request response keysrc idemkey verify config setting jcs fpshape jwt logs proxyproto"
BUILD=${IDEMPROXY_FUZZ_BUILD:-build-fuzz}

# The input size each target is run with: a head of 4 KiB and a few
# pipelined ones, a response with a body, config files, single values.
max_len() {
	case $1 in
	request) echo 16384 ;;
	response) echo 16384 ;;
	keysrc) echo 4096 ;;
	idemkey) echo 1024 ;;
	verify) echo 4096 ;;
	config) echo 8192 ;;
	setting) echo 512 ;;
	jcs) echo 4096 ;;
	fpshape) echo 2048 ;;
	jwt) echo 4096 ;;
	logs) echo 8192 ;;
	proxyproto) echo 4608 ;;
	*) echo "tests/fuzz/run.sh: unknown target $1 (targets: $ALL)" >&2; exit 2 ;;
	esac
}

# Does clang link a libFuzzer program (clang and libclang-rt-14-dev)?
fuzzer_links() {
	command -v clang >/dev/null 2>&1 &&
	echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' |
		clang -fsanitize=fuzzer -x c - -o /dev/null >/dev/null 2>&1
}

setup() {
	if ! fuzzer_links; then
		./deploy/install-deps.sh
		fuzzer_links || { echo "tests/fuzz/run.sh: clang -fsanitize=fuzzer does not link" >&2; exit 1; }
	fi
	if [ ! -f "$BUILD/build.ninja" ]; then
		CC=clang meson setup "$BUILD" \
			-Dfuzz=true \
			-Dintegration_tests=disabled \
			-Dbuildtype=debugoptimized \
			-Db_sanitize=address,undefined \
			-Db_lundef=false \
			"-Dc_args=-fsanitize=fuzzer-no-link -fno-sanitize-recover=all" \
			>"$BUILD.setup.log" 2>&1 ||
			{ cat "$BUILD.setup.log"; rm -rf "$BUILD"; exit 1; }
		rm -f "$BUILD.setup.log"
	fi
	exes=""
	for x in $ALL; do exes="$exes fuzz_$x"; done
	# shellcheck disable=SC2086
	meson compile -C "$BUILD" $exes >"$BUILD/fuzz-compile.log" 2>&1 ||
		{ cat "$BUILD/fuzz-compile.log"; exit 1; }
}

# run_one TARGET SECONDS: 0 when nothing was found.
run_one() {
	t=$1
	secs=$2
	exe="$BUILD/tests/fuzz/fuzz_$t"
	work="$BUILD/fuzz/$t"
	seeds="tests/fuzz/corpus/$t"
	dict=""
	if [ "${IDEMPROXY_FUZZ_RESUME:-0}" = 1 ] && [ -d "$work/corpus" ]; then
		rm -f "$work"/crash-* "$work"/leak-* "$work"/timeout-* \
			"$work"/oom-* "$work"/slow-unit-*
	else
		rm -rf "$work"
	fi
	mkdir -p "$work/corpus"
	if [ -d "$seeds" ]; then
		cp "$seeds"/* "$work/corpus/" 2>/dev/null || true
	fi
	if [ -f "tests/fuzz/$t.dict" ]; then
		dict="-dict=tests/fuzz/$t.dict"
	fi
	rc=0
	# shellcheck disable=SC2086
	ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}:allocator_may_return_null=1" \
	UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1}:print_stacktrace=1" \
	"$exe" -max_total_time="$secs" -max_len="$(max_len "$t")" \
		-timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
		-artifact_prefix="$work/" $dict "$work/corpus" \
		>"$work/log" 2>&1 || rc=$?
	runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -n 1)
	rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/log" | tail -n 1)
	last=$(grep -E '^#[0-9]+' "$work/log" | tail -n 1)
	cov=$(echo "$last" | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
	ft=$(echo "$last" | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
	corp=$(echo "$last" | sed -n 's/.* corp: \([0-9]*\).*/\1/p')
	found=$(cd "$work" && ls -d crash-* leak-* timeout-* oom-* slow-unit-* 2>/dev/null || true)
	if [ "$rc" -ne 0 ] || [ -n "$found" ]; then
		echo "--- fuzz_$t: the end of its log ($work/log):"
		tail -n 60 "$work/log"
		echo "fuzz_$t: ${runs:-?} runs in $secs s (${rate:-?}/s), cov ${cov:-?}, ft ${ft:-?}: FINDING (exit $rc): $(echo $found | sed "s|\([^ ]*\)|$work/\1|g")"
		return 1
	fi
	echo "fuzz_$t: ${runs:-?} runs in $secs s (${rate:-?}/s), cov ${cov:-?}, ft ${ft:-?}, corpus ${corp:-?}: ok"
	return 0
}

case "${1:-}" in
--setup)
	setup
	;;
--meson)
	[ $# -eq 2 ] || { echo "usage: $0 --meson TARGET" >&2; exit 2; }
	max_len "$2" >/dev/null
	run_one "$2" "${IDEMPROXY_FUZZ_SECONDS:-5}"
	;;
''|-*)
	echo "usage: $0 SECONDS [TARGET...] | --setup | --meson TARGET" >&2
	echo "targets: $ALL" >&2
	exit 2
	;;
*)
	secs=$1
	shift
	targets=${*:-$ALL}
	for t in $targets; do max_len "$t" >/dev/null; done
	setup
	status=0
	for t in $targets; do
		run_one "$t" "$secs" || status=1
	done
	exit $status
	;;
esac
