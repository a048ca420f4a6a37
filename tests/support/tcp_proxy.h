// A TCP proxy on 127.0.0.1 for tests that break a connection at a chosen moment: it forwards
// both ways until told to hold what clients send (counting it), then drops every connection,
// losing what it held, and forwards new connections normally again.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace muster::testing {

class TcpProxy {
 public:
  explicit TcpProxy(int targetPort) : target_(targetPort) {
    listen_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr = loopback(0);
    if (listen_ < 0 || bind(listen_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(listen_, 64) != 0) {
      std::abort();
    }
    socklen_t len = sizeof(addr);
    getsockname(listen_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    if (pipe2(wake_, O_CLOEXEC) != 0) std::abort();
    thread_ = std::thread([this] { loop(); });
  }
  ~TcpProxy() {
    stop_ = true;
    poke();
    thread_.join();
    for (auto& c : conns_) closePair(c);
    close(listen_);
    close(wake_[0]);
    close(wake_[1]);
  }

  int port() const { return port_; }
  // From now on, bytes from clients are read and kept back, not forwarded.
  void hold() {
    holding_ = true;
    poke();
  }
  // Bytes held back since hold().
  size_t held() const { return held_; }
  // Closes every connection (what was held is lost) and forwards again.
  void dropAll() {
    drop_ = true;
    poke();
    while (drop_) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

 private:
  struct Conn {
    int client = -1, server = -1;
  };
  static sockaddr_in loopback(int port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return addr;
  }
  void poke() { (void)!write(wake_[1], "x", 1); }
  static void closePair(Conn& c) {
    if (c.client >= 0) close(c.client);
    if (c.server >= 0) close(c.server);
    c.client = c.server = -1;
  }
  void loop() {
    char buf[65536];
    while (!stop_) {
      if (drop_) {
        for (auto& c : conns_) closePair(c);
        conns_.clear();
        holding_ = false;
        drop_ = false;
      }
      std::vector<pollfd> fds{{listen_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
      for (auto& c : conns_) {
        fds.push_back({c.client, POLLIN, 0});
        fds.push_back({c.server, POLLIN, 0});
      }
      if (poll(fds.data(), fds.size(), 1000) <= 0) continue;
      // Only the connections polled above have entries in fds: one accepted below waits for
      // the next round (indexing fds with it ran past the vector's end: ASan's finding).
      const size_t polled = conns_.size();
      if (fds[1].revents) (void)!read(wake_[0], buf, sizeof(buf));
      if (fds[0].revents & POLLIN) {
        int client = accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
        int server = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in addr = loopback(target_);
        if (client >= 0 && server >= 0 &&
            connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
          conns_.push_back({client, server});
        } else {
          if (client >= 0) close(client);
          if (server >= 0) close(server);
        }
      }
      for (size_t i = 0; i < polled; ++i) {
        Conn& c = conns_[i];
        for (int side = 0; side < 2; ++side) {
          const pollfd& p = fds[2 + 2 * i + side];
          if (!(p.revents & (POLLIN | POLLHUP | POLLERR)) || c.client < 0) continue;
          int from = side == 0 ? c.client : c.server, to = side == 0 ? c.server : c.client;
          ssize_t n = read(from, buf, sizeof(buf));
          if (n <= 0) {
            closePair(c);
            continue;
          }
          if (side == 0 && holding_) {
            held_ += static_cast<size_t>(n);
            continue;
          }
          for (ssize_t off = 0; off < n;) {
            ssize_t w = write(to, buf + off, static_cast<size_t>(n - off));
            if (w <= 0) break;
            off += w;
          }
        }
      }
      std::erase_if(conns_, [](const Conn& c) { return c.client < 0; });
    }
  }

  int target_;
  int listen_ = -1, port_ = 0;
  int wake_[2] = {-1, -1};
  std::atomic<bool> stop_{false}, holding_{false}, drop_{false};
  std::atomic<size_t> held_{0};
  std::vector<Conn> conns_;  // the loop's own
  std::thread thread_;
};

}  // namespace muster::testing
