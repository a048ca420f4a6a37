// launch's control socket (common/contract.h's launchControlSocket): takes a one-line command
// from a local client of launch's own user (or root) and writes the answer back.
#pragma once

#include <boost/asio.hpp>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace muster::launcher {

// Thread-safety: the io_context's thread. Lifetime: closes its listener and clients with it.
class ControlSocket {
 public:
  // `reply` may be called later, once; the connection closes after it.
  using Handler = std::function<void(const std::string& command, std::function<void(std::string)> reply)>;
  // Errors: UNAVAILABLE when the name is taken or the socket cannot be made.
  static absl::StatusOr<std::unique_ptr<ControlSocket>> start(boost::asio::io_context& io, Handler handler);
  ~ControlSocket();

 private:
  ControlSocket(boost::asio::io_context& io, Handler handler);
  void accept();

  boost::asio::local::stream_protocol::acceptor acceptor_;
  boost::asio::steady_timer retry_;
  Handler handler_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace muster::launcher
