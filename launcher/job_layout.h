// The job's place on this node: its ids, its log and run directories, the shared directory,
// the store token file, and what of them goes when the job ends.
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "launcher/options.h"

namespace muster::launcher {

struct JobLayout {
  // The rendezvous run id: --rdzv_id, or a fresh uuid-like id for a standalone job.
  std::string runId;
  // The run directory's name (one node), or the run id (several nodes, where every node must
  // name the same folder of the shared directory): <shared dir>/<job id>/<round>.
  std::string jobId;
  // Logs: <base>/<run id>_XXXXXX/attempt_N/<local rank>/..., as torchrun lays them out.
  std::string baseLogDir;
  bool ownBaseLogDir = false;  // a temporary base (no --log_dir): removed after a success
  std::string runDir;
  // The channel's directory: --shared_dir, a temporary one (one node), or "" (several nodes
  // without --shared_dir: the workers get none).
  std::string sharedDir;
  bool ownSharedDir = false;
  // The store's token, and the file (mode 0600, in the run directory) the workers read it
  // from. Several nodes share MUSTER_STORE_TOKEN_FILE's token, or none ("").
  std::string token;
  std::string tokenFile;

  // Removes what the job leaves behind: a temporary shared directory always; after a success
  // the job's folder of a given shared directory and a temporary log base.
  void cleanUp(bool succeeded) const;
  // Removes everything made for the job: for a job that never started a worker.
  void discard() const;
};

// Makes the directories and writes the token file. Errors: INVALID_ARGUMENT naming the flag
// or variable (--log_dir cannot be created, --shared_dir is not a directory, an unreadable
// MUSTER_STORE_TOKEN_FILE), INTERNAL for a temporary directory or file that cannot be made;
// nothing made is left behind then.
absl::StatusOr<JobLayout> makeJobLayout(const LaunchOptions& options,
                                        const std::map<std::string, std::string>& env,
                                        bool multiNode);

// `bytes` random bytes in lower-case hex.
std::string randomHex(size_t bytes);

}  // namespace muster::launcher
