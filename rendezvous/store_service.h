// The gRPC face of a MemoryStore: muster.v1.Store's Session stream and its unary Call, both
// through the FrontDoor (nothing is read before the token is checked). Blocked operations hold
// no thread: a call finishes when the key arrives, the deadline passes or the client leaves.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "muster/v1/store.grpc.pb.h"
#include "rendezvous/front_door.h"
#include "rendezvous/memory_store.h"

namespace muster::rendezvous {

// Thread-safety: the FrontDoor calls it from its threads; closeAll() may be called from any thread.
// Lifetime: must outlive the FrontDoor that serves it.
class StoreService final {
 public:
  explicit StoreService(std::shared_ptr<MemoryStore> memory);
  ~StoreService();

  // Serves Session and Call through `door` (which checks the token).
  void serve(FrontDoor& door);

  // Ends every open session with UNAVAILABLE (after its pending answers are written).
  void closeAll();
  size_t openSessions() const;

  class SessionState;

 private:
  // A new session's reactor.
  StreamReactor* session(const grpc::GenericServerContext& context);
  void forget(const std::shared_ptr<SessionState>& state);

  std::shared_ptr<MemoryStore> memory_;
  mutable std::mutex mu_;
  std::set<std::shared_ptr<SessionState>> sessions_;
  bool closed_ = false;
};

}  // namespace muster::rendezvous
