// The self-check every user can run first: under launch, each rank builds the group, checks
// exact all-reduce and broadcast results and a barrier, and rank 0 sums up.
#pragma once

#include <chrono>
#include <string>

#include "worker/worker_env.h"

namespace muster::worker {

struct SelfCheckOptions {
  std::string backend = "auto";
  std::chrono::milliseconds timeout{60'000};
  int elements = 1 << 16;  // floats per collective
  int failRank = -1;       // for tests: this rank exits with code 3 before the all-reduce
};

// Prints one line per rank on stdout and, on rank 0, a summary. Returns the process's exit
// code: 0 when every rank passed, 1 otherwise.
int runSelfCheck(const WorkerEnv& env, const SelfCheckOptions& options);

}  // namespace muster::worker
