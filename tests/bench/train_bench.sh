#!/usr/bin/env bash
# Training throughput: `worker train` (LibTorch C++) under launch, and the same model, data and
# hyper-parameters in Python with DistributedDataParallel under Debian's torchrun (PyTorch
# 1.13), at world size 1 and 2, in one run, with the ratio. Samples/s count every rank's
# samples per second of training (evaluation and start-up excluded).
#   tests/bench/train_bench.sh [EPOCHS]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${MUSTER_BUILD_DIR:-$root/build}
epochs=${1:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$build/worker/worker" gen-data --out "$work" --train 4000 --dev 10 --test 10 >/dev/null
cat > "$work/config.json" <<JSON
{"train_path": "$work/train.tsv",
 "model": {"embed_dim": 64, "kernel_num": 64, "kernel_sizes": [3, 4, 5], "dropout": 0.4, "max_seq_len": 32},
 "optimizer": {"type": "adam", "lr": 0.002},
 "trainer": {"epochs": $epochs, "batch_size": 32, "seed": 0, "report_interval": 1000000}}
JSON
unset OMP_NUM_THREADS
ours() {
  "$build/launcher/launch" --nproc_per_node="$1" --master_port=0 "$build/worker/worker" train \
    --config "$work/config.json" 2>&1 | sed -n 's/.*: \([0-9]*\) samples\/s over.*/\1/p'
}
theirs() {
  /usr/bin/python3 "$root/tests/compat/torchrun_py311.py" --nproc_per_node="$1" \
    --master_port="$((29000 + RANDOM % 1000))" --monitor_interval=0.1 \
    "$root/tests/bench/docnn_ddp.py" "$work" "$epochs" 32 2>/dev/null | sed -n 's/^samples\/s \([0-9]*\)/\1/p'
}
printf 'training throughput: DocNN, 4000 examples, batch 32 per rank, %s epochs, %s cores\n' "$epochs" "$(nproc)"
printf '%6s %22s %28s %8s\n' world "worker train samples/s" "Python DDP (torchrun) samples/s" ratio
for n in 1 2; do
  a=$(ours "$n"); b=$(theirs "$n")
  printf '%6s %22s %28s %7sx\n' "$n" "$a" "$b" "$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", a / b }')"
done
