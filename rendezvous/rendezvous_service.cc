// RendezvousService: reactors over RendezvousState.
#include "rendezvous/rendezvous_service.h"


namespace muster::rendezvous {
namespace {

grpc::Status toGrpc(const absl::Status& s) {
  return s.ok() ? grpc::Status::OK
                : grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// A join waits for its round; OnCancel and the completion race as in the store's CallReactor.
class JoinReactor final : public grpc::ServerUnaryReactor {
 public:
  JoinReactor(std::shared_ptr<RendezvousState> state, const pb::JoinRequest& request, pb::Assignment* response,
              bool standalone)
      : state_(std::move(state)), guard_(std::make_shared<Guard>()) {
    auto guard = guard_;
    std::lock_guard<std::mutex> lock(guard->mu);
    guard->id = state_->join(request, [this, response, guard, standalone](absl::StatusOr<pb::Assignment> result) {
      {
        std::lock_guard<std::mutex> l(guard->doneMu);
        if (guard->finished) return;
        guard->finished = true;
      }
      if (result.ok()) {
        *response = std::move(*result);
        response->set_standalone_service(standalone);
      }
      Finish(toGrpc(result.status()));
    });
  }
  void OnCancel() override {
    {
      std::lock_guard<std::mutex> lock(guard_->mu);
      state_->cancelJoin(guard_->id);
    }
    {
      std::lock_guard<std::mutex> l(guard_->doneMu);
      if (guard_->finished) return;
      guard_->finished = true;
    }
    Finish(grpc::Status::CANCELLED);
  }
  void OnDone() override { delete this; }

 private:
  struct Guard {
    std::mutex mu, doneMu;
    uint64_t id = 0;
    bool finished = false;
  };
  std::shared_ptr<RendezvousState> state_;
  std::shared_ptr<Guard> guard_;
};

// A watch: one event, the round's end, then the stream finishes. Its state outlives the
// reactor so that a late event finds nothing to write to.
class WatchReactor final : public grpc::ServerWriteReactor<pb::RoundEvent> {
 public:
  WatchReactor(std::shared_ptr<RendezvousState> state, const pb::WatchRequest& request)
      : state_(std::move(state)), shared_(std::make_shared<Shared>()) {
    shared_->reactor = this;
    std::weak_ptr<Shared> weak = shared_;
    auto id = state_->watch(request.run_id(), request.node_id(), request.round(),
                            [weak](const pb::RoundEvent& e) {
                              if (auto s = weak.lock()) s->deliver(e);
                            });
    if (!id.ok()) {
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->finished = true;
      Finish(toGrpc(id.status()));
      return;
    }
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->id = *id;
  }
  void OnWriteDone(bool) override {
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (!shared_->finished) {
      shared_->finished = true;
      Finish(grpc::Status::OK);
    }
  }
  void OnCancel() override {
    uint64_t id;
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      id = shared_->id;
    }
    if (id != 0) state_->unwatch(id, /*clientGone=*/true);
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (!shared_->finished) {
      shared_->finished = true;
      Finish(grpc::Status::CANCELLED);
    }
  }
  void OnDone() override {
    uint64_t id;
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->reactor = nullptr;
      id = shared_->id;
    }
    if (id != 0) state_->unwatch(id, false);
    delete this;
  }

 private:
  struct Shared {
    std::mutex mu;
    WatchReactor* reactor = nullptr;
    uint64_t id = 0;
    bool finished = false;
    bool writing = false;
    pb::RoundEvent event;
    void deliver(const pb::RoundEvent& e) {
      std::lock_guard<std::mutex> lock(mu);
      if (reactor == nullptr || finished || writing) return;
      writing = true;
      event = e;
      reactor->StartWriteAndFinish(&event, grpc::WriteOptions(), grpc::Status::OK);
      finished = true;
    }
  };
  std::shared_ptr<RendezvousState> state_;
  std::shared_ptr<Shared> shared_;
};

}  // namespace

RendezvousService::RendezvousService(std::string token, bool standalone, RunRetention retention)
    : gate_(std::move(token)),
      standalone_(standalone),
      state_(std::make_shared<RendezvousState>(retention)) {}

RendezvousService::~RendezvousService() { state_->shutdown(); }

grpc::ServerUnaryReactor* RendezvousService::Join(grpc::CallbackServerContext* context,
                                                  const pb::JoinRequest* request, pb::Assignment* response) {
  if (!gate_.admits(context)) {
    auto* r = context->DefaultReactor();
    r->Finish(unauthenticated());
    return r;
  }
  return new JoinReactor(state_, *request, response, standalone_);
}

grpc::ServerWriteReactor<pb::RoundEvent>* RendezvousService::Watch(grpc::CallbackServerContext* context,
                                                                   const pb::WatchRequest* request) {
  if (!gate_.admits(context)) {
    class Reject final : public grpc::ServerWriteReactor<pb::RoundEvent> {
     public:
      Reject() { Finish(unauthenticated()); }
      void OnDone() override { delete this; }
    };
    return new Reject();
  }
  return new WatchReactor(state_, *request);
}

grpc::ServerUnaryReactor* RendezvousService::Heartbeat(grpc::CallbackServerContext* context,
                                                       const pb::HeartbeatRequest* request, pb::HeartbeatResponse*) {
  auto* r = context->DefaultReactor();
  if (!gate_.admits(context)) {
    r->Finish(unauthenticated());
  } else {
    r->Finish(toGrpc(state_->heartbeat(request->run_id(), request->node_id())));
  }
  return r;
}

grpc::ServerUnaryReactor* RendezvousService::Report(grpc::CallbackServerContext* context,
                                                    const pb::ReportRequest* request, pb::ReportResponse*) {
  auto* r = context->DefaultReactor();
  if (!gate_.admits(context)) {
    r->Finish(unauthenticated());
  } else {
    r->Finish(toGrpc(state_->report(*request)));
  }
  return r;
}

}  // namespace muster::rendezvous
