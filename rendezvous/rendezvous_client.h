// An agent's side of the rendezvous: join a round, watch it for its end, heartbeat, report.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/deadline.h"
#include "muster/v1/rendezvous.grpc.pb.h"

namespace muster::rendezvous {

namespace pb = ::muster::v1;

// Thread-safety: join/report from one thread at a time; the watch and heartbeat threads call
// their callbacks on their own threads. Lifetime: the destructor stops both threads.
class RendezvousClient {
 public:
  RendezvousClient(const std::string& target, const std::string& token);
  ~RendezvousClient();

  const std::string& target() const { return target_; }
  // Blocks until the round closes, the service refuses, or `deadline` passes.
  absl::StatusOr<pb::Assignment> join(const pb::JoinRequest& request, Deadline deadline);
  absl::Status report(const pb::ReportRequest& request, Deadline deadline);

  // Watches the round on a thread: `onEvent` with the round's end, or `onError` when the
  // service cannot be reached (the stream broke). Heartbeats every `interval` meanwhile; a
  // heartbeat the service cannot answer for `keepAlive` also ends in `onError`.
  void watch(const std::string& runId, const std::string& nodeId, uint64_t round, Millis interval,
             Millis keepAlive, std::function<void(const pb::RoundEvent&)> onEvent,
             std::function<void(const std::string&)> onError);
  // Stops the watch and the heartbeats (the round is over for this node).
  void stopWatch();

 private:
  std::string target_, token_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::Rendezvous::Stub> stub_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::unique_ptr<grpc::ClientContext> watchContext_;
  std::thread watchThread_, heartbeatThread_;
  bool stopping_ = false;
};

}  // namespace muster::rendezvous
