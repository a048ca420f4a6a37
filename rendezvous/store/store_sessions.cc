// StoreSessions: the store's sessions over the MemoryStore, whatever transport carries them.
#include "rendezvous/store/store_sessions.h"

#include <fmt/format.h>

#include <random>

#include "rendezvous/store/store.h"

namespace muster::rendezvous {
namespace {

// Answers a session may hold unwritten (its client reads too slowly or not at all).
constexpr size_t kMaxUnreadAnswers = 65536;
// What one message of answers may carry, for a client that takes them batched.
constexpr size_t kMaxBatchAnswers = 4096;
constexpr size_t kMaxBatchAnswerBytes = size_t{4} << 20;

}  // namespace

void StoreSessions::SessionState::attach(SessionSink* s) {
  std::lock_guard<std::mutex> lock(mu);
  sink = s;
  pumpLocked();
}

void StoreSessions::SessionState::detach() {
  std::lock_guard<std::mutex> lock(mu);
  sink = nullptr;
  finished = true;
}

bool StoreSessions::SessionState::apply(pb::StoreRequest& message) {
  // The request, then those batched with it, in order. The batch is taken off first: the
  // store sizes up the request it executes (a multi_set's limit).
  auto batch = std::move(*message.mutable_batch());
  message.clear_batch();
  if (!applyOne(message, false)) return false;
  for (const auto& more : batch) {
    if (!applyOne(more, true)) return false;
  }
  return true;
}

// Hands one request to the store; false once the session is closing (nothing more is read:
// the rest of a batch is not applied either). `batched`: an entry of a batch, which may not
// carry one of its own.
bool StoreSessions::SessionState::applyOne(const pb::StoreRequest& request, bool batched) {
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (closing) return false;
    seq = nextSeq++;
    parked.emplace(seq, MemoryStore::kNotPending);
  }
  if (batched && request.batch_size() > 0) {
    pb::StoreResponse refused;
    refused.set_id(request.id());
    refused.set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
    refused.set_message("a batched request carries a batch of its own");
    deliver(seq, std::move(refused), false);
    return true;
  }
  std::weak_ptr<SessionState> weak = shared_from_this();
  bool quiet = request.quiet();
  const std::atomic<uint32_t>* port = directPort;
  const std::string* run = instance;
  auto id = memory->execute(request, [weak, seq, quiet, port, run](pb::StoreResponse&& r) {
    // Batching and the direct path are this service's, not the store's: the session says so
    // (only an info request is answered with info).
    if (r.has_info()) {
      r.mutable_info()->set_batching(true);
      r.mutable_info()->set_direct_port(port->load());
      r.mutable_info()->set_instance(*run);
    }
    if (auto s = weak.lock()) s->deliver(seq, std::move(r), quiet);
  });
  bool cancelNow = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = parked.find(seq);
    if (it != parked.end()) {
      it->second = id;
      cancelNow = closing;
    }
  }
  if (cancelNow && memory->cancel(id)) {
    std::lock_guard<std::mutex> lock(mu);
    parked.erase(seq);
    pumpLocked();
  }
  return true;
}

void StoreSessions::SessionState::writeDone(bool ok) {
  {
    std::lock_guard<std::mutex> lock(mu);
    writing = false;
    if (!queue.empty()) queue.pop_front();
    if (ok) {
      pumpLocked();
      return;
    }
  }
  // The client is gone: nothing more can be written, and its parked operations go.
  close(grpc::Status::CANCELLED);
}

void StoreSessions::SessionState::deliver(uint64_t seq, pb::StoreResponse&& response,
                                         bool quiet) {
  std::unique_lock<std::mutex> lock(mu);
  parked.erase(seq);
  if (quiet && response.code() == 0) {
    pumpLocked();
    return;
  }
  bool unread = queue.size() >= kMaxUnreadAnswers && !closing;
  if (unread) {
    // A client that does not read its answers must not grow the server's memory.
    closing = true;
    closeStatus = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                               fmt::format("the client left {} answers unread; session closed",
                                           kMaxUnreadAnswers));
    queue.erase(writing ? queue.begin() + 1 : queue.begin(), queue.end());
  }
  // A session that closes because reads ended or the server shuts down still answers what
  // was asked; one whose client is gone drops the answer.
  if (!finished && closeStatus.error_code() != grpc::StatusCode::CANCELLED) {
    queue.push_back(std::move(response));
  }
  if (!unread) {
    pumpLocked();
    return;
  }
  // Its parked operations go too (close keeps the status, and pumps).
  grpc::Status status = closeStatus;
  lock.unlock();
  close(status);
}

void StoreSessions::SessionState::close(grpc::Status status) {
  std::vector<MemoryStore::WaiterId> ids;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!closing) closeStatus = status;
    closing = true;
    if (status.error_code() == grpc::StatusCode::CANCELLED) {
      // Keep the response being written: the transport still reads it.
      queue.erase(writing ? queue.begin() + 1 : queue.begin(), queue.end());
    }
    for (const auto& [seq, id] : parked) {
      if (id != MemoryStore::kNotPending) ids.push_back(id);
    }
  }
  for (auto id : ids) {
    if (memory->cancel(id)) {
      std::lock_guard<std::mutex> lock(mu);
      for (auto it = parked.begin(); it != parked.end(); ++it) {
        if (it->second == id) {
          parked.erase(it);
          break;
        }
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu);
  pumpLocked();
}

void StoreSessions::SessionState::pumpLocked() {
  if (finished || sink == nullptr) return;
  if (!writing && !queue.empty()) {
    writing = true;
    if (batchAnswers && queue.size() > 1) {
      // Answers ready together go in one message.
      pb::StoreResponse first = std::move(queue.front());
      queue.pop_front();
      size_t bytes = first.ByteSizeLong();
      while (!queue.empty() && static_cast<size_t>(first.batch_size()) + 1 < kMaxBatchAnswers) {
        size_t more = queue.front().ByteSizeLong();
        if (bytes + more > kMaxBatchAnswerBytes) break;
        bytes += more;
        *first.add_batch() = std::move(queue.front());
        queue.pop_front();
      }
      queue.push_front(std::move(first));
    }
    sink->startWrite(queue.front());
    return;
  }
  if (closing && !writing && queue.empty() && parked.empty()) {
    finished = true;
    sink->finish(closeStatus);
  }
}

StoreSessions::StoreSessions(std::shared_ptr<MemoryStore> memory) : memory_(std::move(memory)) {
  std::random_device random;
  for (int i = 0; i < 4; ++i) {
    uint32_t word = random();
    instance_.append(reinterpret_cast<const char*>(&word), sizeof word);
  }
}

StoreSessions::~StoreSessions() = default;

std::shared_ptr<StoreSessions::SessionState> StoreSessions::openSession(bool batchAnswers) {
  auto state = std::make_shared<SessionState>();
  state->memory = memory_;
  state->batchAnswers = batchAnswers;
  state->directPort = &directPort_;
  state->instance = &instance_;
  bool closed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed = closed_;
    sessions_.insert(state);
  }
  if (closed) state->close(grpc::Status(grpc::StatusCode::UNAVAILABLE, "store is shutting down"));
  return state;
}

void StoreSessions::forget(const std::shared_ptr<SessionState>& state) {
  std::lock_guard<std::mutex> lock(mu_);
  sessions_.erase(state);
}

void StoreSessions::closeAll() {
  std::set<std::shared_ptr<SessionState>> sessions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    sessions = sessions_;
  }
  for (const auto& s : sessions) {
    s->close(grpc::Status(grpc::StatusCode::UNAVAILABLE, "store is shutting down"));
  }
}

size_t StoreSessions::openSessions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sessions_.size();
}

}  // namespace muster::rendezvous
