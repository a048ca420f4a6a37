#!/usr/bin/env bash
# Runs the scaling benchmarks and draws their curves next to their anchors (gnuplot, SVG):
#   rdzv.svg     agents joining one round (muster's rendezvous; torch's c10d rendezvous at 32)
#   startup.svg  job start-up through the store against ranks: c10d's TCPStore, launch's
#                front and the gRPC store, with one-connection clients and LibTorch's client
#   store.svg    set+get ops/s against client processes (TCPStore, front, gRPC store, and the
#                same store on its direct path)
# and keeps each bench's CSV and output beside them. Usage:
#   tests/bench/plot_scaling.sh [--plot-only] [OUT_DIR]
# OUT_DIR defaults to docs/perf; --plot-only redraws from the CSV already there. BUILD names
# the build directory (default build). About 5 minutes here.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD:-build}
plotOnly=0
if [[ ${1:-} == --plot-only ]]; then
  plotOnly=1
  shift
fi
out=${1:-docs/perf}
if ! command -v gnuplot >/dev/null; then
  echo "plot_scaling: gnuplot is not installed (apt-get install gnuplot-nox)" >&2
  exit 2
fi
for bench in rdzv_bench store_bench; do
  ((plotOnly)) && break
  if [[ ! -x $build/tests/bench/$bench ]]; then
    echo "plot_scaling: $build/tests/bench/$bench is missing; build first (cmake --build $build)" >&2
    exit 2
  fi
done
mkdir -p "$out"

# The lines a bench marks "csv: " (or "csv-torch: ", "csv-heartbeat: "), without the mark.
csv() { sed -n "s/^$1: //p"; }

if ((!plotOnly)); then
  "$build"/tests/bench/rdzv_bench --sizes 1024,4096,12500,16384,65536 --torch-agents 32 \
    | tee "$out/rdzv.txt"
  csv csv <"$out/rdzv.txt" >"$out/rdzv.csv"
  csv csv-torch <"$out/rdzv.txt" >"$out/rdzv-torch.csv"
  csv csv-heartbeat <"$out/rdzv.txt" >"$out/rdzv-heartbeat.csv"
  "$build"/tests/bench/store_bench --startup 1024,2048,4096,8192,16384 --startup-client wire \
    --stores tcpstore,front,grpc \
    | tee "$out/startup-wire.txt"
  csv csv <"$out/startup-wire.txt" >"$out/startup-wire.csv"
  "$build"/tests/bench/store_bench --startup 1024,2048,4096 --startup-client torch --stores tcpstore,front,grpc \
    | tee "$out/startup-torch.txt"
  csv csv <"$out/startup-torch.txt" >"$out/startup-torch.csv"
  "$build"/tests/bench/store_bench --client-counts 1,8,64 --repeat 3 | tee "$out/store.txt"
  csv csv <"$out/store.txt" >"$out/store.csv"
fi

# The linear reference: seconds per agent at the smallest size.
per=$(awk -F, 'NR == 2 { print $2 / $1 / 1000 }' "$out/rdzv.csv")
gnuplot <<GNUPLOT
set terminal svg size 720,520 font "sans,12" background "white"
set datafile separator ","
set datafile missing "nan"
set key top left box opaque
set grid
set logscale xy

set output "$out/rdzv.svg"
set title "Rendezvous: agents joining one round (2-core VM)"
set xlabel "agents"
set ylabel "seconds until every agent has its rank"
per = $per
plot "$out/rdzv.csv" every ::1 using 1:(\$2/1000) with linespoints lw 2 pt 7 title "muster", \
     [1000:70000] per * x with lines dt 2 lc "gray" title "linear from the first point", \
     "$out/rdzv-torch.csv" every ::1 using 1:(\$2/1000) with points pt 9 ps 1.5 title "torch c10d rendezvous (32 agents)"

set output "$out/startup.svg"
set key below box
set xrange [800:20000]
set yrange [0.05:20]
set title "Job start-up through the store (connect, set, get, add, wait), 4 client processes"
set xlabel "simulated ranks"
set ylabel "seconds to the last rank past the barrier"
set label 1 "missing points: the store reset connections (failed)" at graph 0.02, graph 0.95
plot "$out/startup-wire.csv" every ::1 using 1:2 with linespoints lw 2 pt 7 title "c10d TCPStore (one-connection clients)", \
     "$out/startup-wire.csv" every ::1 using 1:3 with linespoints lw 2 pt 5 title "launch's front (one-connection clients)", \
     "$out/startup-wire.csv" every ::1 using 1:4 with linespoints lw 2 pt 9 title "muster gRPC store", \
     "$out/startup-torch.csv" every ::1 using 1:2 with linespoints dt 2 pt 6 title "c10d TCPStore (LibTorch 1.13 client)", \
     "$out/startup-torch.csv" every ::1 using 1:3 with linespoints dt 2 pt 4 title "launch's front (LibTorch 1.13 client)"

set output "$out/store.svg"
unset label 1
set autoscale x
set key inside bottom right box
set title "Store throughput: 64-byte set+get per client process"
set xlabel "client processes"
set ylabel "operations per second"
unset logscale y
set yrange [0:*]
plot "$out/store.csv" every ::1 using 1:2 with linespoints lw 2 pt 7 title "c10d TCPStore", \
     "$out/store.csv" every ::1 using 1:3 with linespoints lw 2 pt 5 title "launch's front", \
     "$out/store.csv" every ::1 using 1:4 with linespoints lw 2 pt 9 title "muster gRPC store", \
     "$out/store.csv" every ::1 using 1:7 with linespoints lw 2 pt 11 title "muster store, direct path"
GNUPLOT
echo "plot_scaling: $out/rdzv.svg $out/startup.svg $out/store.svg"
