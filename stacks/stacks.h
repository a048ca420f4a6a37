// The stack roll-call's results: every thread's stack of every rank, read from what the
// ranks' handlers wrote (Python's faulthandler or the worker library's native handler, see
// common/contract.h), grouped by where the ranks are, and written as a report. launch takes
// them; rendezvousctl prints them; JSON carries them from node to node.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace muster::stacks {

struct Frame {
  std::string function;  // "train_step", "muster::worker::allReduce(at::Tensor&)"
  std::string file;      // Python: the source file; native: the module (program or library)
  int line = 0;          // Python: the line; native: 0
  std::string offset;    // native: "+0x1e" within the function (or the module), else ""
  bool native = false;
};

struct Thread {
  std::string id;       // "0x00007f3a5c1ff740" (Python), "12345" (native: the thread id)
  std::string name;     // native: /proc's comm; Python: ""
  bool current = false; // the thread that took the signal: the main thread
  std::vector<Frame> frames;  // innermost first
  std::string note;     // "did not answer", "Garbage-collecting", ...
};

enum class Answer {
  kAnswered,   // its stacks are below
  kNoHandler,  // it installed no handler: neither Python with the hook nor the worker library
  kNoAnswer,   // it did not answer within the deadline (stopped, stuck in the kernel)
  kGone,       // it had exited
};

struct RankStacks {
  int rank = -1, localRank = -1;
  pid_t pid = -1;
  std::string host;
  Answer answer = Answer::kAnswered;
  std::string kind;    // "python" or "native"
  std::string state;   // its /proc state and wait channel when it did not answer
  std::vector<Thread> threads;
};

// Parses one dump: faulthandler's "Thread 0x... (most recent call first):" blocks, or the
// native handler's "Thread TID (NAME) current:" blocks of backtrace_symbols_fd lines (C++
// names demangled). Lines it does not know are skipped.
std::vector<Thread> parseDump(std::string_view text);

// "all_reduce (distributed_c10d.py:1536)", "muster::stuck() (worker)".
std::string frameText(const Frame& frame, bool fullPath = false);

// A group: ranks whose main threads stand at the same frames (or that share an answer that is
// not a stack), and the line that says where.
struct Group {
  std::vector<int> ranks;  // indexes into the RankStacks given
  std::string where;       // "all_reduce (distributed_c10d.py:1536) <- train_step (train.py:88)"
};

// The groups, the smallest (the odd ones out) first, ties by lowest rank.
std::vector<Group> groupRanks(const std::vector<RankStacks>& ranks);
// "ranks 0,2,3: all_reduce (...) <- ...", "rank 1: ...".
std::string describeGroup(const std::vector<RankStacks>& ranks, const Group& group);

// "0,2-4,7".
std::string rankList(std::vector<int> ranks);

// The console's lines: one per group ("  ranks 0,2,3: ..."), with `reason` first.
std::string summary(const std::vector<RankStacks>& ranks, const std::string& reason);
// The whole report: each group once, with its first rank's every thread, then which ranks
// (pid, host) stand there.
std::string fullReport(const std::vector<RankStacks>& ranks, const std::string& reason);

nlohmann::json toJson(const std::vector<RankStacks>& ranks);
// Throws nlohmann::json::exception on JSON that is not toJson's.
std::vector<RankStacks> fromJson(const nlohmann::json& json);

}  // namespace muster::stacks
