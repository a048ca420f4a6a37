// The store's sessions over a MemoryStore, whatever transport carries them (the gRPC Session
// stream, transport/store_service.h; the direct path, transport/store_direct.h): requests
// applied in order, answers written as they finish, several to a message for a client that
// takes them so. Blocked operations hold no thread: a call finishes when the key arrives, the
// deadline passes or the client leaves.
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>

#include <grpcpp/support/status.h>

#include "muster/v1/store.pb.h"
#include "rendezvous/store/memory_store.h"

namespace muster::rendezvous {

// A session's way out: the transport that writes its answers. The session calls it with its
// lock held, from any thread, and never again once detached.
class SessionSink {
 public:
  virtual ~SessionSink() = default;
  // One message of answers; the next comes only after SessionState::writeDone().
  virtual void startWrite(const pb::StoreResponse& response) = 0;
  // Every answer is written: end the session with `status`. The sink then detaches.
  virtual void finish(const grpc::Status& status) = 0;
};

// Thread-safety: transports call it from their threads; closeAll() may be called from any
// thread. Lifetime: must outlive the transports that serve it.
class StoreSessions final {
 public:
  explicit StoreSessions(std::shared_ptr<MemoryStore> memory);
  ~StoreSessions();

  const std::shared_ptr<MemoryStore>& memory() const { return memory_; }

  // Ends every open session with UNAVAILABLE (after its pending answers are written).
  void closeAll();
  size_t openSessions() const;

  // The direct path's port, said in every session's ServerInfo (0: none).
  void advertiseDirectPort(uint32_t port) { directPort_.store(port); }
  // This run of the service (random), said in every session's ServerInfo.
  const std::string& instance() const { return instance_; }

  class SessionState;
  // A new session, answering several to a message when `batchAnswers`, its requests applied
  // in order; it ends with UNAVAILABLE at once when the service is closing. The transport
  // attaches its sink, hands it each request message (apply), reports each write (writeDone),
  // closes it when the client goes (close), and detaches when the sink has finished.
  std::shared_ptr<SessionState> openSession(bool batchAnswers);
  // The transport is done with the session.
  void forget(const std::shared_ptr<SessionState>& state);

 private:
  std::shared_ptr<MemoryStore> memory_;
  std::atomic<uint32_t> directPort_{0};
  std::string instance_;
  mutable std::mutex mu_;
  std::set<std::shared_ptr<SessionState>> sessions_;
  bool closed_ = false;
};

// One client's session: applies its requests one after another, answers each as soon as it is
// done (in any order), writes one message at a time through its sink. Shared with the
// completions of parked operations, which may outlive the transport.
class StoreSessions::SessionState : public std::enable_shared_from_this<SessionState> {
 public:
  // From here the session writes through `sink`; a session closed before (the service
  // shutting down while the client was being admitted) finishes now.
  void attach(SessionSink* sink);
  // After the sink's finish() (or when the transport is torn down): no more calls to it.
  void detach();
  // One request message and the requests batched in it, in order. False once the session is
  // closing (the transport reads no more).
  bool apply(pb::StoreRequest& message);
  // The last startWrite() is done; `ok` false: the client is gone.
  void writeDone(bool ok);
  // Ends the session: OK when the client ended its requests, CANCELLED when it is gone (its
  // answers are dropped), anything else after the answers already due are written. Parked
  // operations are withdrawn. Idempotent; the first status stays.
  void close(grpc::Status status);

 private:
  friend class StoreSessions;
  bool applyOne(const pb::StoreRequest& request, bool batched);
  void deliver(uint64_t seq, pb::StoreResponse&& response, bool quiet);
  // With mu held: writes the next message or finishes the session when all is done.
  void pumpLocked();

  std::mutex mu;
  SessionSink* sink = nullptr;
  std::deque<pb::StoreResponse> queue;
  bool writing = false;
  bool batchAnswers = false;  // the client takes StoreResponse.batch
  bool closing = false;
  bool finished = false;
  grpc::Status closeStatus = grpc::Status::OK;
  uint64_t nextSeq = 1;
  // Operations of this session parked in the store: seq -> waiter (kNotPending while execute
  // has not returned yet).
  std::unordered_map<uint64_t, MemoryStore::WaiterId> parked;
  std::shared_ptr<MemoryStore> memory;
  const std::atomic<uint32_t>* directPort = nullptr;
  const std::string* instance = nullptr;
};

}  // namespace muster::rendezvous
