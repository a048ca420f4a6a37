// An agent's side of the rendezvous: join a round, watch it for its end, heartbeat, report.
// Every call is asynchronous (gRPC's callback API): nothing here holds a thread of the caller's.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "common/deadline.h"
#include "muster/v1/rendezvous.grpc.pb.h"
#include "rendezvous/client/round_client.h"

namespace grpc {
class ClientContext;
}

namespace muster::rendezvous {

namespace pb = ::muster::v1;

// Callbacks run on gRPC's threads: post them to where they belong, and do not call back into
// the client from them but through such a post. Thread-safety: every method may be called
// from any thread. Lifetime: the destructor cancels every call still in flight and waits until
// their callbacks have returned (promptly: cancellation does not wait for the service).
class RendezvousClient : public RoundClient {
 public:
  // `tlsCaPem` not empty: TLS, the service's certificate signed by that CA (and naming
  // `tlsServerName` when given, else the target's host).
  RendezvousClient(const std::string& target, const std::string& token,
                   const std::string& tlsCaPem = "", const std::string& tlsServerName = "");
  ~RendezvousClient() override;
  RendezvousClient(const RendezvousClient&) = delete;
  RendezvousClient& operator=(const RendezvousClient&) = delete;

  const std::string& target() const override { return target_; }

  // `done` gets the assignment once the round closes, or why not (the service refused, the
  // deadline passed: DEADLINE_EXCEEDED, cancel(): CANCELLED).
  void join(const pb::JoinRequest& request, Deadline deadline,
            std::function<void(absl::StatusOr<pb::Assignment>)> done) override;
  void report(const pb::ReportRequest& request, Deadline deadline,
              std::function<void(absl::StatusOr<pb::ReportResponse>)> done) override;
  // Blocking forms, for tools and benchmarks (never on an event loop).
  absl::StatusOr<pb::Assignment> join(const pb::JoinRequest& request, Deadline deadline);
  absl::StatusOr<pb::ReportResponse> report(const pb::ReportRequest& request, Deadline deadline);

  // A node's answer to a stack roll-call (`onStacks` of watch()).
  void putStacks(const pb::PutStacksRequest& request, Deadline deadline,
                 std::function<void(absl::Status)> done) override;
  // Blocking: a stack roll-call of a whole run (rendezvousctl).
  absl::StatusOr<pb::StacksReply> stacks(const pb::StacksRequest& request, Deadline deadline);
  // Blocking: every run the service knows, and one run's nodes and ranks (rendezvousctl runs,
  // status; NOT_FOUND for a run it does not know).
  absl::StatusOr<pb::RunsReply> runs(Deadline deadline);
  absl::StatusOr<pb::StatusReply> status(const std::string& runId, Deadline deadline);

  // Watches the round: `onEvent` with the round's end, or `onError` when the service cannot
  // be reached (the stream broke), at most one of them, once. Heartbeats every `interval`
  // meanwhile; heartbeats the service does not answer for `keepAlive` end in `onError`. A
  // watch replaces the one before.
  void watch(const std::string& runId, const std::string& nodeId, uint64_t round, Millis interval,
             Millis keepAlive, std::function<void(const pb::RoundEvent&)> onEvent,
             std::function<void(const std::string&)> onError,
             std::function<void(uint64_t)> onStacks = {}) override;
  // Stops the watch and its heartbeats: once this returns, neither of its callbacks is called.
  // Does not wait for the service.
  void stopWatch() override;
  void setStatus(const pb::NodeStatus& status) override;
  // Cancels every call in flight (joins and reports end with CANCELLED).
  void cancel() override;

 public:
  struct Watch;  // defined in the .cc

 private:
  friend struct Watch;
  // One unary call of a Rendezvous method: `done` gets its status and response on gRPC's
  // thread; the call is counted in flight (begin/end) meanwhile.
  template <typename Request, typename Response>
  void unary(void (pb::Rendezvous::Stub::async::*method)(grpc::ClientContext*, const Request*, Response*,
                                                        std::function<void(grpc::Status)>),
             const Request& request, Deadline deadline, std::function<void(grpc::Status, Response&)> done);
  std::shared_ptr<const pb::NodeStatus> latestStatus();
  // unary(), waited for.
  template <typename Request, typename Response>
  absl::StatusOr<Response> blocking(void (pb::Rendezvous::Stub::async::*method)(grpc::ClientContext*, const Request*,
                                                                               Response*, std::function<void(grpc::Status)>),
                                    const Request& request, Deadline deadline);
  // Bookkeeping of calls in flight, so that the destructor can wait for their callbacks.
  void begin(const std::shared_ptr<grpc::ClientContext>& context);
  void end(const std::shared_ptr<grpc::ClientContext>& context);
  void started();
  void ended();
  // A context for a call; counted until it is destroyed (see the destructor).
  std::shared_ptr<grpc::ClientContext> context(Deadline deadline);

  std::string target_, token_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::Rendezvous::Stub> stub_;
  std::mutex mu_;
  std::condition_variable idle_;
  std::set<std::shared_ptr<grpc::ClientContext>> calls_;  // unary calls in flight (to cancel)
  int inflight_ = 0;                      // callbacks still to come, of every kind
  int contexts_ = 0;                      // contexts not yet destroyed
  std::shared_ptr<Watch> watch_;
  std::shared_ptr<const pb::NodeStatus> status_;  // under mu_: what heartbeats carry
};

}  // namespace muster::rendezvous
