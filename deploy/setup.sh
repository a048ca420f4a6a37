#!/usr/bin/env bash
# Set-up for a fresh Debian 12 machine: installs the Debian packages muster needs (only those
# missing; non-interactive), then configures and builds (Release, ccache when present).
# Idempotent, and the two modes run in either order on one build folder:
#   setup.sh --demo [cmake args]   what the demo needs: the build's libraries, Debian's PyTorch,
#                                  and the programs launch, rendezvousd, rendezvousctl, worker
#   setup.sh [cmake args]          everything: the tests' tools too (Slurm, etcd, podman,
#                                  mmdebstrap, ...), and every target, tests and benchmarks
# Extra arguments go to cmake's configure step (-DMUSTER_WITH_NCCL=OFF).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${MUSTER_BUILD_DIR:-$root/build}
demo=0
if [ "${1:-}" = "--demo" ]; then
  demo=1
  shift
fi

# Building muster and running the demo. etcd's .proto files are not here: the build takes them
# from golang-etcd-server-dev's .deb without installing it and the Go packages it pulls in
# (etcd/CMakeLists.txt).
build_packages=(
  cmake g++ make pkg-config ccache git openssl iproute2 procps
  libboost1.81-dev libgrpc++-dev protobuf-compiler-grpc protobuf-compiler libprotobuf-dev
  libspdlog-dev libfmt-dev nlohmann-json3-dev libcli11-dev libxxhash-dev
  libtorch-dev libgloo-dev python3-torch python3-xxhash
)
# The tests, the benchmarks, the man pages and the packages.
test_packages=(
  libgtest-dev libgmock-dev python3-venv python3-setuptools help2man dpkg-dev file xz-utils
  mmdebstrap podman runc slurm-wlm munge python3-yaml systemd sshfs openssh-sftp-server
  prometheus gdb bc etcd-server etcd-client golang-etcd-server-dev python3-etcd iptables tmux
  stress-ng clang-14 libclang-rt-14-dev
)
packages=("${build_packages[@]}")
if ((!demo)); then packages+=("${test_packages[@]}"); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo=sudo; fi
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
elif ! dpkg-query -W -f='${Status}' golang-etcd-server-dev 2>/dev/null | grep -q "install ok installed" &&
  ! apt-cache show golang-etcd-server-dev >/dev/null 2>&1; then
  # The build fetches etcd's .proto files with apt-get download: it needs the package lists.
  $sudo apt-get update -q
fi

if ((demo)); then
  # A folder the tests configured keeps its tests (GoogleTest is there); a new one gets none.
  configure=()
  if [ ! -f "$build/CMakeCache.txt" ]; then
    configure=(-DMUSTER_BUILD_TESTS=OFF -DMUSTER_BUILD_BENCH=OFF)
  fi
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release "${configure[@]}" "$@" >/dev/null
  cmake --build "$build" -j"$(nproc)" --target muster_demo
else
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMUSTER_BUILD_TESTS=ON \
    -DMUSTER_BUILD_BENCH=ON "$@" >/dev/null
  cmake --build "$build" -j"$(nproc)"
fi
echo "setup: built into $build" >&2
