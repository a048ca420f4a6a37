// Multi-node: a given --shared_dir must be one directory on every node. Group rank 0 writes a
// probe file into it; every node must read it back before any worker runs.
#pragma once

#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "common/deadline.h"

namespace muster::launcher {

struct SharedDirProbe {
  std::string endpoint, token;  // the rendezvous' store
  std::string tlsCaPem, tlsServerName;  // TLS to it, when tlsCaPem is not empty
  std::string storeNamespace;   // where the nodes exchange the probe's nonce and answers
  std::string file;             // the probe file, under the shared directory
  std::string sharedDir;        // for the message
  std::string nodeHost;         // this node, as named in the message
  int groupRank = 0, groupWorldSize = 1;
  Millis timeout{600000};
};

// Blocks (run it off the event loop) up to `probe.timeout`. Errors: FAILED_PRECONDITION naming
// the nodes that cannot see the file; the store's errors; CANCELLED soon after `cancelled` is
// set (every store call waits at most a fraction of a second at a time).
absl::Status probeSharedDir(const SharedDirProbe& probe, const std::atomic<bool>& cancelled);

}  // namespace muster::launcher
