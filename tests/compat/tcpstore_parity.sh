#!/bin/bash
# Every TCPStore method of one torch's own client (tcpstore_ops.py, under with_torch.sh: 1.13's,
# or 2.x's with append, multi_get/set, check, list_keys, queues and timeouts) against torch's own
# server and against launch's front as a rank sees it (MASTER_ADDR:MASTER_PORT of a job): the
# same answers, and the same exception classes where one fails. Usage: with_torch.sh ...
# tcpstore_parity.sh BUILD SOURCE
set -euo pipefail
build=$(cd "$1" && pwd)
source=$(cd "$2" && pwd)
ops=$source/tests/compat/tcpstore_ops.py
work=$(mktemp -d /tmp/muster-tcpstore-XXXXXX)
trap 'rm -rf "$work"' EXIT
# torch 2.6's client can abort in pybind11 ("pybind11_object_dealloc(): Tried to deallocate
# unregistered instance!") as it frees a store after an exception (seen once in a suite run, on
# its own server: the reference side; not reproduced in 32 runs, 10 of them under stress-ng): a
# side that ends so is run again, once, saying so. Any other end is a failure.
torch_abort() { grep -q "pybind11_object_dealloc(): Tried to deallocate unregistered instance" "$1"; }
ref() { TCPSTORE_OPS_OUT=$work/torch.json "$MUSTER_TEST_PYTHON" "$ops" ref >"$work/ref.log" 2>&1; }
ours() {
  # shellcheck disable=SC2086  # MUSTER_TEST_LAUNCH_FLAGS: words
  TCPSTORE_OPS_OUT=$work/launch.json PYTHON_EXEC=$MUSTER_TEST_PYTHON "$build/launcher/launch" \
    $MUSTER_TEST_LAUNCH_FLAGS --nproc_per_node=1 --master_port=0 "$ops" env >"$work/launch.log" 2>&1
}
ref || { torch_abort "$work/ref.log" && echo "torch $MUSTER_TEST_TORCH's client aborted in pybind11 on its own server: once more" && ref; } \
  || { cat "$work/ref.log"; echo "FAIL: torch $MUSTER_TEST_TORCH against its own server"; exit 1; }
ours || { torch_abort "$work/launch.log" && echo "torch $MUSTER_TEST_TORCH's client aborted in pybind11 under launch: once more" && ours; } \
  || { cat "$work/launch.log"; echo "FAIL: torch $MUSTER_TEST_TORCH's client under launch"; exit 1; }
/usr/bin/python3 - "$work" "$MUSTER_TEST_TORCH" <<'PY'
import json, sys
work, version = sys.argv[1:]
theirs = json.load(open(f"{work}/torch.json"))
ours = json.load(open(f"{work}/launch.json"))
# Kept on purpose: launch's front maps every /worker/attempt_N prefix to the round's one key
# space (the nodes of a round may count restarts differently), so another attempt's prefix
# names this round's keys; a rank only ever uses its own.
# A key of more than 8,192 bytes on the wire: torch's classic server takes it, launch's front
# refuses it (closing the connection, with a line in its log) as torch's libuv server does.
# torch 1.13's client does not cancel a wait it gave up on; torch's server wakes it on a later
# SET of that key and the stray byte breaks the client's next answer (tcpstore_ops.py's
# timeout_same_key: the get after the set fails). launch's front withdraws a parked wait once
# its client asks anything else, and that get returns the value.
KEPT = {"check_other_attempt", "longer_check", "to_get_same_key"}
failed = False
for key in sorted(set(theirs) | set(ours)):
    if theirs.get(key) != ours.get(key) and key in KEPT:
        print(f"kept {key}: launch's front {ours.get(key)!r}, torch {version}'s server {theirs.get(key)!r}")
    elif theirs.get(key) != ours.get(key):
        print(f"FAIL {key}: launch's front {ours.get(key)!r}, torch {version}'s server {theirs.get(key)!r}")
        failed = True
print(f"torch {version}: {len(theirs)} answers of its TCPStore client,",
      "some differ" if failed else "the same from launch's front as from torch's own server")
for key in ("queue_push", "list_keys", "get_missing_class", "wait_given_timeout_class"):
    if key in theirs:
        print(f"  {key}: {theirs[key]!r}")
sys.exit(1 if failed else 0)
PY
