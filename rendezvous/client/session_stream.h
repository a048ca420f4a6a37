// What a StoreClient session's messages travel on: gRPC's Session stream
// (transport/store_service.h), or one socket of the store's direct path
// (transport/store_direct.h, framed as transport/direct_wire.h says). Only the client uses it.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/deadline.h"
#include "muster/v1/store.grpc.pb.h"
#include "rendezvous/store/store.h"

namespace muster::rendezvous {

// What a Session's messages travel on: gRPC's Session stream, or the direct path's socket.
// One write and one read may run at once, on different threads; cancel() from any thread.
class SessionStream {
 public:
  virtual ~SessionStream() = default;
  // False: the stream has ended (read() then says why).
  virtual bool write(const pb::StoreRequest& request) = 0;
  // False: the stream has ended; finish() says why.
  virtual bool read(pb::StoreResponse* response) = 0;
  // No more requests (the server answers what it has, then ends the stream).
  virtual void writesDone() = 0;
  // Why the stream ended, once read() said it has.
  virtual grpc::Status finish() = 0;
  // Ends the stream now: a read or write under way returns.
  virtual void cancel() = 0;
  // The store's direct path (not gRPC).
  virtual bool direct() const = 0;
};

// A Session stream on `stub`'s channel, with the token, asking for batched answers.
std::unique_ptr<SessionStream> openGrpcStream(pb::Store::Stub& stub, const std::string& token);

// The direct path at host:port: connects within `deadline`, says hello (magic and token) and
// waits for the welcome, whose ServerInfo goes to `*welcome`. Errors: UNAVAILABLE with the
// reason (no answer in time, refused, closed), or the store's own (UNAUTHENTICATED).
// `*timedOut`: the deadline ran out, which says nothing of the port when the deadline was
// short; `*busy`: the store refused for now (UNAVAILABLE, or closed before its welcome).
absl::StatusOr<std::unique_ptr<SessionStream>> openDirectStream(const std::string& host, int port,
                                                                const std::string& token,
                                                                Deadline deadline,
                                                                pb::ServerInfo* welcome,
                                                                bool* timedOut, bool* busy);

// The host of a HOST:PORT target ("[v6]:port" too); nullopt for anything else (a gRPC scheme,
// a Unix socket), which has no direct path.
std::optional<std::string> targetHost(const std::string& target);

}  // namespace muster::rendezvous
