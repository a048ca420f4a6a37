// Each rank's process in a round: its environment (torchrun's variables and muster's
// contract), its command and where its output goes, as pure functions of the job and the
// round's placement.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "launcher/job_layout.h"
#include "launcher/options.h"
#include "launcher/worker_group.h"

namespace muster::launcher {

// Where this node's workers sit in a round: what the rendezvous assigned (or, on one node, the
// flags and the restart count).
struct RoundPlacement {
  uint64_t round = 0;  // the store namespace's round: the restart count, or the service's round
  int restartCount = 0;
  int groupRank = 0;
  int groupWorldSize = 1;
  int worldSize = 1;
  int rankOffset = 0;  // the global rank of local rank 0
  // Among the round's ranks of this node's --role: ROLE_RANK of local rank 0, and how many.
  // roleWorldSize 0: one role (a node alone, or a rendezvous that does not count roles), whose
  // ranks are the world's.
  int roleRankOffset = 0;
  int roleWorldSize = 0;
  std::string masterAddr;
  int masterPort = 0;
};

// What the specs are made of besides the placement. References: the caller keeps them alive
// for the call.
struct JobSpec {
  const LaunchOptions& options;
  // launch's environment, as the workers inherit it (OMP_NUM_THREADS already settled).
  const std::map<std::string, std::string>& env;
  const std::vector<std::string>& command;  // "${local_rank}" in it is filled in per rank
  const JobLayout& layout;
  std::string storeEndpoint;  // muster's store (MUSTER_STORE_ADDR)
  std::string hostName;       // for --log_line_prefix_template's ${hostname}
  // The stack roll-call (0: none): its signal, and the Python start-up hook's folder.
  int stacksSignal = 0;
  std::string pythonHookDir;
  std::string timerFile;     // TORCHELASTIC_TIMER_FILE, "" when the file timer is off
  std::string progressFifo;  // MUSTER_PROGRESS_FIFO, "" without --hang_timeout or file timer
  bool watchOutput = false;  // --hang_timeout: every line counts as progress
  std::string stopBoard;     // MUSTER_STOP_FILE: the round's stop board (common/stop_board.h)
};

// One spec per local rank. Touches nothing: the rank directories are made by
// makeRankDirectories, numactl is put in front by bindToNuma.
std::vector<WorkerSpec> workerSpecs(const JobSpec& job, const RoundPlacement& placement);

// <run dir>/attempt_<round>: the round's logs and error files.
std::string attemptDirectory(const std::string& runDir, uint64_t round);

// The console prefix of a worker's lines: torchrun's "[<role><local rank>]:", or
// --log_line_prefix_template filled in as Python's Template.safe_substitute does (${name} and
// $name; unknown names stay as written; $$ is $).
std::string linePrefix(const LaunchOptions& options, int localRank, int globalRank,
                       const std::string& hostName);

// Makes each spec's rank directory (its error file's folder) and empties its roll-call file.
// Errors name the directory.
absl::Status makeRankDirectories(const std::vector<WorkerSpec>& specs);

// --numa_binding: each worker runs under numactl, on the CPUs near GPU <local rank>, as
// torchrun. Errors: FAILED_PRECONDITION saying why the CPUs could not be found.
absl::Status bindToNuma(std::vector<WorkerSpec>& specs, const LaunchOptions& options,
                        const std::map<std::string, std::string>& env);

}  // namespace muster::launcher
