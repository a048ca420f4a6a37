// heapFigures: mallinfo2, or the sanitizer's allocation hooks.
#include "rendezvous/server/heap_figures.h"

#include <malloc.h>

#include <atomic>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MUSTER_HEAP_HOOKS 1
// compiler-rt's sanitizer/allocator_interface.h, which GCC does not install; GCC's libasan and
// libtsan export them.
extern "C" {
size_t __sanitizer_get_current_allocated_bytes();
size_t __sanitizer_get_allocated_size(const volatile void* p);
int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void*, size_t),
                                              void (*free_hook)(const volatile void*));
}
#endif

namespace muster::rendezvous {

#ifdef MUSTER_HEAP_HOOKS
namespace {

// Counted from the hooks' install (at this file's static initialisation) on, from the sanitizer's
// own count then. Hooks run on every allocating thread and must not allocate.
std::atomic<uint64_t> live{0};
std::atomic<uint64_t> peak{0};

void onMalloc(const volatile void*, size_t size) {
  uint64_t now = live.fetch_add(size, std::memory_order_relaxed) + size;
  uint64_t seen = peak.load(std::memory_order_relaxed);
  while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}

// The sanitizer calls the free hook before it frees the chunk, so its size can still be asked.
void onFree(const volatile void* p) {
  uint64_t size = __sanitizer_get_allocated_size(p);
  uint64_t now = live.load(std::memory_order_relaxed);
  // A chunk from before the install that the starting count did not hold: never below zero.
  while (!live.compare_exchange_weak(now, now > size ? now - size : 0, std::memory_order_relaxed)) {
  }
}

const bool installed = [] {
  uint64_t start = __sanitizer_get_current_allocated_bytes();
  live.store(start);
  peak.store(start);
  return __sanitizer_install_malloc_and_free_hooks(onMalloc, onFree) != 0;
}();

}  // namespace

HeapFigures heapFigures() {
  HeapFigures h;
  h.now = installed ? live.load() : __sanitizer_get_current_allocated_bytes();
  if (installed) h.peak = peak.load();
  return h;
}

#else

HeapFigures heapFigures() {
  struct mallinfo2 m = mallinfo2();
  return HeapFigures{m.uordblks + m.hblkhd, std::nullopt};
}

#endif

}  // namespace muster::rendezvous
