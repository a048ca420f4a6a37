#!/bin/bash
# Run by package_test.sh inside a fresh Debian 12 root, as root, with a clean environment:
# install muster as a new machine would, use it, build against muster-dev, remove it all,
# and leave muster installed (the image is made from this root).
#   in_fresh_root.sh VERSION COMMIT NCCL_LINE
set -euo pipefail
version=$1
commit=$2
nccl=$3
export DEBIAN_FRONTEND=noninteractive
fail() { echo "fresh root: $*" >&2; exit 1; }
cd /opt/debs
deb=./muster_${version}_amd64.deb
dev=./muster-dev_${version}_amd64.deb

# The lists in the cached root may be a week old; a failure (offline) keeps them.
apt-get update -q >update.log 2>&1 || echo "fresh root: apt-get update failed; using the cached lists"

# Without its libraries the install itself must fail, naming what is missing; not a program
# that later fails to start.
if dpkg -i "$deb" >dpkg.log 2>&1; then
  fail "dpkg -i installed muster on a root without its libraries"
fi
grep -q 'dependency problems' dpkg.log && grep -q 'depends on libtorch1.13' dpkg.log \
  || { cat dpkg.log >&2; fail "dpkg -i failed, but not for the missing libraries"; }
dpkg --purge muster >/dev/null
echo "fresh root: dpkg -i without the libraries fails at install: $(grep -m1 'depends on' dpkg.log | sed 's/^ *//')"

apt-get install -y -q --no-install-recommends "$deb" >apt.log 2>&1 \
  || { tail -30 apt.log >&2; fail "apt-get install $deb failed"; }
echo "fresh root: apt-get install $deb set up $(grep -c '^Setting up' apt.log) packages"

for p in launch rendezvousd rendezvousctl worker; do
  said=$($p --version)
  expected="$p (muster) $version
commit $commit
NCCL $nccl"
  [ "$said" = "$expected" ] || fail "$p --version says '$said', not '$expected'"
done
launch --version | head -1

launch --nproc_per_node=2 --master_port=0 worker >selfcheck.log 2>&1 \
  || { cat selfcheck.log >&2; fail "launch --nproc_per_node=2 worker failed"; }
grep -q '^self-check passed: 2 rank(s)' selfcheck.log || { cat selfcheck.log >&2; fail "no self-check line"; }
grep '^self-check passed' selfcheck.log

# The log exists before the daemon starts: the shell opens it for the background job only when
# that job runs, and a read of a file not there yet would end this script (set -e).
: >rendezvousd.log
rendezvousd --host=127.0.0.1 --port=0 2>>rendezvousd.log &
pid=$!
port=""
for _ in $(seq 600); do  # 60 s
  port=$(sed -n 's/.*store listening on 127\.0\.0\.1:\([0-9]*\) .*/\1/p' rendezvousd.log)
  [ -n "$port" ] && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.1
done
[ -n "$port" ] || { cat rendezvousd.log >&2; fail "rendezvousd did not start"; }
health=$(rendezvousctl --addr="127.0.0.1:$port" health)
[ "$health" = SERVING ] || fail "rendezvousctl health said '$health'"
kill -TERM $pid
wait $pid || fail "rendezvousd exited $? on SIGTERM"
echo "fresh root: rendezvousd on 127.0.0.1:$port: $health"

# muster-dev: its Depends are what a find_package(muster) program needs. The consumer of
# tests/install, configured, built and run under launch with only those (and a compiler).
apt-get install -y -q --no-install-recommends "$dev" cmake g++ make python3 >dev.log 2>&1 \
  || { tail -30 dev.log >&2; fail "apt-get install $dev failed"; }
echo "fresh root: apt-get install $dev cmake g++ make python3 set up $(grep -c '^Setting up' dev.log) packages"
cmake -S consumer -B consumer-build -DCMAKE_BUILD_TYPE=Release >consumer.log 2>&1 \
  && cmake --build consumer-build -j"$(nproc)" >>consumer.log 2>&1 \
  || { tail -30 consumer.log >&2; fail "the find_package(muster) consumer does not build against muster-dev"; }
out=$(launch --nproc_per_node=2 --master_port=0 consumer-build/consumer 2>consumer.err) \
  || { cat consumer.err >&2; fail "the consumer failed under launch"; }
for r in 0 1; do
  grep -qx "consumer rank $r/2: sum 3, hello from rank 0" <<<"$out" || fail "consumer rank $r: $out"
done
echo "fresh root: a find_package(muster) program builds against muster-dev and runs under launch"
where=$(python3 -c 'import muster; print(muster.__file__)')
[ "$where" = /usr/lib/python3/dist-packages/muster/__init__.py ] || fail "import muster found $where"
echo "fresh root: import muster: $where"

# Removal leaves nothing of muster's behind (the byte code Python wrote included).
apt-get purge -y -q muster >purge.log 2>&1 || { tail -20 purge.log >&2; fail "apt-get purge muster failed"; }
left=$(dpkg -l 'muster*' 2>/dev/null | grep '^[a-z][a-z] ' | grep -v '^un' || true)
[ -z "$left" ] || fail "still known to dpkg after purge: $left"
for f in /usr/bin/launch /usr/lib/python3/dist-packages/muster /usr/lib/systemd/system/rendezvousd.service \
         /usr/share/muster /usr/include/muster /usr/lib/cmake/muster; do
  [ ! -e "$f" ] || fail "$f is left after apt-get purge muster: $(find "$f" | head -5)"
done
apt-get autoremove --purge -y -q >autoremove.log 2>&1 || { tail -20 autoremove.log >&2; fail "autoremove failed"; }
echo "fresh root: apt-get purge muster leaves nothing; autoremove took $(grep -c '^Removing' autoremove.log) packages"

# The root as the image has it: muster alone, by apt.
apt-get purge -y -q cmake g++ make python3 >/dev/null 2>&1 || true
apt-get autoremove --purge -y -q >/dev/null 2>&1 || true
apt-get install -y -q --no-install-recommends "$deb" >apt2.log 2>&1 \
  || { tail -30 apt2.log >&2; fail "apt-get install $deb (again) failed"; }
launch --nproc_per_node=2 --master_port=0 worker >selfcheck2.log 2>&1 \
  || { cat selfcheck2.log >&2; fail "the self-check failed after reinstalling"; }
echo "fresh root: reinstalled, self-check passed again"
