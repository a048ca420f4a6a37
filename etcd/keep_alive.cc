// etcd::KeepAlive: one short stream per keep-alive (a request and its answer, within the
// attempt's deadline), so that a member that stops answering is noticed by the deadline.
#include "etcd/keep_alive.h"

#include <fmt/format.h>

namespace muster::etcd {

KeepAlive::KeepAlive(Client& client, int64_t lease, Millis interval, Millis ttl,
                     std::function<void(const std::string&)> onLost)
    : client_(client), lease_(lease), interval_(interval), ttl_(ttl), onLost_(std::move(onLost)) {
  thread_ = std::thread([this] { run(); });
}

KeepAlive::~KeepAlive() {
  {
    std::lock_guard lock(mu_);
    stopped_ = true;
    if (context_) context_->TryCancel();
  }
  cv_.notify_all();
  thread_.join();
}

void KeepAlive::run() {
  auto lastAnswer = Clock::now();
  std::string lastError;
  while (true) {
    auto call = client_.call(deadlineAfter(std::min(interval_, Millis(2000)) + Millis(500)), /*stream=*/true);
    {
      std::lock_guard lock(mu_);
      if (stopped_) return;
      context_ = call.context.get();
    }
    auto stream = client_.lease(call.member).LeaseKeepAlive(call.context.get());
    pb::LeaseKeepAliveRequest request;
    request.set_id(lease_);
    pb::LeaseKeepAliveResponse response;
    bool answered = stream->Write(request) && stream->Read(&response);
    stream->WritesDone();
    if (answered) call.context->TryCancel();
    auto status = stream->Finish();
    {
      std::lock_guard lock(mu_);
      context_ = nullptr;
      if (stopped_) return;
    }
    Millis pause = interval_;
    if (answered) {
      if (response.ttl() <= 0) {
        onLost_(fmt::format("etcd at {}: this node's lease {:x} expired", client_.endpointList(), lease_));
        return;
      }
      lastAnswer = Clock::now();
    } else {
      lastError = status.ok() ? "the member closed the stream" : status.error_message();
      client_.failed(call.member, status.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, lastError) : status);
      if (Clock::now() - lastAnswer >= ttl_) {
        onLost_(fmt::format("etcd at {}: no member answered this node's keep-alive for {:.1f} s (last: {})",
                            client_.endpointList(), std::chrono::duration<double>(ttl_).count(), lastError));
        return;
      }
      pause = Millis(100);  // the next member at once
    }
    std::unique_lock lock(mu_);
    if (cv_.wait_for(lock, pause, [this] { return stopped_; })) return;
  }
}

}  // namespace muster::etcd
