// StoreService: the store's sessions over the MemoryStore, whatever carries them, the gRPC
// Session stream's reactor, and the unary Call, both behind the FrontDoor.
#include "rendezvous/store_service.h"

#include <fmt/format.h>

#include <random>

#include "rendezvous/grpc_status.h"
#include "rendezvous/store.h"

namespace muster::rendezvous {
namespace {

// Answers a session may hold unwritten (its client reads too slowly or not at all).
constexpr size_t kMaxUnreadAnswers = 65536;
// What one message of answers may carry, for a client that takes them batched.
constexpr size_t kMaxBatchAnswers = 4096;
constexpr size_t kMaxBatchAnswerBytes = size_t{4} << 20;

// A gRPC Session: reads one message at a time, hands it to the session, and writes what the
// session gives it.
class SessionReactor final : public StreamReactor, public SessionSink {
 public:
  SessionReactor(std::shared_ptr<StoreService::SessionState> state, StoreService* service)
      : state_(std::move(state)), service_(service) {}

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
    service_->forget(state_);
    delete this;
  }

  void startWrite(const pb::StoreResponse& response) override { StartWrite(response); }
  void finish(const grpc::Status& status) override { Finish(status); }

 private:
  std::shared_ptr<StoreService::SessionState> state_;
  StoreService* service_;
  pb::StoreRequest request_;
};

}  // namespace

void StoreService::SessionState::attach(SessionSink* s) {
  std::lock_guard<std::mutex> lock(mu);
  sink = s;
  pumpLocked();
}

void StoreService::SessionState::detach() {
  std::lock_guard<std::mutex> lock(mu);
  sink = nullptr;
  finished = true;
}

bool StoreService::SessionState::apply(pb::StoreRequest& message) {
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
bool StoreService::SessionState::applyOne(const pb::StoreRequest& request, bool batched) {
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

void StoreService::SessionState::writeDone(bool ok) {
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

void StoreService::SessionState::deliver(uint64_t seq, pb::StoreResponse&& response,
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

void StoreService::SessionState::close(grpc::Status status) {
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

void StoreService::SessionState::pumpLocked() {
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

StoreService::StoreService(std::shared_ptr<MemoryStore> memory) : memory_(std::move(memory)) {
  std::random_device random;
  for (int i = 0; i < 4; ++i) {
    uint32_t word = random();
    instance_.append(reinterpret_cast<const char*>(&word), sizeof word);
  }
}

StoreService::~StoreService() = default;

void StoreService::serve(FrontDoor& door) {
  door.addStream("/muster.v1.Store/Session",
                 [this](const grpc::GenericServerContext& context) { return session(context); });
  door.add<pb::StoreRequest>("/muster.v1.Store/Call", [memory = memory_](const pb::StoreRequest& request,
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

std::shared_ptr<StoreService::SessionState> StoreService::openSession(bool batchAnswers) {
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

StreamReactor* StoreService::session(const grpc::GenericServerContext& context) {
  auto asked = context.client_metadata().find(kBatchMetadataKey);
  bool batch = asked != context.client_metadata().end() && asked->second == grpc::string_ref("1");
  return new SessionReactor(openSession(batch), this);
}

void StoreService::forget(const std::shared_ptr<SessionState>& state) {
  std::lock_guard<std::mutex> lock(mu_);
  sessions_.erase(state);
}

void StoreService::closeAll() {
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

size_t StoreService::openSessions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sessions_.size();
}

}  // namespace muster::rendezvous
