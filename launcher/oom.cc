// OomWitness: /dev/kmsg read without blocking, one record per read.
#include "launcher/oom.h"

#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "absl/strings/numbers.h"

namespace muster::launcher {

namespace {

// The memory cgroup of this process, and the file that counts its OOM kills.
std::string countsFile() {
  std::ifstream in("/proc/self/cgroup");
  std::string v2, v1;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("0::", 0) == 0) v2 = line.substr(3);
    size_t memory = line.find(":memory:");
    if (memory != std::string::npos) v1 = line.substr(memory + 8);
  }
  if (!v1.empty()) return "/sys/fs/cgroup/memory" + (v1 == "/" ? "" : v1) + "/memory.oom_control";
  if (!v2.empty()) return "/sys/fs/cgroup" + (v2 == "/" ? "" : v2) + "/memory.events";
  return "";
}

constexpr size_t kKeep = 4096;  // records of killed processes kept

}  // namespace

OomWitness::OomWitness() {
  kmsg_ = open("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (kmsg_ >= 0) lseek(kmsg_, 0, SEEK_END);
  baseline();
}

OomWitness::~OomWitness() {
  if (kmsg_ >= 0) close(kmsg_);
}

void OomWitness::baseline() { baseline_ = cgroupKills(nullptr); }

long OomWitness::cgroupKills(std::string* where) const {
  std::string file = countsFile();
  if (file.empty()) return 0;
  std::ifstream in(file);
  std::string key;
  long value = 0;
  while (in >> key >> value) {
    if (key == "oom_kill") {
      if (where) *where = file.substr(0, file.rfind('/'));
      return value;
    }
  }
  return 0;
}

void OomWitness::readLog() {
  if (kmsg_ < 0) return;
  char record[8192];
  for (;;) {
    ssize_t n = read(kmsg_, record, sizeof record - 1);
    if (n < 0 && errno == EPIPE) continue;  // records were overwritten: go on with the next
    if (n <= 0) return;
    std::string text(record, static_cast<size_t>(n));
    size_t semi = text.find(';');
    if (semi == std::string::npos) continue;
    std::string message = text.substr(semi + 1, text.find('\n', semi) - semi - 1);
    size_t at = message.find("Killed process ");
    if (at == std::string::npos) continue;
    pid_t pid = 0;
    std::string rest = message.substr(at + 15);
    if (!absl::SimpleAtoi(rest.substr(0, rest.find(' ')), &pid)) continue;
    if (killed_.size() >= kKeep) killed_.erase(killed_.begin());
    killed_[pid] = message;
  }
}

std::string OomWitness::explain(pid_t pid) {
  readLog();
  if (auto it = killed_.find(pid); it != killed_.end()) {
    return fmt::format("the kernel's OOM killer killed it ({})", it->second);
  }
  std::string where;
  long kills = cgroupKills(&where);
  if (kills > baseline_) {
    return fmt::format("the kernel's OOM killer has killed {} process(es) in launch's memory cgroup {} since "
                       "the round started, most likely this one", kills - baseline_, where);
  }
  return "";
}

}  // namespace muster::launcher
