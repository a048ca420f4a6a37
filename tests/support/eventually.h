// A bounded wait for state another thread changes, with no event to wait on (a server's clean-up
// of a connection, a cancelled call). Without gtest: the fuzz targets use it too.
#pragma once

#include <chrono>
#include <functional>
#include <thread>

#include "common/deadline.h"

namespace muster::testing {

// Polls `condition` every `poll` until it holds (true) or `timeout` has passed (false).
inline bool eventually(const std::function<bool()>& condition, Millis timeout = Millis(10000),
                       std::chrono::microseconds poll = std::chrono::microseconds(2000)) {
  auto deadline = Clock::now() + timeout;
  while (!condition()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(poll);
  }
  return true;
}

}  // namespace muster::testing
