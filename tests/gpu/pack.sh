#!/bin/bash
# Packs what tests/gpu/device_check.sh needs on a GPU machine that has none of Debian's
# libraries: the programs (from BUILD) under .gpu/build at their build-tree places, and every
# library they load but glibc, libstdc++, NCCL and the CUDA runtime under .gpu/lib. The programs'
# RPATH names .gpu/lib (and applies to their libraries' own needs), so nothing is put in
# LD_LIBRARY_PATH, which the Python ranks started by launch would inherit. The machine's own
# NCCL and CUDA runtime (its torch's) are linked into .gpu/lib there. Needs patchelf.
#   tests/gpu/pack.sh [BUILD]   (from the source root; .gpu is in .git/info/exclude)
set -euo pipefail
build=${1:-build}
dest=.gpu
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
rm -rf "$dest"
mkdir -p "$dest/lib"
programs=(launcher/launch worker/nccl_check tests/bench/launch_bench tests/bench/trivial_worker
          tests/integration/worker_test)
for p in "${programs[@]}"; do
  mkdir -p "$dest/build/$(dirname "$p")"
  cp "$build/$p" "$dest/build/$p"
  depth=$(($(tr -cd / <<<"$p" | wc -c) + 1))
  up=$(printf '../%.0s' $(seq "$depth"))
  patchelf --force-rpath --set-rpath "\$ORIGIN/${up}lib" "$dest/build/$p"
  ldd "$build/$p" | awk '$3 ~ /^\// {print $3}' \
    | { grep -Ev '/(libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s|libnccl|libcudart)\.so' || true; } \
    | while read -r lib; do cp -Ln "$lib" "$dest/lib/"; done
done
cp /usr/local/cuda/lib64/libcudart.so.13 "$dest/lib/libcudart.so.13.debian-build" 2>/dev/null || true
du -sh "$dest"
