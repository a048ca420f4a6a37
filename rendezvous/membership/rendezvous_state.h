// The rendezvous's state: runs, their rounds, the nodes joining and running, heartbeat
// deadlines. Pure logic behind the gRPC RendezvousService; callbacks report outcomes.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <unordered_map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/deadline.h"
#include "muster/v1/rendezvous.pb.h"

namespace muster::rendezvous {

namespace pb = ::muster::v1;

// How long the service remembers runs nobody uses any more.
struct RunRetention {
  // A finished run (every node succeeded) refuses late joins this long ("has already
  // finished"), then is forgotten and its id may start a new run. A run that stopped with no
  // node left (failed, given up) is forgotten as long after its last node went.
  Millis ttl{300000};
  // At most this many such runs are remembered; beyond it the oldest goes first.
  size_t maxRuns = 10000;
};

// Thread-safety: all methods from any thread; one mutex owns the state, callbacks run outside
// it. A timer thread ends joins that wait too long, closes rounds at their last call, declares
// silent nodes lost, and forgets runs past their retention (costing what it forgets, not a
// scan of every run). Lifetime: the destructor fails pending joins with UNAVAILABLE.
class RendezvousState {
 public:
  using JoinDone = std::function<void(absl::StatusOr<pb::Assignment>)>;
  // Receives the round's end; the watch is over after it.
  using EventSink = std::function<void(const pb::RoundEvent&)>;

  explicit RendezvousState(RunRetention retention = {});
  ~RendezvousState();

  // `done` runs once: with the assignment when the round closes, or with the error.
  uint64_t join(const pb::JoinRequest& request, JoinDone done);
  // The joining client went away: its join is dropped (its `done` does not run).
  void cancelJoin(uint64_t id);
  // Keeps the node alive, and keeps what it says of itself (`status`, when given) for
  // status(); returns the id of a stack roll-call it has yet to answer (0: none).
  absl::StatusOr<uint64_t> heartbeat(const std::string& runId, const std::string& nodeId,
                                     const pb::NodeStatus* status = nullptr);
  // Every run remembered, by id (rendezvousctl runs).
  std::vector<pb::RunSummary> runs() const;
  // One run: its summary, the running round's nodes in group-rank order with their last
  // heartbeat and status, then the nodes waiting. NOT_FOUND for a run not remembered.
  absl::StatusOr<pb::StatusReply> status(const std::string& runId) const;
  // Watches `round` for its end. A round that has already ended (the service took the watch
  // after the round's last report: the two are separate calls) gets its end at once, through
  // `sink` and with id 0, while the run is remembered. NOT_FOUND when the node is not in that
  // running round and the run does not remember its end (a round the run never had, a run
  // forgotten).
  absl::StatusOr<uint64_t> watch(const std::string& runId, const std::string& nodeId,
                                 uint64_t round, EventSink sink);
  // The watch is over; `clientGone`: its agent vanished while the round ran: the node is lost.
  void unwatch(uint64_t id, bool clientGone);
  // A node's outcome for its round. The answer says how the round ended when it has (this
  // report ended it, or it ended before), also for a finished run still remembered.
  // NOT_FOUND: no such run (never, or forgotten).
  absl::StatusOr<pb::ReportResponse> report(const pb::ReportRequest& request);
  // A stack roll-call of the run's running round: each node learns of it from its next
  // heartbeat and answers with putStacks; `done` runs once, when every node has answered or
  // `timeout` has passed (the missing named), or at once with NOT_FOUND for no running round.
  using StacksDone = std::function<void(absl::StatusOr<pb::StacksReply>)>;
  void requestStacks(const std::string& runId, Millis timeout, StacksDone done);
  // A node's answer; one for a roll-call that is over or not its is dropped.
  void putStacks(const pb::PutStacksRequest& request);
  void shutdown();

  size_t pendingJoins() const;
  // Runs remembered: active, finished and idle ones.
  size_t runCount() const;

  // What an operator watches (rendezvousd's metrics).
  struct Stats {
    size_t runsActive = 0;     // gathering, running or idle, not yet forgotten
    size_t runsFinished = 0;   // finished, remembered until their time-to-live
    size_t roundsRunning = 0;
    size_t pendingJoins = 0;
    size_t watchers = 0;
    uint64_t joins = 0;          // since start
    uint64_t roundsStarted = 0;
    uint64_t runsForgotten = 0;
    // Rounds ended, by the event that ended them (pb::RoundEvent::Kind).
    uint64_t roundsEnded[5] = {};
    // Nodes lost, by cause.
    uint64_t nodesLostSilent = 0;     // no heartbeat within keep_alive
    uint64_t nodesLostAgentGone = 0;  // its agent's watch stream dropped
  };
  Stats stats() const;

  // Runs once for each run forgotten (outside the state's lock, on its timer thread): the
  // service drops what the run left in the store. Set before the first join.
  void onForget(std::function<void(const std::string& runId)> hook) { onForget_ = std::move(hook); }

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
    int firstRank = 0;
    Clock::time_point lastHeartbeat{};  // none yet: the epoch
    std::optional<pb::NodeStatus> status;
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
    // Joins waiting for the next round, by join id (the order they came in), and indexed by
    // node id and by wanted node rank: a join finds its duplicates in O(1), not by a scan of
    // tens of thousands.
    std::map<uint64_t, Pending> pending;
    std::unordered_map<std::string, uint64_t> pendingByNode;
    std::unordered_map<int, uint64_t> pendingByRank;
    std::map<std::string, Member> members;
    std::unordered_map<int, std::string> memberByRank;  // wanted node rank -> node id
    size_t membersDone = 0;
    Deadline lastCall = kNoDeadline;
    std::map<uint64_t, Watcher> watchers;
    uint64_t stacksRequest = 0;  // the roll-call its nodes are asked for, 0 for none
    uint64_t idleSeq = 0;     // the retention entry that forgets it while idle
    bool idleNoted = false;   // that entry is written (until a node joins again)
    Clock::time_point created = Clock::now();
    Clock::time_point idleSince{};  // when idleNoted was set
    int worldSize = 0;              // the running (or last) round's
    std::optional<pb::RoundEvent> lastEnd;  // how the last round that ended did
  };
  struct FinishedRun {
    Clock::time_point at;
    uint64_t seq = 0;
    pb::RunSummary summary;  // as it was when it finished
    pb::RoundEvent end;      // its last round's end (JOB_SUCCEEDED)
  };
  // The summary of a run in runs_ (under mu_).
  pb::RunSummary summarize(const std::string& runId, const Run& run, Clock::time_point now) const;
  // Forget `runId` at `at` if it is still as it was when this was written (seq).
  struct Retention {
    Deadline at;
    std::string runId;
    uint64_t seq;
  };
  using Actions = std::vector<std::function<void()>>;
  struct StacksCall {
    std::string runId;
    std::map<std::string, std::string> waiting;  // node id -> "host (node id)"
    pb::StacksReply reply;
    StacksDone done;
    Deadline deadline;
  };
  // Ends a roll-call (the caller holds the lock; `done` runs with the actions).
  void endStacks(std::map<uint64_t, StacksCall>::iterator it, Actions& actions);

  void closeRound(const std::string& runId, Run& run, Actions& actions);
  void endRound(Run& run, const pb::RoundEvent& event, Actions& actions);
  void failPending(Run& run, uint64_t joinId, absl::Status status, Actions& actions);
  void addPending(Run& run, Pending p);
  Pending takePending(Run& run, uint64_t joinId);
  // Wakes the timer thread if `d` comes before what it sleeps until (under mu_). Waking it
  // for nothing costs a scan of every run: per join, that made a round of N joins O(N^2).
  void wakeTimerFor(Deadline d);
  void timerLoop();
  std::map<uint64_t, StacksCall> stacksCalls_;
  uint64_t nextStacks_ = 1;
  Deadline nextDeadline() const;
  static bool idle(const Run& run);
  // An idle run is forgotten after the retention time unless it is used again.
  void noteIfIdle(const std::string& runId, Run& run);
  // Writes the retention entry that forgets `runId` (as it was at `seq`) after the ttl.
  void remember(const std::string& runId, uint64_t seq);
  // Moves a run whose job succeeded out of runs_ (the caller holds no reference into it).
  // `summary`: the run as it was before its last round ended.
  void retire(std::map<std::string, Run>::iterator it, pb::RunSummary summary);
  // How `round` of `runId` ended, when it has and the run remembers (under mu_).
  std::optional<pb::RoundEvent> endOf(const std::string& runId, uint64_t round) const;
  // Forgets what is due (or beyond the cap). Not while iterating runs_.
  void forgetDue(Actions& actions);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  RunRetention retention_;
  std::map<std::string, Run> runs_;
  std::map<std::string, FinishedRun> finished_;
  // The end of a finished run forgotten less than kEndGrace ago, by run id, oldest first in
  // endsByAge_: a node's late watch or report still learns how its round ended when the ttl
  // is shorter than the time between the nodes' last calls (--finished-run-ttl 0). At most
  // maxRuns of them.
  static constexpr Millis kEndGrace{60000};
  struct ForgottenEnd {
    Clock::time_point until;
    pb::RoundEvent end;
  };
  std::map<std::string, ForgottenEnd> forgottenEnds_;
  std::deque<std::pair<Clock::time_point, std::string>> endsByAge_;
  std::deque<Retention> retentions_;  // in time order: the retention time is the same for all
  uint64_t retentionSeq_ = 0;
  std::map<uint64_t, std::string> joinRuns_;     // join id -> run
  std::map<uint64_t, std::string> watcherRuns_;  // watcher id -> run
  uint64_t nextId_ = 1;
  bool shutdown_ = false;
  // What the timer thread sleeps until; the earliest time point while it is awake (it looks
  // at everything again before it sleeps).
  Deadline timerAt_ = Deadline::min();
  Stats counts_;  // the counters of stats(); the gauges are computed
  std::function<void(const std::string&)> onForget_;
  std::thread timer_;
};

}  // namespace muster::rendezvous
