// The gRPC port's door to the kernel. muster accepts the connections itself and hands each one
// it admits to gRPC (ServerBuilder's external connection acceptor: TLS and the server's
// arguments apply as on gRPC's own port), because gRPC 1.51 has no connection cap and its own
// listener stops for good after one failed accept: anyone who could reach the port could end
// the service by opening connections until the descriptors ran out.
//
// Caps, in total and per peer address. At a cap the oldest connection that never made a call
// with the token (none was needed where the service has no token) is closed to make room,
// oldest first; a member's connection is never closed for a newcomer, and when no connection
// can be closed the newcomer is refused. Out of descriptors, a spare one is given up to accept
// and refuse the next connection, so the kernel's queue keeps draining and the loop never stops.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace grpc::experimental {
class ExternalConnectionAcceptor;
}

namespace muster::rendezvous {

struct ConnectionLimits {
  size_t maxConnections = 0;  // 0: as many as the descriptor limit leaves room for
  size_t maxPerPeer = 0;      // connections from one address; 0: no cap but the total
};

struct ConnectionCounts {
  size_t open = 0;       // handed to gRPC and not yet seen closed
  uint64_t refused = 0;  // closed at accept: a cap with nothing to give way, or no descriptor
  uint64_t evicted = 0;  // closed to make room: unauthenticated, oldest first
};

class ConnectionGate {
 public:
  // Serves `listenFd` (listening, non-blocking or not; the gate owns it from here) on a thread
  // of its own, handing admitted connections to `acceptor`, whose server must have started.
  static absl::StatusOr<std::unique_ptr<ConnectionGate>> start(
      int listenFd, std::shared_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor,
      ConnectionLimits limits);
  ~ConnectionGate();

  // A call with the token came on the connection of `peer` (gRPC's peer(): "ipv4:1.2.3.4:5",
  // "ipv6:[::1]:5"); it is a member's from now on. Thread-safe; every call parses `peer` and
  // looks it up under the gate's lock, marked already or not.
  void authenticated(std::string_view peer);
  ConnectionCounts counts() const;
  // Stops accepting and closes the listening socket; connections handed over stay gRPC's.
  // Idempotent; call before the server shuts down.
  void stop();

 private:
  struct Impl;
  explicit ConnectionGate(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

}  // namespace muster::rendezvous
