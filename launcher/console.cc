// ConsoleStream: blocking writes on a thread of their own, never on the event loop.
#include "launcher/console.h"

#include <unistd.h>

#include <cerrno>

namespace muster::launcher {

ConsoleStream::ConsoleStream(int fd, size_t capBytes) : state_(std::make_shared<State>()) {
  state_->fd = fd;
  state_->cap = capBytes;
  thread_ = std::thread(run, state_);
}

ConsoleStream::~ConsoleStream() {
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->stop = true;
  bool blocked = state_->writing;
  lock.unlock();
  state_->wake.notify_all();
  // A writer blocked on a reader that never reads would hold the join for ever: it keeps its
  // state and is left to the process's exit.
  if (blocked) {
    thread_.detach();
  } else {
    thread_.join();
  }
}

bool ConsoleStream::write(std::string data) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.gone) {
    s.dropped += data.size();
    return false;
  }
  if (s.queued + data.size() > s.cap) {
    s.dropped += data.size();
    return true;
  }
  s.queued += data.size();
  s.queue.push_back(std::move(data));
  s.wake.notify_one();
  return true;
}

size_t ConsoleStream::droppedBytes() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->dropped;
}

void ConsoleStream::drain(Millis timeout) {
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mu);
  s.idle.wait_for(lock, timeout, [&] { return s.gone || (s.queue.empty() && !s.writing); });
}

void ConsoleStream::run(std::shared_ptr<State> state) {
  State& s = *state;
  std::unique_lock<std::mutex> lock(s.mu);
  while (true) {
    s.wake.wait(lock, [&] { return s.stop || !s.queue.empty(); });
    if (s.queue.empty()) return;  // stopping, nothing left
    std::string chunk = std::move(s.queue.front());
    s.queue.pop_front();
    s.writing = true;
    lock.unlock();
    const char* p = chunk.data();
    size_t left = chunk.size();
    bool broken = false;
    while (left > 0) {
      ssize_t n = ::write(s.fd, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        broken = true;  // EPIPE (launch ignores SIGPIPE), or the stream is unusable
        break;
      }
      p += n;
      left -= static_cast<size_t>(n);
    }
    lock.lock();
    s.writing = false;
    s.queued -= chunk.size();
    if (broken) {
      s.gone = true;
      s.dropped += left;
      for (const auto& q : s.queue) s.dropped += q.size();
      s.queue.clear();
      s.queued = 0;
    }
    if (s.queue.empty()) s.idle.notify_all();
    if (s.stop && s.queue.empty()) return;
  }
}

}  // namespace muster::launcher
