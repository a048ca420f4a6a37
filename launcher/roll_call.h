// The stack roll-call of this node's ranks: each rank's handler (common/contract.h) is sent
// the roll-call signal, and what it appends to its stacks file is read back, within a
// deadline. A rank with no handler, or that does not answer in time (stopped, stuck in the
// kernel), is reported with its /proc state and wait channel instead.
#pragma once

#include <sys/types.h>

#include <boost/asio.hpp>
#include <functional>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "stacks/stacks.h"

namespace muster::launcher {

struct RollCallTarget {
  int rank = -1, localRank = -1;
  pid_t pid = -1;           // the worker (its process group's leader)
  std::string stacksFile;   // MUSTER_STACKS_FILE
  std::string logCopy;      // where the file is copied once the rank has answered ("": nowhere)
};

// Calls `done` on the io_context's thread once every rank has answered or the deadline has
// passed; the results are in the targets' order. The io_context must outlive the call.
void rollCall(boost::asio::io_context& io, std::vector<RollCallTarget> targets, int signal, Millis deadline,
              const std::string& host, std::function<void(std::vector<stacks::RankStacks>)> done);

}  // namespace muster::launcher
