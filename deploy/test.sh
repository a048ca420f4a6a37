#!/usr/bin/env bash
# The tests: set up, build, run every test with ctest. Exits non-zero when any test fails.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/deploy/setup.sh" "$@"
build=${MUSTER_BUILD_DIR:-$root/build}
# CTEST_PARALLEL_LEVEL: more tests at once than cores (the suite must pass at -j4 on 2 cores).
ctest --test-dir "$build" --output-on-failure --timeout 600 -j"${CTEST_PARALLEL_LEVEL:-$(nproc)}"
