#!/bin/bash
# The Debian packages: built with cpack, their contents and Depends checked, then installed
# into a fresh Debian 12 root the way a new machine installs them (apt-get install ./x.deb,
# which must pull every dependency), where launch runs the self-check, rendezvousd answers a
# health check, a find_package(muster) program builds against muster-dev, and a purge leaves
# nothing behind (tests/package/in_fresh_root.sh). The root, with muster installed again, is
# left in BUILD_DIR/package-test/root for deploy/image.sh (package_image_test.sh).
#   package_test.sh BUILD_DIR SOURCE_DIR
# Needs root (chroot, mounts), mmdebstrap and the Debian mirror this machine's apt uses. The
# fresh root's base (mmdebstrap, a week at most) and the .debs apt downloads are cached in
# $MUSTER_TEST_CACHE (default /var/cache/muster-test), so only the first run downloads.
set -euo pipefail
# No descriptor but stdin, stdout and stderr reaches what this runs (mmdebstrap's hooks).
. "$(dirname "$0")/../support/close_inherited_fds.sh"
build=$(cd "$1" && pwd)
source=$2
# MUSTER_PACKAGE_TEST_OUT: another folder for what this makes (fresh_cache_test.sh's run must
# not replace the checked root package_image_test.sh uses).
out=${MUSTER_PACKAGE_TEST_OUT:-$build/package-test}
cache=${MUSTER_TEST_CACHE:-/var/cache/muster-test}
fail() { echo "package_test: $*" >&2; exit 1; }
if [ "$(id -u)" -ne 0 ]; then echo "package_test: needs root (chroot, mounts): skipped"; exit 77; fi
for tool in cpack mmdebstrap dpkg-deb dpkg-query objdump unshare chroot flock file; do
  command -v "$tool" >/dev/null || fail "$tool is missing (deploy/setup.sh installs it)"
done

# One run at a time in a build folder (deploy/image.sh runs this too), and one at a time on
# the cache (two checkouts' tests on one machine). flock -o holds each lock in flock's own
# process and runs this script again without the descriptor, so no child inherits one.
mkdir -p "$cache/archives/partial"
if [ "${MUSTER_PACKAGE_TEST_LOCKED:-}" != "$build:$cache" ]; then
  MUSTER_PACKAGE_TEST_LOCKED=$build:$cache exec flock -o "$build/package-test.lock" \
    flock -o "$cache/lock" "$0" "$@"
fi
rm -rf "$out"
mkdir -p "$out"
version=$(sed -n 's/^set(CPACK_PACKAGE_VERSION "\(.*\)")$/\1/p' "$build/CPackConfig.cmake")
[ -n "$version" ] || fail "no CPACK_PACKAGE_VERSION in $build/CPackConfig.cmake"
cpack -G DEB --config "$build/CPackConfig.cmake" -B "$out/pkg" >"$out/cpack.log" 2>&1 \
  || { cat "$out/cpack.log" >&2; fail "cpack failed"; }
deb=$out/pkg/muster_${version}_amd64.deb
dev=$out/pkg/muster-dev_${version}_amd64.deb
[ -f "$deb" ] && [ -f "$dev" ] || fail "cpack wrote $(ls "$out/pkg"), not $(basename "$deb") and $(basename "$dev")"

# --- What each package holds.
list() { dpkg-deb -c "$1" | awk '{print $6}' | sed 's|^\./|/|'; }
holds() {  # holds DEB PATH...
  local contents
  contents=$(list "$1")
  shift
  for f in "$@"; do grep -qx "$f" <<<"$contents" || fail "$f is not in the package"; done
}
site=/usr/lib/python3/dist-packages/muster
holds "$deb" /usr/bin/launch /usr/bin/rendezvousd /usr/bin/rendezvousctl /usr/bin/worker \
  $site/__init__.py $site/channel.py $site/job_store.py /usr/lib/systemd/system/rendezvousd.service \
  /usr/share/muster/slurm/muster.sbatch /usr/share/muster/k8s/rendezvousd.yaml \
  /usr/share/man/man1/launch.1.gz /usr/share/man/man1/rendezvousd.1.gz \
  /usr/share/man/man1/rendezvousctl.1.gz /usr/share/man/man1/worker.1.gz
holds "$dev" /usr/include/muster/worker/process_group.h /usr/include/muster/rendezvous/store/store.h \
  /usr/include/muster/muster/v1/store.pb.h /usr/lib/libmuster_worker.a \
  /usr/lib/libmuster_rendezvous.a /usr/lib/cmake/muster/musterConfig.cmake \
  /usr/lib/cmake/muster/musterTargets.cmake
if stray=$(list "$deb" | grep -E '\.(h|a)$|_test|/usr/local|__pycache__'); then
  fail "muster holds what is not its own: $stray"
fi
if stray=$(list "$dev" | grep -E '^/usr/bin/|_test|/usr/local'); then
  fail "muster-dev holds what is not its own: $stray"
fi
mkdir "$out/contents"
dpkg-deb -x "$deb" "$out/contents"
grep -q '^ExecStart=/usr/bin/rendezvousd ' "$out/contents/usr/lib/systemd/system/rendezvousd.service" \
  || fail "the systemd unit does not start /usr/bin/rendezvousd"
for p in launch rendezvousd rendezvousctl worker; do
  page=$(zcat "$out/contents/usr/share/man/man1/$p.1.gz")
  grep -q "^\.TH ${p^^} \"1\"" <<<"$page" || fail "$p.1 is not a man page of $p"
  grep -qF -- '\fB\-\-version\fR' <<<"$page" || fail "$p.1 does not list the flags of $p --help"
done
grep -q 'nproc' <(zcat "$out/contents/usr/share/man/man1/launch.1.gz") || fail "launch.1 lacks its flags"

# --- Depends: exactly the packages owning the libraries the programs load (dpkg-shlibdeps),
# nothing hand-listed beside them.
needed=$(for b in "$out"/contents/usr/bin/*; do objdump -p "$b" | awk '$1 == "NEEDED" {print $2}'; done | sort -u)
expected=$(for lib in $needed; do
  dpkg-query -S "*/x86_64-linux-gnu/$lib" 2>/dev/null | head -1 | sed 's/[:,].*//' \
    || echo "?$lib"
done | sort -u)
grep -q '^?' <<<"$expected" && fail "no Debian package owns $(grep '^?' <<<"$expected")"
depends=$(dpkg-deb -f "$deb" Depends | tr ',' '\n' | sed 's/(.*)//; s/[[:space:]]//g' | sort -u)
# A package may be named by what it provides (libspdlog1.10 provides libspdlog1.10-fmt9).
declare -A names=()  # a name Depends may use -> the owning package
for owner in $expected; do
  names[$owner]=$owner
  for p in $(dpkg-query -W -f='${Provides}' "$owner" | tr ',' '\n' | sed 's/(.*)//; s/[[:space:]]//g'); do
    names[$p]=$owner
  done
done
declare -A covered=()
for d in $depends; do
  [ -n "${names[$d]:-}" ] || fail "Depends names $d, which owns no library the programs load (Depends: $(echo $depends))"
  covered[${names[$d]}]=1
done
for owner in $expected; do
  [ -n "${covered[$owner]:-}" ] || fail "Depends lacks $owner, whose library the programs load (Depends: $(echo $depends))"
done
dpkg-deb -f "$dev" Depends | grep -q "^muster (= $version)" || fail "muster-dev does not depend on muster (= $version)"
echo "package_test: $(basename "$deb") ($(list "$deb" | grep -vc '/$') files) depends on $(echo $depends | wc -w) packages, each owning a library its programs load"

# --- A fresh Debian 12 root from Debian's own packages.
base=$cache/bookworm-apt.tar
root=$out/root
mkdir "$root"
# A cached base that does not unpack (truncated, foreign) is made again.
if [ -s "$base" ] && [ -z "$(find "$base" -mtime +7)" ] && ! tar -xf "$base" -C "$root" 2>"$out/tar.log"; then
  echo "package_test: the cached $base does not unpack ($(head -1 "$out/tar.log")); making it again"
  rm -rf "$base" "$root"
  mkdir "$root"
fi
if [ ! -s "$base" ] || [ -n "$(find "$base" -mtime +7)" ]; then
  sources=()
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -s "$f" ] && sources+=("$f")
  done
  # The machine's own mirrors (a snapshot may be older than its Valid-Until), the package lists
  # kept so that each run need not fetch them.
  if mmdebstrap --variant=apt --skip=cleanup/apt/lists --aptopt='Acquire::Check-Valid-Until "false"' \
      bookworm "$cache/new-root.tar" "${sources[@]}" >"$out/mmdebstrap.log" 2>&1; then
    mv "$cache/new-root.tar" "$base"
  elif [ -s "$base" ] && tar -tf "$base" >/dev/null 2>&1; then
    # Offline: a week-old root still shows what a new machine would need.
    echo "package_test: mmdebstrap failed ($(tail -1 "$out/mmdebstrap.log")); using the cached root"
  else
    tail -20 "$out/mmdebstrap.log" >&2
    fail "mmdebstrap could not make a Debian 12 root"
  fi
  rm -rf "$root"
  mkdir "$root"
  tar -xf "$base" -C "$root"
fi
mkdir -p "$root/opt/debs"
cp "$deb" "$dev" "$root/opt/debs/"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
cp "$source/tests/package/in_fresh_root.sh" "$root/opt/debs/"
cp -r "$source/tests/install/consumer" "$root/opt/debs/consumer"
# What the programs built here say to --version, which the installed ones must say too.
said=$("$build/launcher/launch" --version)
commit=$(sed -n 2p <<<"$said" | sed 's/^commit //')
nccl=$(sed -n 3p <<<"$said" | sed 's/^NCCL //')
# A mount and pid namespace of its own: its mounts and any process left in it end with it.
# The chroot starts with a clean environment, as a new machine's shell would.
unshare --mount --pid --fork --kill-child --propagation private /bin/bash -euc '
  root=$1
  mount -t proc proc "$root/proc"
  mount --rbind /dev "$root/dev"
  mount -t sysfs -o ro sysfs "$root/sys"
  mount -t tmpfs tmpfs "$root/tmp"
  mount --bind "$2" "$root/var/cache/apt/archives"
  shift 2
  chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 \
    /bin/bash /opt/debs/in_fresh_root.sh "$@"
' _ "$root" "$cache/archives" "$version" "$commit" "$nccl" || fail "in the fresh root (above)"
rm -rf "$root/opt/debs"
touch "$root.checked"
echo "package_test: the fresh root is in $root (deploy/image.sh --root makes it an image)"
