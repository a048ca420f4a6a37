// The rendezvous's state: runs, their rounds, the nodes joining and running, heartbeat
// deadlines. Pure logic behind the gRPC RendezvousService; callbacks report outcomes.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/deadline.h"
#include "muster/v1/rendezvous.pb.h"

namespace muster::rendezvous {

namespace pb = ::muster::v1;

// Thread-safety: all methods from any thread; one mutex owns the state, callbacks run outside
// it. A timer thread ends joins that wait too long, closes rounds at their last call, and
// declares silent nodes lost. Lifetime: the destructor fails pending joins with UNAVAILABLE.
class RendezvousState {
 public:
  using JoinDone = std::function<void(absl::StatusOr<pb::Assignment>)>;
  // Receives the round's end; the watch is over after it.
  using EventSink = std::function<void(const pb::RoundEvent&)>;

  RendezvousState();
  ~RendezvousState();

  // `done` runs once: with the assignment when the round closes, or with the error.
  uint64_t join(const pb::JoinRequest& request, JoinDone done);
  // The joining client went away: its join is dropped (its `done` does not run).
  void cancelJoin(uint64_t id);
  absl::Status heartbeat(const std::string& runId, const std::string& nodeId);
  // Watches `round` for its end. NOT_FOUND when the node is not in that running round (the
  // round already ended: the caller rejoins).
  absl::StatusOr<uint64_t> watch(const std::string& runId, const std::string& nodeId,
                                 uint64_t round, EventSink sink);
  // The watch is over; `clientGone`: its agent vanished while the round ran: the node is lost.
  void unwatch(uint64_t id, bool clientGone);
  absl::Status report(const pb::ReportRequest& request);
  void shutdown();

  size_t pendingJoins() const;

 private:
  struct Pending {
    uint64_t id;
    pb::NodeInfo node;
    JoinDone done;
    Deadline deadline;
  };
  struct Member {
    pb::NodeInfo node;
    int groupRank = 0;
    Deadline expiry = kNoDeadline;
    bool done = false;
  };
  struct Watcher {
    std::string nodeId;
    uint64_t round;
    EventSink sink;
  };
  struct Run {
    int minNodes = 0, maxNodes = 0;
    uint64_t lastCallMs = 0, keepAliveMs = 0, joinTimeoutMs = 0;
    std::string firstNode;
    uint64_t round = 0;
    bool running = false;
    bool finished = false;
    std::vector<Pending> pending;
    std::map<std::string, Member> members;
    Deadline lastCall = kNoDeadline;
    std::map<uint64_t, Watcher> watchers;
  };
  using Actions = std::vector<std::function<void()>>;

  void closeRound(const std::string& runId, Run& run, Actions& actions);
  void endRound(Run& run, const pb::RoundEvent& event, Actions& actions);
  void failPending(Run& run, size_t index, absl::Status status, Actions& actions);
  void timerLoop();
  Deadline nextDeadline() const;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Run> runs_;
  std::map<uint64_t, std::string> joinRuns_;     // join id -> run
  std::map<uint64_t, std::string> watcherRuns_;  // watcher id -> run
  uint64_t nextId_ = 1;
  bool shutdown_ = false;
  std::thread timer_;
};

}  // namespace muster::rendezvous
