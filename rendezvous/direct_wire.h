// The direct path's framing (store.proto, DirectHello): what muster's store server and client
// both speak on the plain TCP port a ServerInfo names.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include <google/protobuf/message_lite.h>

namespace muster::rendezvous::direct {

// The first bytes a client sends: anything else on the port is a foreign protocol.
inline constexpr std::string_view kMagic = "MUSTERD1";
// A frame: 4 bytes of little-endian length, then the kind and the message.
inline constexpr size_t kHeaderBytes = 5;

enum class Kind : uint8_t { kHello = 1, kRequest = 2, kAnswer = 3, kEnd = 4, kWelcome = 5, kPing = 6 };

// The server pings a connection it has written nothing to for 10 s (DirectOptions); a client
// that hears nothing for kSilence takes the store for gone (a dead host, a hung process).
inline constexpr std::chrono::milliseconds kSilence{30000};

// Appends one frame carrying `message`.
inline void appendFrame(std::string& out, Kind kind, const google::protobuf::MessageLite& message) {
  size_t body = message.ByteSizeLong();
  uint32_t length = static_cast<uint32_t>(body + 1);
  char header[kHeaderBytes] = {static_cast<char>(length & 0xff), static_cast<char>((length >> 8) & 0xff),
                               static_cast<char>((length >> 16) & 0xff),
                               static_cast<char>((length >> 24) & 0xff), static_cast<char>(kind)};
  size_t at = out.size();
  out.append(header, kHeaderBytes);
  out.resize(at + kHeaderBytes + body);
  message.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(out.data() + at + kHeaderBytes));
}

// The length field of the frame starting at `p` (kind and message).
inline uint32_t frameLength(const char* p) {
  auto b = reinterpret_cast<const unsigned char*>(p);
  return static_cast<uint32_t>(b[0]) | static_cast<uint32_t>(b[1]) << 8 |
         static_cast<uint32_t>(b[2]) << 16 | static_cast<uint32_t>(b[3]) << 24;
}

}  // namespace muster::rendezvous::direct
