#!/usr/bin/env bash
# Fuzzing campaigns: builds the fuzz targets (fuzz/) with clang's libFuzzer under ASan and UBSan
# into build-fuzz/ (MUSTER_FUZZ_BUILD_DIR overrides) and runs each for SECONDS (default 600),
# two at a time, starting from its corpus in fuzz/corpus/<target>/ plus what earlier campaigns
# found (kept in the build folder).
#   tests/fuzz.sh [SECONDS] [TARGET...]
# Prints, per target: executions, coverage (libFuzzer's cov: edges, ft: features), the corpus,
# and any finding: libFuzzer's crash-/leak-/timeout-/oom- file in build-fuzz/fuzz/, which must
# become a regression input in fuzz/corpus/<target>/ (regress-<what>) with the fix. Exits 1 on
# a finding.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
seconds=600
if (($#)) && [[ $1 =~ ^[0-9]+$ ]]; then
  seconds=$1
  shift
fi
build=${MUSTER_FUZZ_BUILD_DIR:-$root/build-fuzz}
cxx=$(command -v clang++-14 || command -v clang++ || true)
[ -n "$cxx" ] || { echo "fuzz: no clang++ (apt-get install clang-14 libclang-rt-14-dev)" >&2; exit 2; }
CXX=$cxx cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMUSTER_FUZZ=ON \
  -DMUSTER_BUILD_TESTS=OFF -DMUSTER_BUILD_BENCH=OFF -DMUSTER_WARNINGS_AS_ERRORS=OFF \
  -DMUSTER_FUZZ_SECONDS="$seconds" >/dev/null
cmake --build "$build" -j"$(nproc)" --target muster_fuzzers
filter=fuzz_
if (($#)); then filter="fuzz_($(IFS='|'; echo "$*"))\$"; fi
rm -f "$build"/fuzz/*-crash-* "$build"/fuzz/*-leak-* "$build"/fuzz/*-timeout-* "$build"/fuzz/*-oom-*
rc=0
ctest --test-dir "$build" -R "$filter" -E fuzz_seeds_current --no-tests=error -j2 -V >"$build/fuzz.log" 2>&1 || rc=$?
# Per target: libFuzzer's final stats and its last status line ("#N DONE cov: C ft: F corp: K/S").
python3 - "$build/fuzz.log" "$build/fuzz" <<'PY'
import os, re, sys
log, folder = sys.argv[1], sys.argv[2]
numbers, lines = {}, {}
for line in open(log, errors="replace"):
    m = re.search(r"Test +#(\d+): fuzz_(\w+)", line)
    if m:
        numbers[m.group(1)] = m.group(2)
    m = re.match(r"(\d+): (.*)", line)
    if m:
        lines.setdefault(m.group(1), []).append(m.group(2))
print(f"{'target':18} {'executions':>12} {'cov':>7} {'ft':>7} {'corpus':>12}  finding")
for number, name in sorted(numbers.items(), key=lambda kv: kv[1]):
    mine = lines.get(number, [])
    execs = next((l.rsplit(":", 1)[1].strip() for l in reversed(mine) if l.startswith("stat::number_of_executed_units")), "?")
    status = next((l for l in reversed(mine) if re.match(r"#\d+", l) and " cov: " in l), "")
    cov = re.search(r" cov: (\d+)", status)
    ft = re.search(r" ft: (\d+)", status)
    corp = re.search(r" corp: (\S+)", status)
    found = sorted(f for f in (os.listdir(folder) if os.path.isdir(folder) else [])
                   if re.match(rf"{name}-(crash|leak|timeout|oom)-", f))
    print(f"{name:18} {execs:>12} {cov.group(1) if cov else '?':>7} {ft.group(1) if ft else '?':>7} "
          f"{corp.group(1) if corp else '?':>12}  {found[0] if found else 'none'}")
PY
echo "fuzz: the log is $build/fuzz.log"
exit $rc
