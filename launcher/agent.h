// The agent: one per node. Hosts the store (node 0), runs rounds of workers, stops them on a
// failure or a signal, restarts within --max_restarts, and reports the root cause.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio.hpp>

#include "launcher/options.h"
#include "launcher/reaper.h"
#include "launcher/worker_group.h"
#include "rendezvous/store_server.h"

namespace muster::launcher {

// Lifetime: run() once. Thread-safety: run() owns the calling thread; everything happens on
// its io_context.
class Agent {
 public:
  Agent(LaunchOptions options, std::map<std::string, std::string> env,
        std::vector<std::string> command);
  ~Agent();

  // Runs the job to its end and returns launch's exit code: 0 when every worker succeeded,
  // 1 when workers failed (after the restarts), 128+N when launch got signal N, 1 when launch
  // itself could not run (the reason is logged).
  int run();

 private:
  struct Failure {
    int globalRank, localRank;
    pid_t pid;
    WorkerExit exit;
    std::string errorFile;       // "" when the worker wrote none
    std::string errorMessage;    // from the error file
    std::vector<std::string> lastLines;
    std::chrono::system_clock::time_point when;
  };

  absl::Status prepare();
  absl::Status startRound();
  std::vector<WorkerSpec> roundSpecs();
  void onWorkerExit(const WorkerState& worker);
  void stopGroup(int sig, const std::string& why);
  void onRoundSettled();
  void finish(int code);
  void armSignals();
  void printFailureReport() const;
  Failure describe(const WorkerState& worker) const;

  LaunchOptions options_;
  std::map<std::string, std::string> env_;
  std::vector<std::string> command_;
  boost::asio::io_context io_;
  boost::asio::signal_set signals_;
  boost::asio::steady_timer graceTimer_;
  boost::asio::steady_timer drainTimer_;
  Reaper reaper_;
  std::unique_ptr<rendezvous::StoreServer> store_;
  std::unique_ptr<WorkerGroup> group_;

  std::string runId_;
  std::string jobId_;  // the run directory's name: unique per job, shared dir subfolder
  std::string masterAddr_;
  int masterPort_ = 0;
  std::string baseLogDir_;
  bool ownBaseLogDir_ = false;
  std::string runDir_;
  std::string sharedDir_;
  bool ownSharedDir_ = false;
  std::string tokenFile_;
  int restartCount_ = 0;
  int groupRank_ = 0;
  int groupWorldSize_ = 1;
  int worldSize_ = 1;

  enum class Stopping { kNo, kFailure, kSignal, kDone };
  Stopping stopping_ = Stopping::kNo;
  int stopSignal_ = 0;
  int rootLocalRank_ = -1;
  std::optional<Failure> rootCause_;
  std::vector<Failure> failures_;
  std::chrono::steady_clock::time_point stopStarted_;
  std::chrono::steady_clock::time_point roundStarted_;
  int exitCode_ = 1;
};

}  // namespace muster::launcher
