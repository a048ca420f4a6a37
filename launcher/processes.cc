// listProcesses / descendantsOf / processState: parsing /proc/PID/stat and /proc/PID/status.
#include "launcher/processes.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "common/files.h"

namespace muster::launcher {

std::optional<ProcessInfo> readProcess(pid_t pid) {
  auto stat = readFile(fmt::format("/proc/{}/stat", pid), "process status");
  if (!stat.ok()) return std::nullopt;  // gone
  const std::string& text = *stat;
  // The command may hold spaces and parentheses: it ends at the last ')'.
  auto open = text.find('('), close = text.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close + 2 > text.size()) return std::nullopt;
  ProcessInfo p;
  p.pid = pid;
  p.command = text.substr(open + 1, close - open - 1);
  std::istringstream rest(text.substr(close + 2));
  rest >> p.state >> p.ppid >> p.pgid;
  return p;
}

std::vector<ProcessInfo> listProcesses() {
  std::vector<ProcessInfo> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid)) continue;
    if (auto p = readProcess(pid)) out.push_back(std::move(*p));  // one gone meanwhile is skipped
  }
  return out;
}

std::string processState(pid_t pid) {
  std::string state = "gone";
  std::ifstream status(fmt::format("/proc/{}/status", pid));
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("State:", 0) == 0) state = std::string(absl::StripAsciiWhitespace(line.substr(6)));
  }
  std::ifstream wchan(fmt::format("/proc/{}/wchan", pid));
  std::string where;
  if (wchan >> where && where != "0") state += ", in " + where;
  return state;
}

std::vector<pid_t> descendantsOf(pid_t root, pid_t except) {
  std::map<pid_t, pid_t> parent;
  std::set<pid_t> zombies;
  for (const auto& p : listProcesses()) {
    parent[p.pid] = p.ppid;
    if (p.state == 'Z') zombies.insert(p.pid);
  }
  std::vector<pid_t> below;
  for (const auto& [pid, ppid] : parent) {
    if (pid == except || zombies.count(pid)) continue;
    // Walk up (bounded, in case /proc changed under the listing into a cycle).
    for (pid_t p = ppid, hops = 0; p > 1 && hops < 4096; ++hops) {
      if (p == except) break;
      if (p == root) {
        below.push_back(pid);
        break;
      }
      auto up = parent.find(p);
      p = up != parent.end() ? up->second : 0;
    }
  }
  return below;
}

}  // namespace muster::launcher
