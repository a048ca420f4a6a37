// Deadlines: every blocking call in muster takes one.
#pragma once

#include <chrono>
#include <cstdint>

namespace muster {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;
using Millis = std::chrono::milliseconds;

// A deadline that never passes (c10d's kNoTimeout).
inline constexpr Deadline kNoDeadline = Deadline::max();

// A flag's seconds (--grace_period 2.5) as milliseconds, truncated.
inline Millis fromSeconds(double seconds) { return Millis(static_cast<int64_t>(seconds * 1000)); }

inline Deadline deadlineAfter(Millis timeout) {
  if (timeout.count() <= 0) return kNoDeadline;
  auto now = Clock::now();
  if (timeout > std::chrono::duration_cast<Millis>(kNoDeadline - now)) return kNoDeadline;
  return now + timeout;
}

// Milliseconds left until `deadline` (0 when passed); kNoDeadline gives 0 too, so callers
// test for kNoDeadline first.
inline int64_t millisLeft(Deadline deadline) {
  if (deadline == kNoDeadline) return 0;
  auto left = std::chrono::ceil<Millis>(deadline - Clock::now()).count();
  return left > 0 ? left : 0;
}

// A deadline as the wall clock's time point (what gRPC's deadlines are); kNoDeadline: never.
inline std::chrono::system_clock::time_point toSystem(Deadline deadline) {
  if (deadline == kNoDeadline) return std::chrono::system_clock::time_point::max();
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(deadline - Clock::now());
}

}  // namespace muster
