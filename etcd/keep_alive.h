// Keeps an etcd lease alive from its own thread, moving to the next member when the one in use
// stops answering.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "etcd/client.h"

namespace muster::etcd {

// Thread-safety: construct and destroy from one thread; `onLost` runs on the keep-alive's
// thread. Lifetime: destroy before the Client; the destructor waits for the thread.
class KeepAlive {
 public:
  // A keep-alive every `interval`. `onLost` runs once, the last call, when the cluster says the
  // lease expired, or no member answered for `ttl` (by then the lease has expired).
  KeepAlive(Client& client, int64_t lease, Millis interval, Millis ttl, std::function<void(const std::string&)> onLost);
  ~KeepAlive();
  KeepAlive(const KeepAlive&) = delete;
  KeepAlive& operator=(const KeepAlive&) = delete;

 private:
  void run();

  Client& client_;
  int64_t lease_;
  Millis interval_, ttl_;
  std::function<void(const std::string&)> onLost_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false;
  grpc::ClientContext* context_ = nullptr;
  std::thread thread_;
};

}  // namespace muster::etcd
