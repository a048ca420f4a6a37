// Test support for tests of a real RendezvousServer: start one on loopback, and wait,
// bounded, for state the server changes on its own threads (tests/support/eventually.h).
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "common/deadline.h"
#include "rendezvous/server/rendezvous_server.h"
#include "tests/support/eventually.h"

namespace muster::testing {

// A server on 127.0.0.1, on a free port unless `port` is given.
inline std::unique_ptr<rendezvous::RendezvousServer> startServer(rendezvous::ServerOptions options = {},
                                                                int port = 0) {
  options.host = "127.0.0.1";
  options.port = port;
  auto server = rendezvous::RendezvousServer::start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

}  // namespace muster::testing
