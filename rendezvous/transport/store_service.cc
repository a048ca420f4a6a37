// muster.v1.Store over gRPC: the Session stream's reactor and the unary Call, both behind the
// FrontDoor.
#include "rendezvous/transport/store_service.h"

#include "rendezvous/rpc/grpc_status.h"
#include "rendezvous/store/store.h"

namespace muster::rendezvous {
namespace {

// A gRPC Session: reads one message at a time, hands it to the session, and writes what the
// session gives it.
class SessionReactor final : public StreamReactor, public SessionSink {
 public:
  SessionReactor(std::shared_ptr<StoreSessions::SessionState> state, StoreSessions* sessions)
      : state_(std::move(state)), sessions_(sessions) {}

  // The reactor is the session's only from here: a close before (the service shutting down
  // while the call was being admitted) finishes it now.
  void OnStart() override {
    StartRead();
    state_->attach(this);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      state_->close(grpc::Status::OK);
      return;
    }
    if (!readInto(request_)) {
      state_->close(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "a request on the session does not parse"));
      return;
    }
    if (state_->apply(request_)) StartRead();
  }

  void OnWriteDone(bool ok) override { state_->writeDone(ok); }
  void OnCancel() override { state_->close(grpc::Status::CANCELLED); }

  void OnDone() override {
    state_->detach();
    sessions_->forget(state_);
    delete this;
  }

  void startWrite(const pb::StoreResponse& response) override { StartWrite(response); }
  void finish(const grpc::Status& status) override { Finish(status); }

 private:
  std::shared_ptr<StoreSessions::SessionState> state_;
  StoreSessions* sessions_;
  pb::StoreRequest request_;
};

// A new Session stream: batched answers when the client asks for them (its metadata).
StreamReactor* openReactor(StoreSessions& sessions, const grpc::GenericServerContext& context) {
  auto asked = context.client_metadata().find(kBatchMetadataKey);
  bool batch = asked != context.client_metadata().end() && asked->second == grpc::string_ref("1");
  return new SessionReactor(sessions.openSession(batch), &sessions);
}

}  // namespace

void serveStore(StoreSessions& sessions, FrontDoor& door) {
  door.addStream("/muster.v1.Store/Session",
                 [&sessions](const grpc::GenericServerContext& context) {
                   return openReactor(sessions, context);
                 });
  door.add<pb::StoreRequest>("/muster.v1.Store/Call", [memory = sessions.memory()](const pb::StoreRequest& request,
                                                                          std::shared_ptr<Answer> answer) {
    auto id = memory->execute(request, [answer](pb::StoreResponse&& response) {
      if (response.code() == 0) {
        answer->reply(response);
      } else {
        answer->finish(toGrpc(responseStatus(response)));
      }
    });
    // A parked operation whose client left is taken out of the store.
    answer->onEnd([memory, id](bool clientGone) {
      if (clientGone && id != MemoryStore::kNotPending) memory->cancel(id);
    });
  });
}

}  // namespace muster::rendezvous
