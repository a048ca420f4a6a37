// What a worker learns from its environment: torchrun's variables and muster's, validated.
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace muster::worker {

struct WorkerEnv {
  int rank = 0;
  int worldSize = 1;
  int localRank = 0;
  int localWorldSize = 1;
  int groupRank = 0;
  int groupWorldSize = 1;
  int restartCount = 0;
  int round = 0;  // MUSTER_ROUND (TORCHELASTIC_RESTART_COUNT when not set): keys the channel's files
  std::string runId = "none";
  std::string jobId;  // MUSTER_JOB_ID: unique per job even when the run id is "none" 
  std::string masterAddr;  // the workers' own TCPStore (rank 0 hosts it), as torchrun sets
  int masterPort = 0;
  bool useAgentStore = false;  // TORCHELASTIC_USE_AGENT_STORE: torchrun's agent hosts the TCPStore
  std::string storeAddr;       // MUSTER_STORE_ADDR: the job's muster store, "" if none
  std::string storeNamespace;  // MUSTER_STORE_NAMESPACE
  std::string tokenFile;       // MUSTER_STORE_TOKEN_FILE
  std::string tlsCaFile;       // MUSTER_STORE_TLS_CA: the store speaks TLS, signed by this CA
  std::string tlsServerName;   // MUSTER_STORE_TLS_SERVER_NAME
  std::string sharedDir;       // MUSTER_SHARED_DIR
  bool standalone = false;     // no launcher variables at all: a world of one

  // Reads and checks the variables. A process started without any of them is a world of one.
  // Errors (INVALID_ARGUMENT, one line naming the variable): a variable that is not a number,
  // one missing while others are set, or values that disagree (RANK >= WORLD_SIZE, ...).
  static absl::StatusOr<WorkerEnv> fromEnvironment(const std::map<std::string, std::string>& env);
  // The same, from this process's environment.
  static absl::StatusOr<WorkerEnv> fromProcess();

  // "rank 2/4 (local 0/2, node 1/2)"
  std::string describe() const;
};

}  // namespace muster::worker
