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
#include "rendezvous/memory_store.h"

namespace muster::rendezvous {

// Metadata key that carries the shared token.
inline constexpr char kTokenMetadataKey[] = "x-muster-token";

// Whether the call carries `token` (constant-time compare). An empty `token` admits every call.
// The one check for every muster service on a server.
bool hasToken(const grpc::CallbackServerContext* context, const std::string& token);

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
  uint64_t rejectedRequests() const { return rejected_.load(); }

  class SessionState;

 private:
  bool authorized(grpc::CallbackServerContext* context);
  void forget(const std::shared_ptr<SessionState>& state);

  std::shared_ptr<MemoryStore> memory_;
  std::string token_;
  std::atomic<uint64_t> rejected_{0};
  mutable std::mutex mu_;
  std::set<std::shared_ptr<SessionState>> sessions_;
  bool closed_ = false;
  std::atomic<int64_t> lastRejectLogMs_{0};
};

}  // namespace muster::rendezvous
