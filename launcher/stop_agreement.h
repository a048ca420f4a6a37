// Across nodes: one stop step for the ranks of every node (the coordinated stop,
// common/stop_board.h), agreed through the job's store: muster's rendezvousd, node 0's launch,
// or the store launch serves beside etcd. In the round's own namespace ("<run>/<round>/stop"):
//   request        the reason of the first notice (compare_set: the first one stays)
//   horizon/<N>    node N's frozen horizon
// Every node watches `request`. On it (its own notice or another node's), the agent freezes its
// board and offers its horizon; once every node of the round has, each takes the largest: the
// same step on every node, with no coordinator and no timing assumed (a node that has not yet
// frozen keeps its ranks below its own horizon, which the largest covers).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include <boost/asio/io_context.hpp>

namespace muster::launcher {

struct StopAgreementSetup {
  std::string endpoint, token;          // the job's store
  std::string tlsCaPem, tlsServerName;  // TLS to it, when tlsCaPem is not empty
  std::string storeNamespace;           // "<run>/<round>/stop"
  int groupRank = 0, groupWorldSize = 1;
};

// Thread-safety: made, used and destroyed on the agent's io_context thread; the handlers run
// there too. Lifetime: destroying it stops its thread (waiting for it up to a second; each store
// call waits half a second at most, but compare_set); no handler runs after. A broken
// connection or a slow store is waited out; another store error ends the agreement (`failed`).
class StopAgreement {
 public:
  struct Handlers {
    std::function<void(int64_t reason)> requested;             // freeze, then offer()
    std::function<void(int64_t step, int64_t reason)> agreed;  // post the step
    std::function<void(const std::string& why)> failed;        // the store failed the agreement
  };
  StopAgreement(boost::asio::io_context& io, StopAgreementSetup setup, Handlers handlers);
  ~StopAgreement();
  StopAgreement(const StopAgreement&) = delete;
  StopAgreement& operator=(const StopAgreement&) = delete;

  // This node's notice: asks every node to stop (the first request of the round stays).
  void request(int64_t reason);
  // This node's frozen horizon, after `requested`.
  void offer(int64_t horizon);

 private:
  struct Shared;
  std::shared_ptr<Shared> shared_;
  std::thread thread_;
};

}  // namespace muster::launcher
