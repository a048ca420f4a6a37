// torchrun's file-based watchdog (TORCHELASTIC_ENABLE_FILE_TIMER=1): a FIFO the workers'
// FileTimerClient writes acquire and release requests to, one JSON line each ({"version": 1,
// "pid", "scope_id", "expiration_time" (seconds since the epoch; negative: release),
// "signal"}). An expired timer's process gets the signal it asked for, as under torchrun;
// launch is told first, so that it can take that rank's stacks and name the scope. Any
// request is progress (--hang_timeout); the worker library's heartbeats come the same way.
#pragma once

#include <sys/types.h>

#include <boost/asio.hpp>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace muster::launcher {

struct TimerRequest {
  pid_t pid = 0;
  std::string scope;
  double expiration = 0;  // seconds since the epoch
  int signal = 0;
};

// Thread-safety: the io_context's thread. Lifetime: the FIFO is removed with the server.
class FileTimerServer {
 public:
  struct Handlers {
    std::function<void(pid_t)> onRequest;             // any well-formed request
    std::function<void(const TimerRequest&)> onExpired;  // the timer to act on, one per process
  };
  // Makes the FIFO at `path` (mode 0600; a FIFO already there is replaced, anything else is
  // an error naming it) and reads it. Errors: FAILED_PRECONDITION, one line.
  static absl::StatusOr<std::unique_ptr<FileTimerServer>> start(boost::asio::io_context& io,
                                                                 std::string path, Handlers handlers);
  ~FileTimerServer();

  const std::string& path() const { return path_; }
  // Timers still set (tests, logs).
  size_t pending() const { return timers_.size(); }

 private:
  FileTimerServer(boost::asio::io_context& io, std::string path, int fd, Handlers handlers);
  void read();
  void line(const std::string& text);
  void arm();
  void expire();

  std::string path_;
  boost::asio::posix::stream_descriptor fifo_;
  boost::asio::steady_timer timer_;
  Handlers handlers_;
  std::map<std::pair<pid_t, std::string>, TimerRequest> timers_;
  std::string partial_;
  std::array<char, 8192> buffer_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace muster::launcher
