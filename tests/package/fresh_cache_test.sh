#!/bin/bash
# The tests' cached roots as a machine that never ran them meets them: package_test.sh, then
# the torch 2.x roots (tests/compat/torch2/torch_root.sh, trixie and sid), with
# MUSTER_TEST_CACHE an empty folder (mmdebstrap makes each root, apt downloads every package),
# started from a shell that holds descriptors 3 to 12 open, as ctest and CI shells may. A warm
# cache once hid a package test that failed on every new machine (mmdebstrap's hooks and
# inherited descriptors).
#   fresh_cache_test.sh BUILD_DIR SOURCE_DIR
# It downloads three roots (some 3 GB), so it runs once for each content of what makes them
# (tests/package/, tests/compat/torch2/, tests/support/close_inherited_fds.sh): a pass is
# remembered under /var/cache/muster-test/fresh-proven (the machine's cache, outside the tree)
# by their hash, and a later run with the same content skips, saying so.
# MUSTER_FRESH_CACHE=always runs it whatever was proven.
set -euo pipefail
build=$(cd "$1" && pwd)
source=$(cd "$2" && pwd)
fail() { echo "fresh_cache_test: $*" >&2; exit 1; }
if [ "$(id -u)" -ne 0 ]; then echo "fresh_cache_test: needs root (chroot, mounts): skipped"; exit 77; fi

hash=$(cd "$source" && find tests/package tests/compat/torch2 tests/support/close_inherited_fds.sh \
  -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
proven=${MUSTER_FRESH_PROVEN:-/var/cache/muster-test/fresh-proven}/$hash
if [ -f "$proven" ] && [ "${MUSTER_FRESH_CACHE:-}" != always ]; then
  echo "fresh_cache_test: the roots' makers at $hash passed from an empty cache on $(cat "$proven"): skipped"
  exit 77
fi

empty=$(mktemp -d "${TMPDIR:-/tmp}/muster-empty-cache-XXXXXX")
trap 'rm -rf "$empty"' EXIT
# Descriptors 3-12 open in the shell that starts the test: files, and pipes (FIFOs opened
# for reading and writing, so no process stands behind them to outlive the test).
mkfifo "$empty/pipe-a" "$empty/pipe-b"
exec 3</dev/null 4>/dev/null 5<"$source/README.md" 6<>"$empty/held" 7</dev/null
exec 8<>"$empty/pipe-a" 9<>"$empty/pipe-b" 10</dev/null 11>/dev/null 12</dev/null
held=$(ls /proc/$$/fd | sort -n | tr '\n' ' ')
echo "fresh_cache_test: cache $empty (empty), descriptors open: $held"
start=$SECONDS
MUSTER_TEST_CACHE=$empty MUSTER_PACKAGE_TEST_OUT=$empty/package-test \
  "$source/tests/package/package_test.sh" "$build" "$source" \
  || fail "the package test failed from an empty cache (above)"
[ -s "$empty/bookworm-apt.tar" ] || fail "the package test passed without making a root in the empty cache"
# The torch roots, unpacked in a build folder of their own (the suite's are in use).
for suite in trixie sid; do
  root=$(MUSTER_TEST_CACHE=$empty "$source/tests/compat/torch2/torch_root.sh" "$empty/build" "$suite") \
    || fail "no $suite torch root from an empty cache (above)"
  [ -s "$empty/torch-$suite.tar" ] || fail "torch_root.sh made no $suite root in the empty cache"
  # A TCPStore server with Debian's torch: the root's sitecustomize picks the classic backend.
  "$source/tests/compat/torch2/in_root.sh" "$root" python3 -c \
    'import torch, torch.distributed as d; d.TCPStore("127.0.0.1", 0, 1, True); print("torch", torch.__version__, "TCPStore up")' \
    || fail "the $suite root from an empty cache cannot start a TCPStore"
done
echo "fresh_cache_test: passed from an empty cache in $((SECONDS - start)) s"
mkdir -p "$(dirname "$proven")"
date -u +%FT%TZ >"$proven"
