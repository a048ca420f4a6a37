// The gRPC face of a MemoryStore: muster.v1.Store's Session on the callback API (a stream reads
// nothing before its token is checked), its unary Call through the FrontDoor. Blocked
// operations hold no thread: a call finishes when the key arrives, the deadline passes or the
// client leaves.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "muster/v1/store.grpc.pb.h"
#include "rendezvous/auth.h"
#include "rendezvous/front_door.h"
#include "rendezvous/memory_store.h"

namespace muster::rendezvous {

// Thread-safety: gRPC calls it from its own threads; closeAll() may be called from any thread.
// Lifetime: must outlive the grpc::Server it is registered with.
class StoreService final
    : public pb::Store::WithGenericMethod_Call<pb::Store::WithCallbackMethod_Session<pb::Store::Service>> {
 public:
  // `gate`: the server's token check, shared with its FrontDoor.
  StoreService(std::shared_ptr<MemoryStore> memory, TokenGate& gate);
  ~StoreService() override;

  // Serves Call through `door` (which checks the token).
  void serveCalls(FrontDoor& door);
  grpc::ServerBidiReactor<pb::StoreRequest, pb::StoreResponse>* Session(
      grpc::CallbackServerContext* context) override;

  // Ends every open session with UNAVAILABLE (after its pending answers are written).
  void closeAll();
  size_t openSessions() const;

  class SessionState;

 private:
  void forget(const std::shared_ptr<SessionState>& state);

  std::shared_ptr<MemoryStore> memory_;
  TokenGate& gate_;
  mutable std::mutex mu_;
  std::set<std::shared_ptr<SessionState>> sessions_;
  bool closed_ = false;
};

}  // namespace muster::rendezvous
