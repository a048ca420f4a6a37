// The workers' store as PyTorch's TCPStore clients see it: a server that speaks TCPStore's
// wire protocol (the torch 1.13 client and the 2.x client) on the port launch gives the
// workers as MASTER_PORT, backed by the same MemoryStore as muster's gRPC store.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "rendezvous/store/memory_store.h"

namespace muster::rendezvous {

struct FrontOptions {
  // Keys go to the namespace contract::roundNamespace(runId, round) of the round set last.
  std::string runId = "none";
  uint64_t round = 0;
  // Connections beyond this are closed at once (each costs a descriptor and a buffer); it is
  // also kept below the process's descriptor limit.
  size_t maxConnections = 16384;
  // Partly received requests of all connections together; a client mid-request when this is
  // spent is closed.
  size_t maxBufferedInput = size_t{1} << 30;
};

// Serves every TCPStore operation of both generations: SET, COMPARE_SET, GET, ADD, CHECK,
// WAIT, GETNUMKEYS, DELETE_KEY; 2.x's VALIDATE, PING, APPEND, MULTI_GET, MULTI_SET,
// CANCEL_WAIT, QUEUE_PUSH/POP/LEN and LIST. 1.13's WATCH_KEY is refused (the connection is
// closed, with a log line); its idle second connection is kept. A client that sends garbage,
// a length over the store's caps or an unknown type, or whose request the store refuses
// (full), is closed alone, with one log line naming it; the others go on. A parked WAIT costs
// no thread. Backpressure: a client that does not read its replies is not read from.
//
// Thread-safety: every method may be called from any thread. Lifetime: the destructor shuts
// the front down; the MemoryStore may outlive it.
class TcpStoreFront {
 public:
  // Serves `listenFd` (bound and listening, e.g. from net::listenTcp) on a thread of its own;
  // the front owns the descriptor from now on, even on error.
  static absl::StatusOr<std::unique_ptr<TcpStoreFront>> start(std::shared_ptr<MemoryStore> memory,
                                                              int listenFd, FrontOptions options);
  ~TcpStoreFront();
  TcpStoreFront(const TcpStoreFront&) = delete;
  TcpStoreFront& operator=(const TcpStoreFront&) = delete;

  // Requests from now on use round `round`'s namespace.
  void setRound(uint64_t round);
  int port() const { return port_; }
  size_t connections() const;
  // Closes every connection (their parked waits are withdrawn) and the listening socket.
  // Idempotent.
  void shutdown();

  class Impl;

 private:
  explicit TcpStoreFront(std::shared_ptr<Impl> impl, int port);
  std::shared_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace muster::rendezvous
