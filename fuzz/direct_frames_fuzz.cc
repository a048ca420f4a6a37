// rendezvousd's direct path (the store's framed TCP protocol) as anyone who reaches its port
// sees it: the magic, a hello with or without the token, then any bytes as frames. Every frame
// the server sends is whole and parses (an answer, a welcome, a ping, or the one end frame,
// which comes last); once the client is gone its connection and parked operations are gone,
// and a later client with the token is welcomed.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <memory>
#include <string>

#include "common/log.h"
#include "fuzz/loopback_client.h"
#include "rendezvous/rpc/auth.h"
#include "rendezvous/store/memory_store.h"
#include "rendezvous/store/store_sessions.h"
#include "rendezvous/transport/direct_wire.h"
#include "rendezvous/transport/store_direct.h"

using namespace muster;
using namespace muster::rendezvous;

namespace {
// Whether `bytes` end with a whole end frame after whole frames; traps on a frame that does
// not parse or anything after the end frame.
bool ended(const std::string& bytes) {
  size_t at = 0;
  bool end = false;
  while (bytes.size() - at >= direct::kHeaderBytes) {
    uint32_t length = direct::frameLength(bytes.data() + at);
    if (length == 0) __builtin_trap();
    if (bytes.size() - at - 4 < length) return false;
    if (end) __builtin_trap();  // a frame after the end frame
    auto kind = static_cast<direct::Kind>(bytes[at + 4]);
    const char* body = bytes.data() + at + direct::kHeaderBytes;
    int bodyBytes = static_cast<int>(length - 1);
    if (kind == direct::Kind::kWelcome) {
      pb::ServerInfo info;
      if (!info.ParseFromArray(body, bodyBytes)) __builtin_trap();
    } else if (kind == direct::Kind::kAnswer || kind == direct::Kind::kEnd || kind == direct::Kind::kPing) {
      pb::StoreResponse response;
      if (!response.ParseFromArray(body, bodyBytes)) __builtin_trap();
      end = kind == direct::Kind::kEnd;
    } else {
      __builtin_trap();
    }
    at += 4 + length;
  }
  return end && at == bytes.size();
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  log::setLevel("off");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider p(data, size);
  // A server of its own: requests name any namespace, and one input's keys must not fill the
  // store for the next.
  auto memory = std::make_shared<MemoryStore>(
      StoreLimits{.maxKeyBytes = 64, .maxValueBytes = 512, .maxKeysPerCall = 16, .maxTotalBytes = 1 << 16});
  StoreSessions sessions(memory);
  TokenGate gate("tok");
  auto started = StoreDirect::start(sessions, gate, {.host = "127.0.0.1", .port = 0, .maxMessageBytes = 4096, .loops = 1});
  if (!started.ok()) __builtin_trap();
  auto& server = *started;
  std::string out;
  int opening = p.ConsumeIntegralInRange(0, 3);
  if (opening > 0) {
    out = direct::kMagic;
    pb::DirectHello hello;
    hello.set_token(opening == 1 ? "wrong" : "tok");
    if (opening != 3) direct::appendFrame(out, direct::Kind::kHello, hello);
  }
  out += p.ConsumeRemainingBytesAsString();
  (void)fuzz::exchange(server->port(), out, 50, ended);
  if (!fuzz::settled([&] { return server->connections() == 0 && memory->pendingWaiters() == 0; })) __builtin_trap();
  // A member is still welcomed.
  std::string hello(direct::kMagic);
  pb::DirectHello h;
  h.set_token("tok");
  direct::appendFrame(hello, direct::Kind::kHello, h);
  std::string answer = fuzz::exchange(server->port(), hello, 5000, ended);
  if (answer.size() < direct::kHeaderBytes || static_cast<direct::Kind>(answer[4]) != direct::Kind::kWelcome) __builtin_trap();
  if (!fuzz::settled([&] { return server->connections() == 0; })) __builtin_trap();
  server->shutdown(Millis(0));
  sessions.closeAll();
  return 0;
}
