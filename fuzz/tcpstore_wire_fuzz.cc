// TCPStore's wire (rendezvous/transport/tcpstore_wire.h), as launch's front reads it from any
// client that reaches the workers' store port: a connection's bytes decoded request by request.
// A request decoded is encoded back byte for byte (both generations); every proper prefix of it
// is incomplete and asks for more than it holds; an error ends the connection, as the front does.
#include <cstdint>
#include <string>
#include <string_view>

#include "rendezvous/transport/tcpstore_wire.h"

using namespace muster::rendezvous::tcpstore;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  const WireLimits limits{.maxKeyBytes = 64, .maxValueBytes = 512, .maxKeysPerCall = 16, .maxRequestBytes = 4096};
  Generation generation = Generation::kUnknown;
  for (size_t at = 0; at < in.size();) {
    const Generation before = generation;
    Request request;
    size_t needed = 0;
    auto used = decode(in.substr(at), generation, limits, request, &needed);
    if (!used.ok()) break;
    if (*used == 0) {
      if (needed <= in.size() - at) __builtin_trap();  // "incomplete" must ask for more than it has
      break;
    }
    if (encode(request, generation) != in.substr(at, *used)) __builtin_trap();
    for (size_t k = 0; k < *used; k += 1 + *used / 8) {
      Generation again = before;
      Request part;
      size_t more = 0;
      auto p = decode(in.substr(at, k), again, limits, part, &more);
      if (!p.ok() || *p != 0 || more <= k || more > *used) __builtin_trap();
    }
    at += *used;
  }
  return 0;
}
