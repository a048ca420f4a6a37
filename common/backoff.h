// Exponential back-off with jitter: the one retry schedule of muster's clients (the store
// client's reconnects, launch's join retries).
#pragma once

#include <algorithm>
#include <random>

#include "common/deadline.h"

namespace muster {

// Not thread-safe: one per retry loop.
class Backoff {
 public:
  Backoff(Millis first, Millis max) : first_(first), max_(max), base_(first) {}

  // The next pause: the current base, jittered to 0.5x..1.5x so that many clients spread out;
  // the base then doubles, up to the maximum.
  Millis next() {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    std::uniform_real_distribution<double> factor(0.5, 1.5);
    Millis pause(static_cast<int64_t>(static_cast<double>(base_.count()) * factor(rng)));
    base_ = std::min(max_, base_ * 2);
    return pause;
  }
  void reset() { base_ = first_; }

 private:
  Millis first_, max_, base_;
};

}  // namespace muster
