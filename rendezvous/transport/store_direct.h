// The store's direct path: the same sessions as muster.v1.Store's Session stream (the same
// StoreSessions, the same token), on a plain TCP port with a framing of its own
// (direct_wire.h) instead of HTTP/2. It exists for speed: a store operation through gRPC's
// client costs several times the kernel's round trip, and 64 client processes on one host
// spend most of their time there. Plaintext only: a server with TLS does not offer it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/deadline.h"
#include "rendezvous/rpc/auth.h"
#include "rendezvous/store/store_sessions.h"

namespace muster::rendezvous {

struct DirectOptions {
  std::string host = "0.0.0.0";
  int port = 0;  // 0 picks a free port; port() says which
  // The largest request message a client may send (the store's largest request).
  size_t maxMessageBytes = size_t{4} << 20;
  // Requests being received, across all connections (gRPC's max_inflight_bytes): a session
  // whose request would pass it ends with RESOURCE_EXHAUSTED.
  size_t maxBufferedBytes = size_t{1} << 30;
  // Connections beyond this are closed at once; also kept below the descriptor limit.
  size_t maxConnections = 65536;
  // Connections that have not said hello yet, at most (each holds a descriptor).
  size_t maxGreeting = 1024;
  // A connection that has not said hello (magic and token) by then is closed.
  Millis helloTimeout{10000};
  // A connection written nothing for this long is pinged (clients give up after 30 s of
  // silence: direct_wire.h).
  Millis pingEvery{10000};
  // Event loops, a thread each; 0: one per core, at most 8.
  int loops = 0;
};

// Thread-safety: every method may be called from any thread. Lifetime: `sessions` and `gate`
// outlive it; the destructor shuts it down.
class StoreDirect {
 public:
  // Errors: UNAVAILABLE (the address cannot be bound; the message says why).
  static absl::StatusOr<std::unique_ptr<StoreDirect>> start(StoreSessions& sessions,
                                                            TokenGate& gate,
                                                            DirectOptions options);
  ~StoreDirect();
  StoreDirect(const StoreDirect&) = delete;
  StoreDirect& operator=(const StoreDirect&) = delete;

  int port() const { return port_; }
  size_t connections() const;

  // Stops accepting, closes connections without a session, waits at most `grace` for the
  // others to end (StoreSessions::closeAll ends their sessions first), then closes the rest.
  // Idempotent; a second caller returns once the first is done.
  void shutdown(Millis grace = Millis(2000));

  class Impl;

 private:
  StoreDirect(std::shared_ptr<Impl> impl, int port) : impl_(std::move(impl)), port_(port) {}
  std::shared_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace muster::rendezvous
