// FrontDoor: the generic reactor that checks a call before it reads it, and Answer.
#include "rendezvous/front_door.h"

#include <fmt/format.h>

#include "absl/status/statusor.h"
#include "rendezvous/grpc_status.h"

namespace muster::rendezvous {

class Answer::Reactor final : public grpc::ServerGenericBidiReactor {
 public:
  // `read`: read the request; else the handler runs at once with an empty one.
  Reactor(const FrontDoor::Handler* handler, std::string peer, std::shared_ptr<std::atomic<int64_t>> inFlight,
          bool read)
      : handler_(handler), answer_(new Answer(this, std::move(peer))), inFlight_(std::move(inFlight)) {
    ++*inFlight_;
    if (read) {
      StartRead(&request_);
    } else {
      (*handler_)(request_, answer_);
    }
  }
  // A call refused before anything is read.
  explicit Reactor(const grpc::Status& refusal) { Finish(refusal); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      answer_->finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the call carried no request"));
      return;
    }
    (*handler_)(request_, answer_);
    request_.Clear();
  }
  void OnWriteDone(bool ok) override { answer_->written(ok); }
  void OnCancel() override {
    if (answer_) answer_->cancelled();
  }
  void OnDone() override {
    if (answer_) answer_->over();
    if (inFlight_) --*inFlight_;
    delete this;
  }

 private:
  const FrontDoor::Handler* handler_ = nullptr;
  std::shared_ptr<Answer> answer_;
  std::shared_ptr<std::atomic<int64_t>> inFlight_;
  grpc::ByteBuffer request_;
};

namespace {

absl::StatusOr<grpc::ByteBuffer> serialize(const google::protobuf::MessageLite& message) {
  grpc::ByteBuffer bytes;
  bool own = false;
  grpc::Status s = grpc::SerializationTraits<google::protobuf::MessageLite>::Serialize(message, &bytes, &own);
  if (!s.ok()) return absl::InternalError("cannot serialize the answer: " + s.error_message());
  return bytes;
}

const grpc::Status kClientGone(grpc::StatusCode::CANCELLED, "the client went away");

}  // namespace

void Answer::write(const google::protobuf::MessageLite& message) {
  auto bytes = serialize(message);
  if (!bytes.ok()) {
    finish(toGrpc(bytes.status()));
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (ending_) return;
  queue_.push_back(std::move(*bytes));
  pumpLocked();
}

bool Answer::finish(const grpc::Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ending_) return false;
  ending_ = true;
  status_ = status;
  pumpLocked();
  return true;
}

bool Answer::reply(const google::protobuf::MessageLite& message) {
  auto bytes = serialize(message);
  if (!bytes.ok()) return finish(toGrpc(bytes.status()));
  // The message and the status in one batch (StartWriteAndFinish) when nothing is being written.
  std::lock_guard<std::mutex> lock(mu_);
  if (ending_) return false;
  queue_.push_back(std::move(*bytes));
  ending_ = true;
  status_ = grpc::Status::OK;
  pumpLocked();
  return true;
}

void Answer::onEnd(std::function<void(bool)> hook) {
  bool now;
  bool gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    gone = clientGone_;
    now = over_ || gone;
    if (!now) hook_ = std::move(hook);
  }
  if (now) hook(gone);
}

void Answer::pumpLocked() {
  if (reactor_ == nullptr || finished_) return;
  if (writing_) return;
  if (!queue_.empty()) {
    writing_ = true;
    if (ending_ && queue_.size() == 1) {
      finished_ = true;
      reactor_->StartWriteAndFinish(&queue_.front(), grpc::WriteOptions(), status_);
    } else {
      reactor_->StartWrite(&queue_.front());
    }
    return;
  }
  if (ending_) {
    finished_ = true;
    reactor_->Finish(status_);
  }
}

std::function<void(bool)> Answer::clientLeftLocked() {
  clientGone_ = true;
  // Keep the message being written: gRPC still holds it.
  queue_.erase(writing_ ? queue_.begin() + 1 : queue_.begin(), queue_.end());
  if (!ending_) {
    ending_ = true;
    status_ = kClientGone;
  }
  pumpLocked();
  return std::move(hook_);
}

void Answer::written(bool ok) {
  std::function<void(bool)> hook;
  {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!queue_.empty()) queue_.pop_front();
    if (ok) {
      pumpLocked();
    } else if (!clientGone_) {
      // The client is gone: nothing more can be written.
      hook = clientLeftLocked();
    }
  }
  if (hook) hook(true);
}

void Answer::cancelled() {
  std::function<void(bool)> hook;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_ || clientGone_) return;
    hook = clientLeftLocked();
  }
  // At once, not when the call is over: a parked get or join whose client left must not take a
  // key or a place in a round meanwhile.
  if (hook) hook(true);
}

void Answer::over() {
  std::function<void(bool)> hook;
  bool gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    reactor_ = nullptr;
    over_ = true;
    ending_ = true;
    gone = clientGone_;
    hook = std::move(hook_);
    queue_.clear();
  }
  if (hook) hook(gone);
}

void FrontDoor::add(std::string method, Handler handler, bool guarded) {
  methods_[std::move(method)] = Method{std::move(handler), guarded};
}

void FrontDoor::close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
}

grpc::ServerGenericBidiReactor* FrontDoor::CreateReactor(grpc::GenericCallbackServerContext* context) {
  auto it = methods_.find(context->method());
  if (it == methods_.end()) {
    return new Answer::Reactor(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                            fmt::format("no method {}", context->method())));
  }
  if (it->second.guarded && !gate_.admits(context)) return new Answer::Reactor(unauthenticated());
  bool read = it->second.guarded || gate_.carries(context);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) {
      return new Answer::Reactor(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down"));
    }
  }
  return new Answer::Reactor(&it->second.handler, context->peer(), inFlight_, read);
}

}  // namespace muster::rendezvous
