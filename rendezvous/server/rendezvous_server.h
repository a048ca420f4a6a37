// The muster service on one address: the gRPC server with the store (StoreSessions, served by
// serveStore), the rendezvous (RendezvousService) and health, behind one token check
// (FrontDoor) and TLS.
// rendezvousd runs one; the master's `launch` hosts one in-process. (It was StoreServer, after
// only one of the three.)
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/deadline.h"
#include "rendezvous/door/connection_gate.h"
#include "rendezvous/store/memory_store.h"
#include "rendezvous/membership/rendezvous_state.h"

namespace grpc {
class Server;
class Service;
}  // namespace grpc

namespace muster::rendezvous {

class StoreSessions;
class RendezvousService;
class FrontDoor;
class TokenGate;
class HealthService;
class StoreDirect;

struct ServerOptions {
  std::string host = "0.0.0.0";
  int port = 29400;         // 0 picks a free port; port() says which
  std::string token;        // empty: no authentication
  std::string tlsCertPem;   // both set: TLS; both empty: plaintext
  std::string tlsKeyPem;
  StoreLimits limits;
  // Log the start and the shutdown at info (rendezvousd) or at debug (a store hosted inside
  // launch, where they are noise).
  bool announce = true;
  // rendezvousd: the service outlives the nodes (Assignment.standalone_service).
  bool standalone = false;
  // How long finished and abandoned runs are remembered, and how many.
  RunRetention retention;
  // The most memory gRPC may hold for calls in flight (requests being received, answers being
  // sent); past it, calls are refused with RESOURCE_EXHAUSTED. 0: twice the largest request, at least 1 GiB.
  size_t maxInflightBytes = 0;
  // The store's direct path (StoreDirect) on this port of `host`: -1 none, 0 a free port.
  // Not with TLS (it is plaintext): asked for together, start fails.
  int directPort = -1;
  // Threads of each transport: gRPC's completion queues (FrontDoor) and the direct path's
  // loops. 0: by the cores (queues 8 to 64, loops 1 to 8), for a service of many clients; a
  // store that serves one node's ranks needs 1 of each.
  int threads = 0;
  // Connections on the gRPC port, in total and per peer address (ConnectionGate): past a cap the
  // oldest that never made a call with the token is closed, or the newcomer refused.
  ConnectionLimits connections;
};

// Thread-safety: all methods may be called from any thread. Lifetime: the destructor shuts the
// server down (pending waits end with UNAVAILABLE).
class RendezvousServer {
 public:
  // Errors: INVALID_ARGUMENT (bad host/port/TLS material, a memory bound below the largest
  // request), UNAVAILABLE (the address cannot be
  // bound; the message names it and says why).
  static absl::StatusOr<std::unique_ptr<RendezvousServer>> start(ServerOptions options);
  ~RendezvousServer();

  int port() const { return port_; }
  // The direct path's port; 0 when it has none.
  int directPort() const;
  // Connections open on the direct path.
  size_t directConnections() const;
  // Connections on the gRPC port: open, refused, closed to make room.
  ConnectionCounts connections() const;
  // host:port as bound ("[::1]:port" for IPv6).
  const std::string& address() const { return address_; }
  const std::shared_ptr<MemoryStore>& memory() const { return memory_; }
  StoreSessions& sessions() { return *sessions_; }
  RendezvousService& rendezvous() { return *rendezvous_; }
  // Calls refused for a missing or wrong token.
  uint64_t rejectedCalls() const;
  // Admitted one-request calls not yet over (FrontDoor).
  int64_t callsInFlight() const;

  // Ends pending waits with UNAVAILABLE, closes every session, stops accepting, and waits at
  // most `grace` for calls in flight. Idempotent.
  void shutdown(Millis grace = Millis(2000));
  // Blocks until the server has shut down.
  void wait();

 private:
  RendezvousServer() = default;
  std::shared_ptr<MemoryStore> memory_;
  std::unique_ptr<TokenGate> gate_;
  std::unique_ptr<FrontDoor> door_;
  std::unique_ptr<HealthService> health_;
  std::unique_ptr<StoreSessions> sessions_;
  std::unique_ptr<RendezvousService> rendezvous_;
  std::unique_ptr<StoreDirect> direct_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<ConnectionGate> connections_;
  std::string address_;
  int port_ = 0;
  std::mutex mu_;
  bool down_ = false;
  bool announce_ = true;
};

}  // namespace muster::rendezvous
