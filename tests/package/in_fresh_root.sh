#!/bin/bash
# Run by package_test.sh inside a fresh Debian 12 root, as root: install muster as a new
# machine would, then use it.   in_fresh_root.sh VERSION
set -euo pipefail
version=$1
export DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 PATH=/usr/sbin:/usr/bin:/sbin:/bin
fail() { echo "fresh root: $*" >&2; exit 1; }
cd /opt/debs

# Without its libraries the install itself must fail, naming what is missing; not a program
# that later fails to start.
if dpkg -i "muster_${version}_amd64.deb" >dpkg.log 2>&1; then
  fail "dpkg -i installed muster on a root without its libraries"
fi
grep -q 'dependency problems' dpkg.log && grep -q 'depends on libtorch1.13' dpkg.log \
  || { cat dpkg.log >&2; fail "dpkg -i failed, but not for the missing libraries"; }
dpkg --purge muster >/dev/null
echo "fresh root: dpkg -i without the libraries fails at install: $(grep -m1 'depends on' dpkg.log | sed 's/^ *//')"

apt-get install -y -q --no-install-recommends "./muster_${version}_amd64.deb" >apt.log 2>&1 \
  || { tail -30 apt.log >&2; fail "apt-get install ./muster_${version}_amd64.deb failed"; }
echo "fresh root: apt-get install set up $(grep -c '^Setting up' apt.log) packages"

for p in launch rendezvousd rendezvousctl worker; do
  first=$($p --version | head -1)
  [ "$first" = "$p (muster) $version" ] || fail "$p --version says '$first'"
done
launch --version

launch --nproc_per_node=2 --master_port=0 worker >selfcheck.log 2>&1 \
  || { cat selfcheck.log >&2; fail "launch --nproc_per_node=2 worker failed"; }
grep -q '^self-check passed: 2 rank(s)' selfcheck.log || { cat selfcheck.log >&2; fail "no self-check line"; }
grep '^self-check passed' selfcheck.log

rendezvousd --host=127.0.0.1 --port=0 2>rendezvousd.log &
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

[ -f /usr/lib/python3/dist-packages/muster/channel.py ] || fail "the Python package is missing"
# muster-dev's Depends resolve (simulated: its -dev dependencies are large to install).
apt-get install -s -q --no-install-recommends "./muster-dev_${version}_amd64.deb" >dev.log 2>&1 \
  || { tail -20 dev.log >&2; fail "apt cannot install muster-dev's dependencies"; }
echo "fresh root: muster-dev installable ($(grep -c '^Inst' dev.log) packages with it)"
