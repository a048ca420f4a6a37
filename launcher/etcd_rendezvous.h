// The rendezvous kept in an etcd cluster (--rdzv_backend=etcd): no muster service; every
// node's launch reads and writes the run's keys under one prefix, and agrees on each round
// through etcd's transactions.
//
// Keys, under /muster/runs/<run id>/ (readable with `etcdctl get --prefix`):
//   state               the run: {"round", "phase": running|ended|finished, "nodes" of the
//                       running round in group-rank order, "event" that ended it}; written
//                       only by a transaction that compares its revision, so one writer wins
//   join/<round>/<node> a node waiting for, or running in, that round; on the node's lease
//   report/<round>/<node>  how the node's part of the round ended; on the node's lease
//   stacks/<id>[/<node>]   a stack roll-call asked of the run, and each node's answer
// A node's lease is its life: kept alive every keep_alive_interval, it expires after
// keep_alive_interval x keep_alive_max_attempt without, and every key of the node goes with
// it, which the others see as the node lost. Every node watches the prefix (no polling) and
// keeps a view of it; any node may close a gathering round or end a running one, by a
// transaction on `state`; every node acts on the `state` it sees, so all act alike.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

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
  void report(const muster::v1::ReportRequest& request, Deadline deadline,
              std::function<void(absl::Status)> done) override;
  void putStacks(const muster::v1::PutStacksRequest& request, Deadline deadline,
                 std::function<void(absl::Status)> done) override;
  void watch(const std::string& runId, const std::string& nodeId, uint64_t round, Millis interval, Millis keepAlive,
             std::function<void(const muster::v1::RoundEvent&)> onEvent, std::function<void(const std::string&)> onError,
             std::function<void(uint64_t)> onStacks) override;
  void stopWatch() override;
  void cancel() override;

  // The prefix of a run's keys (the run id escaped so that no run's prefix holds another's).
  static std::string prefixOf(const std::string& runId);

 private:
  struct JoinEntry {
    nlohmann::json node;
    int64_t createRevision = 0;
  };
  // What this node knows of the run's keys, kept by the watch.
  struct View {
    nlohmann::json state;  // null: no round yet
    int64_t stateRevision = 0;
    std::map<uint64_t, std::map<std::string, JoinEntry>> joins;
    std::map<uint64_t, std::map<std::string, nlohmann::json>> reports;
    std::set<uint64_t> stacks;
  };
  struct PendingJoin {
    muster::v1::JoinRequest request;
    Deadline deadline;
    std::function<void(absl::StatusOr<muster::v1::Assignment>)> done;
    std::optional<uint64_t> keyRound;  // the round this node's join key is at
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
  // Connects, takes this node's lease and starts the watch (once, at the first join).
  absl::Status start(const muster::v1::JoinRequest& request, Deadline deadline);
  void apply(const etcd::Watch::Events& events);
  void applyPut(const std::string& key, const std::string& value, int64_t createRevision, int64_t modRevision);
  void applyDelete(const std::string& key);
  void step();
  void stepJoin();
  void stepWatch();
  void failJoin(absl::Status status);
  void lost(const std::string& why);
  // Writes `state` if nobody wrote it since this node read it (false: somebody did, or etcd
  // did not answer; the watch brings what is there).
  bool writeState(const nlohmann::json& state, int64_t lease = 0);
  void endRound(uint64_t round, muster::v1::RoundEvent event);
  std::string key(const std::string& rest) const { return prefix_ + rest; }

  etcd::Options options_;
  std::string runId_, prefix_, target_, nodeId_;
  int storePort_;
  Millis retention_;
  std::unique_ptr<etcd::Client> client_;
  int64_t lease_ = 0;
  std::unique_ptr<etcd::KeepAlive> keepAlive_;
  std::unique_ptr<etcd::Watch> watch_;
  View view_;
  std::optional<PendingJoin> join_;
  std::optional<RoundWatch> watching_;
  std::string lostWhy_;  // not empty: this node's lease or watch is gone

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  // stopWatch() and the thread's delivery of a watch's end agree under this lock.
  std::mutex watchMu_;
  uint64_t watchGeneration_ = 0;
  std::thread thread_;
};

}  // namespace muster::launcher
