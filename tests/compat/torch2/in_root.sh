#!/bin/bash
# Runs a command in a torch root (torch_root.sh), in a mount namespace of its own: the host's
# /proc, /sys, /dev, /tmp and the folders named in MUSTER_ROOT_BINDS (colon-separated) at the
# same paths, the host's /etc/hosts over the root's (bound read-only in this namespace: nothing
# is written into the root, which other tests use at the same moment), the working directory
# kept. The root shares the host's network, so ranks in it reach launch's store on loopback.
# Usage: in_root.sh ROOT CMD [ARG...]
set -euo pipefail
root=$1
shift
exec unshare --mount --propagation private /bin/bash -c '
  set -e
  root=$1 cwd=$2
  shift 2
  mount -t proc proc "$root/proc"
  mount --rbind /sys "$root/sys"
  mount --rbind /dev "$root/dev"
  mount --bind /tmp "$root/tmp"
  IFS=: read -ra binds <<<"${MUSTER_ROOT_BINDS:-}"
  for dir in "${binds[@]}"; do
    [ -n "$dir" ] || continue
    mkdir -p "$root$dir"
    mount --bind "$dir" "$root$dir"
  done
  # torch_root.sh made the file when it made the root: a bind needs a file to cover.
  mount --bind -o ro /etc/hosts "$root/etc/hosts"
  exec chroot "$root" /bin/sh -c "cd \"\$0\" 2>/dev/null || cd /; exec \"\$@\"" "$cwd" "$@"
' _ "$root" "$PWD" "$@"
