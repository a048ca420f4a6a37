#!/usr/bin/env bash
# Set-up for a fresh Debian 12 machine: installs the Debian packages muster's build and tests
# need (only those missing; non-interactive), then configures and builds (Release, ccache when
# present). Idempotent. Extra arguments go to cmake's configure step (-DMUSTER_WITH_NCCL=OFF).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${MUSTER_BUILD_DIR:-$root/build}

packages=(
  cmake g++ make pkg-config ccache git openssl iproute2 procps
  libboost1.81-dev libgrpc++-dev protobuf-compiler-grpc protobuf-compiler libprotobuf-dev
  libspdlog-dev libfmt-dev nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev
  libtorch-dev libgloo-dev python3-torch libxxhash-dev python3-xxhash python3-venv
  python3-setuptools help2man dpkg-dev file xz-utils mmdebstrap podman runc
  slurm-wlm munge python3-yaml systemd sshfs openssh-sftp-server prometheus gdb bc
  etcd-server etcd-client golang-etcd-server-dev python3-etcd iptables tmux
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo=sudo; fi
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$build" -j"$(nproc)"
echo "setup: built into $build" >&2
