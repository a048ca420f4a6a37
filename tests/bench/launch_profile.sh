#!/bin/bash
# Where launch's start goes: perf over RUNS runs of a trivial 4-worker job, and the CPU that
# each phase of launch took per run (DWARF call graphs, so a phase counts what it calls).
# Wall time against torchrun is launch_bench's; this says what makes it up.
#
#   tests/bench/launch_profile.sh [LAUNCH] [RUNS]    (LAUNCH: build/launcher/launch)
#
# Needs perf (linux-perf) and root or kernel.perf_event_paranoid <= 1. perf's sampling slows
# the runs down; compare phases within one output, or two binaries profiled one after the other.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
launch=${1:-$here/build/launcher/launch}
runs=${2:-40}
command -v perf >/dev/null || { echo "launch_profile: perf is not installed (apt-get install linux-perf)" >&2; exit 2; }
[ -x "$launch" ] || { echo "launch_profile: $launch is not an executable" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/runs.sh" <<EOF
#!/bin/sh
for i in \$(seq $runs); do "$launch" --nproc_per_node=4 --no_python /bin/true >/dev/null 2>&1 || exit 1; done
EOF
chmod +x "$work/runs.sh"
hz=10000
perf record -q -F $hz --call-graph dwarf,16384 -o "$work/perf.data" "$work/runs.sh" >/dev/null 2>&1 \
  || { echo "launch_profile: perf record failed (perf_event_paranoid?)" >&2; exit 1; }
comm=$(basename "$launch" | cut -c1-15)
samples=$(perf script -i "$work/perf.data" --comm "$comm" -F comm 2>/dev/null | wc -l)
perf report -i "$work/perf.data" --comm "$comm" --children --percentage relative --sort symbol \
  --stdio -g none 2>/dev/null | sed 's/  */ /g' >"$work/report.txt"
awk -v n="$samples" -v hz=$hz -v runs="$runs" 'BEGIN {
  printf "launch CPU per run: %.2f ms (%d samples at %d Hz over %d runs)\n", n / hz * 1000 / runs, n, hz, runs }'
while IFS='|' read -r symbol what; do
  # A phase without samples is 0 (no line in the report).
  pct=$(awk -v s="] $symbol " 'index($0, s) { gsub("%", "", $1); print $1; exit }' "$work/report.txt")
  awk -v p="${pct:-0}" -v n="$samples" -v hz=$hz -v runs="$runs" -v what="$what" 'BEGIN {
    printf "  %6.2f ms %5.1f%%  %s\n", p / 100 * n / hz * 1000 / runs, p, what }'
done <<'EOF'
_dl_relocate_object|relocating the program and its shared libraries (ld.so)
muster::launcher::Agent::prepare|prepare: job layout, the store, the watchdogs
muster::rendezvous::RendezvousServer::start|  of which the store (gRPC, TCPStore front, direct path)
muster::launcher::Agent::startRound|a round: rank directories, the workers' start
muster::launcher::spawnProcess|  of which spawning the 4 workers (launch's side: each clone until exec)
muster::launcher::Agent::killLeftovers|after the round: looking for what the workers left
muster::launcher::JobLayout::cleanUp|removing the job's directories
exit_mmap|tearing down launch's memory at exit (kernel)
EOF
