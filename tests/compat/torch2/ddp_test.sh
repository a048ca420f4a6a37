#!/bin/bash
# A DDP step on Gloo under one torch, run by that torch's own torchrun and by launch side by
# side (under with_torch.sh: the ranks are that torch's Python, with its TCPStore client on
# launch's front). The parameters after the step must be the same to the bit, the all-reduce
# right, and every torchrun variable the ranks see the same (launch given
# MUSTER_TEST_LAUNCH_FLAGS to follow that torchrun). Usage: with_torch.sh ... ddp_test.sh BUILD SOURCE
set -euo pipefail
build=$(cd "$1" && pwd)
source=$(cd "$2" && pwd)
version=$MUSTER_TEST_TORCH
work=$(mktemp -d /tmp/muster-torch2-XXXXXX)
trap 'rm -rf "$work"' EXIT
free_port() { /usr/bin/python3 -c "import sys; sys.path.insert(0, '$source/tests/compat'); import parity_support as p; print(p.free_port())"; }
unset OMP_NUM_THREADS
mkdir "$work/torch" "$work/muster"
tp=$(free_port)
# shellcheck disable=SC2086  # MUSTER_TEST_TORCHRUN is a command line
$MUSTER_TEST_TORCHRUN --nproc_per_node=2 --master_port="$tp" \
  "$source/tests/compat/ddp_step.py" "$work/torch" >"$work/torchrun.log" 2>&1 \
  || { cat "$work/torchrun.log"; echo "FAIL: torchrun $version failed"; exit 1; }
mp=$(free_port)
# shellcheck disable=SC2086  # MUSTER_TEST_LAUNCH_FLAGS: words
PYTHON_EXEC=$MUSTER_TEST_PYTHON "$build/launcher/launch" $MUSTER_TEST_LAUNCH_FLAGS --nproc_per_node=2 \
  --master_port="$mp" "$source/tests/compat/ddp_step.py" "$work/muster" >"$work/launch.log" 2>&1 \
  || { cat "$work/launch.log"; echo "FAIL: launch with torch $version ranks failed"; exit 1; }
/usr/bin/python3 - "$work" "$tp" "$mp" "$version" <<'PY'
import json, sys
work, tp, mp, version = sys.argv[1:]
failed = False
for rank in (0, 1):
    theirs = json.load(open(f"{work}/torch/{rank}.json"))
    ours = json.load(open(f"{work}/muster/{rank}.json"))
    if ours["params"] != theirs["params"]:
        print(f"FAIL: rank {rank}: parameters differ: launch {ours['params']} torchrun {theirs['params']}")
        failed = True
    if ours["allreduce"] != 3.0 or ours["world"] != 2:
        print(f"FAIL: rank {rank}: all-reduce {ours['allreduce']}, world {ours['world']}")
        failed = True
    for key in sorted(set(theirs["env"]) | set(ours["env"])):
        value, mine = theirs["env"].get(key), ours["env"].get(key)
        if key == "MASTER_PORT":
            same = mine == mp and value == tp
        elif key == "TORCHELASTIC_ERROR_FILE":
            suffix = f"/attempt_0/{rank}/error.json"
            same = (mine or "").endswith(suffix) and (value or "").endswith(suffix)
        else:
            same = mine == value
        if not same:
            print(f"FAIL: rank {rank}: {key}: launch {mine!r}, torchrun {version} {value!r}")
            failed = True
print(f"torch {version}: the DDP step under launch and under its torchrun", "differs" if failed else "is the same")
sys.exit(1 if failed else 0)
PY
