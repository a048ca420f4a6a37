// The rendezvous kept in an etcd cluster (--rdzv_backend=etcd): no muster service; every
// node's launch reads and writes the run's keys (etcd/run_keys.h) and agrees on each round
// through etcd's transactions on `state`, written only by a transaction on its revision.
//
// A node's lease is its life: kept alive every keep_alive_interval, it expires after
// keep_alive_interval x keep_alive_max_attempt without, and every key of the node goes with
// it, which the others see as the node lost.
//
// One node decides each round: of a gathering round, the first joiner still there (its join
// key's create revision the lowest); of a running round, the lowest group rank still there.
// The decider alone watches the join and report keys and writes the round's state (closed,
// ended and why, finished); every node watches `state` and the roll-call questions, and every
// other node watches the decider's join key alone, to choose again when it goes. So a round
// of N nodes costs etcd O(N) watch events, not every node's key sent to every node (N^2,
// which at 512 nodes left etcd's watchers minutes behind).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "etcd/client.h"
#include "etcd/keep_alive.h"
#include "etcd/watch.h"
#include "rendezvous/client/round_client.h"

namespace muster::launcher {

// Thread-safety and lifetime: RoundClient's. Its calls run on one thread of its own, in order.
// The destructor revokes this node's lease (the others see it gone at once).
class EtcdRendezvous : public rendezvous::RoundClient {
 public:
  // `storePort`: this node's store (muster.v1.Store), which the workers use when this node is
  // group rank 0 (0: none). `retention`: how long a finished run refuses late joiners before
  // its id may start anew.
  EtcdRendezvous(etcd::Options options, const std::string& runId, int storePort = 0,
                 Millis retention = Millis(300000));
  ~EtcdRendezvous() override;

  const std::string& target() const override { return target_; }
  void join(const muster::v1::JoinRequest& request, Deadline deadline,
            std::function<void(absl::StatusOr<muster::v1::Assignment>)> done) override;
  // The answer has no `ended`: on etcd the round's end reaches the node through its watch of
  // the run's keys, and watch() and report() run in order on this node's one thread, so the
  // watch is in place before the report is written.
  void report(const muster::v1::ReportRequest& request, Deadline deadline,
              std::function<void(absl::StatusOr<muster::v1::ReportResponse>)> done) override;
  void putStacks(const muster::v1::PutStacksRequest& request, Deadline deadline,
                 std::function<void(absl::Status)> done) override;
  void watch(const std::string& runId, const std::string& nodeId, uint64_t round, Millis interval, Millis keepAlive,
             std::function<void(const muster::v1::RoundEvent&)> onEvent, std::function<void(const std::string&)> onError,
             std::function<void(uint64_t)> onStacks) override;
  void stopWatch() override;
  void setStatus(const muster::v1::NodeStatus& status) override;
  void cancel() override;

 private:
  struct JoinEntry {
    nlohmann::json node;
    int64_t createRevision = 0;
  };
  // A round's join keys, by node and in the order they came (their create revision).
  struct RoundJoins {
    std::map<std::string, JoinEntry> byNode;
    std::map<int64_t, std::string> byRevision;
    void put(const std::string& node, JoinEntry entry);
    void erase(const std::string& node);
    const JoinEntry* first() const;
  };
  // What this node knows of the run's keys: `state` and the questions (every node), the join
  // and report keys (the decider), kept by the watches.
  struct View {
    nlohmann::json state;  // null: no round yet
    int64_t stateRevision = 0;
    std::map<uint64_t, RoundJoins> joins;
    std::map<uint64_t, std::map<std::string, nlohmann::json>> reports;
    std::set<uint64_t> stacks;
    // How each round ended, as `state` said (kept: a later state may come in the same batch).
    std::map<uint64_t, nlohmann::json> ended;
  };
  struct PendingJoin {
    muster::v1::JoinRequest request;
    Deadline deadline;
    std::function<void(absl::StatusOr<muster::v1::Assignment>)> done;
    std::optional<uint64_t> keyRound;  // the round this join put this node's key at
    std::optional<JoinEntry> first;    // that round's first joiner, whose --nnodes is the run's
    Deadline closeAt = kNoDeadline;    // the last call: MIN nodes are there, and more may come
  };
  struct RoundWatch {
    uint64_t round = 0;
    std::function<void(const muster::v1::RoundEvent&)> onEvent;
    std::function<void(const std::string&)> onError;
    std::function<void(uint64_t)> onStacks;
    std::set<uint64_t> asked;  // roll-calls already passed on
    uint64_t generation = 0;   // watchGeneration_ when it began
  };

  void run();
  void post(std::function<void()> task);
  // Connects, takes this node's lease and starts the shared watches (once, at the first join).
  absl::Status start(const muster::v1::JoinRequest& request, Deadline deadline);
  // A watch of the keys under `rest`, from `revision`, its events applied on this thread; a
  // role watch's events are dropped once the role has changed.
  std::unique_ptr<etcd::Watch> watchKeys(const std::string& rest, int64_t revision, bool role);
  void apply(const etcd::Watch::Events& events);
  void applyPut(const std::string& key, const std::string& value, int64_t createRevision, int64_t modRevision);
  void applyDelete(const std::string& key);
  // Who decides the round this node waits for or runs in, and this node's watches to match:
  // the join and report keys when it decides, the decider's join key when another does.
  void chooseRole();
  void becomeDecider();
  void follow(const std::string& rest);
  // The lowest group rank of running round `round` still there ("" for none; nullopt when etcd
  // did not answer, and this node is lost).
  std::optional<std::string> writerOf(uint64_t round, const nlohmann::json& nodes);
  // No role: nothing of this node's to decide or follow.
  void drop();
  void step();
  void stepJoin();
  // Tells the agent its round's end (every node).
  void stepWatch();
  // Decides the running round's end (its decider, whether or not it still runs in it: a node
  // whose rank failed decides while it waits for the next round).
  void decide();
  void failJoin(absl::Status status);
  void lost(const std::string& why);
  // Writes `state` if nobody wrote it since this node read it (false: somebody did, or etcd
  // did not answer; the watch brings what is there). Once written, not again over the same
  // revision: the watch is bringing the new one.
  bool writeState(const nlohmann::json& state, int64_t lease = 0);
  void endRound(uint64_t round, muster::v1::RoundEvent event);
  std::string key(const std::string& rest) const { return prefix_ + rest; }

  etcd::Options options_;
  std::string runId_, prefix_, target_, nodeId_;
  int storePort_;
  Millis retention_;
  Millis ttl_{0};
  std::unique_ptr<etcd::Client> client_;
  int64_t lease_ = 0;
  std::unique_ptr<etcd::KeepAlive> keepAlive_;
  std::vector<std::unique_ptr<etcd::Watch>> shared_;  // state, roll-call questions
  std::vector<std::unique_ptr<etcd::Watch>> role_;    // join/ and report/, or a decider's join key
  std::string roleKey_;                               // "decider", a followed key's rest, or ""
  uint64_t roleGeneration_ = 0;
  bool roleStale_ = false;  // something changed that may change who decides
  View view_;
  std::optional<PendingJoin> join_;
  std::optional<RoundWatch> watching_;
  std::optional<uint64_t> heldKeyRound_;  // where this node's join key is, whichever join put it
  // The last status/<node> written, and when: each write is a revision etcd keeps until it is
  // compacted, so a new one only when the ranks change, or every kStatusRefresh.
  Clock::time_point statusWritten_{};
  std::optional<muster::v1::NodeStatus> statusSaid_;
  int64_t wroteOver_ = -1;  // the state revision this node last wrote over (its write on the way)
  std::string lostWhy_;  // not empty: this node's lease or watch is gone

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::atomic<bool> stopRequested_{false};  // cancel() or the destructor: a connection gives up
  // stopWatch() and the thread's delivery of a watch's end agree under this lock.
  std::mutex watchMu_;
  uint64_t watchGeneration_ = 0;
  std::thread thread_;
};

}  // namespace muster::launcher
