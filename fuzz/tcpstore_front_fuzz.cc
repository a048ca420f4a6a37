// launch's TCPStore front as a client that reaches the workers' store port sees it: a
// connection's bytes (any mix of both generations' requests, garbage, caps passed) and the
// answers. The front never crashes or wedges; once the client is gone its connection, its parked
// waits and barriers are gone too, and a later client is served (a PING answers).
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

#include "common/log.h"
#include "common/net.h"
#include "fuzz/loopback_client.h"
#include "rendezvous/store/memory_store.h"
#include "rendezvous/transport/tcpstore_front.h"
#include "rendezvous/transport/tcpstore_wire.h"

using namespace muster;
using namespace muster::rendezvous;

namespace {
std::shared_ptr<MemoryStore> memory;
std::unique_ptr<TcpStoreFront> front;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  log::setLevel("off");
  memory = std::make_shared<MemoryStore>(
      StoreLimits{.maxKeyBytes = 256, .maxValueBytes = 4096, .maxKeysPerCall = 64, .maxTotalBytes = 1 << 20});
  std::string why;
  int fd = net::listenTcp("127.0.0.1", 0, why);
  if (fd < 0) __builtin_trap();
  auto started = TcpStoreFront::start(memory, fd, {.runId = "fz"});
  if (!started.ok()) __builtin_trap();
  front = std::move(*started);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)fuzz::exchange(front->port(), std::string_view(reinterpret_cast<const char*>(data), size));
  // The client is gone: so are its connection and whatever it parked.
  if (!fuzz::settled([] { return front->connections() == 0 && memory->pendingWaiters() == 0; })) __builtin_trap();
  memory->dropJob("fz");
  // And the front still serves: a 2.x client's VALIDATE and PING.
  tcpstore::Request validate{.op = tcpstore::Op::kValidate, .word = tcpstore::kValidationMagic};
  tcpstore::Request ping{.op = tcpstore::Op::kPing, .word = 7};
  std::string hello = tcpstore::encode(validate, tcpstore::Generation::kV2) +
                      tcpstore::encode(ping, tcpstore::Generation::kV2);
  std::string answer =
      fuzz::exchange(front->port(), hello, 5000, [](const std::string& got) { return got.size() >= 4; });
  if (answer != std::string("\x07\0\0\0", 4)) {
    std::fprintf(stderr, "tcpstore_front: a PING after the input was answered with %zu bytes\n", answer.size());
    __builtin_trap();
  }
  if (!fuzz::settled([] { return front->connections() == 0; })) __builtin_trap();
  return 0;
}
