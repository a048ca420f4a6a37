#!/bin/bash
# cmake --install into a fresh prefix, then build a consumer project against it with
# find_package(muster) and run it under the installed launch.
#   install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
source=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/muster-install-XXXXXX")
trap 'rm -rf "$work"' EXIT

cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
for f in bin/launch bin/rendezvousd bin/rendezvousctl bin/worker lib/libmuster_worker.a \
         include/muster/worker/process_group.h include/muster/rendezvous/store/store.h \
         include/muster/muster/v1/store.pb.h lib/cmake/muster/musterConfig.cmake \
         lib/cmake/muster/musterConfigVersion.cmake share/muster/slurm/muster.sbatch \
         lib/systemd/system/rendezvousd.service share/muster/k8s/rendezvousd.yaml; do
  [ -e "$work/prefix/$f" ] || { echo "install_test: $f was not installed" >&2; exit 1; }
done
grep -q "^ExecStart=$work/prefix/bin/rendezvousd " "$work/prefix/lib/systemd/system/rendezvousd.service" \
  || { echo "install_test: the installed unit does not start $work/prefix/bin/rendezvousd" >&2; exit 1; }
# Nothing of the tests or the example programs' internals.
if find "$work/prefix" -name '*_test*' -o -name 'programs' | grep -q .; then
  echo "install_test: test files or example-program headers were installed" >&2
  exit 1
fi

launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S "$source/tests/install/consumer" -B "$work/consumer" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$work/prefix" "${launcher[@]}" >"$work/configure.log" \
  || { cat "$work/configure.log" >&2; exit 1; }
cmake --build "$work/consumer" -j2 >"$work/build.log" 2>&1 || { cat "$work/build.log" >&2; exit 1; }

out=$("$work/prefix/bin/launch" --nproc_per_node=2 "$work/consumer/consumer" 2>"$work/launch.err") \
  || { cat "$work/launch.err" >&2; exit 1; }
echo "$out"
# 1 + 2 = 3 on both ranks; rank 0's bytes on both.
for r in 0 1; do
  grep -qx "consumer rank $r/2: sum 3, hello from rank 0" <<<"$out" \
    || { echo "install_test: rank $r's line is missing" >&2; exit 1; }
done
echo "install_test: installed tree builds and runs a find_package(muster) program"

# The Python package: installed into Python's site directory under the prefix, and by pip
# (no network) into a virtual environment; both run a 2-rank broadcast under launch.
site=$(cd "$work/prefix" && ls -d lib/python3*/*-packages 2>/dev/null | head -1)
[ -n "$site" ] && [ -e "$work/prefix/$site/muster/channel.py" ] \
  || { echo "install_test: the muster Python package was not installed" >&2; exit 1; }
if /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null; then
  cat >"$work/bcast.py" <<'PY'
import sys, muster, torch
c = muster.Channel()
t = c.broadcast(torch.arange(4) * 7 if c.rank == 0 else None, 0)
# One write per line (print writes the newline apart under PYTHONUNBUFFERED, and the two
# ranks' output may then interleave).
sys.stdout.write(f"python rank {c.rank}: {t.tolist()} from {muster.__file__.split('/muster/')[0]}\n")
PY
  check_python() {  # check_python PYTHON SITE_DIR_EXPECTED
    out=$(PYTHON_EXEC=$1 "$work/prefix/bin/launch" --nproc_per_node=2 --master_port=0 \
          "$work/bcast.py" 2>"$work/py.err") || { cat "$work/py.err" >&2; exit 1; }
    for r in 0 1; do
      grep -qx "python rank $r: \[0, 7, 14, 21\] from $2" <<<"$out" \
        || { echo "install_test: python rank $r's line is missing: $out" >&2; exit 1; }
    done
  }
  printf '#!/bin/sh\nPYTHONPATH=%s exec /usr/bin/python3 "$@"\n' "$work/prefix/$site" >"$work/py"
  chmod +x "$work/py"
  check_python "$work/py" "$work/prefix/$site"
  cp -r "$source/python" "$work/python-src"  # pip builds in the tree: not in the source's
  /usr/bin/python3 -m venv --system-site-packages "$work/venv"
  "$work/venv/bin/pip" install "$work/python-src" >"$work/pip.log" 2>&1 \
    || { cat "$work/pip.log" >&2; exit 1; }
  venv_site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  check_python "$work/venv/bin/python" "$venv_site"
  echo "install_test: import muster works from cmake --install and from pip install ./python"
fi
