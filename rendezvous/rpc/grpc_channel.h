// The one way muster's clients open a gRPC channel to a store or rendezvous service: plaintext
// or TLS (a CA, and the name to check), and the reconnect and keep-alive tuning they share.
#pragma once

#include <compare>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "common/deadline.h"

namespace muster::rendezvous {

struct ChannelOptions {
  std::string target;         // host:port
  std::string tlsCaPem;       // not empty: TLS, and the server must be signed by this CA
  std::string tlsServerName;  // overrides the name checked in the server's certificate
  // Reconnect back-off: from `minBackoff` up to `maxBackoff` (gRPC's default starts at 1 s).
  Millis minBackoff{50};
  Millis maxBackoff{2000};
  // How long one connection attempt may take (TCP, TLS, HTTP/2 settings) before it is given
  // up and retried. gRPC's default; at 100 ms, a server busy accepting thousands of clients
  // (job start-up) had its attempts dropped and retried over and over.
  Millis connectTimeout{20000};
  // Pings an idle connection this often to notice a dead peer; 0: gRPC's default (none).
  Millis keepAlive{0};
  // A channel of its own (its own TCP connection), not one shared with other channels to the
  // same target.
  bool ownConnection = true;

  auto operator<=>(const ChannelOptions&) const = default;
};

std::shared_ptr<grpc::Channel> makeChannel(const ChannelOptions& options);

// The channel this process already has open with the same options, or a new one
// (`ownConnection` is taken as set: the connection is this process's, shared by whoever asks
// for the same options). Many clients of one store in a process (every rank of a node in one
// launcher, simulated ranks in a benchmark) so share one TCP connection, each on its own
// stream, instead of opening one each.
std::shared_ptr<grpc::Channel> sharedChannel(const ChannelOptions& options);

}  // namespace muster::rendezvous
