// What launch says about failed workers: each failure as torchrun's error file and stderr
// show it, and the end-of-job report (the root cause first, then torchrun's summary).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "launcher/worker_group.h"

namespace muster::launcher {

struct Failure {
  int globalRank = -1, localRank = -1;
  pid_t pid = -1;
  WorkerExit exit;
  std::string errorFile;     // "" when the worker wrote none
  std::string errorMessage;  // what the error file says (readErrorFile)
  std::vector<std::string> lastLines;  // the last lines of its stderr
  // What launch knows beyond the exit: "its file timer 'load' expired", "the kernel's OOM
  // killer killed it (...)"; "" for nothing.
  std::string cause;
  std::chrono::system_clock::time_point when;
};

// "exited with code 3", "was killed by SIGSEGV".
std::string describeExit(const WorkerExit& exit);

// True for an exit launch's own stop explains: SIGTERM, SIGKILL, or exit code 128+SIGTERM.
bool endedByStop(const WorkerExit& exit);

// torchrun's error file: {"message": "..."} or {"message": {"message": ..., "extraInfo":
// {"py_callstack": ..., "timestamp": ...}}}. Returns what best explains the failure: the
// Python stack when there is one; "" for no file; a line saying so for a file that is not
// torchrun's JSON.
std::string readErrorFile(const std::string& path);

// A worker that has exited, as a Failure (reads its error file).
Failure describeFailure(const WorkerState& worker);

// The report printed when the job fails: "launch: root cause: rank R (local_rank L, pid P)
// ...", its error file and stderr's last lines, then torchrun's "<program> FAILED" summary
// with the other failures and the root cause on `host`.
std::string failureReport(const std::string& program, const std::optional<Failure>& rootCause,
                          const std::vector<Failure>& others, const std::string& host);

}  // namespace muster::launcher
