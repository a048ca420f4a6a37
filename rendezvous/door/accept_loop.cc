#include "rendezvous/door/accept_loop.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace muster::rendezvous {

namespace asio = boost::asio;
using asio::ip::tcp;

AcceptLoop::AcceptLoop(asio::io_context& io, std::string name, std::shared_ptr<spdlog::logger> log)
    : acceptor_(io), retry_(io), name_(std::move(name)), log_(std::move(log)) {}

absl::Status AcceptLoop::adopt(int listenFd) {
  boost::system::error_code ec;
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getsockname(listenFd, reinterpret_cast<sockaddr*>(&addr), &len);
  acceptor_.assign(addr.ss_family == AF_INET6 ? tcp::v6() : tcp::v4(), listenFd, ec);
  if (!ec) acceptor_.non_blocking(true, ec);
  if (ec) {
    ::close(listenFd);
    return absl::InternalError(fmt::format("{}: cannot use socket {}: {}", name_, listenFd, ec.message()));
  }
  return absl::OkStatus();
}

void AcceptLoop::start(Handler onAccepted, std::weak_ptr<void> owner) {
  onAccepted_ = std::move(onAccepted);
  owner_ = std::move(owner);
  accept();
}

void AcceptLoop::close() {
  boost::system::error_code ec;
  acceptor_.close(ec);
  retry_.cancel();
}

void AcceptLoop::accept() {
  acceptor_.async_wait(tcp::acceptor::wait_read, [this, keep = owner_.lock()](boost::system::error_code ec) {
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    int fd = ec ? -1 : ::accept4(acceptor_.native_handle(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      int err = ec ? ec.value() : errno;
      if (!ec && (err == EAGAIN || err == EWOULDBLOCK || err == EINTR || err == ECONNABORTED)) {
        accept();
        return;
      }
      if (!errorLogged_) {
        log_->error("{}: cannot accept: {}; retrying every 100 ms", name_, std::strerror(err));
        errorLogged_ = true;
      }
      retry_.expires_after(std::chrono::milliseconds(100));
      retry_.async_wait([this, keep](boost::system::error_code e) {
        if (!e) accept();
      });
      return;
    }
    errorLogged_ = false;
    boost::system::error_code ignored;
    onAccepted_(fd, acceptor_.local_endpoint(ignored).protocol());
    accept();
  });
}

}  // namespace muster::rendezvous
