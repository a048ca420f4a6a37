// Test support: a network file system between two NetnsNetwork hosts. Host `serverHost` serves
// one SFTP session on its address, with no sshd and no keys: a python3 listener (stdlib only)
// in its namespace accepts one TCP connection, from `clientHost`'s address only, and execs
// OpenSSH's sftp-server on it; sshfs -o directport mounts the directory from inside host
// `clientHost`'s namespace, so the file traffic crosses the bridge as TCP (plain SFTP, neither
// encrypted nor authenticated). A mount belongs to the mount namespace, not the network one:
// every process of the machine sees the mount point. Needs root, FUSE (/dev/fuse), sshfs,
// /usr/bin/python3 and /usr/lib/openssh/sftp-server (apt-get install --no-install-recommends
// sshfs openssh-sftp-server: openssh-sftp-server only recommends openssh-server, whose install
// would start an sshd); mount() returns false, with why() and nothing left behind, when any is
// missing. Destroy it before NetnsNetwork::remove() (which would kill its processes and leave a
// dead mount, though the destructor still clears that).
//
// Semantics seen through the mount (sshfs 3.7, OpenSSH 9.2's sftp-server, kernel 6.x): rename
// (also over an existing name), O_EXCL, pwrite, fsync, MAP_PRIVATE mappings (MADV_POPULATE_READ
// too) all work; a file unlinked on either side stays readable through a descriptor or mapping
// opened before. Caching: the kernel keeps names and attributes for 1 s; sshfs's own cache
// (dir_cache=yes, its default) keeps listings and attributes for 20 s, so kDefaultOptions turns
// it off. A client that stat()ed a path within the last second may see the old size when the
// server replaces the file. Should the server stop answering (stopServer()), readers wait
// (state S, D once signalled; a second lookup in the same directory waits in D, unkillable) for
// as long as it does: nothing times out, as this transport has no keepalive (ssh's
// ServerAliveInterval does not apply) and the server's kernel still acknowledges the TCP
// traffic. resumeServer() frees them (one signalled meanwhile then dies of it); so does SIGKILL
// to sshfs (readers get ECONNABORTED, and the mount point answers ENOTCONN until unmount()). A
// server that dies closes the connection: waiting readers get EIO, descriptors opened before
// ENOTCONN, and sshfs unmounts itself within milliseconds, leaving the mount point an ordinary,
// empty local directory. unmount() never blocks on a hung server.
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "tests/support/netns.h"

namespace muster::testing {

class SshfsMount {
 public:
  // No sshfs directory cache (listings and attributes as fresh as the kernel's 1 s). The server
  // takes one connection, so max_conns must stay 1 (more mounts, then gives EIO) and reconnect
  // only turns a lost server into EIO on a mount that stays (instead of sshfs unmounting).
  static constexpr const char* kDefaultOptions = "dir_cache=no";

  SshfsMount(const NetnsNetwork& net, int serverHost, int clientHost)
      : serverPath_(net.path(serverHost)),
        clientPath_(net.path(clientHost)),
        address_(net.address(serverHost)),
        clientAddress_(net.address(clientHost)),
        port_(2222 + counter()++ % 1000) {}
  ~SshfsMount() { unmount(); }
  SshfsMount(const SshfsMount&) = delete;
  SshfsMount& operator=(const SshfsMount&) = delete;

  // Serves `exportDir` (an existing directory) from the server host and mounts it at
  // `mountPoint` (made when missing, and then removed again by unmount()). `options` are more
  // sshfs -o options (sshfs's or FUSE's; ssh's are accepted and ignored), "" for sshfs's own
  // defaults. Waits up to `timeoutSeconds` for the listener and then for a file made in
  // exportDir to show through the mount. False, with why() and nothing left behind, when it
  // cannot.
  bool mount(const std::string& exportDir, const std::string& mountPoint,
             const std::string& options = kDefaultOptions, int timeoutSeconds = 60) {
    unmount();
    why_.clear();
    char tmpl[] = "/tmp/muster-sshfs-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return fail("cannot make a temporary directory");
    dir_ = tmpl;
    std::error_code ec;
    createdMountPoint_ = !std::filesystem::exists(mountPoint, ec) &&
                         std::filesystem::create_directories(mountPoint, ec);
    // As /proc/self/mountinfo will name it.
    mountPoint_ = std::filesystem::weakly_canonical(std::filesystem::absolute(mountPoint, ec), ec).string();
    std::string exported = std::filesystem::weakly_canonical(std::filesystem::absolute(exportDir, ec), ec).string();
    marker_ = ".sshfs-ready-" + std::to_string(getpid()) + "-" + std::to_string(port_);
    vars_ = "D=" + quote(dir_) + " X=" + quote(exported) + " M=" + quote(mountPoint_) +
            " S=" + quote(serverPath_) + " C=" + quote(clientPath_) + " A=" + quote(address_) +
            " B=" + quote(clientAddress_) + " P=" + std::to_string(port_) + " K=" + quote(marker_) +
            " O=" + quote(options) + " T=" + std::to_string(timeoutSeconds) +
            " R=" + (createdMountPoint_ ? "1" : "0") + "; ";

    // The marker and the listener, in the background: it binds $A:$P, makes $D/listening,
    // takes one connection from $B (giving up after $T s), moves it onto its stdin and stdout
    // and becomes sftp-server (the same pid; argv[0] $D/sftp-server names it ours).
    if (sh(R"sh(
set -e
for t in sshfs nsenter awk; do
  command -v $t >/dev/null || { echo "$t is not installed" >&2; exit 3; }
done
[ -x /usr/bin/python3 ] || { echo "/usr/bin/python3 is not installed (python3)" >&2; exit 3; }
[ -x /usr/lib/openssh/sftp-server ] ||
  { echo "/usr/lib/openssh/sftp-server is not installed (openssh-sftp-server)" >&2; exit 3; }
command -v fusermount3 >/dev/null || command -v fusermount >/dev/null ||
  { echo "fusermount is not installed (fuse3)" >&2; exit 3; }
[ -c /dev/fuse ] || { echo "FUSE is not available here (no /dev/fuse)" >&2; exit 3; }
[ -d "$X" ] || { echo "$X is not a directory" >&2; exit 3; }
[ -d "$M" ] || { echo "cannot make the mount point $M" >&2; exit 3; }
cat > "$D/bridge.py" <<'EOF'
import os, socket, sys, time
address, port, peer, start, d, wait = sys.argv[1:7]
deadline = time.monotonic() + float(wait)
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((address, int(port)))
s.listen(1)
open(d + "/listening", "w").close()
while True:
    s.settimeout(max(0.1, deadline - time.monotonic()))
    c, (host, _) = s.accept()
    if host == peer:
        break
    c.close()
s.close()
c.setblocking(True)
os.dup2(c.fileno(), 0)
os.dup2(c.fileno(), 1)
c.close()
os.closerange(3, 1 << 20)
os.execv("/usr/lib/openssh/sftp-server", [d + "/sftp-server", "-e", "-d", start])
EOF
: > "$X/$K"
nsenter --net="$S" /usr/bin/python3 -I "$D/bridge.py" "$A" "$P" "$B" "$X" "$D" "$T" \
  </dev/null >>"$D/server.log" 2>&1 &
echo $! > "$D/server.pid"
)sh") != 0) {
      return fail("cannot set up: " + tail("setup.log"));
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeoutSeconds);
    while (sh(R"sh([ -e "$D/listening" ])sh") != 0) {
      if (!running("server.pid")) {
        return fail("the listener exited: " + tail("server.log"));
      }
      if (std::chrono::steady_clock::now() > deadline) {
        return fail("the listener did not listen within " + std::to_string(timeoutSeconds) + " s: " +
                    tail("server.log"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }

    // sshfs in the foreground (its pid is $!: nsenter execs it), in the background of this shell.
    sh(R"sh(
nsenter --net="$C" sshfs -f -o "directport=$P${O:+,$O}" "$A:$X" "$M" </dev/null >>"$D/sshfs.log" 2>&1 &
echo $! > "$D/sshfs.pid"
)sh");
    // Ready: mounted, and the marker shows through it (a round trip to the server).
    while (sh(R"sh(
awk -v m="$M" '$5 == m && index($0, " - fuse.sshfs ") {f = 1} END {exit !f}' /proc/self/mountinfo &&
  [ -e "$M/$K" ]
)sh") != 0) {
      if (!running("sshfs.pid")) {
        return fail("sshfs exited: " + tail("sshfs.log") + tail("server.log"));
      }
      if (std::chrono::steady_clock::now() > deadline) {
        return fail("the mount did not come up within " + std::to_string(timeoutSeconds) + " s: " +
                    tail("sshfs.log") + tail("server.log"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    // Through the mount, so that no cache keeps it.
    sh(R"sh(rm -f "$M/$K" "$X/$K")sh");
    return true;
  }

  // Detaches the mount (lazily: never blocks); SIGTERM to sshfs (which fails whatever still
  // waits on the mount), SIGKILL to the listener or sftp-server (closing the connection ends
  // sshfs too, even one waiting on a stopped server), SIGKILL to sshfs should it still be there
  // 3 s later; removes the temporary directory and a mount point that mount() made. Idempotent.
  void unmount() {
    if (dir_.empty()) return;
    sh(R"sh(
has() { [ -n "$1" ] && tr '\0' '\n' <"/proc/$1/cmdline" 2>/dev/null | grep -qxF "$2"; }
mounted() {
  awk -v m="$M" '$5 == m && index($0, " - fuse.sshfs ") {f = 1} END {exit !f}' /proc/self/mountinfo
}
L=$(cat "$D/server.pid" 2>/dev/null); F=$(cat "$D/sshfs.pid" 2>/dev/null)
if mounted; then fusermount3 -u -z "$M" || fusermount -u -z "$M" || umount -l "$M"; fi
if has "$F" "$M"; then kill -TERM "$F"; fi
if has "$L" "$D/bridge.py" || has "$L" "$D/sftp-server"; then kill -KILL "$L"; fi
i=0
while has "$F" "$M" && [ $i -lt 30 ]; do sleep 0.1; i=$((i + 1)); done
if has "$F" "$M"; then kill -KILL "$F"; fi
rm -f "$X/$K"
rm -rf "$D"
if [ "$R" = 1 ]; then rmdir "$M"; fi
true
)sh");
    dir_.clear();
    createdMountPoint_ = false;
  }

  // SIGSTOP / SIGCONT to sftp-server: a server that stops answering.
  bool stopServer() { return signalServer("STOP"); }
  bool resumeServer() { return signalServer("CONT"); }

  // Whether the mount is still there: sshfs unmounts itself when it loses the server, and the
  // mount point is then a local directory.
  bool mounted() const {
    return !dir_.empty() && sh(R"sh(
awk -v m="$M" '$5 == m && index($0, " - fuse.sshfs ") {f = 1} END {exit !f}' /proc/self/mountinfo
)sh") == 0;
  }

  const std::string& why() const { return why_; }
  const std::string& mountPoint() const { return mountPoint_; }
  int port() const { return port_; }

 private:
  static std::atomic<int>& counter() {
    static std::atomic<int> n{0};
    return n;
  }
  static std::string quote(const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  }
  // Runs `script` after the variables; its output goes to $D/setup.log.
  int sh(const std::string& script) const {
    return std::system(("(" + vars_ + script + "\n) >>" + quote(dir_ + "/setup.log") + " 2>&1").c_str());
  }
  std::string tail(const std::string& file) const {
    std::ifstream in(dir_ + "/" + file);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    if (text.size() > 1000) text = "..." + text.substr(text.size() - 1000);
    return text.empty() ? "" : "[" + file + "] " + text + " ";
  }
  // Whether the process in $D/`pidFile` is there and no zombie (any command line: it may not
  // have exec'd yet).
  bool running(const std::string& pidFile) const {
    return sh("F=" + quote(pidFile) + R"sh(
[ -n "$(tr -d '\0' <"/proc/$(cat "$D/$F")/cmdline" 2>/dev/null)" ]
)sh") == 0;
  }
  bool fail(const std::string& reason) {
    why_ = reason;
    unmount();
    return false;
  }
  // Only once the listener has become sftp-server (mount() succeeded).
  bool signalServer(const std::string& sig) const {
    if (dir_.empty()) return false;
    return sh("G=" + sig + R"sh(
L=$(cat "$D/server.pid" 2>/dev/null)
[ -n "$L" ] && tr '\0' '\n' <"/proc/$L/cmdline" 2>/dev/null | grep -qxF "$D/sftp-server" && kill -$G "$L"
)sh") == 0;
  }

  std::string serverPath_, clientPath_, address_, clientAddress_;
  int port_;
  std::string dir_, mountPoint_, marker_, vars_, why_;
  bool createdMountPoint_ = false;
};

}  // namespace muster::testing
