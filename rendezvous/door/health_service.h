// grpc.health.v1.Health (Check and Watch) through the FrontDoor, without the token (probes
// carry no secret): "" and each muster service answer SERVING until shutdown begins.
#pragma once

#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "rendezvous/door/front_door.h"

namespace muster::rendezvous {

// Thread-safety: any thread. Lifetime: must outlive the server its door is on.
class HealthService {
 public:
  // `services`: the names that are known besides "".
  explicit HealthService(std::vector<std::string> services);
  void serve(FrontDoor& door);
  // Every watcher hears of a change; `serving` false also ends the watches.
  void setServing(bool serving);

 private:
  int statusOf(const std::string& service) const;
  std::vector<std::string> services_;
  mutable std::mutex mu_;
  bool serving_ = false;
  struct Watch {
    std::string service;
    std::shared_ptr<Answer> answer;
  };
  std::vector<std::shared_ptr<Watch>> watches_;
};

}  // namespace muster::rendezvous
