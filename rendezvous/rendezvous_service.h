// muster.v1.Rendezvous on the gRPC callback API, over a RendezvousState. A blocked Join holds no
// thread; a Watch stream that drops while its round runs marks its node lost at once.
#pragma once

#include <memory>
#include <string>

#include "muster/v1/rendezvous.grpc.pb.h"
#include "rendezvous/auth.h"
#include "rendezvous/rendezvous_state.h"

namespace muster::rendezvous {

// Thread-safety: gRPC's threads call it. Lifetime: must outlive the server it is registered on.
class RendezvousService final : public pb::Rendezvous::CallbackService {
 public:
  // `token` empty: no authentication (as the store's).
  // `standalone`: this is rendezvousd (Assignment.standalone_service).
  explicit RendezvousService(std::string token, bool standalone = false, RunRetention retention = {});
  ~RendezvousService() override;

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* context, const pb::JoinRequest* request,
                                 pb::Assignment* response) override;
  grpc::ServerWriteReactor<pb::RoundEvent>* Watch(grpc::CallbackServerContext* context,
                                                  const pb::WatchRequest* request) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context, const pb::HeartbeatRequest* request,
                                      pb::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* Report(grpc::CallbackServerContext* context, const pb::ReportRequest* request,
                                   pb::ReportResponse* response) override;

  RendezvousState& state() { return *state_; }
  void shutdown() { state_->shutdown(); }

 private:
  TokenGate gate_;
  bool standalone_ = false;
  std::shared_ptr<RendezvousState> state_;
};

}  // namespace muster::rendezvous
