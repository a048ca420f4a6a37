// listProcesses / descendantsOf / processState: parsing /proc/PID/stat, /proc/PID/status and
// /proc/PID/task/TID/children.
#include "launcher/processes.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/status/status.h"

namespace muster::launcher {
namespace {

// A /proc file's text, or the errno of open or read (one page or a few: no stream needed).
int readProcFile(const std::string& path, std::string& text) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  char buffer[4096];
  ssize_t got;
  while ((got = read(fd, buffer, sizeof(buffer))) > 0) text.append(buffer, static_cast<size_t>(got));
  int err = got < 0 ? errno : 0;
  close(fd);
  return err;
}

}  // namespace

std::optional<ProcessInfo> readProcess(pid_t pid) {
  std::string text;
  if (readProcFile(fmt::format("/proc/{}/stat", pid), text) != 0) return std::nullopt;  // gone
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

std::vector<pid_t> descendantsByScan(pid_t root, pid_t except) {
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

namespace {

// The children of each of pid's threads (CONFIG_PROC_CHILDREN), each checked to be pid's
// child still (a pid listed, then reused, is not). UNIMPLEMENTED where the kernel has no such
// file; a process that is gone has none.
absl::Status childrenOf(pid_t pid, std::vector<ProcessInfo>& out) {
  std::string dir = fmt::format("/proc/{}/task", pid);
  std::error_code ec;
  std::filesystem::directory_iterator end;
  std::filesystem::directory_iterator task(dir, ec);
  for (; !ec && task != end; task.increment(ec)) {
    std::string text;
    if (int err = readProcFile(task->path() / "children", text); err != 0) {
      std::error_code gone;
      if (err == ENOENT && std::filesystem::exists(task->path(), gone)) {
        return absl::UnimplementedError("no /proc/PID/task/TID/children here");
      }
      if (err == ENOENT || err == ESRCH) continue;  // the thread ended meanwhile
      return absl::InternalError(fmt::format("{}: {}", (task->path() / "children").string(), std::strerror(err)));
    }
    for (auto word : absl::StrSplit(text, ' ', absl::SkipWhitespace())) {
      pid_t child = 0;
      if (!absl::SimpleAtoi(word, &child)) continue;
      if (auto info = readProcess(child); info && info->ppid == pid) out.push_back(std::move(*info));
    }
  }
  if (ec && ec.value() != ENOENT && ec.value() != ESRCH) {
    return absl::InternalError(fmt::format("{}: {}", dir, ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<pid_t>> descendantsByChildren(pid_t root, pid_t except) {
  std::vector<pid_t> below, queue{root};
  std::set<pid_t> seen{root};
  for (size_t next = 0; next < queue.size(); ++next) {
    std::vector<ProcessInfo> children;
    if (auto s = childrenOf(queue[next], children); !s.ok()) return s;
    for (const auto& child : children) {
      if (child.pid == except || !seen.insert(child.pid).second || seen.size() > 65536) continue;
      queue.push_back(child.pid);
      if (child.state != 'Z') below.push_back(child.pid);
    }
  }
  return below;
}

absl::StatusOr<std::vector<pid_t>> descendantsOf(pid_t root, pid_t except) {
  // Down from root: a few files for a job's tree, where the scan reads every process there is.
  auto below = descendantsByChildren(root, except);
  if (absl::IsUnimplemented(below.status())) return descendantsByScan(root, except);
  return below;
}

}  // namespace muster::launcher
