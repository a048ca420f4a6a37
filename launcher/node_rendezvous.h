// This node's side of the rendezvous: joins each round (asking again while a just-restarted
// service drops the connection), watches the round to its end, and reports how this node's
// part of it ended. Every completion runs on the agent's event loop.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio.hpp>

#include "absl/status/statusor.h"
#include "common/backoff.h"
#include "common/deadline.h"
#include "launcher/options.h"
#include "rendezvous/client/rendezvous_client.h"

namespace muster::launcher {

// Thread-safety: call from the loop's thread only; every callback runs there (posted), never
// after the object is destroyed. Lifetime: destroy it before the io_context; the destructor
// cancels every call and waits only for gRPC's callbacks, which only post.
class NodeRendezvous {
 public:
  struct Node {
    std::string runId;
    std::string nodeId;  // unique per launch: "<host>-<pid>-<random>"
    std::string host;    // where the other nodes reach this one
    int localWorldSize = 1;
    int wantedRank = -1;  // --node_rank for the static backend; -1: the service assigns it
    std::string role;     // --role
    int minNodes = 1, maxNodes = 1;
  };

  // `tlsCaPem` not empty: TLS to the service (see RendezvousClient).
  NodeRendezvous(boost::asio::io_context& io, const std::string& endpoint,
                 const std::string& token, Node node, LaunchOptions::RdzvConf conf,
                 const std::string& tlsCaPem = "", const std::string& tlsServerName = "");
  // Over another rendezvous (etcd: EtcdRendezvous).
  NodeRendezvous(boost::asio::io_context& io, std::unique_ptr<rendezvous::RoundClient> client, Node node,
                 LaunchOptions::RdzvConf conf);
  ~NodeRendezvous();
  NodeRendezvous(const NodeRendezvous&) = delete;
  NodeRendezvous& operator=(const NodeRendezvous&) = delete;

  const std::string& endpoint() const { return client_->target(); }
  const Node& node() const { return node_; }

  // Joins the next round, offering `masterPort` for the workers' store should this node be
  // group rank 0. `done` gets the assignment, or why not (within the join timeout plus a
  // margin for the service's own answer). A service not up yet is waited for. With
  // `serviceRestarts` (an earlier round said the service is a rendezvousd, which systemd or a
  // pod restarts) a join that ends UNAVAILABLE (the connection broke, the service is shutting
  // down) is asked again with back-off until then; otherwise it is the answer: node 0's launch
  // does not come back. A join replaces one still waiting.
  void join(int masterPort, bool serviceRestarts,
            std::function<void(absl::StatusOr<muster::v1::Assignment>)> done);
  // Watches `round`: its end (onEvent), or the service lost (onError); heartbeats meanwhile,
  // whose answers may ask for this node's stacks (onStacks, with the roll-call's id).
  void watch(uint64_t round, std::function<void(const muster::v1::RoundEvent&)> onEvent,
             std::function<void(const std::string&)> onError, std::function<void(uint64_t)> onStacks);
  // Answers roll-call `request` with this node's ranks' stacks (stacks::toJson); failures are
  // logged.
  void putStacks(uint64_t request, std::string json);
  // Neither of the watch's callbacks runs after this.
  void stopWatch();
  // What this node says of itself and its ranks, sent with its next keep-alive.
  void setStatus(const muster::v1::NodeStatus& status) { client_->setStatus(status); }
  // Tells the service how this node's round ended; `then` runs once it has it, or could not
  // be told (logged), with pendingReports() already lowered. It gets how the round ended when
  // the service said so in its answer (muster's service does; etcd's answer says nothing).
  using Reported = std::function<void(const std::optional<muster::v1::RoundEvent>& ended)>;
  void report(uint64_t round, bool succeeded, const std::string& message, Reported then = {});
  int pendingReports() const { return pendingReports_; }
  // Stops the join: its `done` is not called, and it is not asked again.
  void stopJoining();
  // Ends every call in flight (a join or a report ends with CANCELLED) and stops asking again.
  void cancel();

 private:
  void sendJoin();

  boost::asio::io_context& io_;
  Node node_;
  LaunchOptions::RdzvConf conf_;
  std::unique_ptr<rendezvous::RoundClient> client_;
  boost::asio::steady_timer retryTimer_;
  muster::v1::JoinRequest joinRequest_;
  std::function<void(absl::StatusOr<muster::v1::Assignment>)> joined_;
  Deadline joinDeadline_;
  Backoff joinBackoff_{Millis(50), Millis(1000)};
  bool retryUnavailable_ = false;
  uint64_t joinGeneration_ = 0;  // a completion of an older join is dropped
  int pendingReports_ = 0;
  // Callbacks posted to the loop check this: the object may be gone when they run.
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace muster::launcher
