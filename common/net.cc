#include "common/net.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>

#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/host_name.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/udp.hpp>

namespace muster::net {
namespace asio = boost::asio;

std::string routeAddress(const std::string& host, int port) {
  if (host.empty()) return "";
  // A UDP connect chooses the route and the local address and sends nothing.
  asio::io_context io;
  boost::system::error_code ec;
  asio::ip::udp::resolver resolver(io);
  auto found = resolver.resolve(host, std::to_string(port), ec);
  if (ec || found.empty()) return "";
  asio::ip::udp::socket socket(io);
  for (const auto& entry : found) {
    socket.close(ec);
    socket.connect(entry.endpoint(), ec);
    if (ec) continue;
    auto local = socket.local_endpoint(ec);
    if (ec) continue;
    if (local.address().is_v6()) {
      // Without a link-local scope ("%eth0"): other hosts name the address, not our interface.
      auto v6 = local.address().to_v6();
      v6.scope_id(0);
      return v6.to_string();
    }
    return local.address().to_string();
  }
  return "";
}

std::string hostName() {
  boost::system::error_code ec;
  std::string name = asio::ip::host_name(ec);
  return ec ? std::string("localhost") : name;
}

const std::string& canonicalHostName() {
  // CPython's socket.getfqdn(): gethostbyaddr() of the host's name (its first address, then
  // that address's entry), the first of the entry's name and aliases with a dot, else its name.
  // With "127.0.0.1 localhost" first in /etc/hosts, a host listed on 127.0.0.1 is "localhost".
  static const std::string name = []() -> std::string {
    std::string host = hostName();
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) return host;
    const void* addr = nullptr;
    socklen_t len = 0;
    int family = found->ai_family;
    if (family == AF_INET) {
      addr = &reinterpret_cast<const sockaddr_in*>(found->ai_addr)->sin_addr;
      len = sizeof(in_addr);
    } else if (family == AF_INET6) {
      addr = &reinterpret_cast<const sockaddr_in6*>(found->ai_addr)->sin6_addr;
      len = sizeof(in6_addr);
    }
    std::string result = host;
    if (addr != nullptr) {
      hostent entry{}, *got = nullptr;
      std::string buf(16384, '\0');
      int err = 0;
      if (gethostbyaddr_r(addr, len, family, &entry, buf.data(), buf.size(), &got, &err) == 0 &&
          got != nullptr && got->h_name != nullptr) {
        result = got->h_name;
        if (result.find('.') == std::string::npos) {
          for (char** alias = got->h_aliases; alias != nullptr && *alias != nullptr; ++alias) {
            if (std::strchr(*alias, '.') != nullptr) {
              result = *alias;
              break;
            }
          }
        }
      }
    }
    freeaddrinfo(found);
    return result;
  }();
  return name;
}

int freeTcpPort() {
  asio::io_context io;
  boost::system::error_code ec;
  asio::ip::tcp::acceptor acceptor(io);
  asio::ip::tcp::endpoint any(asio::ip::tcp::v4(), 0);
  acceptor.open(any.protocol(), ec);
  if (!ec) acceptor.bind(any, ec);
  if (ec) return 0;
  auto bound = acceptor.local_endpoint(ec);
  return ec ? 0 : bound.port();
}

bool isLocalHost(const std::string& host) {
  return isLoopback(host) || host == hostName() || host == canonicalHostName();
}

std::string joinHostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos && host.front() != '[') {
    return "[" + host + "]:" + std::to_string(port);
  }
  return host + ":" + std::to_string(port);
}

std::optional<HostPort> splitHostPort(std::string_view text) {
  std::string_view host = text, port;
  bool hasPort = false;
  if (!text.empty() && text.front() == '[') {
    size_t close = text.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    host = text.substr(1, close - 1);
    std::string_view rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return std::nullopt;
      port = rest.substr(1);
      hasPort = true;
    }
  } else if (size_t colon = text.find(':'); colon != std::string_view::npos) {
    if (text.find(':', colon + 1) != std::string_view::npos) return std::nullopt;
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    hasPort = true;
  }
  if (host.empty()) return std::nullopt;
  HostPort out{std::string(host), std::nullopt};
  if (hasPort) {
    int value = 0;
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (port.empty() || ec != std::errc() || end != port.data() + port.size() || value < 0 ||
        value > 65535) {
      return std::nullopt;
    }
    out.port = value;
  }
  return out;
}

namespace {

int bindListen(const sockaddr* addr, socklen_t len, int backlog, bool dualStack, int& err) {
  int fd = socket(addr->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    err = errno;
    return -1;
  }
  int one = 1, zero = 0;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (addr->sa_family == AF_INET6) {
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, dualStack ? &zero : &one, sizeof(int));
  }
  if (bind(fd, addr, len) != 0 || listen(fd, backlog) != 0) {
    err = errno;
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

int listenTcp(const std::string& host, int port, std::string& why, int backlog) {
  int err = 0;
  if (host.empty() || host == "0.0.0.0" || host == "::") {
    // Every address: one dual-stack IPv6 socket, or IPv4 alone on a host without IPv6.
    sockaddr_in6 any6{};
    any6.sin6_family = AF_INET6;
    any6.sin6_addr = in6addr_any;
    any6.sin6_port = htons(static_cast<uint16_t>(port));
    int fd = bindListen(reinterpret_cast<sockaddr*>(&any6), sizeof(any6), backlog, true, err);
    if (fd >= 0) return fd;
    if (err == EADDRINUSE || host == "::") {
      why = joinHostPort(host.empty() ? "0.0.0.0" : host, port) + ": " + std::strerror(err);
      return -1;
    }
    sockaddr_in any4{};
    any4.sin_family = AF_INET;
    any4.sin_addr.s_addr = htonl(INADDR_ANY);
    any4.sin_port = htons(static_cast<uint16_t>(port));
    fd = bindListen(reinterpret_cast<sockaddr*>(&any4), sizeof(any4), backlog, false, err);
    if (fd < 0) why = joinHostPort("0.0.0.0", port) + ": " + std::strerror(err);
    return fd;
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0) {
    why = "cannot resolve '" + host + "': " + gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (addrinfo* ai = res; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = bindListen(ai->ai_addr, ai->ai_addrlen, backlog, false, err);
  }
  freeaddrinfo(res);
  if (fd < 0) why = joinHostPort(host, port) + ": " + std::strerror(err);
  return fd;
}

int boundPort(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return 0;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return 0;
}

bool isLoopback(const std::string& address) {
  if (address == "localhost") return true;
  boost::system::error_code ec;
  auto parsed = asio::ip::make_address(address, ec);
  return !ec && parsed.is_loopback();
}

}  // namespace muster::net
