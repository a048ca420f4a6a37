// stopRequested(): the rank's side of the stop board (stop_request.h).
#include "worker/stop_request.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "common/contract.h"
#include "common/stop_board.h"

namespace muster::worker {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kMaxAhead = 256;  // steps a rank may be promised past its own at one ask

// What this process knows of the board: the file, its slot, and the answers it may reuse.
struct Asker {
  std::mutex mu;
  bool opened = false;
  int fd = -1;  // -1: not under launch's board
  int slot = 0;
  int64_t horizon = 0;  // steps below go on without asking (the horizon only grows)
  int64_t stopStep = stopboard::kNone;
  int64_t callsSince = 0;  // calls since windowStart
  Clock::time_point windowStart;
  int64_t ahead = 1;
};

Asker& asker() {
  static Asker* a = new Asker();  // never destroyed: a rank may ask from a thread at exit
  return *a;
}

// Opens the board launch named, once it can: an error is thrown again at the next call.
void openBoard(Asker& a) {
  const char* path = std::getenv(contract::kStopFile);
  if (path == nullptr || *path == '\0') {
    a.opened = true;
    return;
  }
  const char* slotVar = std::getenv(contract::kStopSlot);
  char* end = nullptr;
  long slot = slotVar ? std::strtol(slotVar, &end, 10) : -1;
  if (slotVar == nullptr || *slotVar == '\0' || *end != '\0' || slot < 0 || slot >= stopboard::kMaxSlots) {
    throw std::runtime_error(fmt::format("stopRequested: {} is set but {} is not a slot ({})", contract::kStopFile,
                                         contract::kStopSlot, slotVar ? slotVar : "unset"));
  }
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    throw std::runtime_error(fmt::format("stopRequested: cannot open the stop board {}='{}': {}",
                                         contract::kStopFile, path, std::strerror(errno)));
  }
  a.fd = fd;
  a.slot = static_cast<int>(slot);
  a.opened = true;
}

// Calls this rank makes in about a millisecond: how many steps it asks the horizon to move (a
// fast loop locks the board about once a millisecond, a slow one every step). Measured over a
// window of at least a millisecond of calls, counted by calls (not steps: a loop that skips
// steps is not taken for a fast one).
int64_t aheadOf(Asker& a, Clock::time_point now) {
  double ms = std::chrono::duration<double, std::milli>(now - a.windowStart).count();
  if (a.windowStart == Clock::time_point{} || ms >= 1.0) {
    if (a.windowStart != Clock::time_point{}) {
      a.ahead = std::clamp<int64_t>(static_cast<int64_t>(static_cast<double>(a.callsSince) / ms), 1, kMaxAhead);
    }
    a.windowStart = now;
    a.callsSince = 0;
  }
  return a.ahead;
}

}  // namespace

bool stopRequested(int64_t step) {
  if (step < 0) throw std::runtime_error(fmt::format("stopRequested: a step of {}: steps count from 0", step));
  Asker& a = asker();
  std::unique_lock lock(a.mu);
  if (!a.opened) openBoard(a);
  if (a.fd < 0) return false;
  if (a.stopStep != stopboard::kNone) return step >= a.stopStep;
  ++a.callsSince;
  if (step < a.horizon) return false;
  while (true) {
    auto now = Clock::now();
    auto asked = stopboard::ask(a.fd, a.slot, step, aheadOf(a, now));
    if (!asked.ok()) throw std::runtime_error("stopRequested: " + std::string(asked.status().message()));
    a.stopStep = asked->stopStep;
    if (asked->answer != stopboard::Answer::kWait) {
      if (a.stopStep == stopboard::kNone) a.horizon = std::max(a.horizon, asked->horizon);
      return asked->answer == stopboard::Answer::kStop;
    }
    // Launch is choosing the stop step (at this step or before it): ask again shortly.
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    lock.lock();
    if (a.stopStep != stopboard::kNone) return step >= a.stopStep;
  }
}

std::optional<int64_t> resumedFromStep() {
  const char* text = std::getenv(contract::kResumedFromStep);
  if (text == nullptr) return std::nullopt;
  int64_t step = 0;
  const char* end = text + std::strlen(text);
  auto [at, ec] = std::from_chars(text, end, step);
  if (*text == '\0' || ec != std::errc() || at != end || step < 0) {
    throw std::runtime_error(fmt::format("{}='{}' is not a step", contract::kResumedFromStep, text));
  }
  return step;
}

}  // namespace muster::worker
