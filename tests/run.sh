#!/bin/sh
# The test command (README, .ci/run): install what is needed, build under
# AddressSanitizer + UndefinedBehaviorSanitizer with warnings as errors, run
# every suite (unit tests in C, integration tests in pytest against the real
# binary), the soaks, the fuzzers and the memory store's threads under
# ThreadSanitizer, and end with one "N passed, N failed" line. Exit status
# is non-zero on any failure or sanitizer report.
set -eu
cd "$(dirname "$0")/.."

./deploy/install-deps.sh

BUILD=${IDEMPROXY_TEST_BUILD:-build-test}
if [ ! -f "$BUILD/build.ninja" ]; then
  meson setup "$BUILD" \
    -Dbuildtype=debugoptimized \
    -Db_sanitize=address,undefined \
    -Dc_args=-fno-sanitize-recover=all \
    -Dwerror=true
fi
meson compile -C "$BUILD"

# Sanitizer reports end the process with an error; the integration tests
# also scan every process's stderr for them.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"

status=0
# Citus (tests/integration/test_citus.py, the Citus soak) is built from its
# source tarball by the tests themselves the first time
# (tests/integration/support/citus.py runs deploy/build-citus.sh), then
# cached; a machine that cannot build it fails them, with the reason.
meson test -C "$BUILD" --print-errorlogs --num-processes 2 || status=$?

# The soak (tests/soak, docs/reliability.md): ~60 s of three instances on
# PostgreSQL + Redis under faults, then its history checker; it prints its
# own PASS/FAIL and a failing run keeps its history (path printed).
IDEMPROXY_BIN="$(cd "$BUILD" && pwd)/proxy/idemproxy" tests/soak/run.sh 60 ||
  status=1
# The same against Citus (a coordinator and two workers, docs/scale.md):
# each PostgreSQL fault hits one of the three nodes.
SOAK_ARGS=--citus IDEMPROXY_BIN="$(cd "$BUILD" && pwd)/proxy/idemproxy" \
  tests/soak/run.sh 60 || status=1

# The soak again on the release build, the binary users run: it links
# jemalloc, which a sanitized build cannot (docs/architecture.md "Memory:
# the allocator").
REL_BUILD=${IDEMPROXY_RELEASE_BUILD:-build-release}
if [ ! -f "$REL_BUILD/build.ninja" ]; then
  meson setup "$REL_BUILD" -Dbuildtype=release -Djemalloc=enabled \
    -Dintegration_tests=disabled -Dwerror=true
fi
if meson compile -C "$REL_BUILD"; then
  IDEMPROXY_BIN="$(cd "$REL_BUILD" && pwd)/proxy/idemproxy" \
    tests/soak/run.sh 60 || status=1
else
  status=1
fi

# The fuzzers (tests/fuzz, docs/fuzzing.md): a short run of each harness
# from its seeds and regression inputs (IDEMPROXY_FUZZ_SECONDS, default 5),
# one at a time, in a clang build of their own; counted in the summary.
FUZZ_BUILD=${IDEMPROXY_FUZZ_BUILD:-build-fuzz}
logs="$BUILD/meson-logs/all-testlog.json"
cp "$BUILD/meson-logs/testlog.json" "$logs"
if IDEMPROXY_FUZZ_BUILD="$FUZZ_BUILD" tests/fuzz/run.sh --setup; then
  meson test -C "$FUZZ_BUILD" --suite fuzz --no-rebuild --print-errorlogs \
    --num-processes 1 || status=1
  cat "$FUZZ_BUILD/meson-logs/testlog.json" >> "$logs"
else
  echo '{"name": "fuzz: build", "result": "FAIL"}' >> "$logs"
  status=1
fi

# The memory store's threads under ThreadSanitizer: its unit test runs
# claims, completions, waiters woken through the loops' mailboxes and
# cancellations from many threads at once (docs/architecture.md "The store
# interface"). ASLR off (setarch -R) where the machine allows it: TSan's
# shadow memory needs an address layout it knows, which some kernels'
# randomisation breaks. Counted in the summary.
TSAN_BUILD=${IDEMPROXY_TSAN_BUILD:-build-tsan}
no_aslr=""
if setarch "$(uname -m)" -R true 2>/dev/null; then
  no_aslr="setarch $(uname -m) -R"
fi
if { [ -f "$TSAN_BUILD/build.ninja" ] ||
     meson setup "$TSAN_BUILD" -Dbuildtype=debugoptimized -Db_sanitize=thread \
       -Dintegration_tests=disabled -Dwerror=true >/dev/null; } &&
   meson compile -C "$TSAN_BUILD" tests/unit/test_store >/dev/null; then
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1" \
    $no_aslr meson test -C "$TSAN_BUILD" store \
      --no-rebuild --print-errorlogs --logbase tsan || status=1
  cat "$TSAN_BUILD/meson-logs/tsan.json" >> "$logs"
else
  echo '{"name": "tsan: build", "result": "FAIL"}' >> "$logs"
  status=1
fi

/usr/bin/python3 tests/support/summary.py "$logs" || status=1
exit $status
