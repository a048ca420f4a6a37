#!/usr/bin/env bash
# The container image the Kubernetes manifests name (deploy/k8s: registry.example.com/muster:
# VERSION), made from a fresh Debian 12 root with the muster package installed by apt, as
# tests/package/package_test.sh makes and checks it. Needs root, mmdebstrap and podman
# (deploy/setup.sh installs them).
#   deploy/image.sh [BUILD_DIR]    build the packages, the checked root, then the image
#   deploy/image.sh --root DIR     the image from a root made before
# Push it with: podman push registry.example.com/muster:VERSION
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source=$(cd "$here/.." && pwd)
if [ "${1:-}" = --root ]; then
  root=${2:?--root needs a directory}
else
  build=${1:-${MUSTER_BUILD_DIR:-$source/build}}
  "$source/tests/package/package_test.sh" "$build" "$source" >&2
  root=$build/package-test/root
fi
# Only a root that package_test.sh finished with (installed, used, checked).
[ -f "$root.checked" ] && [ -x "$root/usr/bin/rendezvousd" ] \
  || { echo "image: $root is not a root package_test.sh checked" >&2; exit 1; }
version=$(dpkg-query --admindir="$root/var/lib/dpkg" -W -f='${Version}' muster)
tag=registry.example.com/muster:$version
for manifest in rendezvousd.yaml train-job.yaml; do
  grep -q "^ *image: $tag\$" "$source/deploy/k8s/$manifest" \
    || { echo "image: deploy/k8s/$manifest does not name $tag" >&2; exit 1; }
done
command -v podman >/dev/null || { echo "image: podman is missing (deploy/setup.sh installs it)" >&2; exit 1; }
# Its default command is the service as deploy/k8s/rendezvousd.yaml runs it, which needs a
# token: without one mounted it refuses to start rather than serve anyone. Left out: the
# test's apt settings (99mmdebstrap), the build machine's resolv.conf, the package lists.
old=$(podman image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
if ! log=$(tar -C "$root" --exclude=./opt/debs --exclude=./etc/apt/apt.conf.d/99mmdebstrap \
      --exclude=./etc/resolv.conf --exclude='./var/lib/apt/lists/*' --exclude='./tmp/*' -c . \
    | podman import --change 'CMD ["/usr/bin/rendezvousd", "--host=0.0.0.0", "--port=29400", "--token-file=/etc/muster/token/token"]' \
        --change 'EXPOSE 29400' --change 'ENV LC_ALL=C.UTF-8' - "$tag" 2>&1); then
  echo "$log" >&2
  echo "image: podman import failed" >&2
  exit 1
fi
# The image this tag named before is untagged now: remove it (unless a container uses it).
new=$(podman image inspect --format '{{.Id}}' "$tag")
if [ -n "$old" ] && [ "$old" != "$new" ]; then podman rmi "$old" >/dev/null 2>&1 || true; fi
echo "$tag"
