// launch's own stdout and stderr as the workers' output reaches them: a writer thread per
// stream with a bounded queue, so that a terminal or pipe that stops reading never stalls the
// event loop. A stalled reader costs memory up to the cap; past it lines are dropped and
// counted. A reader that has gone (EPIPE) is noticed, so that the workers can be told the
// same way (their pipe closes).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/deadline.h"

namespace muster::launcher {

// Thread-safety: write() from any thread; one writer thread per stream. Lifetime: create it
// after the orphan guard's fork (it starts a thread); the destructor waits for the queue to
// drain for at most the time given to drain() (default: none) and then drops the rest.
class ConsoleStream {
 public:
  explicit ConsoleStream(int fd, size_t capBytes = 64u << 20);
  ~ConsoleStream();
  ConsoleStream(const ConsoleStream&) = delete;
  ConsoleStream& operator=(const ConsoleStream&) = delete;

  // Queues `data`. False once the reader has gone: the caller stops sending.
  bool write(std::string data);
  // Bytes dropped because the queue was full, or because the reader had gone.
  size_t droppedBytes() const;
  // Waits until everything queued is written, the reader has gone, or `timeout` passes.
  void drain(Millis timeout);

 private:
  // Shared with the writer thread, which may outlive this object (detached while blocked in
  // write() on a reader that never reads).
  struct State {
    int fd = -1;
    size_t cap = 0;
    std::mutex mu;
    std::condition_variable wake, idle;
    std::deque<std::string> queue;  // guarded by mu
    size_t queued = 0, dropped = 0;
    bool writing = false, gone = false, stop = false;
  };
  static void run(std::shared_ptr<State> state);

  std::shared_ptr<State> state_;
  std::thread thread_;
};

}  // namespace muster::launcher
