// muster.v1.Rendezvous over a RendezvousState, served through the FrontDoor (every method sends
// one request). A blocked Join holds no thread; a Watch stream that drops while its round runs
// marks its node lost at once.
#pragma once

#include <memory>
#include <string>

#include "muster/v1/rendezvous.pb.h"
#include "rendezvous/door/front_door.h"
#include "rendezvous/membership/rendezvous_state.h"

namespace muster::rendezvous {

// Thread-safety: gRPC's threads call it. Lifetime: must outlive the server its door is on.
class RendezvousService {
 public:
  // `standalone`: this is rendezvousd (Assignment.standalone_service).
  explicit RendezvousService(bool standalone = false, RunRetention retention = {});
  ~RendezvousService();

  // Serves Join, Watch, Heartbeat and Report through `door` (which checks the token).
  void serve(FrontDoor& door);

  RendezvousState& state() { return *state_; }
  void shutdown() { state_->shutdown(); }

 private:
  bool standalone_ = false;
  std::shared_ptr<RendezvousState> state_;
};

}  // namespace muster::rendezvous
