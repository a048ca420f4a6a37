// rendezvousctl runs and status for runs whose rendezvous is in etcd: the same replies as
// muster's own service gives (muster.v1.RunsReply, StatusReply), read off the runs' keys
// (etcd/run_keys.h), so that one view shows either.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/deadline.h"
#include "etcd/client.h"
#include "muster/v1/rendezvous.pb.h"

namespace muster::etcd {

// Every run under the client's runsPrefix: a first round still gathering (join keys, no state
// yet) as waiting; a run whose nodes are all gone (their leases, and join keys, with them) as
// stopped. A finished run says when etcd forgets it (its state's lease); a run's age counts
// from its first round. DATA_LOSS: a run key holds what launch does not write.
absl::StatusOr<::muster::v1::RunsReply> runsOf(Client& client, Deadline deadline);
// One run: the running round's nodes in group-rank order (a node whose join key is gone: no
// heartbeat, no status), then the nodes waiting to join the next round, each with what it last
// said of itself (status/<node>; its age by the writer's clock). A first round gathering: its
// nodes, waiting. NOT_FOUND: no such run.
absl::StatusOr<::muster::v1::StatusReply> statusOf(Client& client, const std::string& runId, Deadline deadline);

// The running round of a run and the store its nodes share (group rank 0's launch serves it:
// its host and store port), for `rendezvousctl stop`. NOT_FOUND: no such run;
// FAILED_PRECONDITION: it is not running a round now (gathering, ended, finished).
struct RunningStore {
  uint64_t round = 0;
  std::string endpoint;  // HOST:PORT
};
absl::StatusOr<RunningStore> runningStoreOf(Client& client, const std::string& runId, Deadline deadline);

}  // namespace muster::etcd
