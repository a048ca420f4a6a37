#!/bin/bash
# A Debian root with another torch, for running ranks and torchrun under it: trixie (torch 2.6,
# Python 3.13) or sid (torch 2.14, Python 3.14), from Debian's own packages. Prints the root's
# path. Usage: torch_root.sh BUILD SUITE
#
# The root's tarball (mmdebstrap, python3-torch, python3-numpy, procps; ~1.2 GB) is cached in
# $MUSTER_TEST_CACHE (default /var/cache/muster-test) and made again after a week, or when it
# does not unpack; each tarball is unpacked once into BUILD/torch-roots/SUITE.<its mtime>, with
# classic_tcpstore.py in the root's sitecustomize (Debian's torch has no libuv) and an
# /etc/hosts for in_root.sh to bind the host's over. Needs root and the Debian mirror.
# Exit 77: skipped (not root, no mmdebstrap).
set -euo pipefail
# No descriptor but stdin, stdout and stderr reaches what this runs (mmdebstrap's hooks).
. "$(dirname "$0")/../../support/close_inherited_fds.sh"
mkdir -p "$1"
build=$(cd "$1" && pwd)
suite=$2
here=$(cd "$(dirname "$0")" && pwd)
cache=${MUSTER_TEST_CACHE:-/var/cache/muster-test}
say() { echo "torch_root: $*" >&2; }
fail() { say "$*"; exit 1; }
case $suite in trixie | sid) ;; *) fail "SUITE is trixie or sid, not '$suite'" ;; esac
if [ "$(id -u)" -ne 0 ]; then say "needs root (chroot, mounts): skipped"; exit 77; fi
for tool in mmdebstrap unshare chroot flock tar; do
  command -v "$tool" >/dev/null || { say "$tool is missing: skipped"; exit 77; }
done
mkdir -p "$cache" "$build/torch-roots"
# One maker at a time for a suite, on the cache and in the build folder (flock -o: the lock
# stays in flock's process, no child inherits it).
if [ "${MUSTER_TORCH_ROOT_LOCKED:-}" != "$build:$cache:$suite" ]; then
  MUSTER_TORCH_ROOT_LOCKED=$build:$cache:$suite exec flock -o "$cache/torch-$suite.lock" \
    flock -o "$build/torch-roots/$suite.lock" "$0" "$@"
fi
tarball=$cache/torch-$suite.tar
fresh() { [ -s "$tarball" ] && [ -z "$(find "$tarball" -mtime +7)" ]; }
make_tarball() {
  say "making a Debian $suite root with python3-torch (about a minute, 1.2 GB)"
  local log=$build/torch-roots/$suite-mmdebstrap.log
  # sid's Release file may be past its Valid-Until date.
  if mmdebstrap --variant=apt --include=python3-torch,python3-numpy,procps \
      --aptopt='Acquire::Check-Valid-Until "false"' "$suite" "$cache/torch-$suite.new.tar" \
      "deb http://deb.debian.org/debian $suite main" >"$log" 2>&1; then
    mv "$cache/torch-$suite.new.tar" "$tarball"
  elif [ -s "$tarball" ]; then
    say "mmdebstrap failed ($(tail -1 "$log")); using the cached root"
  else
    rm -rf "$cache/torch-$suite.new.tar"
    tail -20 "$log" >&2
    fail "mmdebstrap could not make a Debian $suite root"
  fi
}
# Each tarball unpacks into a folder of its own, named by the tarball's time: a root is never
# changed or removed under a test that runs in it. A new one replaces the older ones but the
# last (a test that started in it may still run; roots are made again a week apart at most).
unpack() {
  root=$build/torch-roots/$suite.$(stat -c %Y "$tarball")
  [ -e "$root.ready" ] && return 0
  # (Called in an if: set -e does not hold inside, so each step says when it failed.)
  local keep old
  keep=$(ls -1 "$build/torch-roots" | grep -E "^$suite\.[0-9]+\.ready\$" | sort -t. -k2 -n | tail -1) || true
  for old in "$build/torch-roots/$suite" "$build/torch-roots/$suite".[0-9]*; do
    case $old in *.ready | *.log | *-python) continue ;; esac
    [ -d "$old" ] || continue
    [ "$(basename "$old").ready" = "$keep" ] && continue
    rm -rf "$old" "$old.ready" "$old-python" || return 1
  done
  mkdir -p "$root" || return 1
  tar -xf "$tarball" -C "$root" 2>"$root.tar.log" || return 1
  rm -f "$root.tar.log"
  local python
  python=$(cd "$root/etc" && ls -d python3.* | sort -V | tail -1)
  [ -n "$python" ] || fail "no /etc/python3.X in the $suite root"
  # Debian's /usr/lib/python3.X/sitecustomize.py links to /etc/python3.X/sitecustomize.py.
  cat "$here/classic_tcpstore.py" >>"$root/etc/$python/sitecustomize.py" || fail "cannot extend the $suite root's sitecustomize"
  # in_root.sh binds the host's /etc/hosts over this file, read-only: it must be there.
  [ -e "$root/etc/hosts" ] || : >"$root/etc/hosts" || fail "cannot make the $suite root's /etc/hosts"
  touch "$root.ready" || return 1
}
fresh || make_tarball
if ! unpack; then
  say "the cached $tarball does not unpack ($(head -1 "$root.tar.log")); making it again"
  rm -rf "$root" "$root.tar.log" "$tarball"
  make_tarball
  [ -s "$tarball" ] || fail "no $suite root to unpack"
  unpack || fail "the $suite root made just now does not unpack: $(head -1 "$root.tar.log")"
fi
echo "$root"
