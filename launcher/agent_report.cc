// Agent: what a round leaves to be read: the failure summary (launch's root cause, then
// torchrun's block) and torchelastic's events, as torchrun writes them.
#include "launcher/agent.h"

#include <filesystem>

#include <fmt/format.h>

#include "common/net.h"
#include "launcher/console.h"
#include "launcher/events.h"

namespace muster::launcher {
namespace fs = std::filesystem;

void Agent::printFailureReport() const {
  // torchrun's @record hands the root cause's error file to whoever set TORCHELASTIC_ERROR_FILE
  // for it (a scheduler); the workers' own variable is theirs (worker_specs).
  if (auto dest = env_.find("TORCHELASTIC_ERROR_FILE");
      rootCause_ && dest != env_.end() && !dest->second.empty()) {
    if (auto s = handOverErrorFile(*rootCause_, dest->second); !s.ok()) {
      logger()->error("{}", std::string(s.message()));
    } else if (!rootCause_->errorFile.empty()) {
      logger()->info("rank {}'s error file copied to {} (TORCHELASTIC_ERROR_FILE)",
                     rootCause_->globalRank, dest->second);
    }
  }
  std::string out = failureReport(options_.program, rootCause_, failures_,
                                  net::canonicalHostName(), options_.torchrun);
  if (!rootCause_ && !hangWhy_.empty()) out = fmt::format("launch: root cause: the job hung: {}\n", hangWhy_) + out;
  std::fwrite(out.data(), 1, out.size(), stderr);
  std::fflush(stderr);
}

void Agent::emit(ElasticEvent e) const {
  if (options_.eventLogHandler != "console") return;
  e.runId = layout_.runId;
  e.role = options_.role;
  e.hostname = net::canonicalHostName();
  e.rdzvBackend = options_.rdzvBackend;
  e.agentRestarts = at_.restartCount;
  e.entryPoint = fs::path(command_.empty() ? "" : command_[0]).filename().string();
  if (e.groupKnown && !e.groupRank) e.groupRank = at_.groupRank;
  if (e.groupKnown && !e.groupWorldSize) e.groupWorldSize = at_.groupWorldSize;
  e.totalRunTimeS = std::chrono::duration<double>(std::chrono::steady_clock::now() - launched_).count();
  std::string line = eventLine(e) + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

// torchelastic records RENDEZVOUS and ASSIGN_WORKER_RANKS with the group rank and size the
// agent held before them: none before its first round.
void Agent::emitRendezvousEvents(double durationMs) {
  for (const char* state : {"RENDEZVOUS", "ASSIGN_WORKER_RANKS"}) {
    ElasticEvent e;
    e.state = state;
    e.durationMs = durationMs;
    durationMs = 0.0;
    e.groupKnown = shownGroup_.has_value();
    if (shownGroup_) std::tie(e.groupRank, e.groupWorldSize) = *shownGroup_;
    emit(e);
  }
}

// As torchelastic's agent: START for each worker as it starts (no pid or exit code yet); at the
// round's end each worker's state with the round's: a worker that exited non-zero (launch's
// SIGTERM too) is FAILED with its error file's JSON ({"message": "<NONE>"} without one), its
// exit code and pid; one that exited 0 is SUCCEEDED, or TERMINATED when the round failed.
void Agent::emitWorkerEvents() {
  if (!group_) return;
  shownGroup_ = {at_.groupRank, at_.groupWorldSize};
  if (options_.eventLogHandler != "console") return;
  bool roundFailed = false;
  for (const auto& w : group_->workers()) {
    if (w->exit && (w->exit->code != 0 || w->exit->signal != 0)) roundFailed = true;
  }
  for (const auto& w : group_->workers()) {
    ElasticEvent e;
    e.fromWorker = true;
    e.globalRank = w->spec.globalRank;
    e.localRank = w->spec.localRank;
    e.roleRank = at_.roleWorldSize > 0 ? at_.roleRankOffset + w->spec.localRank : w->spec.globalRank;
    e.roleWorldSize = at_.roleWorldSize > 0 ? at_.roleWorldSize : at_.worldSize;
    e.workerId = w->pid;
    if (!w->exit) {
      e.state = "START";
    } else if (w->exit->code == 0 && w->exit->signal == 0) {
      e.state = roundFailed ? "TERMINATED" : "SUCCEEDED";
    } else {
      const WorkerExit& x = *w->exit;
      e.state = "FAILED";
      e.exitCode = x.torchrunCode();
      e.workerPid = w->pid;
      e.rawError = eventRawError(w->spec.errorFile, *e.exitCode, options_.torchrun);
    }
    emit(e);
  }
}

}  // namespace muster::launcher
