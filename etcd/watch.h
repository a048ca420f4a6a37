// A watch of every key under a prefix, on its own thread, that outlives the member it started
// on: a broken stream is opened again at the next member from the next revision, so no event
// is lost or seen twice.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "etcd/client.h"

namespace muster::etcd {

// Thread-safety: construct and destroy from one thread; the callbacks run on the watch's own
// thread, one at a time. Lifetime: destroy before the Client; the destructor cancels the
// stream and waits for the thread (no callback runs after it returns).
class Watch {
 public:
  using Events = std::vector<::mvccpb::Event>;
  // From `revision` (0: from now). `onEvents` gets each response's events in order, with the
  // revision the cluster was at. `onError` runs once, the last call, when no member served the
  // watch for `giveUpAfter` or the revisions it needs were compacted away.
  Watch(Client& client, std::string prefix, int64_t revision, Millis giveUpAfter,
        std::function<void(Events, int64_t revision)> onEvents,
        std::function<void(const std::string&)> onError);
  ~Watch();
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;

 private:
  void run();

  Client& client_;
  std::string prefix_;
  int64_t next_;
  Millis giveUpAfter_;
  std::function<void(Events, int64_t)> onEvents_;
  std::function<void(const std::string&)> onError_;
  std::mutex mu_;
  bool stopped_ = false;
  grpc::ClientContext* context_ = nullptr;  // the stream open now, to cancel
  std::thread thread_;
};

// The end of the range of every key that starts with `prefix` (etcd's range_end).
std::string prefixEnd(const std::string& prefix);

}  // namespace muster::etcd
