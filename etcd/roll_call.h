// A stack roll-call of a run whose rendezvous is in etcd (rendezvousctl stacks --run ID
// --etcd ...): the question goes to every node of the running round through a key they all
// watch, and their answers come back as keys of their own (etcd/run_keys.h).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/deadline.h"
#include "etcd/client.h"

namespace muster::etcd {

struct NodeStacks {
  std::string nodeId, host;
  std::string json;  // the node's answer: stacks::toJson of its ranks
};

struct RollCallAnswers {
  int nodes = 0;                 // in the running round
  std::vector<NodeStacks> answered;
  std::vector<std::string> missing;  // "host (node id)" of each node that did not answer
};

// Asks run `runId`'s running round and waits up to `timeout` for every node's answer, then
// removes the question and the answers. Errors: NOT_FOUND (no such run in etcd),
// FAILED_PRECONDITION (no round runs now), or the cluster's (UNAVAILABLE, PERMISSION_DENIED).
// Blocking; thread-safe as the Client is.
absl::StatusOr<RollCallAnswers> askForStacks(Client& client, const std::string& runId, Millis timeout);

}  // namespace muster::etcd
