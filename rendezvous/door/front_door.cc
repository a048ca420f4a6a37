// FrontDoor: the generic reactor that checks a call before it reads it, and Answer.
#include "rendezvous/door/front_door.h"

#include <algorithm>

#include <fmt/format.h>

#include "absl/status/statusor.h"
#include "common/log.h"
#include "rendezvous/rpc/grpc_status.h"

namespace muster::rendezvous {

// One call on the async generic API, from its request to its end. Each event is a tag on the
// call's completion queue; pending_ counts the operations not yet back (the request, then the
// read, writes, finish and the done notification), and the last one back deletes the call.
class Answer::Reactor {
 public:
  // Requests the next call on `notify`; the call's own operations go to `callQueue`.
  Reactor(FrontDoor& door, grpc::ServerCompletionQueue* notify, grpc::ServerCompletionQueue* callQueue)
      : door_(door), notify_(notify), stream_(&context_) {
    ++door_.live_;
    context_.AsyncNotifyWhenDone(&doneTag_);
    door_.generic_.RequestCall(&context_, &stream_, callQueue, notify, &startedTag_);
  }

  ~Reactor() {
    if (--door_.live_ == 0) {
      std::lock_guard<std::mutex> lock(door_.queuesMu_);
      door_.liveCv_.notify_all();
    }
  }

  // Operations the answer starts, under its mutex, or a stream's reactor.
  void StartRead(grpc::ByteBuffer* into) {
    ++pending_;
    stream_.Read(into, &readTag_);
  }
  void StartWrite(const grpc::ByteBuffer* bytes) {
    ++pending_;
    stream_.Write(*bytes, &writtenTag_);
  }
  void StartWriteAndFinish(const grpc::ByteBuffer* bytes, grpc::WriteOptions options, const grpc::Status& status) {
    ++pending_;
    stream_.WriteAndFinish(*bytes, options, status, &finishedTag_);
  }
  void Finish(const grpc::Status& status) {
    ++pending_;
    stream_.Finish(status, &finishedTag_);
  }

  // A completion queue's event.
  static void proceed(void* tag, bool ok) {
    auto* t = static_cast<Tag*>(tag);
    (t->call->*(t->event))(ok);
  }

 private:
  friend class Answer;
  friend class StreamReactor;
  struct Tag {
    Reactor* call;
    void (Reactor::*event)(bool ok);
  };

  // The call's events come on its own queue's thread, but this one on the queue that was told
  // of it, where gRPC has already posted the done notification: that may come first (the client
  // left at once), and then waits for this (doneEarly_).
  void started(bool ok) {
    if (!ok) {  // the server is shutting down: no call, and no done notification
      delete this;
      return;
    }
    door_.request(notify_);
    grpc::Status refusal;
    bool read = false;
    const FrontDoor::Method* method = door_.admit(context_, refusal, read);
    bool doneEarly;
    {
      std::lock_guard<std::mutex> lock(startMu_);
      if (method != nullptr && method->stream) {
        streamReactor_ = method->stream(context_);
        streamReactor_->call_ = this;
        ++pending_;  // Finish's return, which OnDone comes after
      } else if (method != nullptr) {
        handler_ = &method->handler;
        ++door_.inFlight_;
        answer_.reset(new Answer(this, context_.peer()));
      }
      begun_ = true;
      doneEarly = doneEarly_;
    }
    if (method == nullptr) {
      Finish(refusal);
    } else if (streamReactor_ != nullptr) {
      streamReactor_->OnStart();
    } else if (read) {
      StartRead(&request_);
    } else {
      (*handler_)(request_, answer_);
    }
    // The done notification's share of pending_ is still held when it came early.
    if (doneEarly) ended();
    release();
  }
  void read(bool ok) {
    if (streamReactor_ != nullptr) {
      streamReactor_->OnReadDone(ok);
    } else if (!ok) {
      answer_->finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the call carried no request"));
    } else {
      (*handler_)(request_, answer_);
      request_.Clear();
    }
    release();
  }
  void written(bool ok) {
    if (streamReactor_ != nullptr) {
      streamReactor_->OnWriteDone(ok && !std::exchange(streamReactor_->writeFailed_, false));
    } else {
      answer_->written(ok);
    }
    release();
  }
  void finished(bool) {
    if (streamReactor_ != nullptr) release();  // the share held for Finish's return
    release();
  }
  void done(bool) {
    {
      std::lock_guard<std::mutex> lock(startMu_);
      if (!begun_) {
        doneEarly_ = true;  // started() will call ended()
        return;
      }
    }
    ended();
  }
  // The call is over on gRPC's side. A parked get or join whose client left must let go of its
  // key or its place in a round at once, not when the call's last operation is back.
  void ended() {
    if (context_.IsCancelled()) {
      if (streamReactor_ != nullptr) {
        streamReactor_->OnCancel();
      } else if (answer_) {
        answer_->cancelled();
      }
    }
    release();
  }
  void release() {
    if (answer_ ? !answer_->operationDone() : --pending_ > 0) return;
    if (streamReactor_ != nullptr) streamReactor_->OnDone();
    if (answer_) --door_.inFlight_;
    delete this;
  }

  FrontDoor& door_;
  grpc::ServerCompletionQueue* notify_;
  grpc::GenericServerContext context_;
  grpc::GenericServerAsyncReaderWriter stream_;
  grpc::ByteBuffer request_;
  const FrontDoor::Handler* handler_ = nullptr;
  std::shared_ptr<Answer> answer_;  // a one-request call's
  StreamReactor* streamReactor_ = nullptr;  // or a stream's
  std::mutex startMu_;
  bool begun_ = false;      // started() has set the call up (under startMu_)
  bool doneEarly_ = false;  // the done notification came before that (under startMu_)
  std::atomic<int> pending_{2};  // the request and the done notification
  Tag startedTag_{this, &Reactor::started};
  Tag readTag_{this, &Reactor::read};
  Tag writtenTag_{this, &Reactor::written};
  Tag finishedTag_{this, &Reactor::finished};
  Tag doneTag_{this, &Reactor::done};
};

namespace {

auto logger() {
  static auto logger = log::get("store");
  return logger;
}

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
  if (hook) hook(true);
}

bool Answer::operationDone() {
  std::function<void(bool)> hook;
  bool gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (--reactor_->pending_ > 0) return false;
    reactor_ = nullptr;
    over_ = true;
    ending_ = true;
    gone = clientGone_;
    hook = std::move(hook_);
    queue_.clear();
  }
  if (hook) hook(gone);
  return true;
}

void FrontDoor::add(std::string method, Handler handler, bool guarded) {
  methods_[std::move(method)] = Method{std::move(handler), nullptr, guarded};
}

void FrontDoor::addStream(std::string method, StreamFactory factory) {
  methods_[std::move(method)] = Method{nullptr, std::move(factory), true};
}

void StreamReactor::StartRead() { call_->StartRead(&read_); }

bool StreamReactor::readInto(google::protobuf::MessageLite& message) {
  return grpc::SerializationTraits<google::protobuf::MessageLite>::Deserialize(&read_, &message).ok();
}

void StreamReactor::StartWrite(const google::protobuf::MessageLite& message) {
  auto bytes = serialize(message);
  if (!bytes.ok()) {
    // Not to be: a message past 2 GiB. The call is cancelled (OnCancel comes), and this write,
    // of nothing, is reported failed (OnWriteDone(false)).
    logger()->error("{}", std::string(bytes.status().message()));
    call_->context_.TryCancel();
    writeFailed_ = true;
    grpc::ByteBuffer nothing;
    call_->StartWrite(&nothing);
    return;
  }
  call_->StartWrite(&*bytes);
}

void StreamReactor::Finish(const grpc::Status& status) { call_->Finish(status); }

void FrontDoor::close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
}

const FrontDoor::Method* FrontDoor::admit(grpc::GenericServerContext& context, grpc::Status& refusal,
                                          bool& read) {
  auto it = methods_.find(context.method());
  if (it == methods_.end()) {
    refusal = grpc::Status(grpc::StatusCode::UNIMPLEMENTED, fmt::format("no method {}", context.method()));
    return nullptr;
  }
  if (it->second.guarded && !gate_.admits(&context)) {
    refusal = unauthenticated();
    return nullptr;
  }
  read = it->second.guarded || gate_.carries(&context);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) {
      refusal = grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down");
      return nullptr;
    }
  }
  if (read && onMember_) onMember_(context.peer());
  return &it->second;
}

void FrontDoor::attach(grpc::ServerBuilder& builder, int queues) {
  builder.RegisterAsyncGenericService(&generic_);
  if (queues <= 0) queues = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 8u, 64u));
  for (int i = 0; i < queues; ++i) queues_.push_back(builder.AddCompletionQueue());
}

void FrontDoor::request(grpc::ServerCompletionQueue* notify) {
  // The call's operations go round the queues, whichever queue was told of it: a connection's
  // calls are told on its own queue, and one busy connection would fill that queue alone.
  auto* callQueue = queues_[next_.fetch_add(1, std::memory_order_relaxed) % queues_.size()].get();
  std::lock_guard<std::mutex> lock(queuesMu_);
  if (!queuesOpen_) return;
  new Answer::Reactor(*this, notify, callQueue);
}

void FrontDoor::start() {
  {
    std::lock_guard<std::mutex> lock(queuesMu_);
    queuesOpen_ = true;
  }
  for (auto& queue : queues_) {
    // Several requests ahead on each queue, for bursts of calls.
    for (int i = 0; i < kRequestsAhead; ++i) request(queue.get());
    threads_.emplace_back([cq = queue.get()] {
      void* tag;
      bool ok;
      while (cq->Next(&tag, &ok)) Answer::Reactor::proceed(tag, ok);
    });
  }
}

void FrontDoor::stop() {
  {
    std::unique_lock<std::mutex> lock(queuesMu_);
    if (stopped_) return;
    stopped_ = true;
    queuesOpen_ = false;
    // Every call's last operation back before the queues close: an answer may still start one
    // (a finish for a client that left), and gRPC aborts on an operation for a closed queue.
    // The server has shut down, so the requests still waiting fail and every call has ended.
    while (!liveCv_.wait_for(lock, std::chrono::seconds(5), [&] { return live_.load() == 0; })) {
      logger()->warn("{} call(s) of the front door still being wound up", live_.load());
    }
  }
  for (auto& queue : queues_) queue->Shutdown();
  for (auto& thread : threads_) thread.join();
  if (threads_.empty()) {  // never started: nothing was asked of the queues; drain them here
    for (auto& queue : queues_) {
      void* tag;
      bool ok;
      while (queue->Next(&tag, &ok)) Answer::Reactor::proceed(tag, ok);
    }
  }
}

FrontDoor::~FrontDoor() { stop(); }

}  // namespace muster::rendezvous
