#!/bin/bash
# The programs that cmake/static_deps.cmake links against static gRPC, Protobuf and Abseil:
# none of those libraries is among what they load, directly or through another library (their
# start depends on it, and a second copy of Abseil beside the linked one would be a bug), and
# each still runs. Usage: static_deps_test.sh PROGRAM...
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 PROGRAM..." >&2; exit 2; }
status=0
for program in "$@"; do
  loaded=$(ldd "$program" | awk '{print $1}')
  shared=$(echo "$loaded" | grep -E '^lib(grpc|gpr|protobuf|absl_|upb|re2|address_sorting)' || true)
  if [ -n "$shared" ]; then
    echo "FAIL: $program loads $(echo $shared) (linked shared: see cmake/static_deps.cmake)"
    status=1
  fi
  "$program" --version >/dev/null || { echo "FAIL: $program --version exited $?"; status=1; }
  echo "$program loads: $(echo $loaded)"
done
exit $status
