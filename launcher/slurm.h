// launch inside a Slurm allocation: the node count, node rank, master host and run id come
// from srun's SLURM_* variables when the matching flags are absent. Flags given win.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace muster::launcher {

struct LaunchOptions;

// What Slurm says about the step launch runs in.
struct SlurmStep {
  std::string jobId;
  bool inStep = false;      // started by srun (SLURM_STEP_ID), not the batch or salloc shell
  int numNodes = 0;         // the step's nodes (the allocation's outside a step)
  int nodeId = -1;          // this node's index in the step, -1 when unknown
  int numTasks = 0;         // tasks in the step, 0 when unknown
  std::string firstHost;    // first host of the step's (or job's) node list
  std::string submitDir;    // where sbatch/srun ran (SLURM_SUBMIT_DIR), usually shared
};

// nullopt outside Slurm (no SLURM_JOB_ID). Errors (INVALID_ARGUMENT, one line) name the
// variable that is malformed.
absl::StatusOr<std::optional<SlurmStep>> slurmStepFromEnv(
    const std::map<std::string, std::string>& env);

// The first host of a Slurm host list: "n[1-2],gpu7" -> "n1", "r[08-09]-c[3,5]" -> "r08-c3".
absl::StatusOr<std::string> firstSlurmHost(const std::string& hostList);

// Fills the flags that `options.given` lacks from `step`: --nnodes, --node_rank,
// --master_addr (several nodes: the first host's name; see slurmNodeAddress), --master_port (29500 plus the
// job id modulo 1000, so that two jobs sharing a node differ), --rdzv_id and, for several
// nodes, --shared_dir (SLURM_SUBMIT_DIR/.muster-shared; launch creates it). Returns what it
// took, as "--flag=value" strings, for the log line. Errors: launch run outside srun in a
// multi-node allocation, or srun starting more than one launch per node.
absl::StatusOr<std::vector<std::string>> applySlurmStep(LaunchOptions& options,
                                                        const SlurmStep& step);

// What parsing left for launch to do inside a Slurm step (it runs a command and touches the
// file system): resolves a --master_addr taken from Slurm to its NodeAddr, creates the default
// shared dir, and logs one line saying what was taken.
void settleSlurmStep(LaunchOptions& options);

// The address other nodes reach `host` at: its NodeAddr in `scontrol show node` (which is
// what slurmctld itself uses, and works where node names do not resolve), else `host`.
std::string slurmNodeAddress(const std::string& host);

// `scontrol requeue JOB`: the job goes back to the queue (Slurm ends this run of it); its
// message when scontrol fails.
absl::Status requeueSlurmJob(const std::string& jobId);

// Parses NodeAddr out of `scontrol show node -o` output; "" when absent.
std::string nodeAddrFromScontrol(const std::string& output);

}  // namespace muster::launcher
