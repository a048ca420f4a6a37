#!/bin/bash
# Builds `worker` on a GPU machine against that machine's own LibTorch (a PyPI wheel with CUDA,
# found through its python3), with ProcessGroupNCCL (USE_C10D_NCCL), from the kit that
# tests/gpu/pack.sh made under .gpu/worker-kit: the worker's LibTorch files are compiled there,
# muster's other libraries come as archives built on Debian 12, Debian's headers go before the
# wheel's (which may hold other versions of fmt or protobuf), Debian's shared libraries from
# .gpu/lib through the program's DT_RPATH (which, unlike RUNPATH, also serves their own needs).
# Prints what it found (compiler, torch, ABI, CUDA and NCCL headers, Gloo's or not) and, on
# failure, the first errors; exit 0 when OUT/worker runs.
#   tests/gpu/build_worker.sh [OUT]   (from the source root; OUT defaults to .gpu/worker-build)
set -euo pipefail
here=$(pwd)
kit=$here/.gpu/worker-kit
lib=$here/.gpu/lib
out=$(mkdir -p "${1:-.gpu/worker-build}" && cd "${1:-.gpu/worker-build}" && pwd)
py=${PYTHON:-python3}
cxx=${CXX:-g++}
if ! command -v "$cxx" >/dev/null; then
  echo "build_worker: no C++ compiler ($cxx) on this machine"
  exit 3
fi
echo "compiler: $("$cxx" --version | head -1)"

probe=$("$py" -c 'import os, torch
print(os.path.dirname(torch.__file__), int(torch.compiled_with_cxx11_abi()), torch.__version__,
      torch.version.cuda or "none")') || { echo "build_worker: $py cannot import torch"; exit 3; }
read -r tdir abi version cuda <<<"$probe"
echo "torch $version at $tdir, C++11 ABI $abi, CUDA $cuda"
if [ "$abi" != 1 ]; then
  echo "build_worker: torch $version uses the old C++ ABI; muster's archives (Debian 12) the new"
  exit 3
fi
purelib=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
header_dir() {  # the folder that holds header $1 (and $2 beside it, when given): CUDA's, else
  local f d     # the wheels' nvidia packages (whose cuda_runtime.h lacks nvcc's crt/ headers)
  for f in $(find /usr/local/cuda/include /usr/local/cuda/targets/*/include "$purelib/nvidia" \
               /usr/include -name "$1" 2>/dev/null); do
    d=$(dirname "$f")
    [ -z "${2:-}" ] || [ -e "$d/$2" ] || continue
    echo "$d"
    return 0
  done
  echo "build_worker: no $1${2:+ with $2} on this machine" >&2
  return 1
}
flags=(-std=c++20 -O2 -pthread -D_GLIBCXX_USE_CXX11_ABI=1 -DUSE_DISTRIBUTED
       -DFMT_SHARED -DSPDLOG_COMPILED_LIB -DSPDLOG_FMT_EXTERNAL -DSPDLOG_SHARED_LIB
       -I"$here" -I"$kit/include" -I"$kit/gen"
       -isystem "$tdir/include" -isystem "$tdir/include/torch/csrc/api/include")
torch_libs=(-ltorch -ltorch_cpu -lc10)
rm -f "$out/NO_GLOO"
if "$cxx" -E -x c++ -isystem "$tdir/include" - <<<'#include <gloo/algorithm.h>' >/dev/null 2>&1; then
  flags+=(-DUSE_C10D_GLOO)
else  # PyPI's wheels ship ProcessGroupGloo.hpp without the gloo headers it includes
  echo "no Gloo headers in this LibTorch: worker is built with NCCL alone (backend gloo refused)"
  touch "$out/NO_GLOO"
fi
if [ "$cuda" != none ]; then  # a LibTorch with CUDA: ProcessGroupNCCL
  cuda_inc=$(header_dir cuda_runtime_api.h crt/host_config.h)
  nccl_inc=$(header_dir nccl.h)
  echo "CUDA headers: $cuda_inc; NCCL headers: $nccl_inc"
  flags+=(-DUSE_C10D_NCCL -isystem "$cuda_inc" -isystem "$nccl_inc")
  torch_libs=(-ltorch -ltorch_cuda -ltorch_cpu -lc10_cuda -lc10)
fi
sources=(worker/c10d_store.cc worker/process_group.cc worker/self_check.cc
         worker/shared_dir_channel.cc
         worker/programs/sst_data.cc worker/programs/config.cc worker/programs/docnn.cc
         worker/programs/trainer.cc worker/programs/decoder.cc worker/worker_main.cc)
rm -rf "$out/obj" "$out/worker" "$out/link.log"  # a failed build leaves no older worker behind
mkdir -p "$out/obj"
compile() {  # one source into OUT/obj; its errors into OUT/obj/NAME.log
  local name; name=$(tr / _ <<<"$1")
  "$cxx" "${flags[@]}" -c "$1" -o "$out/obj/$name.o" 2>"$out/obj/$name.log" \
    || { echo "build_worker: $1 did not compile:"; grep -m 8 -E 'error|Error' "$out/obj/$name.log"
         return 1; }
}
start=$(date +%s)
fail=0
for s in "${sources[@]}"; do compile "$s" & done
for _ in "${sources[@]}"; do wait -n || fail=1; done
[ $fail -eq 0 ] || exit 1
echo "compiled ${#sources[@]} files in $(($(date +%s) - start)) s"

libs=()
while read -r l; do libs+=("$lib/$l"); done <"$kit/libs"
"$cxx" -o "$out/worker" "$out"/obj/*.o \
  -Wl,--start-group "$kit"/archives/*.a -Wl,--end-group "${libs[@]}" \
  -L"$tdir/lib" -Wl,--no-as-needed "${torch_libs[@]}" -Wl,--as-needed \
  -Wl,--disable-new-dtags -Wl,-rpath,"$tdir/lib:$lib" -Wl,-rpath-link,"$lib" \
  -Wl,--allow-shlib-undefined -pthread -ldl 2>"$out/link.log" \
  || { echo "build_worker: linking failed:"; grep -m 12 -E 'error|undefined' "$out/link.log"; exit 1; }
"$out/worker" --version
