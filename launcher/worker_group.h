// One round's workers on this node: spawning them, carrying their output (console, files,
// prefixes, the last lines of stderr), seeing each exit the moment it happens, and signalling
// their process groups.
#pragma once

#include <sys/types.h>

#include <boost/asio.hpp>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "launcher/reaper.h"

namespace muster::launcher {

class ConsoleStream;

struct WorkerSpec {
  int localRank = 0;
  int globalRank = 0;
  std::vector<std::string> argv;           // argv[0] is an executable path
  std::map<std::string, std::string> env;  // the whole environment
  // Where each stream goes: to the console (with `prefix` on each line when not empty), to a
  // file, or both; stderr's last lines are kept either way.
  bool stdoutToConsole = true, stderrToConsole = true;
  std::string stdoutFile, stderrFile;  // "" for none
  std::string prefix;
  std::string errorFile;  // TORCHELASTIC_ERROR_FILE
  // --duplicate_std{out,err}_filters: lines containing any filter also go, with `prefix`, to
  // this file, which the workers of a round share ("" for none).
  std::string filteredStdoutFile, filteredStderrFile;
  std::vector<std::string> stdoutFilters, stderrFilters;
  // The roll-call's file (MUSTER_STACKS_FILE, in launch's runtime folder), "" for none, and
  // where it is copied in the log folder once the rank has answered a roll-call.
  std::string stacksFile, stacksLogCopy;
  // Both streams pass through launch, so that each line counts as progress (--hang_timeout).
  bool watchOutput = false;
};

struct WorkerExit {
  int code = -1;    // exit code, or -1 when a signal ended it
  int signal = 0;   // the signal, or 0
  std::chrono::steady_clock::time_point at;
  // As torchrun writes an exit: the code, or minus the signal.
  int torchrunCode() const { return signal != 0 ? -signal : code; }
};

// A worker as the group sees it.
struct WorkerState {
  WorkerSpec spec;
  pid_t pid = -1;
  std::chrono::steady_clock::time_point started;
  std::optional<WorkerExit> exit;
  std::deque<std::string> lastErrLines;  // the last kTailLines lines of stderr
  // Its last line of output through launch, and its last file-timer request (the epoch: none
  // yet), for rendezvousctl status.
  std::chrono::steady_clock::time_point lastOutput{}, lastTimer{};
  int openStreams = 0;                   // pipes not yet at EOF
  bool abandoned = false;                // given up on after SIGKILL (WorkerGroup::abandon)
  // The group got SIGKILL after its leader was reaped: nothing of it can be left, and its id
  // may now be reused by an unrelated process group, so it is never signalled again.
  bool groupDone = false;
};

// Thread-safety: everything runs on the io_context's thread. Lifetime: outlives its workers'
// pipes; the destructor SIGKILLs any process group still there.
class WorkerGroup {
 public:
  static constexpr size_t kTailLines = 20;
  using ExitHandler = std::function<void(const WorkerState&)>;

  // Where console output goes: launch's stdout and stderr, written off the event loop.
  struct Consoles {
    ConsoleStream* out = nullptr;
    ConsoleStream* err = nullptr;
  };
  // Output lost to a log file that could not be written.
  struct LogLoss {
    std::string error;
    size_t bytes = 0;
  };

  WorkerGroup(boost::asio::io_context& io, Reaper& reaper, ExitHandler onExit,
              Consoles consoles);
  ~WorkerGroup();

  // Starts every worker. On an error (one line naming the rank and the program), the workers
  // already started are killed.
  absl::Status start(std::vector<WorkerSpec> specs);

  // Sends `sig` to each process group that may still hold processes.
  void signalAll(int sig);
  // Reaps exited workers (call on SIGCHLD); runs the exit handler for each.
  void reap();

  bool allExited() const;
  // True for a worker of this group that has not been reaped yet.
  bool owns(pid_t pid) const;
  // All exited and every output pipe drained (so the last lines are complete).
  bool settled() const;
  const std::vector<std::unique_ptr<WorkerState>>& workers() const { return workers_; }

  const std::map<std::string, LogLoss>& logLosses() const { return logLosses_; }
  // Records output that could not be written to `file` (a warning the first time).
  void logLost(const std::string& file, int err, size_t bytes);

  // Gives up on what SIGKILL did not end (a process stuck in the kernel, state D): workers not
  // exited count as killed, output pipes still open are closed, and the group settles. Returns
  // one line per process still there: rank, pid, command, and its state from /proc.
  std::vector<std::string> abandon();

  // Called for output from any worker (progress).
  void onOutput(std::function<void()> callback) { outputCallback_ = std::move(callback); }
  // Called once, when settled() becomes true.
  void onSettled(std::function<void()> callback) { settledCallback_ = std::move(callback); }

 private:
  struct Pump;
  absl::Status startOne(WorkerSpec spec);
  void pump(std::shared_ptr<Pump> pump);
  void maybeSettled();

  boost::asio::io_context& io_;
  Reaper& reaper_;
  ExitHandler onExit_;
  std::vector<std::unique_ptr<WorkerState>> workers_;
  std::vector<std::weak_ptr<Pump>> pumps_;
  std::function<void()> settledCallback_;
  bool settledFired_ = false;
  std::function<void()> outputCallback_;
  std::map<std::string, std::shared_ptr<int>> filtered_;  // path -> descriptor, shared by pumps
  Consoles consoles_;
  std::map<std::string, LogLoss> logLosses_;
};

// Raises this process's soft descriptor limit to its hard limit (the store serves a connection
// per rank); workers started afterwards get the old soft limit back. Call before any thread.
void raiseFileLimit();

// "SIGTERM" for 15, "signal 77" for unknown numbers.
std::string signalName(int sig);

}  // namespace muster::launcher
