#include "rendezvous/door/connection_gate.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <grpcpp/server_builder.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "common/limits.h"
#include "common/log.h"

namespace muster::rendezvous {
namespace {

std::shared_ptr<spdlog::logger> logger() {
  static auto l = log::get("rendezvous");
  return l;
}

using Clock = std::chrono::steady_clock;

// The kernel's name for one socket, unlike its descriptor's number, which a later socket or
// file takes once gRPC has closed it.
uint64_t cookieOf(int fd) {
  uint64_t cookie = 0;
  socklen_t size = sizeof(cookie);
  return getsockopt(fd, SOL_SOCKET, SO_COOKIE, &cookie, &size) == 0 ? cookie : 0;
}

// "ip|port", as accept saw the peer (an IPv4 client of a dual-stack socket as IPv4, as gRPC
// names it).
std::string keyOf(const sockaddr_storage& addr, std::string& ip) {
  char text[INET6_ADDRSTRLEN] = {};
  uint16_t port = 0;
  if (addr.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(addr);
    inet_ntop(AF_INET, &v4.sin_addr, text, sizeof(text));
    port = ntohs(v4.sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(addr);
    if (IN6_IS_ADDR_V4MAPPED(&v6.sin6_addr)) {
      inet_ntop(AF_INET, &v6.sin6_addr.s6_addr[12], text, sizeof(text));
    } else {
      inet_ntop(AF_INET6, &v6.sin6_addr, text, sizeof(text));
    }
    port = ntohs(v6.sin6_port);
  }
  ip = text;
  return fmt::format("{}|{}", ip, port);
}

// The same key from gRPC's peer(): "ipv4:127.0.0.1:5555", "ipv6:[::1]:5555" (the brackets
// may come percent-encoded). Empty for anything else.
std::string keyOfPeer(std::string_view peer) {
  size_t scheme = peer.find(':');
  if (scheme == std::string_view::npos) return {};
  std::string_view rest = peer.substr(scheme + 1);
  size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos) return {};
  std::string ip(rest.substr(0, colon));
  for (std::string_view bracket : {"%5B", "%5b", "["}) {
    if (ip.rfind(bracket, 0) == 0) ip.erase(0, bracket.size());
  }
  for (std::string_view bracket : {"%5D", "%5d", "]"}) {
    if (ip.size() >= bracket.size() &&
        ip.compare(ip.size() - bracket.size(), bracket.size(), bracket) == 0) {
      ip.erase(ip.size() - bracket.size());
    }
  }
  // A link-local address's zone ("fe80::1%25eth0"), which accept's address does not carry.
  if (size_t zone = ip.find('%'); zone != std::string::npos) ip.erase(zone);
  return fmt::format("{}|{}", ip, rest.substr(colon + 1));
}

}  // namespace

struct ConnectionGate::Impl {
  struct Connection {
    int fd;
    uint64_t cookie;
    std::string key, ip;
    Clock::time_point accepted;
    bool member = false;
  };
  using List = std::list<Connection>;

  int listenFd = -1;
  int wake = -1;   // eventfd: stop
  int spare = -1;  // given up to accept a connection when none is left, then taken again
  std::shared_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor;
  ConnectionLimits limits;
  std::thread thread;

  mutable std::mutex mu;
  List strangers, members;  // each oldest first
  std::unordered_map<std::string, List::iterator> byKey;
  std::unordered_map<std::string, size_t> perIp;
  uint64_t refused = 0, evicted = 0;
  Clock::time_point lastSweep{};
  log::OncePerSecond refusedLog, evictedLog, exhaustedLog;

  bool alive(const Connection& c) const { return cookieOf(c.fd) == c.cookie; }

  // The spare descriptor held again, when one is free.
  void holdSpare() {
    if (spare < 0) spare = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  }

  void forget(List& list, List::iterator it) {
    if (auto n = perIp.find(it->ip); n != perIp.end() && --n->second == 0) perIp.erase(n);
    byKey.erase(it->key);
    list.erase(it);
  }

  // Drops what gRPC has closed (its descriptor now another socket's, a file's, or none).
  void sweep(List& list) {
    for (auto it = list.begin(); it != list.end();) {
      auto next = std::next(it);
      if (!alive(*it)) forget(list, it);
      it = next;
    }
  }
  void sweepAll() {
    sweep(strangers);
    sweep(members);
    lastSweep = Clock::now();
  }
  // At a cap: what closed since the last look, at most 20 times a second.
  void sweepIfStale() {
    if (Clock::now() - lastSweep >= std::chrono::milliseconds(50)) sweepAll();
  }

  // Closes the oldest stranger (from `ip` when given) to make room; false when there is none.
  bool evictOldest(const std::string* ip) {
    for (auto it = strangers.begin(); it != strangers.end(); ++it) {
      if (ip != nullptr && it->ip != *ip) continue;
      // Still the socket accepted (gRPC has not closed it and another taken its number).
      if (alive(*it)) {
        ::shutdown(it->fd, SHUT_RDWR);  // gRPC reads its end and closes the descriptor
        ++evicted;
        if (evictedLog.pass()) {
          logger()->warn(
              "connection from {} closed to make room: it made no call with the token in "
              "{:.1f} s{}",
              it->ip, std::chrono::duration<double>(Clock::now() - it->accepted).count(),
              evictedLog.heldBackNote());
        }
      }
      forget(strangers, it);
      return true;
    }
    return false;
  }

  void refuse(int fd, const std::string& ip, const std::string& why) {
    ::close(fd);
    ++refused;
    if (refusedLog.pass())
      logger()->warn("connection from {} refused: {}{}", ip, why, refusedLog.heldBackNote());
  }

  // Whether the accepted `fd` may be handed to gRPC (recorded when so); closed when not.
  bool admit(int fd, const sockaddr_storage& addr) {
    std::string ip;
    std::string key = keyOf(addr, ip);
    std::lock_guard<std::mutex> lock(mu);
    auto fromIp = [&] {
      auto n = perIp.find(ip);
      return n == perIp.end() ? size_t{0} : n->second;
    };
    if (limits.maxPerPeer > 0 && fromIp() >= limits.maxPerPeer) {
      sweepIfStale();
      if (fromIp() >= limits.maxPerPeer && !evictOldest(&ip)) {
        refuse(fd, ip,
               fmt::format("{} connections from it already, the most one address may have "
                           "(--max-connections-per-peer), all of them members'",
                           limits.maxPerPeer));
        return false;
      }
    }
    if (strangers.size() + members.size() >= limits.maxConnections) {
      sweepIfStale();
      if (strangers.size() + members.size() >= limits.maxConnections && !evictOldest(nullptr)) {
        refuse(fd, ip,
               fmt::format("{} connections open, the most allowed (--max-connections), all "
                           "of them members'",
                           limits.maxConnections));
        return false;
      }
    }
    // A key still held names a socket gRPC closed (a port the kernel gave out again).
    if (auto old = byKey.find(key); old != byKey.end()) {
      forget(old->second->member ? members : strangers, old->second);
    }
    // Without the kernel's name for it (SO_COOKIE: Linux 4.13) a connection cannot be told
    // from a later one on its descriptor: handed over, never closed by the gate.
    uint64_t cookie = cookieOf(fd);
    if (cookie == 0) return true;
    strangers.push_back({fd, cookie, key, ip, Clock::now()});
    byKey.emplace(key, std::prev(strangers.end()));
    ++perIp[ip];
    return true;
  }

  // Out of descriptors: the spare one goes to take the next connection off the queue and
  // close it, so clients are told at once instead of waiting in a queue nobody drains.
  bool exhausted(int err) {
    bool took = false;
    if (spare >= 0) {
      ::close(spare);
      spare = -1;
      sockaddr_storage addr{};
      socklen_t size = sizeof(addr);
      int fd = ::accept4(listenFd, reinterpret_cast<sockaddr*>(&addr), &size, SOCK_CLOEXEC);
      if (fd >= 0) {
        std::string ip;
        keyOf(addr, ip);
        std::lock_guard<std::mutex> lock(mu);
        refuse(fd, ip,
               fmt::format("no descriptor left ({}; {} allowed)", std::strerror(err),
                           descriptorLimit()));
        took = true;
      }
      holdSpare();
    }
    std::lock_guard<std::mutex> lock(mu);
    sweepIfStale();
    // A stranger's descriptor back for the next one (a member reconnecting, say).
    evictOldest(nullptr);
    if (!took && exhaustedLog.pass()) {
      logger()->error(
          "cannot accept on the store's port: {} ({} descriptors allowed); trying "
          "again every 50 ms",
          std::strerror(err), descriptorLimit());
    }
    return took;
  }

  void run() {
    pollfd fds[2] = {{listenFd, POLLIN, 0}, {wake, POLLIN, 0}};
    int waitMs = -1;
    while (true) {
      int n = ::poll(fds, 2, waitMs);
      if (n < 0) {
        if (errno != EINTR && exhaustedLog.pass()) {
          logger()->error("the store's accept loop: poll: {}; trying again", std::strerror(errno));
        }
        waitMs = 50;
        ::usleep(50'000);
        continue;
      }
      if (fds[1].revents != 0) return;
      waitMs = 1000;
      holdSpare();
      {
        // What closed, looked at once a second however busy the port.
        std::lock_guard<std::mutex> lock(mu);
        if (Clock::now() - lastSweep >= std::chrono::seconds(1)) sweepAll();
      }
      if (n == 0) continue;
      // The kernel's queue, a bounded share at a time.
      for (int i = 0; i < 256; ++i) {
        sockaddr_storage addr{};
        socklen_t size = sizeof(addr);
        int fd = ::accept4(listenFd, reinterpret_cast<sockaddr*>(&addr), &size,
                           SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
          int err = errno;
          if (err == EINTR || err == ECONNABORTED) continue;
          if (err == EAGAIN || err == EWOULDBLOCK) break;
          if ((err == EMFILE || err == ENFILE) && exhausted(err)) continue;
          waitMs = 50;
          // Wait out the pause rather than spin on an error that persists.
          ::poll(fds + 1, 1, 50);
          break;
        }
        if (!admit(fd, addr)) continue;
        // As gRPC's own listener sets it (accepted sockets inherit it there): small frames go
        // out at once, not after Nagle's wait for an acknowledgement.
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters p;
        p.listener_fd = listenFd;
        p.fd = fd;
        acceptor->HandleNewConnection(&p);
      }
    }
  }
};

absl::StatusOr<std::unique_ptr<ConnectionGate>> ConnectionGate::start(
    int listenFd, std::shared_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor,
    ConnectionLimits limits) {
  auto impl = std::make_shared<Impl>();
  impl->listenFd = listenFd;
  impl->acceptor = std::move(acceptor);
  size_t room = connectionRoom(limits.maxConnections == 0 ? SIZE_MAX : limits.maxConnections);
  if (limits.maxConnections != 0 && room < limits.maxConnections) {
    logger()->warn("--max-connections={} leaves no room below the descriptor limit ({}); {} it is",
                   limits.maxConnections, descriptorLimit(), room);
  }
  limits.maxConnections = std::max<size_t>(room, 1);
  impl->limits = limits;
  int flags = fcntl(listenFd, F_GETFL);
  if (flags < 0 || fcntl(listenFd, F_SETFL, flags | O_NONBLOCK) < 0) {
    ::close(listenFd);
    return absl::InternalError(
        fmt::format("the store's listening socket: {}", std::strerror(errno)));
  }
  impl->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  impl->holdSpare();
  if (impl->wake < 0 || impl->spare < 0) {
    int err = errno;
    ::close(listenFd);
    if (impl->wake >= 0) ::close(impl->wake);
    if (impl->spare >= 0) ::close(impl->spare);
    return absl::ResourceExhaustedError(
        fmt::format("the store's accept loop: {}", std::strerror(err)));
  }
  impl->thread = std::thread([raw = impl.get()] { raw->run(); });
  return std::unique_ptr<ConnectionGate>(new ConnectionGate(std::move(impl)));
}

ConnectionGate::~ConnectionGate() { stop(); }

void ConnectionGate::stop() {
  if (!impl_->thread.joinable()) return;
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(impl_->wake, &one, sizeof(one));
  impl_->thread.join();
  ::close(impl_->listenFd);
  ::close(impl_->wake);
  if (impl_->spare >= 0) ::close(impl_->spare);
}

void ConnectionGate::authenticated(std::string_view peer) {
  std::string key = keyOfPeer(peer);
  if (key.empty()) return;
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->byKey.find(key);
  if (it == impl_->byKey.end() || it->second->member) return;
  it->second->member = true;
  impl_->members.splice(impl_->members.end(), impl_->strangers, it->second);
}

ConnectionCounts ConnectionGate::counts() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return {impl_->strangers.size() + impl_->members.size(), impl_->refused, impl_->evicted};
}

}  // namespace muster::rendezvous
