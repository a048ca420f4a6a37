#!/usr/bin/env bash
# Stack roll-call latency: `rendezvousctl stacks --pid` on a running job, from the request to
# the printed report, for N local ranks of a C++ program (the worker library's handler) and of
# a Python one (launch's faulthandler hook); the best of 3. The anchor, measured in the same
# run: gdb attaching to ONE rank and printing its threads' backtraces, what one would do by
# hand without muster.
#   tests/bench/stacks_bench.sh [N ...]    (default: 8 64)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${MUSTER_BUILD_DIR:-$root/build}
counts=("$@")
[ ${#counts[@]} -gt 0 ] || counts=(8 64)
work=$(mktemp -d)
launch_pid=
cleanup() { touch "$work/go"; [ -n "$launch_pid" ] && wait "$launch_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
now() { date +%s%N; }
ms() { echo "scale=1; ($2 - $1) / 1000000" | bc; }

run() {  # kind n: starts the job, measures, ends it
  local kind=$1 n=$2 best= gdb_ms=
  rm -f "$work/go" "$work/out"
  if [ "$kind" = c++ ]; then
    cmd=(--no_python "$build/tests/integration/stuck_worker" -1 "$work/go")
  else
    cmd=(--no_python /usr/bin/python3 "$root/tests/bench/stacks_idle.py" "$work/go")
  fi
  "$build/launcher/launch" --nproc_per_node="$n" --master_port=0 --log_dir="$work/logs" "${cmd[@]}" \
    >"$work/out" 2>"$work/err" &
  launch_pid=$!
  for _ in $(seq 600); do
    [ "$(grep -c ' ready$' "$work/out" 2>/dev/null || true)" -ge "$n" ] && break
    sleep 0.1
  done
  for _ in 1 2 3; do
    t0=$(now)
    "$build/rendezvous/rendezvousctl" stacks --pid "$launch_pid" >"$work/report"
    t1=$(now)
    grep -q "stack roll-call" "$work/report"
    t=$(ms "$t0" "$t1")
    if [ -z "$best" ] || [ "$(echo "$t < $best" | bc)" = 1 ]; then best=$t; fi
  done
  rank0=$(sed -n 's/^rank 0 pid \([0-9]*\) ready$/\1/p' "$work/out")
  t0=$(now)
  gdb -p "$rank0" -batch -ex 'thread apply all bt' >/dev/null 2>&1 || true
  t1=$(now)
  gdb_ms=$(ms "$t0" "$t1")
  touch "$work/go"
  wait "$launch_pid" || true
  launch_pid=
  printf '%-7s %4d ranks: roll-call of every rank %8.1f ms | gdb, one rank %8.1f ms | ratio %6.2f\n' \
    "$kind" "$n" "$best" "$gdb_ms" "$(echo "scale=4; $best / $gdb_ms" | bc)"
}

printf 'stack roll-call latency, request to printed report (best of 3), %s cores\n' "$(nproc)"
for n in "${counts[@]}"; do
  run c++ "$n"
  run python "$n"
done
