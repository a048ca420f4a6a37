// RendezvousClient: gRPC's callback API throughout. Join and Report are unary calls; the Watch
// is a read reactor; heartbeats are unary calls spaced by an alarm. Every call in flight is
// counted, so that the destructor can wait for the last callback.
#include "rendezvous/client/rendezvous_client.h"

#include <fmt/format.h>
#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <future>

#include "common/log.h"
#include "rendezvous/rpc/grpc_channel.h"
#include "rendezvous/rpc/grpc_status.h"
#include "rendezvous/rpc/auth.h"

namespace muster::rendezvous {
namespace {

// A unary call's parts, alive until its callback has run.
template <typename Request, typename Response>
struct Unary {
  std::shared_ptr<grpc::ClientContext> context;
  Request request;
  Response response;
};

}  // namespace

// One watch: its stream, its heartbeats, and the rule that at most one callback is delivered,
// never after stop().
struct RendezvousClient::Watch : std::enable_shared_from_this<Watch> {
  RendezvousClient* client = nullptr;
  pb::WatchRequest request;
  Millis interval{0}, keepAlive{0};
  std::function<void(const pb::RoundEvent&)> onEvent;
  std::function<void(const std::string&)> onError;
  std::function<void(uint64_t)> onStacks;  // a stack roll-call asked for, by its id
  uint64_t lastStacks = 0;

  std::mutex mu;
  bool over = false;  // stopped, or a callback was delivered
  Clock::time_point lastOk = Clock::now();
  std::shared_ptr<grpc::ClientContext> stream, beat;  // the calls in flight, to cancel
  std::shared_ptr<grpc::ClientContext> extraBeat;     // a heartbeat out of turn in flight
  std::unique_ptr<grpc::Alarm> alarm;                 // the next heartbeat

  // Runs `f` (a callback) once, unless stopped; under the lock, so that stop() returns only
  // when no callback can still start.
  void deliver(const std::function<void()>& f) {
    std::lock_guard<std::mutex> lock(mu);
    if (over) return;
    over = true;
    f();
  }

  // One callback fewer to wait for (the stream's).
  void ended() { client->ended(); }

  void stop() {
    std::shared_ptr<grpc::ClientContext> s, b, x;
    grpc::Alarm* a = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu);
      over = true;  // from here on nothing replaces the alarm or starts a call
      s = stream;
      b = beat;
      x = extraBeat;
      a = alarm.get();
    }
    // Outside the lock: a cancelled call's callback may run inline, and it takes the lock.
    if (s) s->TryCancel();
    if (b) b->TryCancel();
    if (x) x->TryCancel();
    if (a) a->Cancel();
  }

  // Sets the alarm for the next heartbeat.
  void arm() {
    std::lock_guard<std::mutex> lock(mu);
    if (over) return;
    alarm = std::make_unique<grpc::Alarm>();
    client->started();
    RendezvousClient* c = client;
    std::weak_ptr<Watch> weak = weak_from_this();  // the alarm must not keep its owner alive
    alarm->Set(std::chrono::system_clock::now() + interval, [c, weak](bool fired) {
      if (auto self = weak.lock(); self && fired) self->heartbeat();
      c->ended();
    });
  }

  // One heartbeat now; `rearm`: the regular one, which sets the alarm for the next. One out of
  // turn at a time: while one is in flight another is not sent (the next carries the status).
  void heartbeat(bool rearm = true) {
    auto call = std::make_shared<Unary<pb::HeartbeatRequest, pb::HeartbeatResponse>>();
    call->context = client->context(deadlineAfter(interval));
    call->request.set_run_id(request.run_id());
    call->request.set_node_id(request.node_id());
    if (auto status = client->latestStatus()) *call->request.mutable_status() = *status;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (over || (!rearm && extraBeat)) return;
      (rearm ? beat : extraBeat) = call->context;
      client->started();
    }
    client->stub_->async()->Heartbeat(
        call->context.get(), &call->request, &call->response, [self = shared_from_this(), call, rearm](grpc::Status s) {
          bool lost = false;
          {
            std::lock_guard<std::mutex> lock(self->mu);
            if (!rearm) self->extraBeat.reset();
            if (s.ok()) {
              self->lastOk = Clock::now();
              uint64_t asked = call->response.stacks_request();
              if (asked != 0 && asked != self->lastStacks && !self->over && self->onStacks) {
                self->lastStacks = asked;
                self->onStacks(asked);
              }
            } else {
              lost = Clock::now() - self->lastOk >= self->keepAlive;
            }
          }
          if (lost) {
            self->deliver([&] {
              self->onError(fmt::format("the rendezvous at {} has not answered a heartbeat for {:.1f} s",
                                        self->client->target_, self->keepAlive.count() / 1000.0));
            });
          } else if (rearm) {
            self->arm();
          }
          self->client->ended();
        });
  }
};

namespace {

// The watch's stream: the first event ends it.
class WatchStream : public grpc::ClientReadReactor<pb::RoundEvent> {
 public:
  WatchStream(std::shared_ptr<RendezvousClient::Watch> watch, std::shared_ptr<grpc::ClientContext> context)
      : watch_(std::move(watch)), context_(std::move(context)) {}

  void start(pb::Rendezvous::Stub* stub) {
    stub->async()->Watch(context_.get(), &watch_->request, this);
    StartRead(&event_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    got_ = true;
    watch_->deliver([&] { watch_->onEvent(event_); });
    context_->TryCancel();  // one event is all a watch says
  }

  void OnDone(const grpc::Status& status) override {
    if (!got_) {
      if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
        // The round ended before the service took the watch, and the service no longer says
        // how (it answers a round it remembers with its end): UNKNOWN, which the agent weighs
        // against its own report's answer before it calls the node lost.
        pb::RoundEvent ended;
        ended.set_kind(pb::RoundEvent::UNKNOWN);
        ended.set_round(watch_->request.round());
        ended.set_message(fmt::format("round {} ended before this node's watch began, and the rendezvous "
                                      "no longer says how ({})", watch_->request.round(),
                                      status.error_message()));
        watch_->deliver([&] { watch_->onEvent(ended); });
      } else {
        watch_->deliver([&] {
          watch_->onError(fmt::format("the rendezvous at {} went away ({})", watch_->client->target(),
                                      status.error_message()));
        });
      }
    }
    auto watch = std::move(watch_);
    delete this;
    watch->ended();
  }

 private:
  std::shared_ptr<RendezvousClient::Watch> watch_;
  std::shared_ptr<grpc::ClientContext> context_;
  pb::RoundEvent event_;
  bool got_ = false;
};

}  // namespace

RendezvousClient::RendezvousClient(const std::string& target, const std::string& token,
                                   const std::string& tlsCaPem, const std::string& tlsServerName)
    : target_(target), token_(token) {
  channel_ = makeChannel({.target = target,
                          .tlsCaPem = tlsCaPem,
                          .tlsServerName = tlsServerName,
                          .minBackoff = Millis(50),
                          .maxBackoff = Millis(1000)});
  stub_ = pb::Rendezvous::NewStub(channel_);
}

RendezvousClient::~RendezvousClient() {
  stopWatch();
  cancel();
  // Every callback has returned and every context is gone (gRPC destroys a callback's captures
  // on its own thread, after the callback): a context holds the channel, and the last channel
  // released on a gRPC thread shuts gRPC's callback queue down under that thread (an abort in
  // grpc_cq_internal_unref, seen at launch's exit).
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [&] { return inflight_ == 0 && contexts_ == 0; });
}

std::shared_ptr<grpc::ClientContext> RendezvousClient::context(Deadline deadline) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++contexts_;
  }
  std::shared_ptr<grpc::ClientContext> context(new grpc::ClientContext(), [this](grpc::ClientContext* c) {
    delete c;
    std::lock_guard<std::mutex> lock(mu_);
    if (--contexts_ == 0) idle_.notify_all();
  });
  if (!token_.empty()) context->AddMetadata(kTokenMetadataKey, token_);
  context->set_deadline(toSystem(deadline));
  return context;
}

void RendezvousClient::begin(const std::shared_ptr<grpc::ClientContext>& context) {
  std::lock_guard<std::mutex> lock(mu_);
  calls_.insert(context);
  ++inflight_;
}

void RendezvousClient::end(const std::shared_ptr<grpc::ClientContext>& context) {
  std::lock_guard<std::mutex> lock(mu_);
  calls_.erase(context);
  if (--inflight_ == 0) idle_.notify_all();
}

void RendezvousClient::started() {
  std::lock_guard<std::mutex> lock(mu_);
  ++inflight_;
}

void RendezvousClient::ended() {
  std::lock_guard<std::mutex> lock(mu_);
  if (--inflight_ == 0) idle_.notify_all();
}

void RendezvousClient::cancel() {
  std::set<std::shared_ptr<grpc::ClientContext>> calls;
  {
    std::lock_guard<std::mutex> lock(mu_);
    calls = calls_;
  }
  for (const auto& c : calls) c->TryCancel();  // outside the lock: callbacks may run inline
}

void RendezvousClient::join(const pb::JoinRequest& request, Deadline deadline,
                            std::function<void(absl::StatusOr<pb::Assignment>)> done) {
  auto call = std::make_shared<Unary<pb::JoinRequest, pb::Assignment>>();
  call->context = context(deadline);
  call->context->set_wait_for_ready(true);  // node 0 may not be up yet: wait for it, within the deadline
  call->request = request;
  begin(call->context);
  stub_->async()->Join(call->context.get(), &call->request, &call->response,
                       [this, call, deadline, done = std::move(done)](grpc::Status status) {
                         if (status.ok()) {
                           done(std::move(call->response));
                         } else if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
                                    Clock::now() >= deadline) {
                           // Our own deadline, not the service's answer (which comes with the
                           // join timeout, before it, and counts the nodes).
                           done(absl::DeadlineExceededError(
                               fmt::format("no rendezvous answered at {} before the join timeout", target_)));
                         } else {
                           done(toAbsl(status));
                         }
                         end(call->context);
                       });
}

template <typename Request, typename Response>
void RendezvousClient::unary(void (pb::Rendezvous::Stub::async::*method)(grpc::ClientContext*, const Request*,
                                                                        Response*, std::function<void(grpc::Status)>),
                             const Request& request, Deadline deadline,
                             std::function<void(grpc::Status, Response&)> done) {
  auto call = std::make_shared<Unary<Request, Response>>();
  call->context = context(deadline);
  call->request = request;
  begin(call->context);
  (stub_->async()->*method)(call->context.get(), &call->request, &call->response,
                            [this, call, done = std::move(done)](grpc::Status status) {
                              done(std::move(status), call->response);
                              end(call->context);
                            });
}

void RendezvousClient::report(const pb::ReportRequest& request, Deadline deadline,
                              std::function<void(absl::StatusOr<pb::ReportResponse>)> done) {
  unary<pb::ReportRequest, pb::ReportResponse>(
      &pb::Rendezvous::Stub::async::Report, request, deadline,
      [done = std::move(done)](grpc::Status status, pb::ReportResponse& response) {
        if (status.ok()) {
          done(std::move(response));
        } else {
          done(toAbsl(status));
        }
      });
}

void RendezvousClient::putStacks(const pb::PutStacksRequest& request, Deadline deadline,
                                 std::function<void(absl::Status)> done) {
  unary<pb::PutStacksRequest, pb::PutStacksResponse>(
      &pb::Rendezvous::Stub::async::PutStacks, request, deadline,
      [done = std::move(done)](grpc::Status status, pb::PutStacksResponse&) { done(toAbsl(status)); });
}

template <typename Request, typename Response>
absl::StatusOr<Response> RendezvousClient::blocking(
    void (pb::Rendezvous::Stub::async::*method)(grpc::ClientContext*, const Request*, Response*,
                                                std::function<void(grpc::Status)>),
    const Request& request, Deadline deadline) {
  std::promise<absl::StatusOr<Response>> result;
  unary<Request, Response>(method, request, deadline, [&result](grpc::Status status, Response& reply) {
    if (status.ok()) {
      result.set_value(std::move(reply));
    } else {
      result.set_value(toAbsl(status));
    }
  });
  return result.get_future().get();
}

bool ranksChanged(const pb::NodeStatus* before, const pb::NodeStatus& after) {
  if (before == nullptr || before->ranks_size() != after.ranks_size()) return true;
  if (before->has_stop() != after.has_stop()) return true;
  if (after.has_stop()) {
    const auto& a = before->stop();
    const auto& b = after.stop();
    if (a.agreed() != b.agreed() || a.step() != b.step() || a.failed() != b.failed()) return true;
  }
  for (int i = 0; i < after.ranks_size(); ++i) {
    const auto& a = before->ranks(i);
    const auto& b = after.ranks(i);
    if (a.pid() != b.pid() || a.state() != b.state() || a.exit_code() != b.exit_code()) return true;
  }
  return false;
}

void RendezvousClient::setStatus(const pb::NodeStatus& status) {
  auto copy = std::make_shared<const pb::NodeStatus>(status);
  std::shared_ptr<Watch> now;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ranksChanged(status_.get(), status)) now = watch_;
    status_ = std::move(copy);
  }
  // What changed is told at once (one heartbeat out of turn), not up to an interval later.
  if (now) now->heartbeat(/*rearm=*/false);
}

std::shared_ptr<const pb::NodeStatus> RendezvousClient::latestStatus() {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

absl::StatusOr<pb::StacksReply> RendezvousClient::stacks(const pb::StacksRequest& request, Deadline deadline) {
  return blocking(&pb::Rendezvous::Stub::async::Stacks, request, deadline);
}

absl::StatusOr<pb::RunsReply> RendezvousClient::runs(Deadline deadline) {
  return blocking(&pb::Rendezvous::Stub::async::Runs, pb::RunsRequest(), deadline);
}

absl::StatusOr<pb::StatusReply> RendezvousClient::status(const std::string& runId, Deadline deadline) {
  pb::StatusRequest request;
  request.set_run_id(runId);
  return blocking(&pb::Rendezvous::Stub::async::Status, request, deadline);
}

absl::StatusOr<pb::Assignment> RendezvousClient::join(const pb::JoinRequest& request, Deadline deadline) {
  std::promise<absl::StatusOr<pb::Assignment>> result;
  join(request, deadline, [&](absl::StatusOr<pb::Assignment> r) { result.set_value(std::move(r)); });
  return result.get_future().get();
}

absl::StatusOr<pb::ReportResponse> RendezvousClient::report(const pb::ReportRequest& request, Deadline deadline) {
  return blocking<pb::ReportRequest, pb::ReportResponse>(&pb::Rendezvous::Stub::async::Report, request, deadline);
}

void RendezvousClient::watch(const std::string& runId, const std::string& nodeId, uint64_t round,
                             Millis interval, Millis keepAlive,
                             std::function<void(const pb::RoundEvent&)> onEvent,
                             std::function<void(const std::string&)> onError,
                             std::function<void(uint64_t)> onStacks) {
  stopWatch();
  auto w = std::make_shared<Watch>();
  w->client = this;
  w->request.set_run_id(runId);
  w->request.set_node_id(nodeId);
  w->request.set_round(round);
  w->interval = interval;
  w->keepAlive = keepAlive;
  w->onEvent = std::move(onEvent);
  w->onError = std::move(onError);
  w->onStacks = std::move(onStacks);
  w->stream = context(kNoDeadline);
  {
    std::lock_guard<std::mutex> lock(mu_);
    watch_ = w;
    ++inflight_;  // the stream's OnDone
  }
  (new WatchStream(w, w->stream))->start(stub_.get());
  w->arm();
}

void RendezvousClient::stopWatch() {
  std::shared_ptr<Watch> w;
  {
    std::lock_guard<std::mutex> lock(mu_);
    w = std::move(watch_);
  }
  if (w) w->stop();
}

}  // namespace muster::rendezvous
