// AcceptLoop: the listening side that the store's two socket servers share (the TCPStore front
// and the direct path). One listening socket, served on one io_context: each connection is
// accepted with accept4 (close-on-exec, so it never leaks into a worker launch spawns at that
// moment; non-blocking) and handed over as a descriptor. A transient error (EAGAIN, EINTR, an
// aborted handshake) just accepts again; any other (out of descriptors, EMFILE) is logged once
// and retried every 100 ms: the listening socket is never left unserved.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>

#include <spdlog/spdlog.h>

#include "absl/status/status.h"

namespace muster::rendezvous {

class AcceptLoop {
 public:
  // `fd`: the accepted connection, now the handler's; `protocol`: the listening socket's, for
  // tcp::socket::assign.
  using Handler = std::function<void(int fd, boost::asio::ip::tcp protocol)>;

  // `name` starts its lines in `log` ("TCPStore front on port 29500").
  AcceptLoop(boost::asio::io_context& io, std::string name, std::shared_ptr<spdlog::logger> log);

  // Takes a bound, listening socket (net::listenTcp); closes it and says why when it cannot.
  absl::Status adopt(int listenFd);

  // Starts accepting on the io_context's thread. `owner`, when given, is kept alive by every
  // pending wait (the server whose member this loop is).
  void start(Handler onAccepted, std::weak_ptr<void> owner = {});

  // No more connections: closes the listening socket and cancels a pending retry. On the
  // io_context's thread, or before it runs.
  void close();

 private:
  void accept();

  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::steady_timer retry_;
  std::string name_;
  std::shared_ptr<spdlog::logger> log_;
  Handler onAccepted_;
  std::weak_ptr<void> owner_;
  bool errorLogged_ = false;
};

}  // namespace muster::rendezvous
