#!/bin/bash
# The checks on a GPU machine, in one run, from the source root, after tests/gpu/pack.sh
# packed .gpu here (carried to the machine). Uses the machine's python3, its torch, torchrun,
# NCCL and CUDA runtime. Prints everything; exit 0 only when every check passed. Files for the
# record (the store bench's CSV) go to $OUT when it is set, else to .gpu/out.
#   [CHECKS="nccl parity ddp bench docnn worker events store visible elastic"] tests/gpu/device_check.sh [DEMO_DATA_DIR]
# 1. the machine: nvidia-smi, driver, CUDA, torch and its C++ ABI, NCCL, compiler, cmake,
#    glibc, descriptor limits
# 2. muster's NCCL path: worker_test's NCCL self-check, and launch --nproc_per_node=1 nccl_check
#    beside torch's init_process_group("nccl") under launch: the same values, 1 GiB all-reduce
# 3. this torch's torchrun and launch side by side: environment parity, DDP on NCCL identical,
#    launch_bench's overhead ratio; `events`: output parity's event-log cases alone
# 4. DocNN on the GPU (NCCL) and on the CPU (Gloo) under launch: dev accuracy of each; `worker`:
#    worker built there against the machine's LibTorch (build_worker.sh), `worker train` on the
#    GPU with ProcessGroupNCCL and on the CPU with Gloo, the Python DocNN on the GPU beside it
# 5. `store`: store_startup.py, launch's TCPStore front beside torch's libuv and classic servers
# 6. `visible`: visible_devices.py, the workers of --nproc_per_node=gpu and auto under each
#    CUDA_VISIBLE_DEVICES by torchrun and launch, with CUDA's own count; `elastic`:
#    elastic_parity.py, torchelastic's launcher tests by this torch's torchrun and by launch
#    (ELASTIC_CASES: only these cases)
set -uo pipefail
here=$(pwd)
data=${1:-}
failed=()
checks=" ${CHECKS:-nccl parity ddp bench docnn worker pydocnn events store visible elastic} "
out=${OUT:-$here/.gpu/out}
mkdir -p "$out"
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
"$py" -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "CUDA", torch.version.cuda, "NCCL", ".".join(map(str, torch.cuda.nccl.version())), "GPUs", torch.cuda.device_count(), "C++11 ABI", torch.compiled_with_cxx11_abi())'
echo "NCCL library: $nccl; CUDA runtime: $cudart"
echo "compiler: $(g++ --version 2>/dev/null | head -1 || echo none); $(cmake --version 2>/dev/null | head -1 || echo 'no cmake')"
echo "descriptors: soft $(ulimit -Sn), hard $(ulimit -Hn); CPUs $(nproc); ephemeral ports $(cat /proc/sys/net/ipv4/ip_local_port_range)"
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
import json, os, sys
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

# worker train on NCCL: the demo's DocNN config, any world size, the packed data, a checkpoint
# (resumed by a second run, copied to $out for a CPU to load).
worker_config() {  # OUT_JSON
  "$py" - "$1" "$data" <<'EOF'
import json, os, sys
out, data = sys.argv[1], os.path.abspath(sys.argv[2])
c = json.load(open("configs/distributed_docnn.json"))
c.update(distributed_world_size=0, train_path=f"{data}/train.tsv", eval_path=f"{data}/dev.tsv",
         test_path=f"{data}/test.tsv", save_path=os.path.abspath(out + ".ckpt"), resume=True)
json.dump(c, open(out, "w"))
EOF
}
if [ -n "$data" ] && want worker; then
  check "build worker against torch $version's LibTorch (CUDA, ProcessGroupNCCL)" \
    timeout 240 tests/gpu/build_worker.sh .gpu/worker-build
  if [ -x .gpu/worker-build/worker ]; then
    rm -f .gpu/docnn.json.ckpt
    worker_config .gpu/docnn.json
    check "worker train on the GPU (NCCL) under launch --nproc_per_node=gpu" \
      timeout 120 build/launcher/launch --nproc_per_node=gpu --master_port=0 \
        .gpu/worker-build/worker train --config .gpu/docnn.json --backend nccl
    check "worker train resumes its GPU checkpoint on the GPU (every epoch done: the test set)" \
      timeout 120 build/launcher/launch --nproc_per_node=gpu --master_port=0 \
        .gpu/worker-build/worker train --config .gpu/docnn.json --backend nccl
    cp .gpu/docnn.json.ckpt "$out/docnn-gpu.ckpt" 2>/dev/null
    worker_config .gpu/docnn-cpu.json
    [ -e .gpu/worker-build/NO_GLOO ] || check "worker train on the CPU (Gloo), 1 rank, the same build" \
      timeout 120 build/launcher/launch --nproc_per_node=1 --master_port=0 \
        .gpu/worker-build/worker train --config .gpu/docnn-cpu.json --backend gloo
    check "worker self-check on NCCL (exact all-reduce and broadcast on the GPU)" \
      timeout 60 build/launcher/launch --nproc_per_node=gpu --master_port=0 .gpu/worker-build/worker --backend nccl
  fi
fi
if [ -n "$data" ] && want pydocnn; then
  check "the Python DocNN on the GPU (NCCL, 1 rank) under launch, beside worker train" \
    env PYTHON_EXEC="$py" timeout 120 build/launcher/launch --nproc_per_node=1 --master_port=0 \
      tests/bench/docnn_ddp.py "$data" 5 32 nccl
fi

if want events; then
  "$py" -m torch.distributed.run --help | grep -m1 -- "--event-log-handler" \
    || echo "torchrun $version has no --event-log-handler"
  check "output parity's event cases with torchrun $version" \
    timeout 120 "$py" tests/compat/output_parity.py "$here/build/launcher/launch" events events_failed
fi

want store && check "TCPStore start-up and operations: launch's front, torch's libuv and classic servers" \
  timeout 240 "$py" tests/gpu/store_startup.py --launch "$here/build/launcher/launch" \
    --sizes 1024,4096,16000 --step-timeout 45 --out "$out/store.csv"

want visible && check "--nproc_per_node=gpu and auto under each CUDA_VISIBLE_DEVICES, torchrun $version and launch" \
  env CUDART="$cudart" timeout 240 "$py" tests/gpu/visible_devices.py "$here/build/launcher/launch" --out "$out/visible.json"
want elastic && check "torchelastic's launcher tests, torchrun $version and launch" \
  env PARITY_VERBOSE=1 timeout 420 "$py" tests/compat/elastic_parity.py "$here/build/launcher/launch" ${ELASTIC_CASES:-}

if [ ${#failed[@]} -eq 0 ]; then echo "device_check: every check passed"; exit 0; fi
printf 'device_check: FAILED: %s\n' "${failed[@]}"
exit 1
