#!/bin/bash
# Packs what tests/gpu/device_check.sh and build_worker.sh need on a GPU machine that has none of
# Debian's libraries: the programs (from BUILD) under .gpu/build at their build-tree places, and every
# library they load but glibc, libstdc++, NCCL and the CUDA runtime under .gpu/lib. The programs'
# RPATH names .gpu/lib (and applies to their libraries' own needs), so nothing is put in
# LD_LIBRARY_PATH, which the Python ranks started by launch would inherit. The machine's own
# NCCL and CUDA runtime (its torch's) are linked into .gpu/lib there. Needs patchelf.
#   tests/gpu/pack.sh [BUILD]   (from the source root; .gpu is in .git/info/exclude)
# Carry .gpu as one tarball (`tar czf .gpu.tgz .gpu`, about 19 MB against 60 MB unpacked).
set -euo pipefail
build=${1:-build}
dest=.gpu
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
rm -rf "$dest"
mkdir -p "$dest/lib"
# Copies into lib/ the shared libraries FILE loads, but the machine's own (glibc's, the
# compiler's) and its torch's (NCCL, the CUDA runtime), which device_check.sh links in there.
carry_needs() {  # FILE
  ldd "$1" | awk '$3 ~ /^\// {print $3}' \
    | { grep -Ev '/(libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s|libnccl|libcudart)\.so' || true; } \
    | while read -r lib; do cp -Ln "$lib" "$dest/lib/"; done
}
programs=(launcher/launch worker/nccl_check tests/bench/launch_bench tests/bench/trivial_worker
          tests/integration/worker_test)
for p in "${programs[@]}"; do
  mkdir -p "$dest/build/$(dirname "$p")"
  cp "$build/$p" "$dest/build/$p"
  strip --strip-debug "$dest/build/$p"
  depth=$(($(tr -cd / <<<"$p" | wc -c) + 1))
  up=$(printf '../%.0s' $(seq "$depth"))
  patchelf --force-rpath --set-rpath "\$ORIGIN/${up}lib" "$dest/build/$p"
  carry_needs "$build/$p"
done
cp /usr/local/cuda/lib64/libcudart.so.13 "$dest/lib/libcudart.so.13.debian-build" 2>/dev/null || true

# The kit tests/gpu/build_worker.sh builds `worker` from there against the machine's own LibTorch
# (a wheel's, with CUDA), which cannot be carried: muster's own libraries that need no LibTorch
# as archives built here, the headers of Debian's libraries that the worker's LibTorch files
# include (before the wheel's own, which may hold other versions of fmt or protobuf), the
# generated protobuf headers, the shared libraries of worker's link line but LibTorch's (copied
# under their sonames into lib/, listed in kit/libs), and the demo's data.
kit=$dest/worker-kit
mkdir -p "$kit/include" "$kit/archives" "$kit/data"
for a in worker/libmuster_worker_env.a rendezvous/libmuster_rendezvous.a proto/libmuster_proto.a \
         common/libmuster_common.a common/libmuster_build_info.a; do
  cp "$build/$a" "$kit/archives/"
  strip --strip-debug "$kit/archives/$(basename "$a")"
done
for h in absl google/protobuf spdlog fmt CLI nlohmann xxhash.h; do
  mkdir -p "$kit/include/$(dirname "$h")"
  cp -r "/usr/include/$h" "$kit/include/$h"
done
cp -r "$build/proto/gen" "$kit/gen"
: >"$kit/libs"
for lib in $(tr ' ' '\n' <"$build/worker/CMakeFiles/worker.dir/link.txt" \
             | grep -E '^/usr/lib/.*\.so|^-l(re2|xxhash)$' | grep -Ev 'torch|c10|glog|gflags'); do
  case $lib in -l*) lib=$(ldconfig -p | awk -v n="lib${lib#-l}.so" '!found && $1 ~ "^"n {print $NF; found = 1}') ;; esac
  soname=$(objdump -p "$lib" | awk '$1 == "SONAME" {print $2}')
  cp -Ln "$lib" "$dest/lib/$soname"
  echo "$soname" >>"$kit/libs"
done
for lib in $(cat "$kit/libs"); do  # what those need in turn (found at link time through lib/)
  carry_needs "$dest/lib/$lib"
done
cp "$build"/demo-data/{train,dev,test}.tsv "$kit/data/" 2>/dev/null \
  || "$build/worker/worker" gen-data --out "$kit/data" --train 4000 --dev 500 --test 500 >/dev/null
du -sh "$dest"
