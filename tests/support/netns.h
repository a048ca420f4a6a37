// Test support: hosts as network namespaces. Two (or more) "hosts" <tag>h1, <tag>h2 ... at
// <subnet>.1, .2 ..., each with a veth into a bridge that lives in a namespace of its own,
// <tag>br, optionally at <subnet>.254. The 10.x addresses exist only inside these namespaces.
// Needs root and iproute2; processes enter a host with `nsenter --net=<path>` (not `ip netns
// exec`, which remounts /sys).
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <string>

namespace muster::testing {

class NetnsNetwork {
 public:
  // `prefix` keeps concurrent tests apart (with the pid); `secondOctet` picks 10.N.x.0/24.
  NetnsNetwork(const std::string& prefix, int secondOctet, int hosts = 2)
      : tag_(prefix + std::to_string(getpid() % 100000)),
        subnet_("10." + std::to_string(secondOctet) + "." + std::to_string(getpid() % 200 + 20)),
        hosts_(hosts) {}
  ~NetnsNetwork() { remove(); }
  NetnsNetwork(const NetnsNetwork&) = delete;
  NetnsNetwork& operator=(const NetnsNetwork&) = delete;

  // False (and nothing left behind) when namespaces cannot be made here.
  bool create(bool bridgeHasAddress = false) {
    // Namespaces of these names are a killed test's of the same pid (live pids are unique):
    // gone first, or `ip netns add` would fail and the test skip as if none could be made.
    made_ = true;
    remove();
    std::string b = tag_ + "br";
    std::string s = "set -e; ip netns add " + b + "; ip -n " + b + " link set lo up; ip -n " + b +
                    " link add br0 type bridge; ip -n " + b + " link set br0 up; ";
    if (bridgeHasAddress) s += "ip -n " + b + " addr add " + address(254) + "/24 dev br0; ";
    for (int h = 1; h <= hosts_; ++h) {
      std::string ns = name(h), v = tag_ + "v" + std::to_string(h), p = tag_ + "p" + std::to_string(h);
      s += "ip netns add " + ns + "; ip link add " + v + " type veth peer name " + p + "; ip link set " + v +
           " netns " + ns + "; ip link set " + p + " netns " + b + "; ip -n " + b + " link set " + p +
           " master br0; ip -n " + b + " link set " + p + " up; ip -n " + ns + " addr add " + address(h) +
           "/24 dev " + v + "; ip -n " + ns + " link set " + v + " up; ip -n " + ns + " link set lo up; ";
    }
    made_ = true;
    if (std::system(("(" + s + ") >/dev/null 2>&1").c_str()) != 0) {
      remove();
      return false;
    }
    return true;
  }

  // Kills what is still inside, then deletes the namespaces.
  void remove() {
    if (!made_) return;
    made_ = false;
    std::string all = tag_ + "br";
    for (int h = 1; h <= hosts_; ++h) all += " " + name(h);
    std::system(("for n in " + all + "; do p=$(ip netns pids $n 2>/dev/null); [ -z \"$p\" ] || kill -9 $p; " +
                 "ip netns del $n; done >/dev/null 2>&1")
                    .c_str());
  }

  std::string name(int host) const { return tag_ + "h" + std::to_string(host); }
  std::string bridgeName() const { return tag_ + "br"; }
  std::string path(int host) const { return "/run/netns/" + name(host); }
  std::string bridgePath() const { return "/run/netns/" + bridgeName(); }
  std::string address(int host) const { return subnet_ + "." + std::to_string(host); }
  // The host's interface on the bridge (inside its namespace).
  std::string interfaceName(int host) const { return tag_ + "v" + std::to_string(host); }
  const std::string& subnet() const { return subnet_; }

 private:
  std::string tag_, subnet_;
  int hosts_;
  bool made_ = false;
};

}  // namespace muster::testing
