// The machine's processes as /proc shows them: for finding what the workers left behind and
// saying where a process is stuck.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace muster::launcher {

struct ProcessInfo {
  pid_t pid = 0, ppid = 0, pgid = 0;
  char state = 0;       // R, S, D, Z, ... (/proc/PID/stat)
  std::string command;  // the name in parentheses
};

// Every process now in /proc (one that vanishes meanwhile is left out).
std::vector<ProcessInfo> listProcesses();
// One process as /proc/PID/stat shows it; nullopt when it is gone.
std::optional<ProcessInfo> readProcess(pid_t pid);

// The live (not zombie) processes below `root`, but neither `except` nor anything below it:
// down from root through /proc/PID/task/TID/children (a few files), or where the kernel has
// no such file, a walk up from every process in /proc (through zombies: a dead shell between
// root and a daemon). A process that left root's tree (its parent died and init adopted it) is
// not found: make root a child subreaper (PR_SET_CHILD_SUBREAPER) to keep such orphans below it.
// One listed has been root's or a descendant's child when read: a pass is a snapshot, and a
// process that forks or is adopted meanwhile is found by the next. Errors (out of descriptors)
// say which file.
absl::StatusOr<std::vector<pid_t>> descendantsOf(pid_t root, pid_t except);
// Its two ways: down through the children files (UNIMPLEMENTED where the kernel has none), and
// the scan of /proc.
absl::StatusOr<std::vector<pid_t>> descendantsByChildren(pid_t root, pid_t except);
std::vector<pid_t> descendantsByScan(pid_t root, pid_t except);

// "D (disk sleep), in request_wait_answer": the State line of /proc/PID/status and where in
// the kernel it waits; "gone" when it is.
std::string processState(pid_t pid);

}  // namespace muster::launcher
