// The machine's processes as /proc shows them: for finding what the workers left behind and
// saying where a process is stuck.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

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

// The live (not zombie) processes below `root`, but neither `except` nor anything below it.
// The walk up passes through zombies (a dead shell between root and a daemon). A process that
// left root's tree (its parent died and init adopted it) is not found: make root a child
// subreaper (PR_SET_CHILD_SUBREAPER) to keep such orphans below it.
std::vector<pid_t> descendantsOf(pid_t root, pid_t except);

// "D (disk sleep), in request_wait_answer": the State line of /proc/PID/status and where in
// the kernel it waits; "gone" when it is.
std::string processState(pid_t pid);

}  // namespace muster::launcher
