// RendezvousClient: a unary Join with a deadline; a Watch stream and heartbeats on threads.
#include "rendezvous/rendezvous_client.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include "common/log.h"
#include "rendezvous/store_service.h"

namespace muster::rendezvous {
namespace {

std::chrono::system_clock::time_point toSystem(Deadline d) {
  if (d == kNoDeadline) return std::chrono::system_clock::time_point::max();
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(d - Clock::now());
}

absl::Status toAbsl(const grpc::Status& s) {
  return s.ok() ? absl::OkStatus() : absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace

RendezvousClient::RendezvousClient(const std::string& target, const std::string& token)
    : target_(target), token_(token) {
  log::routeGrpcLogs();
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  channel_ = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  stub_ = pb::Rendezvous::NewStub(channel_);
}

RendezvousClient::~RendezvousClient() { stopWatch(); }

absl::StatusOr<pb::Assignment> RendezvousClient::join(const pb::JoinRequest& request, Deadline deadline) {
  grpc::ClientContext context;
  if (!token_.empty()) context.AddMetadata(kTokenMetadataKey, token_);
  context.set_deadline(toSystem(deadline));
  context.set_wait_for_ready(true);  // node 0 may not be up yet: wait for it, within the deadline
  pb::Assignment assignment;
  auto status = stub_->Join(&context, request, &assignment);
  if (!status.ok()) {
    if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && status.error_message() == "Deadline Exceeded") {
      return absl::DeadlineExceededError(fmt::format("no rendezvous answered at {} before the join timeout", target_));
    }
    return toAbsl(status);
  }
  return assignment;
}

absl::Status RendezvousClient::report(const pb::ReportRequest& request, Deadline deadline) {
  grpc::ClientContext context;
  if (!token_.empty()) context.AddMetadata(kTokenMetadataKey, token_);
  context.set_deadline(toSystem(deadline));
  pb::ReportResponse response;
  return toAbsl(stub_->Report(&context, request, &response));
}

void RendezvousClient::watch(const std::string& runId, const std::string& nodeId, uint64_t round,
                             Millis interval, Millis keepAlive,
                             std::function<void(const pb::RoundEvent&)> onEvent,
                             std::function<void(const std::string&)> onError) {
  stopWatch();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = false;
    watchContext_ = std::make_unique<grpc::ClientContext>();
    if (!token_.empty()) watchContext_->AddMetadata(kTokenMetadataKey, token_);
  }
  auto reported = std::make_shared<std::atomic<bool>>(false);
  watchThread_ = std::thread([this, runId, nodeId, round, onEvent, onError, reported] {
    pb::WatchRequest request;
    request.set_run_id(runId);
    request.set_node_id(nodeId);
    request.set_round(round);
    auto reader = stub_->Watch(watchContext_.get(), request);
    pb::RoundEvent event;
    bool got = reader->Read(&event);
    auto status = reader->Finish();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    if (reported->exchange(true)) return;
    if (got) {
      onEvent(event);
    } else if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
      // The round ended before the watch began: the service answers the next join.
      pb::RoundEvent ended;
      ended.set_kind(pb::RoundEvent::NODE_LOST);
      ended.set_round(round);
      ended.set_message(status.error_message());
      onEvent(ended);
    } else {
      onError(fmt::format("the rendezvous at {} went away ({})", target_, status.error_message()));
    }
  });
  heartbeatThread_ = std::thread([this, runId, nodeId, interval, keepAlive, onError, reported] {
    auto lastOk = Clock::now();
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      cv_.wait_for(lock, interval, [&] { return stopping_; });
      if (stopping_) return;
      lock.unlock();
      grpc::ClientContext context;
      if (!token_.empty()) context.AddMetadata(kTokenMetadataKey, token_);
      context.set_deadline(std::chrono::system_clock::now() + interval);
      pb::HeartbeatRequest request;
      request.set_run_id(runId);
      request.set_node_id(nodeId);
      pb::HeartbeatResponse response;
      bool ok = stub_->Heartbeat(&context, request, &response).ok();
      lock.lock();
      if (ok) {
        lastOk = Clock::now();
      } else if (Clock::now() - lastOk >= keepAlive && !stopping_) {
        lock.unlock();
        if (!reported->exchange(true)) {
          onError(fmt::format("the rendezvous at {} has not answered a heartbeat for {:.1f} s", target_,
                              keepAlive.count() / 1000.0));
        }
        return;
      }
    }
  });
}

void RendezvousClient::stopWatch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    if (watchContext_) watchContext_->TryCancel();
  }
  cv_.notify_all();
  if (watchThread_.joinable() && watchThread_.get_id() != std::this_thread::get_id()) watchThread_.join();
  if (heartbeatThread_.joinable() && heartbeatThread_.get_id() != std::this_thread::get_id()) heartbeatThread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  watchContext_.reset();
}

}  // namespace muster::rendezvous
