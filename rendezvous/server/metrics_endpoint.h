// An HTTP endpoint that serves one text, made fresh for each request: rendezvousd's
// `--metrics-port` (GET /metrics, the Prometheus text format). Boost.Beast on one thread of
// its own. A client that stalls is dropped after a timeout, at most kMaxClients are served at
// once (a new one pushes out the oldest), a request's header is capped, and running out of
// descriptors makes it pause and accept again: nothing a scraper or a stranger does can wedge
// the daemon or keep a scrape out for long.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace muster::rendezvous {

class MetricsEndpoint {
 public:
  static constexpr int kMaxClients = 64;
  using Render = std::function<std::string()>;

  // Listens on host:port (port 0: a free one) and serves `render()` at /metrics.
  // Errors: UNAVAILABLE naming the address and why it cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> start(const std::string& host, int port,
                                                                Render render);
  ~MetricsEndpoint();
  int port() const;

  class Impl;

 private:
  explicit MetricsEndpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace muster::rendezvous
