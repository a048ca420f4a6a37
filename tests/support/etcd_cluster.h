// Test support: a real etcd cluster (Debian's etcd-server 3.4, /usr/bin/etcd) for the tests of
// --rdzv_backend=etcd, with N members on 127.0.0.1 (or each in a network namespace of its own,
// so that a test can cut one off), optionally TLS and user/password auth. The v2 API is on too,
// so that torchrun 1.13's etcd backends (v2 API, python3-etcd) can share the cluster. Members
// log to <dir>/m<i>.log, not the test's stderr; etcdctl (/usr/bin/etcdctl) checks, finds the
// leader and sets auth up, as a test would by hand.
#pragma once

#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/child.h"

namespace muster::testing {

struct EtcdOptions {
  int members = 3;
  bool tls = false;             // clients speak TLS to the members (peers stay plain http)
  bool clientCertAuth = false;  // with tls: members also demand a client certificate from ca()
  bool auth = false;            // v3 auth on (user root, password()); the v2 API stays open
  // etcd's own defaults, spelled out because tests count on them: a dead leader is replaced
  // within about 1-2.5 s (measured here from SIGKILL, or link down, to leader() naming another).
  int heartbeatMs = 100, electionMs = 1000;
  // Optional, one per member: member i runs in the network namespace netns[i] (a path such as
  // NetnsNetwork::path gives) at addresses[i]; etcdctl then runs in clientNetns (e.g. the
  // bridge's namespace with its address), since those addresses exist only inside namespaces.
  // Cutting member i off is then the test's `ip -n <ns> link set <if> down`.
  std::vector<std::string> netns, addresses;
  std::string clientNetns;
};

class EtcdCluster {
 public:
  explicit EtcdCluster(EtcdOptions options = {}) : o_(std::move(options)) {
    for (int i = 0; i < o_.members; ++i) {
      clientPorts_.push_back(freePort());
      peerPorts_.push_back(freePort());
    }
    members_.resize(o_.members);
  }
  ~EtcdCluster() { stop(); }
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  // Certificates (when tls), every member started, and `timeout` to see all healthy; then auth
  // (when asked). False, with why(), when any step fails.
  bool start(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    dir_ = freshTestDir("muster-etcd");
    if (o_.tls && !makeCertificates()) return fail("openssl failed: see " + file("openssl.log"));
    for (int i = 0; i < o_.members; ++i) launch(i);
    if (!healthy("", timeout)) return fail("no healthy cluster in time: see " + file("m0.log"));
    if (o_.auth) {
      bool ok = false;
      etcdctl({"user", "add", "root:" + password()}, &ok);
      if (ok) etcdctl({"auth", "enable"}, &ok);  // etcdctl grants root its role itself
      if (!ok) return fail("auth enable failed");
      authOn_ = true;
    }
    return true;
  }

  // Kills every member (SIGKILL) and removes the directory, certificates and logs with it.
  void stop() {
    for (auto& m : members_) m.reset();  // ~Child kills and reaps
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
    dir_.clear();
  }

  int size() const { return o_.members; }
  std::string address(int i) const { return o_.addresses.empty() ? "127.0.0.1" : o_.addresses[i]; }
  std::string endpoint(int i) const { return address(i) + ":" + std::to_string(clientPorts_[i]); }
  // "host:port,host:port,...": no scheme, as --rdzv_endpoint takes them.
  std::string endpoints() const {
    std::string all;
    for (int i = 0; i < o_.members; ++i) all += (i ? "," : "") + endpoint(i);
    return all;
  }
  pid_t pid(int i) const { return members_[i] ? members_[i]->pid() : -1; }

  // Any signal; SIGSTOP (then SIGCONT) freezes a member, the nearest thing to a partition on
  // loopback. A signal that ends it is waited for, so that restart() finds its ports free.
  void kill(int i, int sig = SIGKILL) {
    if (!members_[i]) return;
    members_[i]->kill(sig);
    if (sig == SIGKILL || sig == SIGTERM || sig == SIGINT) {
      members_[i]->wait(std::chrono::seconds(10));
      members_[i].reset();
    }
  }

  // Member i again, on its data directory (so it rejoins as itself), once it is healthy.
  bool restart(int i, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    members_[i].reset();
    launch(i);
    return healthy(endpoint(i), timeout);
  }

  // The member that is leader in its own eyes, with the highest term (an old leader cut off
  // may still think it leads for an election timeout); -1 when none claims it within `wait`.
  int leader(std::chrono::milliseconds wait = std::chrono::seconds(5)) {
    static const std::regex re(
        R"re("Endpoint":"([^"]+)","Status":\{"header":\{[^}]*"member_id":(\d+),[^}]*"raft_term":(\d+)\}[^}]*"leader":(\d+))re");
    // Only members that run, each given 1 s: a member that cannot answer (stopped, cut off)
    // would otherwise hold every poll for etcdctl's whole command timeout.
    std::string live;
    for (int i = 0; i < o_.members; ++i) live += members_[i] ? (live.empty() ? "" : ",") + endpoint(i) : "";
    auto deadline = std::chrono::steady_clock::now() + wait;
    do {
      std::string json = etcdctl({"endpoint", "status", "-w", "json", "--command-timeout=1s"}, nullptr, live);
      int best = -1;
      unsigned long long bestTerm = 0;
      for (std::sregex_iterator m(json.begin(), json.end(), re), end; m != end; ++m) {
        unsigned long long term = std::stoull((*m)[3]);
        if ((*m)[2] != (*m)[4] || term < bestTerm) continue;
        for (int i = 0; i < o_.members; ++i) {
          if (endpoint(i) == (*m)[1]) best = i, bestTerm = term;
        }
      }
      if (best >= 0) return best;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    } while (std::chrono::steady_clock::now() < deadline);
    return -1;
  }

  int peerPort(int i) const { return peerPorts_[i]; }

  // Member i's id, as `etcdctl member list` writes it (hex); empty when it does not answer.
  std::string memberId(int i) {
    static const std::regex re(R"re("member_id":(\d+))re");
    std::string json = etcdctl({"endpoint", "status", "-w", "json", "--command-timeout=2s"}, nullptr, endpoint(i));
    std::smatch m;
    if (!std::regex_search(json, m, re)) return "";
    std::ostringstream hex;
    hex << std::hex << std::stoull(m[1]);
    return hex.str();
  }

  // Makes member i the leader (etcdctl move-leader, asked of the leader now); false when it is
  // not the leader within `wait`.
  bool makeLeader(int i, std::chrono::milliseconds wait = std::chrono::seconds(10)) {
    auto deadline = std::chrono::steady_clock::now() + wait;
    while (std::chrono::steady_clock::now() < deadline) {
      int now = leader();
      if (now == i) return true;
      std::string id = memberId(i);
      if (now >= 0 && !id.empty()) etcdctl({"move-leader", id}, nullptr, endpoint(now));
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return leader() == i;
  }

  // etcdctl with these arguments against `at` (default: every member), with the TLS and auth
  // flags the cluster needs; its stdout. `ok`, when given, says whether it exited 0.
  std::string etcdctl(const std::vector<std::string>& args, bool* ok = nullptr, const std::string& at = "") {
    std::vector<std::string> argv;
    if (!o_.clientNetns.empty()) argv = {"/usr/bin/nsenter", "--net=" + o_.clientNetns, "--"};
    argv.insert(argv.end(), {"/usr/bin/etcdctl", "--endpoints=" + (at.empty() ? endpoints() : at),
                             "--dial-timeout=2s", "--command-timeout=5s"});
    if (o_.tls) {
      // With --cacert, etcdctl speaks TLS to endpoints without a scheme.
      argv.insert(argv.end(), {"--cacert=" + ca(), "--cert=" + clientCert(), "--key=" + clientKey()});
    }
    if (authOn_) argv.push_back("--user=" + user() + ":" + password());
    argv.insert(argv.end(), args.begin(), args.end());
    Child c(argv);
    auto exit = c.wait(std::chrono::seconds(20));
    if (ok) *ok = exit && exit->code == 0;
    return c.stdoutText();
  }

  const std::filesystem::path& dir() const { return dir_; }
  std::string log(int i) const { return read(file("m" + std::to_string(i) + ".log")); }
  const std::string& why() const { return why_; }
  // TLS material (when tls): the cluster's CA, a client certificate it signed, and a second
  // CA that signed nothing here, for tests that must fail verification.
  std::string ca() const { return file("ca.pem"); }
  std::string clientCert() const { return file("client.pem"); }
  std::string clientKey() const { return file("client-key.pem"); }
  std::string otherCa() const { return file("other-ca.pem"); }
  std::string user() const { return "root"; }
  std::string password() const { return "muster-etcd-test"; }

 private:
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  static std::string read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  bool fail(const std::string& why) {
    why_ = why;
    return false;
  }

  // Through /bin/sh so that all of etcd's output goes to its log (nothing reads Child's pipes
  // while a test runs); exec keeps the pid etcd's, and nsenter execs etcd in turn.
  void launch(int i) {
    std::string scheme = o_.tls ? "https://" : "http://", cluster, name = "m" + std::to_string(i);
    for (int j = 0; j < o_.members; ++j) {
      cluster += (j ? ",m" : "m") + std::to_string(j) + "=http://" + address(j) + ":" + std::to_string(peerPorts_[j]);
    }
    std::string peer = "http://" + address(i) + ":" + std::to_string(peerPorts_[i]);
    std::string cmd = "exec ";
    if (!o_.netns.empty()) cmd += "/usr/bin/nsenter --net='" + o_.netns[i] + "' -- ";
    // --initial-cluster* only count on the first start: a restart finds its data directory.
    cmd += "/usr/bin/etcd --name=" + name + " --data-dir='" + file(name) + "' --listen-client-urls=" + scheme +
           endpoint(i) + " --advertise-client-urls=" + scheme + endpoint(i) + " --listen-peer-urls=" + peer +
           " --initial-advertise-peer-urls=" + peer + " --initial-cluster=" + cluster +
           " --initial-cluster-state=new --initial-cluster-token=muster-" + std::to_string(getpid()) +
           " --enable-v2=true --heartbeat-interval=" + std::to_string(o_.heartbeatMs) +
           " --election-timeout=" + std::to_string(o_.electionMs) + " --logger=zap";
    // No --trusted-ca-file without --client-cert-auth: etcd 3.4 then demands client certs anyway.
    if (o_.tls) cmd += " --cert-file='" + file("server.pem") + "' --key-file='" + file("server-key.pem") + "'";
    if (o_.tls && o_.clientCertAuth) cmd += " --client-cert-auth --trusted-ca-file='" + ca() + "'";
    cmd += " >>'" + file(name + ".log") + "' 2>&1";
    members_[i] = std::make_unique<Child>(std::vector<std::string>{"/bin/sh", "-c", cmd});
  }

  bool healthy(const std::string& at, std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      bool ok = false;
      etcdctl({"endpoint", "health"}, &ok, at);  // exits 0 only when every one answered
      if (ok) return true;
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  // P-256 keys (fast to make); the server certificate names 127.0.0.1, localhost and every
  // member's address, as clients check the address they dialled against it.
  bool makeCertificates() {
    std::string san = "subjectAltName=IP:127.0.0.1,DNS:localhost";
    for (const auto& a : o_.addresses) san += ",IP:" + a;
    std::string k = "openssl req -x509 -days 2 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes ";
    std::string leaf = "-CA ca.pem -CAkey ca-key.pem -addext basicConstraints=CA:FALSE ";
    // A CA's key usage, which strict verifiers (python3-etcd's pyOpenSSL) ask for.
    std::string ca = "-addext keyUsage=critical,keyCertSign,cRLSign ";
    std::string s = "cd '" + dir_.string() + "' && (" + k + "-keyout ca-key.pem -out ca.pem -subj /CN=muster-test-ca " + ca + "&& " + k +
                    "-keyout other-ca-key.pem -out other-ca.pem -subj /CN=muster-other-ca " + ca + "&& " + k + leaf +
                    "-keyout server-key.pem -out server.pem -subj /CN=etcd -addext " + san +
                    " -addext extendedKeyUsage=serverAuth && " + k + leaf +
                    "-keyout client-key.pem -out client.pem -subj /CN=root -addext extendedKeyUsage=clientAuth)"
                    " >openssl.log 2>&1";
    return std::system(s.c_str()) == 0;
  }

  EtcdOptions o_;
  std::vector<int> clientPorts_, peerPorts_;
  std::vector<std::unique_ptr<Child>> members_;
  std::filesystem::path dir_;
  std::string why_;
  bool authOn_ = false;
};

}  // namespace muster::testing
