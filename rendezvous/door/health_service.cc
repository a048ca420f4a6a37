// HealthService: Check answers the status now; Watch writes it and then each change.
#include "rendezvous/door/health_service.h"

#include <algorithm>

#include "grpc/health/v1/health.pb.h"

namespace muster::rendezvous {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

HealthCheckResponse response(int status) {
  HealthCheckResponse r;
  r.set_status(static_cast<HealthCheckResponse::ServingStatus>(status));
  return r;
}

}  // namespace

HealthService::HealthService(std::vector<std::string> services) : services_(std::move(services)) {}

int HealthService::statusOf(const std::string& service) const {
  if (!service.empty() && std::find(services_.begin(), services_.end(), service) == services_.end()) {
    return HealthCheckResponse::SERVICE_UNKNOWN;
  }
  return serving_ ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
}

void HealthService::serve(FrontDoor& door) {
  door.add<HealthCheckRequest>("/grpc.health.v1.Health/Check", [this](const HealthCheckRequest& request,
                                                                      std::shared_ptr<Answer> answer) {
    int status;
    {
      std::lock_guard<std::mutex> lock(mu_);
      status = statusOf(request.service());
    }
    if (status == HealthCheckResponse::SERVICE_UNKNOWN) {
      answer->finish(grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service " + request.service()));
    } else {
      answer->reply(response(status));
    }
  }, /*guarded=*/false);
  door.add<HealthCheckRequest>("/grpc.health.v1.Health/Watch", [this](const HealthCheckRequest& request,
                                                                      std::shared_ptr<Answer> answer) {
    auto watch = std::make_shared<Watch>(Watch{request.service(), answer});
    bool open;
    {
      std::lock_guard<std::mutex> lock(mu_);
      answer->write(response(statusOf(request.service())));
      open = serving_;
      if (open) watches_.push_back(watch);
    }
    if (!open) {
      answer->finish(grpc::Status::OK);
      return;
    }
    answer->onEnd([this, watch](bool) {
      std::lock_guard<std::mutex> lock(mu_);
      watches_.erase(std::remove(watches_.begin(), watches_.end(), watch), watches_.end());
    });
  }, /*guarded=*/false);
}

void HealthService::setServing(bool serving) {
  std::lock_guard<std::mutex> lock(mu_);
  if (serving_ == serving) return;
  serving_ = serving;
  for (const auto& w : watches_) {
    w->answer->write(response(statusOf(w->service)));
    if (!serving) w->answer->finish(grpc::Status::OK);
  }
  if (!serving) watches_.clear();
}

}  // namespace muster::rendezvous
