#!/usr/bin/env bash
# The demo: set up, build, then run muster's store as a standalone daemon and use it from
# several client processes the way agents and workers do.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/deploy/setup.sh" "$@"
build=${MUSTER_BUILD_DIR:-$root/build}
bin=$build/rendezvous
work=$(mktemp -d)
trap 'kill $daemon 2>/dev/null || true; rm -rf "$work"' EXIT

"$bin/rendezvousd" --host 127.0.0.1 --port 0 2>"$work/daemon.log" &
daemon=$!
for _ in $(seq 100); do
  addr=$(grep -oE 'listening on [0-9.]+:[0-9]+' "$work/daemon.log" | awk '{print $3}' || true)
  [ -n "$addr" ] && break
  sleep 0.05
done
[ -n "$addr" ] || { cat "$work/daemon.log"; exit 1; }
ctl() { "$bin/rendezvousctl" --addr "$addr" --ns demo/round0 "$@"; }
echo "== rendezvousd is up at $addr: $(ctl health)"
echo "== four 'ranks' block on the key 'go' (get blocks until the key exists)"
for r in 0 1 2 3; do (echo "rank $r got: $(ctl get go)") & done
echo "== and each adds itself to a counter"
for r in 0 1 2 3; do ctl add arrived 1 >/dev/null; done
echo "arrived = $(ctl get arrived)"
ctl set go "all 4 here"
wait $(jobs -p | grep -v "^$daemon\$") 2>/dev/null || true
echo "== compare_set elects a leader once"
echo "leader: $(ctl compare-set leader '' rank2), then $(ctl compare-set leader '' rank3)"
echo "== the next round does not see the keys of this one"
echo "keys in demo/round0: $(ctl num-keys); in demo/round1: $("$bin/rendezvousctl" --addr "$addr" --ns demo/round1 num-keys)"
echo "== a get that nobody answers times out, naming the key"
ctl --timeout 0.5 get never || true
kill -TERM $daemon
wait $daemon
echo "== daemon log:"
cat "$work/daemon.log"
