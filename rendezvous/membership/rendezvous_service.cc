// RendezvousService: the rendezvous methods as FrontDoor handlers over RendezvousState.
#include "rendezvous/membership/rendezvous_service.h"

#include <algorithm>

#include "rendezvous/rpc/grpc_status.h"

namespace muster::rendezvous {

RendezvousService::RendezvousService(bool standalone, RunRetention retention)
    : standalone_(standalone), state_(std::make_shared<RendezvousState>(retention)) {}

RendezvousService::~RendezvousService() { state_->shutdown(); }

void RendezvousService::serve(FrontDoor& door) {
  auto state = state_;
  // A join waits for its round; one whose client leaves first is withdrawn.
  door.add<pb::JoinRequest>("/muster.v1.Rendezvous/Join", [state, standalone = standalone_](
                                                              const pb::JoinRequest& request,
                                                              std::shared_ptr<Answer> answer) {
    uint64_t id = state->join(request, [answer, standalone](absl::StatusOr<pb::Assignment> result) {
      if (!result.ok()) {
        answer->finish(toGrpc(result.status()));
        return;
      }
      result->set_standalone_service(standalone);
      answer->reply(*result);
    });
    answer->onEnd([state, id](bool clientGone) {
      if (clientGone) state->cancelJoin(id);
    });
  });
  // A watch: one event, the round's end, then the stream finishes. A watcher that leaves
  // while its round runs has lost its node.
  door.add<pb::WatchRequest>("/muster.v1.Rendezvous/Watch", [state](const pb::WatchRequest& request,
                                                                    std::shared_ptr<Answer> answer) {
    auto id = state->watch(request.run_id(), request.node_id(), request.round(),
                           [answer](const pb::RoundEvent& event) { answer->reply(event); });
    if (!id.ok()) {
      answer->finish(toGrpc(id.status()));
      return;
    }
    if (*id == 0) return;  // the round had ended: its end is the answer, given already
    answer->onEnd([state, id = *id](bool clientGone) { state->unwatch(id, clientGone); });
  });
  door.add<pb::HeartbeatRequest>("/muster.v1.Rendezvous/Heartbeat", [state](const pb::HeartbeatRequest& request,
                                                                            std::shared_ptr<Answer> answer) {
    auto request_ = state->heartbeat(request.run_id(), request.node_id(),
                                     request.has_status() ? &request.status() : nullptr);
    if (request_.ok()) {
      pb::HeartbeatResponse response;
      response.set_stacks_request(*request_);
      answer->reply(response);
    } else {
      answer->finish(toGrpc(request_.status()));
    }
  });
  // A stack roll-call of a run: answered when every node has sent its ranks' stacks, or at
  // the timeout with the missing named.
  door.add<pb::StacksRequest>("/muster.v1.Rendezvous/Stacks", [state](const pb::StacksRequest& request,
                                                                      std::shared_ptr<Answer> answer) {
    Millis timeout(std::clamp<int64_t>(request.timeout_ms() == 0 ? 30000 : request.timeout_ms(), 100, 600000));
    state->requestStacks(request.run_id(), timeout, [answer](absl::StatusOr<pb::StacksReply> reply) {
      if (reply.ok()) {
        answer->reply(*reply);
      } else {
        answer->finish(toGrpc(reply.status()));
      }
    });
  });
  door.add<pb::PutStacksRequest>("/muster.v1.Rendezvous/PutStacks", [state](const pb::PutStacksRequest& request,
                                                                            std::shared_ptr<Answer> answer) {
    state->putStacks(request);
    answer->reply(pb::PutStacksResponse());
  });
  // What an operator sees: every run, and one run's nodes and ranks.
  door.add<pb::RunsRequest>("/muster.v1.Rendezvous/Runs", [state](const pb::RunsRequest&,
                                                                  std::shared_ptr<Answer> answer) {
    pb::RunsReply reply;
    for (auto& run : state->runs()) *reply.add_runs() = std::move(run);
    answer->reply(reply);
  });
  door.add<pb::StatusRequest>("/muster.v1.Rendezvous/Status", [state](const pb::StatusRequest& request,
                                                                      std::shared_ptr<Answer> answer) {
    auto reply = state->status(request.run_id());
    if (reply.ok()) {
      answer->reply(*reply);
    } else {
      answer->finish(toGrpc(reply.status()));
    }
  });
  door.add<pb::ReportRequest>("/muster.v1.Rendezvous/Report", [state](const pb::ReportRequest& request,
                                                                      std::shared_ptr<Answer> answer) {
    auto response = state->report(request);
    if (response.ok()) {
      answer->reply(*response);
    } else {
      answer->finish(toGrpc(response.status()));
    }
  });
}

}  // namespace muster::rendezvous
