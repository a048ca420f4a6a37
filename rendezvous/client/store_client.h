// The store's client: one session per connection carries every operation, many in flight at
// once, on a gRPC stream or on the store's direct path (store_direct.h) when it offers one;
// views of other namespaces share the connection.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "rendezvous/store/store.h"

namespace muster::rendezvous {

struct ClientOptions {
  std::string target;         // host:port of the store
  std::string ns;             // the namespace of the first view
  std::string token;          // sent as x-muster-token when not empty
  std::string tlsCaPem;       // not empty: TLS, and the server must be signed by this CA
  std::string tlsServerName;  // overrides the name checked in the server's certificate
  // Move the session to the store's direct path when the store offers one (ServerInfo's
  // direct_port, plaintext stores only) and it can be reached; gRPC otherwise.
  bool direct = true;
};

class ClientConnection;

// Thread-safety: every operation may be called from many threads at once; they share one
// stream. Lifetime: a view keeps its connection alive; the connection closes with the last.
// Retries: a broken connection is reopened with jittered exponential back-off until the
// operation's deadline; operations that are safe to repeat (set, get, check, wait, num_keys,
// multi_get, multi_set) are sent again, the others fail with UNAVAILABLE.
class StoreClient : public Store {
 public:
  // Connects within `deadline`. Errors: INVALID_ARGUMENT (bad target), DEADLINE_EXCEEDED (no
  // store answered in time; the message names the target), UNAUTHENTICATED.
  static absl::StatusOr<std::unique_ptr<StoreClient>> connect(const ClientOptions& options,
                                                              Deadline deadline);
  ~StoreClient() override;

  const std::string& ns() const override { return ns_; }
  const std::string& target() const;
  // A view of another namespace over the same connection.
  std::unique_ptr<StoreClient> withNamespace(std::string ns) const;
  absl::Status flush(Deadline deadline) override;
  // Whether the connection's session is on the store's direct path now (not gRPC).
  bool direct() const;

 protected:
  absl::StatusOr<pb::StoreResponse> execute(pb::StoreRequest& request,
                                            Deadline deadline) override;
  absl::Status post(pb::StoreRequest& request) override;

 private:
  StoreClient(std::shared_ptr<ClientConnection> connection, std::string ns);
  std::shared_ptr<ClientConnection> connection_;
  std::string ns_;
};

}  // namespace muster::rendezvous
