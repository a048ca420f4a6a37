// ControlSocket: one read of a line (bounded, with a deadline), the peer's credentials checked
// first.
#include "launcher/control_socket.h"

#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include "common/contract.h"
#include "common/log.h"

namespace muster::launcher {
namespace asio = boost::asio;
using local = asio::local::stream_protocol;

namespace {

auto logger() {
  static auto l = log::get("launch");
  return l;
}

constexpr size_t kMaxCommand = 256;

struct Client {
  Client(asio::io_context& io, local::socket s) : socket(std::move(s)), timer(io) {}
  local::socket socket;
  asio::steady_timer timer;
  asio::streambuf in{kMaxCommand};
};

void answer(std::shared_ptr<Client> c, std::string text) {
  auto data = std::make_shared<std::string>(std::move(text));
  asio::async_write(c->socket, asio::buffer(*data), [c, data](const boost::system::error_code&, size_t) {
    boost::system::error_code ignored;
    c->socket.shutdown(local::socket::shutdown_both, ignored);
    c->socket.close(ignored);
    c->timer.cancel();
  });
}

}  // namespace

absl::StatusOr<std::unique_ptr<ControlSocket>> ControlSocket::start(asio::io_context& io, Handler handler) {
  std::unique_ptr<ControlSocket> s(new ControlSocket(io, std::move(handler)));
  boost::system::error_code ec;
  local::endpoint at(contract::launchControlSocket(getpid()));
  s->acceptor_.open(at.protocol(), ec);
  if (!ec) s->acceptor_.bind(at, ec);
  if (!ec) s->acceptor_.listen(16, ec);
  if (ec) return absl::UnavailableError(fmt::format("cannot open launch's control socket: {}", ec.message()));
  s->accept();
  return s;
}

ControlSocket::ControlSocket(asio::io_context& io, Handler handler)
    : acceptor_(io), retry_(io), handler_(std::move(handler)) {}

ControlSocket::~ControlSocket() {
  *alive_ = false;
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  retry_.cancel();
}

void ControlSocket::accept() {
  acceptor_.async_accept([this, alive = alive_](const boost::system::error_code& ec, local::socket socket) {
    if (!*alive) return;
    if (ec) {
      if (ec == asio::error::operation_aborted) return;
      // Out of descriptors (EMFILE) or the like: try again in a moment, not in a busy loop.
      retry_.expires_after(std::chrono::milliseconds(100));
      retry_.async_wait([this, alive](const boost::system::error_code& e) {
        if (*alive && !e) accept();
      });
      return;
    }
    ucred peer{};
    socklen_t len = sizeof peer;
    if (getsockopt(socket.native_handle(), SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 ||
        (peer.uid != geteuid() && peer.uid != 0)) {
      logger()->warn("control socket: refused a client of uid {} (pid {})", peer.uid, peer.pid);
      accept();
      return;
    }
    auto c = std::make_shared<Client>(static_cast<asio::io_context&>(acceptor_.get_executor().context()),
                                      std::move(socket));
    c->timer.expires_after(std::chrono::seconds(10));
    c->timer.async_wait([c](const boost::system::error_code& e) {
      if (e) return;
      boost::system::error_code ignored;
      c->socket.close(ignored);  // a client that never says anything
    });
    asio::async_read_until(c->socket, c->in, '\n', [this, alive, c](const boost::system::error_code& e, size_t n) {
      if (!*alive || e) return;
      std::string command(asio::buffers_begin(c->in.data()), asio::buffers_begin(c->in.data()) + n - 1);
      c->timer.cancel();
      handler_(command, [c](std::string text) { answer(c, std::move(text)); });
    });
    accept();
  });
}

}  // namespace muster::launcher
