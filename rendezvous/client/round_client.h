// What a node's agent asks of a rendezvous, whoever keeps it: a muster service (rendezvousd, or
// node 0's launch: RendezvousClient) or an etcd cluster (launcher/etcd_rendezvous.h).
#pragma once

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "common/deadline.h"
#include "muster/v1/rendezvous.pb.h"

namespace muster::rendezvous {

// Callbacks may run on any thread of the implementation's: post them to where they belong,
// and call back into the client only through such a post. Thread-safety: every method from
// any thread. Lifetime: the destructor ends every call in flight; no callback runs after it.
class RoundClient {
 public:
  virtual ~RoundClient() = default;

  // Where the rendezvous is, for messages.
  virtual const std::string& target() const = 0;
  // `done` gets the assignment once the round closes, or why not (refused, DEADLINE_EXCEEDED,
  // cancel(): CANCELLED, the rendezvous unreachable: UNAVAILABLE).
  virtual void join(const ::muster::v1::JoinRequest& request, Deadline deadline,
                    std::function<void(absl::StatusOr<::muster::v1::Assignment>)> done) = 0;
  // `done` gets the service's answer: how the round ended when it has (ReportResponse.ended),
  // or why the report was not taken.
  virtual void report(const ::muster::v1::ReportRequest& request, Deadline deadline,
                      std::function<void(absl::StatusOr<::muster::v1::ReportResponse>)> done) = 0;
  // A node's answer to a stack roll-call (`onStacks` of watch()).
  virtual void putStacks(const ::muster::v1::PutStacksRequest& request, Deadline deadline,
                         std::function<void(absl::Status)> done) = 0;
  // Watches the round: `onEvent` with the round's end, or `onError` when the rendezvous cannot
  // be reached, at most one of them, once; `onStacks` for each roll-call asked meanwhile. This
  // node is kept alive every `interval`; after `keepAlive` without it, it is lost.
  virtual void watch(const std::string& runId, const std::string& nodeId, uint64_t round, Millis interval,
                     Millis keepAlive, std::function<void(const ::muster::v1::RoundEvent&)> onEvent,
                     std::function<void(const std::string&)> onError, std::function<void(uint64_t)> onStacks) = 0;
  // Once this returns, neither of the watch's callbacks is called.
  virtual void stopWatch() = 0;
  // What this node says of itself and its ranks from now on (rendezvousctl status): sent with
  // the watch's next keep-alive, the latest only, and at once when its ranks or their states
  // changed (a round's start, a rank's exit).
  virtual void setStatus(const ::muster::v1::NodeStatus& status) = 0;
  // Ends every call in flight (joins and reports end with CANCELLED).
  virtual void cancel() = 0;
};

// Whether `after` tells of other ranks or states than `before` (none yet: nullptr): a round's
// start, a rank's exit, the group stopping, a coordinated stop asked, agreed or failed. Ages and
// memory change at every refresh and do not count.
bool ranksChanged(const ::muster::v1::NodeStatus* before, const ::muster::v1::NodeStatus& after);

}  // namespace muster::rendezvous
