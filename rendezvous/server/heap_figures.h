// What the daemon's allocations hold, now and at their peak, for its metrics.
#pragma once

#include <cstdint>
#include <optional>

namespace muster::rendezvous {

struct HeapFigures {
  uint64_t now = 0;               // bytes the allocations hold now
  std::optional<uint64_t> peak;  // their most since the process began, where it is known
};

// glibc's in-use bytes (small chunks and mmap'd ones), with no peak: glibc has no allocation
// hooks. Under ASan or TSan (tests/sanitize.sh), whose allocator replaces glibc's and keeps memory
// of its own (quarantine, shadow, per-thread caches) that the resident set counts: the bytes asked
// for, counted by the sanitizer's allocation hooks, and their peak, so that a test bounds what
// our code holds rather than the sanitizer's bookkeeping.
HeapFigures heapFigures();

}  // namespace muster::rendezvous
