#!/bin/sh
# tests/soak/run.sh [SECONDS] [SEED] - the soak with its history checker
# (tests/soak/soak.py; docs/reliability.md). SECONDS defaults to 60 (the
# run in tests/run.sh); 600 is the long run. A SEED repeats a run's fault
# schedule and client operations. First the checker's own tests (it must
# catch the violations it is meant to catch), then the soak. Exit status
# non-zero on any violation or failure; a failing run keeps its history
# and prints where.
#
# IDEMPROXY_BIN  the binary under test (default: build-test/proxy/idemproxy,
#                the ASan+UBSan build of tests/run.sh)
# SOAK_ARGS      more soak.py options (--instances 2, --clients 12, --keep;
#                --lenient: at-least-once proxies, the former checker rules)
set -eu
cd "$(dirname "$0")/../.."
SECONDS_=${1:-60}
SEED=${2:-}
: "${IDEMPROXY_BIN:=$PWD/build-test/proxy/idemproxy}"
export IDEMPROXY_BIN
export PYTHONDONTWRITEBYTECODE=1

if ! /usr/bin/python3 tests/soak/test_check.py >/tmp/soak-check-tests.$$ 2>&1; then
  cat /tmp/soak-check-tests.$$
  rm -f /tmp/soak-check-tests.$$
  echo "soak: the checker's own tests failed" >&2
  exit 1
fi
echo "soak: checker self-test: $(tail -n 3 /tmp/soak-check-tests.$$ | tr '\n' ' ')"
rm -f /tmp/soak-check-tests.$$
# shellcheck disable=SC2086
exec /usr/bin/python3 tests/soak/soak.py --duration "$SECONDS_" \
    ${SEED:+--seed "$SEED"} ${SOAK_ARGS:-}
