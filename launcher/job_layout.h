// The job's place on this node: its ids, its log and run directories, launch's private runtime
// folder, the shared directory, the store token file, and what of them goes when the job ends.
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
  // A temporary base (no --log_dir), as torchrun's torchelastic_XXXX: removed after a success
  // when it holds no file (no stream was redirected or tee'd), kept with the logs otherwise.
  bool ownBaseLogDir = false;
  std::string runDir;
  // launch's own files: the store's token, the Python hook, the ranks' stack files, the
  // FIFOs. Private (0700, under $TMPDIR), never in the log folder, which holds torchrun's
  // files only (a log folder is copied into bug reports and buckets: no secret may be there).
  // Removed when launch ends, and by the orphan guard when launch is killed.
  std::string runtimeDir;
  // The channel's directory: --shared_dir, a temporary one in the runtime folder (one node), or
  // "" (several nodes without --shared_dir: the workers get none).
  std::string sharedDir;
  bool ownSharedDir = false;
  // The store's token, and the file (mode 0600, in the runtime folder) the workers read it
  // from. Several nodes share MUSTER_STORE_TOKEN_FILE's token, or none ("").
  std::string token;
  std::string tokenFile;

  // Removes what the job leaves behind: the runtime folder and a temporary shared directory
  // always; after a success the job's folder of a given shared directory, and a temporary log
  // base that holds no log file.
  void cleanUp(bool succeeded) const;
  // Removes everything made for the job: for a job that never started a worker.
  void discard() const;
};

// launch's private runtime folder, made before anything else of the job (the orphan guard is
// told of it when it starts): $TMPDIR/muster-launch-XXXXXX (absolute; /tmp when $TMPDIR cannot
// take it), mode 0700. INTERNAL when neither can.
absl::StatusOr<std::string> makeRuntimeDir(const std::map<std::string, std::string>& env);

// Makes the directories and writes the token file into `runtimeDir` (makeRuntimeDir's), which
// the layout then owns. Errors: INVALID_ARGUMENT naming the flag
// or variable (--log_dir cannot be created, --shared_dir is not a directory, an unreadable
// MUSTER_STORE_TOKEN_FILE), INTERNAL for a temporary directory or file that cannot be made;
// nothing made is left behind then.
absl::StatusOr<JobLayout> makeJobLayout(const LaunchOptions& options,
                                        const std::map<std::string, std::string>& env,
                                        bool multiNode, const std::string& runtimeDir);

// `bytes` random bytes in lower-case hex.
std::string randomHex(size_t bytes);

}  // namespace muster::launcher
