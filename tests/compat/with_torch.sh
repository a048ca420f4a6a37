#!/bin/bash
# Runs a compatibility test against one torch: the host's (Debian 12's PyTorch 1.13 under
# /usr/bin/python3), or a Debian root's (torch_root.sh: trixie 2.6, sid 2.14). The command sees
#   MUSTER_TEST_PYTHON    a Python with that torch, to give ranks (PYTHON_EXEC) and run scripts
#   MUSTER_TEST_TORCHRUN  that torch's own torchrun, as a command line (split on spaces)
#   MUSTER_TEST_LEGACY    its python -m torch.distributed.launch, the same way
#   MUSTER_TEST_TORCH     its version (torch.__version__)
#   MUSTER_TEST_LAUNCH_FLAGS  what launch is given to follow that torchrun: --torchrun_version
#                         for a torch older than launch's default (2.14), else nothing
#   MUSTER_ROOT_BINDS     the folders a root sees (the source and build trees, /tmp is always)
# Usage: with_torch.sh BUILD SOURCE host|trixie|sid CMD [ARG...]. Exit 77 (skipped) when the
# root cannot be made here (not root, no mmdebstrap).
set -euo pipefail
build=$(cd "$1" && pwd)
source=$(cd "$2" && pwd)
suite=$3
shift 3
here=$source/tests/compat
if [ "$suite" = host ]; then
  [ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null \
    || { echo "with_torch: no PyTorch under /usr/bin/python3: skipped" >&2; exit 77; }
  export MUSTER_TEST_PYTHON=/usr/bin/python3
  export MUSTER_TEST_TORCHRUN="/usr/bin/python3 $here/torchrun_py311.py"
  export MUSTER_TEST_LEGACY="/usr/bin/python3 $here/torchrun_py311.py --legacy"
else
  rc=0
  root=$("$here/torch2/torch_root.sh" "$build" "$suite") || rc=$?
  [ $rc -eq 0 ] || exit $rc
  # The wrapper lives in the build tree, which the root sees at the same path; one a root (a test
  # that started in an older root keeps its torch when a newer one is made).
  wrap=$root-python
  # The root's python3 by its full name, as torchrun's sys.executable names it to the ranks.
  want=$(printf '#!/bin/sh\nexec "%s" "%s" /usr/bin/python3 "$@"' "$here/torch2/in_root.sh" "$root")
  if [ ! -x "$wrap" ] || [ "$(cat "$wrap")" != "$want" ]; then
    # A name of its own, then a rename: two tests starting together each write their own
    # file, and either rename leaves the same whole wrapper in place.
    new=$(mktemp "$wrap.XXXXXX")
    printf '%s\n' "$want" >"$new"
    chmod +x "$new"
    mv -f "$new" "$wrap"
  fi
  export MUSTER_ROOT_BINDS=$source:$build${MUSTER_ROOT_BINDS:+:$MUSTER_ROOT_BINDS}
  export MUSTER_TEST_PYTHON=$wrap
  export MUSTER_TEST_TORCHRUN="$wrap -m torch.distributed.run"
  export MUSTER_TEST_LEGACY="$wrap -m torch.distributed.launch"
fi
MUSTER_TEST_TORCH=$("$MUSTER_TEST_PYTHON" -c 'import torch; print(torch.__version__)')
export MUSTER_TEST_TORCH
MUSTER_TEST_LAUNCH_FLAGS=
if [ "$(printf '%s\n' "$MUSTER_TEST_TORCH" 2.14 | sort -V | head -n1)" != 2.14 ]; then
  MUSTER_TEST_LAUNCH_FLAGS=--torchrun_version=$MUSTER_TEST_TORCH
fi
export MUSTER_TEST_LAUNCH_FLAGS
exec "$@"
