// PyTorch's TCPStore wire format, as its 1.13 and 2.x clients speak it: decoding one request
// from the front of a connection's bytes, and encoding replies. No I/O and no store state.
//
// Framing (both generations): a 1-byte query type, then its arguments; strings and byte
// values are a little-endian u64 length and the bytes; counts and integers are little-endian
// 8-byte values. No length header, no request id: a client has one request in flight. The 2.x
// client opens with VALIDATE (type 0 and the u32 magic 0x3C85F7CE); its type numbers are the
// 1.13 ones shifted by one up to GETNUMKEYS, with new ones after DELETE_KEY (8 in both); the
// last, BARRIER (18, torch 2.14's Store::barrier), counts arrivals on its key as an ADD of 1
// and is answered STOP_WAITING once the count reaches the world size it names.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace muster::rendezvous::tcpstore {

inline constexpr uint32_t kValidationMagic = 0x3C85F7CE;

enum class Generation {
  kUnknown,  // nothing decided yet (no byte seen)
  kV1,       // torch 1.13: no handshake
  kV2,       // torch 2.x: VALIDATE first, then PING, ...
};

enum class Op {
  kValidate, kSet, kCompareSet, kGet, kAdd, kCheck, kWait, kNumKeys, kWatchKey, kDeleteKey,
  kAppend, kMultiGet, kMultiSet, kCancelWait, kPing, kQueuePush, kQueuePop, kQueueLen, kList,
  kBarrier,  // 2.x (torch 2.14's Store::barrier): a key and the world size
};

// The name of an op as c10d spells it ("SET", "CANCEL_WAIT").
std::string_view opName(Op op);

struct Request {
  Op op = Op::kSet;
  std::vector<std::string> keys;    // one for single-key ops; CHECK/WAIT/MULTI_*: many
  std::vector<std::string> values;  // SET/APPEND/QUEUE_PUSH: 1; COMPARE_SET: expected,
                                    // desired; MULTI_SET: one per key
  int64_t number = 0;               // ADD: the delta; BARRIER: the world size
  uint32_t word = 0;                // PING: the nonce; VALIDATE: the magic
};

// Caps checked while decoding, before anything is allocated: a length over a cap is an error,
// not a wait for more bytes.
struct WireLimits {
  size_t maxKeyBytes = 8192;
  size_t maxValueBytes = 64u << 20;
  size_t maxKeysPerCall = 16384;
  size_t maxRequestBytes = 256u << 20;  // one whole request (MULTI_SET, WAIT of many keys)
};

// Decodes one request from the front of `data`. Returns the bytes it used, or 0 when `data`
// holds only part of a request; then `*needed` (when given) is how many bytes `data` must hold
// before another call can get further. An incomplete request is only scanned (lengths read,
// nothing copied), so feeding a large request in small pieces costs no copying. `generation` is decided by the connection's first bytes (a
// first byte other than 0, or 0 without the magic after it, is 1.13) and kept by the caller.
// Errors (INVALID_ARGUMENT, one line; the caller closes the connection): an unknown type, a
// length or count over a cap, a 2.x VALIDATE with the wrong magic or after the first message.
absl::StatusOr<size_t> decode(std::string_view data, Generation& generation,
                              const WireLimits& limits, Request& out, size_t* needed = nullptr);

// Encoders: append a reply's parts to `out`.
void putU8(std::string& out, uint8_t v);
void putU32(std::string& out, uint32_t v);
void putI64(std::string& out, int64_t v);
void putBytes(std::string& out, std::string_view bytes);

// Reply bytes of CHECK and WAIT.
inline constexpr uint8_t kReady = 0, kNotReady = 1;
inline constexpr uint8_t kStopWaiting = 0, kWaitCanceled = 1;
inline constexpr uint8_t kKeyCallbackRegistered = 3;

// Request encoders (what a client sends), for tests and benchmarks.
std::string encode(const Request& request, Generation generation);

}  // namespace muster::rendezvous::tcpstore
