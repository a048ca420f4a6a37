#!/bin/bash
# Issue 36's checks on a GPU machine, in one run, from the source root, after tests/gpu/pack.sh
# packed .gpu here (carried to the machine). Uses the machine's python3, its torch, torchrun,
# NCCL and CUDA runtime. Prints everything; exit 0 only when every check passed.
#   [CHECKS="nccl parity ddp bench docnn"] tests/gpu/device_check.sh [DEMO_DATA_DIR]
# 1. the machine: nvidia-smi, driver, CUDA, torch, NCCL
# 2. muster's NCCL path: worker_test's NCCL self-check, and launch --nproc_per_node=1 nccl_check
#    beside torch's init_process_group("nccl") under launch: the same values, 1 GiB all-reduce
# 3. this torch's torchrun and launch side by side: environment parity, DDP on NCCL identical,
#    launch_bench's overhead ratio
# 4. DocNN on the GPU (NCCL) and on the CPU (Gloo) under launch: dev accuracy of each
set -uo pipefail
here=$(pwd)
data=${1:-}
failed=()
checks=" ${CHECKS:-nccl parity ddp bench docnn} "
want() { [[ $checks == *" $1 "* ]]; }
check() {  # name command...: runs it, notes a failure
  local name=$1; shift
  echo "== $name"
  "$@"
  local rc=$?
  [ $rc -eq 0 ] || { failed+=("$name (exit $rc)"); echo "!! $name failed: exit $rc"; }
}
# The programs' compiled-in paths: the source tree at /work/main, the build tree beside it.
mkdir -p /work
[ -e /work/main ] || ln -s "$here" /work/main
[ -e build ] || ln -s "$here/.gpu/build" build
export MUSTER_BUILD_DIR=$here/build MUSTER_SOURCE_DIR=$here
py=$(command -v python3)
purelib=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
nccl=$(find "$purelib/nvidia" /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu -name 'libnccl.so.2' 2>/dev/null | head -1)
cudart=$(find "$purelib/nvidia" /usr/local/cuda/lib64 -name 'libcudart.so.13' 2>/dev/null | head -1)
[ -n "$cudart" ] || cudart=$here/.gpu/lib/libcudart.so.13.debian-build
ln -sf "$nccl" .gpu/lib/libnccl.so.2
ln -sf "$cudart" .gpu/lib/libcudart.so.13

echo "== the machine"
nvidia-smi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
ldd --version | head -1
"$py" -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "CUDA", torch.version.cuda, "NCCL", ".".join(map(str, torch.cuda.nccl.version())), "GPUs", torch.cuda.device_count())'
echo "NCCL library: $nccl; CUDA runtime: $cudart"
build/launcher/launch --version

want nccl && check "worker_test: Worker.NcclSelfCheckOnTheGpus" \
  timeout 180 build/tests/integration/worker_test --gtest_filter='Worker.Nccl*'

gib=$((1 << 28))  # floats in 1 GiB
want nccl && check "nccl_check under launch, 1 GiB x 20" \
  timeout 120 build/launcher/launch --nproc_per_node=1 --master_port=0 build/worker/nccl_check "$gib" 20
want nccl && check "torch's NCCL under launch, 1 GiB x 20" \
  env PYTHON_EXEC="$py" timeout 120 build/launcher/launch --nproc_per_node=1 --master_port=0 tests/gpu/torch_nccl_check.py "$gib" 20
want nccl && check "torch's NCCL under torchrun, 1 GiB x 20" \
  timeout 120 "$py" -m torch.distributed.run --nproc_per_node=1 --master_port=29581 tests/gpu/torch_nccl_check.py "$gib" 20

version=$("$py" -c 'import torch; print(torch.__version__)')
export MUSTER_TEST_PYTHON=$py MUSTER_TEST_TORCH=$version
export MUSTER_TEST_TORCHRUN="$py -m torch.distributed.run" MUSTER_TEST_LEGACY="$py -m torch.distributed.launch"
MUSTER_TEST_LAUNCH_FLAGS=
if [ "$(printf '%s\n' "$version" 2.14 | sort -V | head -n1)" != 2.14 ]; then
  MUSTER_TEST_LAUNCH_FLAGS=--torchrun_version=$(cut -d. -f1,2 <<<"$version")
fi
export MUSTER_TEST_LAUNCH_FLAGS
if want parity; then
  check "environment parity with torchrun $version" \
    timeout 240 "$py" tests/compat/env_parity.py "$here/build/launcher/launch"
  check "output parity with torchrun $version" \
    timeout 150 "$py" tests/compat/output_parity.py "$here/build/launcher/launch"
  # What this torch's torchrun does where releases differ (launcher/torchrun_version.h).
  tdir=$("$py" -c 'import os, torch.distributed as d; print(os.path.dirname(d.__file__))')
  grep -n "signals_to_handle\|SIGNALS_TO_HANDLE" "$tdir/run.py" "$tdir"/elastic/agent/server/*.py | head -5
  grep -rn "system_terminated_error" "$tdir/elastic" | head -3
  grep -n "standalone" "$tdir/run.py" | head -20
fi

ddp() {  # the NCCL DDP step under torchrun and under launch: the same parameters and sums
  local w; w=$(mktemp -d)
  mkdir -p "$w/torch" "$w/muster"
  timeout 120 "$py" -m torch.distributed.run --nproc_per_node=1 --master_port=29582 tests/compat/ddp_step.py "$w/torch" nccl \
    && PYTHON_EXEC=$py timeout 120 build/launcher/launch $MUSTER_TEST_LAUNCH_FLAGS --nproc_per_node=1 --master_port=0 \
         tests/compat/ddp_step.py "$w/muster" nccl \
    || return 1
  "$py" - "$w" <<'EOF'
import json, sys
w = sys.argv[1]
a, b = (json.load(open(f"{w}/{side}/0.json")) for side in ("torch", "muster"))
same = a["params"] == b["params"] and a["allreduce"] == b["allreduce"]
print("DDP step on NCCL: parameters", "identical" if same else "DIFFER", a["params"], b["params"])
sys.exit(0 if same else 1)
EOF
}
want ddp && check "DDP step on NCCL, torchrun $version and launch" ddp

want bench && check "launch_bench against torchrun $version" \
  timeout 240 build/tests/bench/launch_bench --torchrun "$py -m torch.distributed.run" \
    --torch-version "$version" --reps 5 --torch-reps 3

if [ -n "$data" ] && want docnn; then
  check "DocNN on the GPU (NCCL, 1 rank) under launch" \
    env PYTHON_EXEC="$py" timeout 180 build/launcher/launch --nproc_per_node=1 --master_port=0 tests/bench/docnn_ddp.py "$data" 5 32 nccl
  check "DocNN on the CPU (Gloo, 2 ranks) under launch" \
    env PYTHON_EXEC="$py" timeout 180 build/launcher/launch --nproc_per_node=2 --master_port=0 tests/bench/docnn_ddp.py "$data" 5 32 gloo
fi

if [ ${#failed[@]} -eq 0 ]; then echo "device_check: every check passed"; exit 0; fi
printf 'device_check: FAILED: %s\n' "${failed[@]}"
exit 1
