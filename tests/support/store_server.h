// Test support for tests of a real RendezvousServer: start one on loopback, and wait,
// bounded, for state the server changes on its own threads.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <thread>

#include "common/deadline.h"
#include "rendezvous/server/rendezvous_server.h"

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

// Bounded wait for state that the server changes on its own threads (a cancelled call's
// clean-up has no event a client can see).
inline bool eventually(const std::function<bool()>& condition, Millis timeout = Millis(10000)) {
  auto deadline = Clock::now() + timeout;
  while (!condition()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(Millis(2));
  }
  return true;
}

}  // namespace muster::testing
