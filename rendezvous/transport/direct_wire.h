// The direct path's framing (store.proto, DirectHello): what muster's store server and client
// both speak on the plain TCP port a ServerInfo names.
#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

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

// Both ends' socket options: no delay, and a peer that vanishes (its host lost, a cable
// pulled) noticed: data it does not acknowledge, or keepalive probes it does not answer, end
// the connection after 30 s. (A peer that hangs but whose kernel answers: the pings.)
inline void watchPeer(int fd) {
  int one = 1, idle = 10, interval = 5, count = 3;
  unsigned int userTimeout = 30000;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &userTimeout, sizeof userTimeout);
}

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
