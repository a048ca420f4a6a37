// Test support: the Store implementations the conformance suite runs against, each behind the
// same small interface.
#pragma once

#include <memory>
#include <string>

#include "rendezvous/store/local_store.h"
#include "rendezvous/client/store_client.h"
#include "rendezvous/server/rendezvous_server.h"

namespace muster::rendezvous::testing {

// Small limits so that the suite can reach them cheaply.
inline StoreLimits testLimits() {
  StoreLimits limits;
  limits.maxKeyBytes = 256;
  limits.maxValueBytes = 1 << 20;
  limits.maxKeysPerCall = 64;
  limits.maxTotalBytes = 4 << 20;
  return limits;
}

// The in-process store: LocalStore views on one MemoryStore.
class LocalBackend {
 public:
  LocalBackend() : memory_(std::make_shared<MemoryStore>(testLimits())) {}
  std::unique_ptr<Store> open(const std::string& ns) {
    return std::make_unique<LocalStore>(memory_, ns);
  }
  MemoryStore& memory() { return *memory_; }

 private:
  std::shared_ptr<MemoryStore> memory_;
};

// A real gRPC server on 127.0.0.1:0 and real clients (on the store's direct path when `direct`).
class GrpcBackend {
 public:
  explicit GrpcBackend(bool direct = false) : direct_(direct) {
    ServerOptions options;
    options.host = "127.0.0.1";
    options.port = 0;
    options.directPort = direct ? 0 : -1;
    options.limits = testLimits();
    auto server = RendezvousServer::start(options);
    if (!server.ok()) throw std::runtime_error(std::string(server.status().message()));
    server_ = std::move(*server);
  }
  std::unique_ptr<Store> open(const std::string& ns) {
    ClientOptions options;
    options.target = server_->address();
    options.ns = ns;
    auto client = StoreClient::connect(options, deadlineAfter(Millis(10000)));
    if (!client.ok()) throw std::runtime_error(std::string(client.status().message()));
    // The suite runs where it says: on the direct path, or on gRPC.
    if ((*client)->direct() != direct_) {
      throw std::runtime_error(direct_ ? "the client did not move to the store's direct path"
                                       : "the client left gRPC for a direct path");
    }
    return std::move(*client);
  }
  MemoryStore& memory() { return *server_->memory(); }
  RendezvousServer& server() { return *server_; }

 private:
  bool direct_;
  std::unique_ptr<RendezvousServer> server_;
};

// The same server with its direct path on, and clients that use it.
class DirectBackend : public GrpcBackend {
 public:
  DirectBackend() : GrpcBackend(true) {}
};

}  // namespace muster::rendezvous::testing
