// The orphan guard: a small process that outlives launch by design and kills every worker
// process group the moment launch is gone, however it went (kill -9 included), then removes
// launch's private runtime folder.
#pragma once

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"

namespace muster::launcher {

// Lifetime: start() forks the guard; it must run before any thread is started (a forked child
// of a threaded process may only call async-signal-safe functions, and the guard is written
// that way anyway). The guard exits when launch's end of the pipe closes, after SIGKILLing
// each process group it was told about and removing the folder start() named (launch removes
// it itself when it ends normally). Thread-safety: watch() may be called from one thread.
class Reaper {
 public:
  // Forks the guard; `removeAtEnd`, when not empty, is a folder the guard removes (with all in
  // it) once launch is gone. Errors: INTERNAL when pipe or fork fails.
  absl::Status start(const std::string& removeAtEnd = "");
  // Tells the guard about a worker's process group. Cheap: one write of 4 bytes.
  void watch(pid_t pgid);
  // Tells the guard that the group is gone (its ids may be reused).
  void forget(pid_t pgid);
  pid_t pid() const { return pid_; }

 private:
  int fd_ = -1;
  pid_t pid_ = -1;
};

}  // namespace muster::launcher
