#!/usr/bin/env bash
# The demo: set up, build, then run a real PyTorch DistributedDataParallel training job under
# launch (2 ranks, Gloo), show how a failing rank is reported, and use the store from a client.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/deploy/setup.sh" "$@"
build=${MUSTER_BUILD_DIR:-$root/build}
# Debian's PyTorch lives under /usr/bin/python3, whatever python3 comes first on PATH.
export PYTHON_EXEC=${PYTHON_EXEC:-/usr/bin/python3}
launch=$build/launcher/launch

echo
echo "== 1. training: launch --nproc_per_node=2 examples/ddp_demo.py --epochs 5"
start=$(date +%s%N)
"$launch" --nproc_per_node=2 --master_port=0 "$root/examples/ddp_demo.py" --epochs 5
echo "   (done in $(( ($(date +%s%N) - start) / 1000000 )) ms, Python start-up and launch included)"

echo
echo "== 2. a rank that fails: launch names it, stops the others at once, shows why"
if "$launch" --nproc_per_node=2 --master_port=0 "$root/examples/ddp_demo.py" --epochs 3 \
     --fail-rank 1; then
  echo "unexpected success"; exit 1
else
  echo "   (launch exited with $?, as it should)"
fi

echo
echo "== 3. the store on its own: rendezvousd and a client"
work=$(mktemp -d)
trap 'kill $daemon 2>/dev/null || true; rm -rf "$work"' EXIT
"$build/rendezvous/rendezvousd" --host 127.0.0.1 --port 0 2>"$work/daemon.log" &
daemon=$!
addr=""
for _ in $(seq 200); do
  addr=$(grep -oE 'listening on [0-9.]+:[0-9]+' "$work/daemon.log" | awk '{print $3}' || true)
  [ -n "$addr" ] && break
  sleep 0.05
done
[ -n "$addr" ] || { cat "$work/daemon.log"; exit 1; }
ctl() { "$build/rendezvous/rendezvousctl" --addr "$addr" --ns demo/round0 "$@"; }
echo "rendezvousd at $addr: $(ctl health)"
( echo "a waiting get got: $(ctl get go)" ) &
getter=$!
ctl set go "hello from another process"
wait $getter
echo "add: $(ctl add counter 5), compare_set: $(ctl compare-set leader '' rank0)"
kill -TERM $daemon
wait $daemon
echo "rendezvousd stopped cleanly"
