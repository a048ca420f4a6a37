// One loopback connection per fuzz input, for the targets whose parser only reads a socket
// (launch's TCPStore front, rendezvousd's direct path): the input is sent while the answers are
// read, then the connection is half-closed and read to its end. A connection the server leaves
// open (a WAIT parked for a key nobody sets) is reset after `idleMs` without a byte. SO_LINGER 0:
// the reset leaves no TIME_WAIT, which thousands of inputs a second would pile up.
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <thread>

#include "tests/support/eventually.h"

namespace muster::fuzz {

// `finished`, when given, says from the bytes received so far that the server has said its last.
inline std::string exchange(int port, std::string_view input, int idleMs = 50,
                            const std::function<bool(const std::string&)>& finished = nullptr) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // Thousands of connections a second leave as many in TIME_WAIT: no local port free for a
  // moment is the harness's limit, not the server's; a refusal is the server's.
  int s = -1;
  for (int tries = 0;; ++tries) {
    s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) __builtin_trap();
    if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) break;
    int err = errno;
    ::close(s);  // a socket whose connect failed is not used again (POSIX leaves it unspecified)
    // libFuzzer's -timeout alarm (SIGALRM every second) interrupts a connect that waits (a SYN
    // answered by a TIME_WAIT's ACK is sent again a second later): that is no answer either.
    if (err == EINTR) continue;
    if (err == EADDRNOTAVAIL && tries < 500) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    std::fprintf(stderr, "loopback_client: connect to port %d: %s\n", port, std::strerror(err));
    __builtin_trap();
  }
  linger l{1, 0};
  ::setsockopt(s, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  std::string got;
  size_t sent = 0;
  bool halfClosed = false;
  char buf[65536];
  for (;;) {
    if (sent == input.size() && !halfClosed) {
      ::shutdown(s, SHUT_WR);
      halfClosed = true;
    }
    pollfd p{s, static_cast<short>(POLLIN | (sent < input.size() ? POLLOUT : 0)), 0};
    int ready = ::poll(&p, 1, idleMs);
    if (ready < 0 && errno == EINTR) continue;  // libFuzzer's alarm, not the server
    if (ready <= 0) break;  // the server holds the connection: reset it
    if ((p.revents & POLLOUT) && sent < input.size()) {
      ssize_t k = ::send(s, input.data() + sent, input.size() - sent, MSG_NOSIGNAL);
      if (k > 0) sent += static_cast<size_t>(k);
      if (k < 0 && errno != EINTR) sent = input.size();  // reset by the server: read what it said
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t k = ::recv(s, buf, sizeof buf, 0);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) break;
      got.append(buf, static_cast<size_t>(k));
      if (finished && finished(got)) break;
    }
  }
  ::close(s);
  return got;
}

// What an input left behind (its connection, a parked wait) is gone within 5 s, polled every
// 200 us: inputs come by the thousand a second.
inline bool settled(const std::function<bool()>& gone) {
  return testing::eventually(gone, Millis(5000), std::chrono::microseconds(200));
}

}  // namespace muster::fuzz
