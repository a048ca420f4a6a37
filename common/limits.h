// The process's descriptor limit: servers take what the hard limit allows, since every
// connection (and every worker's pipe) is a descriptor.
#pragma once

#include <sys/resource.h>

#include <algorithm>
#include <cstddef>
#include <optional>

namespace muster {

// Raises the soft RLIMIT_NOFILE to the hard limit (systemd's LimitNOFILE=, ulimit -Hn), not the
// soft 1024 a shell gives. Returns the limit before, for children that should get it back;
// nullopt when nothing changed (already at the hard limit, or the kernel refused).
inline std::optional<rlimit> raiseDescriptorLimit() {
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) != 0 || files.rlim_cur >= files.rlim_max) return std::nullopt;
  rlimit before = files;
  files.rlim_cur = files.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &files) != 0) return std::nullopt;
  return before;
}

// The soft RLIMIT_NOFILE now (0 if it cannot be read).
inline rlim_t descriptorLimit() {
  rlimit files{};
  return getrlimit(RLIMIT_NOFILE, &files) == 0 ? files.rlim_cur : 0;
}

// Of `wanted` connections, those a server may hold and stay clear of the soft descriptor limit
// (each is a descriptor; the rest of the process needs some): 256 below it, or half of a small
// one.
inline size_t connectionRoom(size_t wanted) {
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) != 0 || files.rlim_cur == RLIM_INFINITY) return wanted;
  size_t room = files.rlim_cur > 512 ? files.rlim_cur - 256 : files.rlim_cur / 2;
  return std::min(wanted, room);
}

}  // namespace muster
