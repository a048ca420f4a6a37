#!/usr/bin/env bash
# The demo: set up only what it needs (deploy/setup.sh --demo), build its four programs, then
# train DocNN on 2 ranks under launch (worker train, bundled generated SST-format data), decode
# the test set on 2 ranks (worker decode, and the Python example examples/decode.py through
# muster's channel), and show how a failing rank is reported. Well under a minute on 2 cores
# once built.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/deploy/setup.sh" --demo "$@"
build=${MUSTER_BUILD_DIR:-$root/build}
launch=$build/launcher/launch
worker=$build/worker/worker
# The configs read their data from build/demo-data, next to the default build directory.
data=$root/build/demo-data
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

echo
echo "== 1. data: worker gen-data (SST-2 format: a header, then sentence<TAB>label)"
"$worker" gen-data --out "$data" --train 4000 --dev 500 --test 500
rm -f "$data/docnn.ckpt"

echo
echo "== 2. training: launch --nproc_per_node=2 --nnodes=1 worker train --config configs/distributed_docnn.json"
start=$(date +%s%N)
"$launch" --nproc_per_node=2 --nnodes=1 --master_port=0 "$worker" train \
  --config "$root/configs/distributed_docnn.json"
echo "   (training took $(ms "$start") ms, launch included)"

echo
echo "== 3. decoding: launch --nproc_per_node=2 worker decode --config configs/decode_docnn.json"
"$launch" --nproc_per_node=2 --master_port=0 "$worker" decode \
  --config "$root/configs/decode_docnn.json"
echo "   first predictions ($data/predictions.tsv):"
head -4 "$data/predictions.tsv" | sed 's/^/     /'

echo
echo "== 3b. the same in Python: launch --nproc_per_node=2 examples/decode.py (import muster: the"
echo "       weights and the predictions travel through the shared-directory channel)"
PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" PYTHON_EXEC=${PYTHON_EXEC:-/usr/bin/python3} \
  "$launch" --nproc_per_node=2 --master_port=0 "$root/examples/decode.py" \
  --train "$data/train.tsv" --input "$data/test.tsv" --output "$data/predictions_py.tsv" 2>&1 \
  | grep -v '^\[.*\] \[launch\] \[\(info\|warning\)\]'
echo "   first predictions ($data/predictions_py.tsv):"
head -3 "$data/predictions_py.tsv" | sed 's/^/     /'

echo
echo "== 4. a rank that fails: launch names it, stops the others at once, shows why"
set +e
"$launch" --nproc_per_node=3 --master_port=0 "$worker" --fail-rank 1 2>&1 | grep -v '^\[.*\] \[info\]'
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -eq 0 ]; then echo "unexpected: launch succeeded"; exit 1; fi
echo "   (launch exited with $rc, as it should)"

echo
echo "== 5. the same launch runs unmodified PyTorch: examples/ddp_demo.py under Debian's PyTorch"
PYTHON_EXEC=${PYTHON_EXEC:-/usr/bin/python3} "$launch" --nproc_per_node=2 --master_port=0 \
  "$root/examples/ddp_demo.py" --epochs 3 2>&1 | grep -E "epoch|training on"
echo
echo "Done. Model: $data/docnn.ckpt; predictions: $data/predictions.tsv, $data/predictions_py.tsv"
