#!/usr/bin/env bash
# The suite under a sanitizer: builds the project with it into a folder of its own and runs
# every test that can run there.
#   tests/sanitize.sh asan [ctest args]   AddressSanitizer + UndefinedBehaviorSanitizer (and
#                                         LeakSanitizer), into build-asan/
#   tests/sanitize.sh tsan [ctest args]   ThreadSanitizer, into build-tsan/
# MUSTER_SANITIZE_BUILD_DIR overrides the folder. Set-up is deploy/setup.sh's (it installs what
# is missing). Every process a sanitizer stops exits 86 (TSan: 66) and writes its report to
# <build>/sanitizer-reports/, which must be empty at the end: the script prints what is there
# and fails. Left out, each for its reason, are the tests named in tests/sanitize/skip-<kind>.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
kind=${1:-}
case "$kind" in
  asan) flags=address,undefined ;;
  tsan) flags=thread ;;
  *) echo "usage: tests/sanitize.sh asan|tsan [ctest args]" >&2; exit 2 ;;
esac
shift
build=${MUSTER_SANITIZE_BUILD_DIR:-$root/build-$kind}
deps=()
if [ "$kind" = tsan ]; then
  # Abseil, Protobuf and gRPC built with TSan (cached under /var/cache/muster; tsan_deps.sh),
  # found before Debian's; a build folder made against other ones is made again.
  prefix=$("$root/tests/sanitize/tsan_deps.sh")
  if [ "$(cat "$build/tsan-deps" 2>/dev/null)" != "$prefix" ]; then rm -rf "$build"; fi
  mkdir -p "$build"
  echo "$prefix" >"$build/tsan-deps"
  deps=(-DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_RPATH="$prefix/lib")
fi
# The benchmarks measure speed, which a sanitizer's build does not have; the package and image
# tests pack what they find in the build folder, and a sanitizer's programs are not a package.
MUSTER_BUILD_DIR=$build "$root/deploy/setup.sh" -DMUSTER_SANITIZE=$flags -DMUSTER_BUILD_BENCH=OFF "${deps[@]}"
reports=$build/sanitizer-reports
rm -rf "$reports"
mkdir -p "$reports"
# One regular expression of the names in skip-<kind> (a name per line; '#' starts a reason).
skip=$(sed -e 's/#.*//' -e 's/[[:space:]]*$//' -e '/^$/d' "$root/tests/sanitize/skip-$kind" | paste -sd'|')
start=$(date +%s)
rc=0
ctest --test-dir "$build" --output-on-failure --timeout 900 -j"${CTEST_PARALLEL_LEVEL:-$(nproc)}" \
  ${skip:+-E "$skip"} "$@" || rc=$?
echo "sanitize: the suite under $kind took $(( $(date +%s) - start )) s"
if [ -n "$(ls -A "$reports")" ]; then
  for f in "$reports"/*; do
    echo "=== $f"
    cat "$f"
  done
  echo "sanitize: $(ls "$reports" | wc -l) report(s) in $reports" >&2
  exit 1
fi
exit $rc
