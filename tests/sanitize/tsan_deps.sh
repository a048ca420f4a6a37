#!/usr/bin/env bash
# Abseil, Protobuf and gRPC built with ThreadSanitizer, for tests/sanitize.sh tsan: Debian's own
# packages are built without it, and TSan sees none of their synchronization (every lock and
# atomic inside them is invisible, so each hand-off through gRPC reads as a race). This builds
# the very versions Debian 12 installs, from Debian's source packages with Debian's patches
# (Abseil's options too: the same ABI as the packages), with the compiler and flags of the TSan
# build, as shared libraries, into a folder of its own under /var/cache/muster, and prints that
# folder. A finished folder is used again (its name carries the versions, the compiler and this
# script's hash); runs beside each other wait on one lock; an unfinished folder is built again.
#   tests/sanitize/tsan_deps.sh   (as root; about 40 min on 2 cores the first time)
# Debian's protoc and grpc_cpp_plugin of the same versions make the code (the TSan build finds
# them on PATH); c-ares, RE2, OpenSSL and zlib stay Debian's: gRPC orders what it asks of them.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${MUSTER_TSAN_DEPS_CACHE:-/var/cache/muster/tsan-deps}
cc=${CC:-gcc}
cxx=${CXX:-g++}
need=(cmake g++ dpkg-dev ccache libabsl-dev libprotobuf-dev protobuf-compiler libgrpc++-dev
      protobuf-compiler-grpc libc-ares-dev libre2-dev libssl-dev zlib1g-dev)
missing=()
for pkg in "${need[@]}"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
if ((${#missing[@]})); then
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
versions=()
for pkg in libabsl-dev libprotobuf-dev libgrpc++-dev; do
  v=$(dpkg-query -W -f '${source:Version}' "$pkg" 2>/dev/null) || { echo "tsan_deps: $pkg is not installed (deploy/setup.sh installs it)" >&2; exit 2; }
  versions+=("$v")
done
key=$( { printf '%s\n' "${versions[@]}"; "$cxx" --version | head -1; cat "${BASH_SOURCE[0]}"; } | sha256sum | cut -c1-16)
prefix=$cache/$key
mkdir -p "$cache"
exec 9>"$cache/lock"
flock 9
if [ -e "$prefix/complete" ]; then echo "$prefix"; exit 0; fi
# What other versions (or an unfinished run) left is of no use.
find "$cache" -mindepth 1 -maxdepth 1 ! -name lock ! -name "$key" -exec rm -rf {} +
rm -rf "$prefix"
work=$cache/work-$key
mkdir -p "$work/lists" "$work/src"
log() { echo "tsan_deps: $*" >&2; }

# Debian's source packages of the installed versions (bookworm's deb-src, in a list of our own).
echo "deb-src http://deb.debian.org/debian bookworm main" >"$work/sources.list"
echo "deb-src http://deb.debian.org/debian-security bookworm-security main" >>"$work/sources.list"
apt=(-o Dir::Etc::SourceList="$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
     -o Dir::State::Lists="$work/lists" -o Dir::Cache="$work/cache" -o APT::Sandbox::User=root)
mkdir -p "$work/cache/archives/partial"
apt-get "${apt[@]}" update -qq >&2
(cd "$work/src" && apt-get "${apt[@]}" source -qq --download-only \
   "abseil=${versions[0]}" "protobuf=${versions[1]}" "grpc=${versions[2]}" >&2)
for dsc in "$work"/src/*.dsc; do
  (cd "$work/src" && dpkg-source -x --no-check "$dsc" >/dev/null)
done

flags="-fsanitize=thread -O1 -g1 -fno-omit-frame-pointer"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
common=(-G "Unix Makefiles" -DCMAKE_BUILD_TYPE=None -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_PREFIX_PATH="$prefix"
        -DCMAKE_INSTALL_LIBDIR=lib -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx"
        -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread
        -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread -DCMAKE_INSTALL_RPATH="$prefix/lib"
        -DBUILD_SHARED_LIBS=ON -DBUILD_TESTING=OFF "${launcher[@]}")
build() {  # NAME SOURCE [cmake args]: configure, build and install one package
  local name=$1 src=$2
  shift 2
  log "building $name ($(date +%T))"
  cmake -S "$src" -B "$work/build-$name" "${common[@]}" "$@" >"$work/$name.log" 2>&1 \
    && cmake --build "$work/build-$name" -j"$(nproc)" >>"$work/$name.log" 2>&1 \
    && cmake --install "$work/build-$name" >>"$work/$name.log" 2>&1 \
    || { tail -30 "$work/$name.log" >&2; log "$name failed (the whole log: $work/$name.log)"; exit 1; }
}
# Abseil as Debian builds it (C++17, its options pinned by Debian's configure.diff).
build absl "$(echo "$work"/src/abseil-*/)" -DCMAKE_CXX_STANDARD=17 -DABSL_PROPAGATE_CXX_STD=ON
# libprotobuf alone: the code is made by Debian's protoc of the same version.
build protobuf "$(echo "$work"/src/protobuf-*/)" -Dprotobuf_BUILD_TESTS=OFF -Dprotobuf_BUILD_PROTOC_BINARIES=OFF \
  -Dprotobuf_BUILD_SHARED_LIBS=ON -Dprotobuf_WITH_ZLIB=ON
# gRPC with Debian's options, no code generators (Debian's grpc_cpp_plugin makes the code); its
# plugin-support library, which muster does not use, links Debian's libprotoc.
protoc_lib=$(ldconfig -p | awk '$1 ~ /^libprotoc\.so/ && !found {print $NF; found = 1}')
build grpc "$(echo "$work"/src/grpc-*/)" -DgRPC_ABSL_PROVIDER=package -DgRPC_CARES_PROVIDER=package \
  -DgRPC_PROTOBUF_PROVIDER=package -DgRPC_RE2_PROVIDER=package -DgRPC_SSL_PROVIDER=package \
  -DgRPC_ZLIB_PROVIDER=package -DgRPC_BACKWARDS_COMPATIBILITY_MODE=OFF -DgRPC_BUILD_TESTS=OFF \
  -DgRPC_BUILD_CODEGEN=OFF -DgRPC_BUILD_CSHARP_EXT=OFF -DgRPC_INSTALL=ON -DProtobuf_PROTOC_LIBRARY="$protoc_lib"
printf '%s\n' "${versions[@]}" >"$prefix/versions"
touch "$prefix/complete"
rm -rf "$work"
log "done ($(date +%T)): $prefix"
echo "$prefix"
