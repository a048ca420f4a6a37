// Starting a worker process as posix_spawn does (clone with CLONE_VM | CLONE_VFORK: no copy of
// launch's page tables), but without the vfork window: every signal is blocked until the
// child has put every disposition back to the default, so none of launch's handlers can run
// in the child before exec. Exec's failure comes back in launch's memory.
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace muster::launcher {

struct SpawnRequest {
  std::string path;               // an executable's path (not searched in PATH)
  std::vector<std::string> argv;  // argv[0] included
  std::vector<std::string> env;   // the whole environment, "NAME=value"
  int stdinFd = -1, stdoutFd = -1, stderrFd = -1;  // -1: /dev/null
  std::optional<rlimit> files;    // RLIMIT_NOFILE for the child, when set
};

// Starts the program in a process group of its own (its pid), with default signal dispositions
// and an empty signal mask, descriptors 0-2 only, and SIGKILL when launch dies
// (PR_SET_PDEATHSIG). Errors: INTERNAL with the errno of mmap, clone ("fork: ...") or exec
// (the reason alone); EMFILE says which limit to raise.
absl::StatusOr<pid_t> spawnProcess(const SpawnRequest& request);

// strerror, and for EMFILE/ENFILE which limit to raise.
std::string errnoText(int err);

}  // namespace muster::launcher
