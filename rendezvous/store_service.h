// The gRPC face of a MemoryStore: muster.v1.Store on the callback API, with the shared-token
// check. Blocked operations hold no thread: a reactor finishes when the key arrives, the
// deadline passes or the client leaves.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "muster/v1/store.grpc.pb.h"
#include "rendezvous/auth.h"
#include "rendezvous/memory_store.h"

namespace muster::rendezvous {

// Thread-safety: gRPC calls it from its own threads; closeAll() may be called from any thread.
// Lifetime: must outlive the grpc::Server it is registered with.
class StoreService final : public pb::Store::CallbackService {
 public:
  // `token` empty: no authentication.
  StoreService(std::shared_ptr<MemoryStore> memory, std::string token);
  ~StoreService() override;

  grpc::ServerUnaryReactor* Call(grpc::CallbackServerContext* context,
                                 const pb::StoreRequest* request,
                                 pb::StoreResponse* response) override;
  grpc::ServerBidiReactor<pb::StoreRequest, pb::StoreResponse>* Session(
      grpc::CallbackServerContext* context) override;

  // Ends every open session with UNAVAILABLE (after its pending answers are written).
  void closeAll();
  size_t openSessions() const;
  uint64_t rejectedRequests() const { return gate_.rejected(); }

  class SessionState;

 private:
  void forget(const std::shared_ptr<SessionState>& state);

  std::shared_ptr<MemoryStore> memory_;
  TokenGate gate_;
  mutable std::mutex mu_;
  std::set<std::shared_ptr<SessionState>> sessions_;
  bool closed_ = false;
};

}  // namespace muster::rendezvous
