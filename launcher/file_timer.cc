// FileTimerServer: the FIFO is opened read-write, so that it never reads end-of-file between
// writers; a timer is armed for the earliest expiration.
#include "launcher/file_timer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "launcher/spawn.h"
#include "common/log.h"

namespace muster::launcher {
namespace asio = boost::asio;

namespace {

auto logger() {
  static auto l = log::get("launch");
  return l;
}

double epochSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

constexpr size_t kMaxLine = 65536;  // FileTimerClient writes at most PIPE_BUF bytes a request

}  // namespace

absl::StatusOr<std::unique_ptr<FileTimerServer>> FileTimerServer::start(asio::io_context& io, std::string path,
                                                                         Handlers handlers) {
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISFIFO(st.st_mode)) {
      return absl::FailedPreconditionError(fmt::format(
          "TORCHELASTIC_TIMER_FILE {} exists and is not a FIFO; name a new path", path));
    }
    unlink(path.c_str());
  }
  if (mkfifo(path.c_str(), 0600) != 0) {
    return absl::FailedPreconditionError(
        fmt::format("cannot make the file timer's FIFO {}: {}", path, errnoText(errno)));
  }
  int fd = open(path.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    unlink(path.c_str());
    return absl::FailedPreconditionError(fmt::format("cannot open the FIFO {}: {}", path, errnoText(err)));
  }
  return std::unique_ptr<FileTimerServer>(new FileTimerServer(io, std::move(path), fd, std::move(handlers)));
}

FileTimerServer::FileTimerServer(asio::io_context& io, std::string path, int fd, Handlers handlers)
    : path_(std::move(path)), fifo_(io, fd), timer_(io), handlers_(std::move(handlers)) {
  read();
}

FileTimerServer::~FileTimerServer() {
  *alive_ = false;
  boost::system::error_code ignored;
  fifo_.close(ignored);
  timer_.cancel();
  unlink(path_.c_str());
}

void FileTimerServer::read() {
  fifo_.async_read_some(asio::buffer(buffer_), [this, alive = alive_](const boost::system::error_code& ec, size_t n) {
    if (!*alive || ec) return;
    partial_.append(buffer_.data(), n);
    size_t start = 0, nl;
    while ((nl = partial_.find('\n', start)) != std::string::npos) {
      line(partial_.substr(start, nl - start));
      start = nl + 1;
    }
    partial_.erase(0, start);
    if (partial_.size() > kMaxLine) {
      logger()->warn("file timer: dropping {} bytes without a newline from {}", partial_.size(), path_);
      partial_.clear();
    }
    arm();
    read();
  });
}

void FileTimerServer::line(const std::string& text) {
  static log::OncePerSecond complaints;
  TimerRequest r;
  try {
    auto j = nlohmann::json::parse(text);
    r.pid = j.at("pid").get<pid_t>();
    r.scope = j.at("scope_id").get<std::string>();
    r.expiration = j.at("expiration_time").get<double>();
    r.signal = j.at("signal").get<int>();
    if (r.pid <= 0 || !std::isfinite(r.expiration)) throw std::invalid_argument("pid or expiration_time out of range");
  } catch (const std::exception& e) {
    if (complaints.pass()) {
      logger()->warn("file timer: ignoring a request that is not FileTimerClient's ({}): {:.200}", e.what(), text);
    }
    return;
  }
  if (handlers_.onRequest) handlers_.onRequest(r.pid);
  auto key = std::make_pair(r.pid, r.scope);
  if (r.expiration < 0) {
    timers_.erase(key);
  } else {
    timers_[key] = r;
  }
}

void FileTimerServer::arm() {
  if (timers_.empty()) {
    timer_.cancel();
    return;
  }
  double earliest = timers_.begin()->second.expiration;
  for (const auto& [key, r] : timers_) earliest = std::min(earliest, r.expiration);
  double wait = std::max(0.0, earliest - epochSeconds());
  timer_.expires_after(std::chrono::microseconds(static_cast<int64_t>(std::min(wait, 86400.0) * 1e6)));
  timer_.async_wait([this, alive = alive_](const boost::system::error_code& ec) {
    if (!*alive || ec) return;
    expire();
    arm();
  });
}

void FileTimerServer::expire() {
  double now = epochSeconds();
  // As torchrun: per process, the earliest expired timer that asks for a signal; every timer
  // of that process is then cleared.
  std::map<pid_t, TimerRequest> due;
  for (const auto& [key, r] : timers_) {
    if (r.expiration > now) continue;
    auto it = due.find(r.pid);
    if (it == due.end() || (r.signal > 0 && (it->second.signal <= 0 || r.expiration < it->second.expiration))) {
      due[r.pid] = r;
    }
  }
  for (const auto& [pid, r] : due) {
    for (auto it = timers_.begin(); it != timers_.end();) {
      it = it->first.first == pid ? timers_.erase(it) : std::next(it);
    }
    if (r.signal <= 0) {
      logger()->info("file timer '{}' of pid {} expired; it names no signal, so nothing is done", r.scope, pid);
      continue;
    }
    if (handlers_.onExpired) handlers_.onExpired(r);
  }
}

}  // namespace muster::launcher
