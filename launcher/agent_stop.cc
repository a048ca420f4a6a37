// Agent: the coordinated stop. On a notice (--stop_notice, SIGUSR1 by default) to a job whose
// ranks ask stop_requested(step), launch freezes the round's stop board and posts its horizon as
// the stop step: every rank is told to stop at that step, and to go on at every step before it
// (common/stop_board.h); across nodes the step is agreed through the store (stop_agreement.h).
// The ranks save what they need and exit 0; launch exits kStoppedExit. Ranks not gone by
// --stop_timeout (a rank that never asks among ones that do) are stopped as a failure and named.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/contract.h"
#include "common/deadline.h"
#include "common/stop_board.h"
#include "launcher/agent.h"
#include "launcher/failure_report.h"
#include "launcher/slurm.h"
#include "launcher/stop_record.h"
#include "launcher/worker_group.h"

namespace muster::launcher {

std::string Agent::stopBoardPath() const {
  return (std::filesystem::path(layout_.runtimeDir) / fmt::format("stop-board-{}", at_.round)).string();
}

bool Agent::ranksAsk() {
  if (stopAware_ || stopBoard_.empty()) return stopAware_;
  if (auto board = stopboard::read(stopBoard_); board.ok()) {
    stopAware_ = std::any_of(board->asked.begin(), board->asked.end(), [](int64_t s) { return s != stopboard::kNone; });
  }
  return stopAware_;
}

bool Agent::requestStop(int sig) {
  bool notice = std::find(options_.stopNotice.begin(), options_.stopNotice.end(), sig) != options_.stopNotice.end();
  return notice && askStop(sig);
}

namespace {
// The signal a stop's reason is, or 0 (stopboard::kReason* are not signals).
int signalOf(int64_t reason) { return reason > 0 && reason < 1000 ? static_cast<int>(reason) : 0; }
}  // namespace

std::string Agent::stopCause(int64_t reason) {
  if (signalOf(reason) > 0) return "launch got " + signalName(signalOf(reason));
  if (reason == stopboard::kReasonDeadline) return "--stop_at's time came";
  return reasonName(reason);
}

bool Agent::askStop(int64_t reason) {
  if (stopping_ == Stopping::kDone || stopping_ == Stopping::kSignal) return false;
  std::string came = stopCause(reason);
  // The group restarts (it stops after a failure or another node's, or this node waits for the
  // next round): a job whose ranks ask keeps the notice for the next round.
  bool restarting = !stop_ && (!group_ || stopBoard_.empty() || stopping_ == Stopping::kFailure ||
                               stopping_ == Stopping::kRemote);
  if (restarting) {
    if (pendingStop_) {
      logger()->warn("{} again: the next round's ranks already stop at their first step", came);
      return true;
    }
    // A failure with no restart left (or a worker that could not be killed) ends the job: the
    // notice keeps its usual meaning.
    bool remote = stopping_ == Stopping::kRemote;
    bool nextRound = !stuck_ && (stopping_ == Stopping::kNo || (remote && remote_ == Remote::kWaiting) ||
                                 (at_.restartCount < options_.maxRestarts &&
                                  !(remote && remote_ == Remote::kGone && !standaloneService_)));
    if (!nextRound || !ranksAsk()) return false;  // today's handling
    pendingStop_ = reason;
    logger()->warn("{} while the group restarts: the next round's ranks stop at their first step "
                   "(stop_requested), and the job ends", came);
    // The next round must start within --stop_timeout: a join that does not come ends the job.
    if (options_.stopTimeoutS > 0) {
      stopTimer_.expires_after(fromSeconds(options_.stopTimeoutS));
      stopTimer_.async_wait([this](const boost::system::error_code& ec) {
        if (ec || !pendingStop_ || stopping_ == Stopping::kDone) return;
        std::fprintf(stderr, "launch: the stop on request (%s) could not be done: the next round did not start "
                     "within %g s (--stop_timeout)\n", reasonName(*pendingStop_).c_str(), options_.stopTimeoutS);
        if (multiNode_) report(false, "the stop on request could not be done: the next round did not start");
        finish(1);
      });
    }
    return true;
  }
  if (!group_ || stopBoard_.empty() || stopping_ != Stopping::kNo) return false;
  // One node: its ranks must be running. Across nodes a node whose ranks are done still passes
  // the notice on: the others' ranks run.
  if (!multiNode_ && group_->allExited()) return false;
  if (multiNode_ && !agreement_) return false;  // the agreement failed: the signal's usual meaning
  if (stop_) {
    if (stop_->step >= 0) {
      logger()->warn("{} again: the ranks already stop at step {}", came, stop_->step);
    } else {
      logger()->warn("{} again: the nodes are already agreeing on a stop step", came);
    }
    return true;
  }
  auto board = stopboard::read(stopBoard_);
  if (!board.ok()) {
    logger()->error("{} and cannot read the ranks' stop board: {}; handling it as without ranks that ask", came,
                    std::string(board.status().message()));
    return false;
  }
  stopAware_ = stopAware_ || std::any_of(board->asked.begin(), board->asked.end(),
                                         [](int64_t s) { return s != stopboard::kNone; });
  if (!stopAware_) return false;  // an unmodified script: today's handling
  stop_ = CoordinatedStop{.reason = reason, .at = std::chrono::steady_clock::now()};
  armStopTimer();
  if (agreement_) {
    // Every node's horizon makes the step: the request goes through the store, and this node
    // takes it as the others do (onStopRequested, then onStopAgreed).
    logger()->warn("{}: asking every node to stop at one step (stop_requested)", came);
    agreement_->request(reason);
    return true;
  }
  onStopRequested(reason);
  if (stop_ && stop_->frozenHorizon >= 0) onStopAgreed(stop_->frozenHorizon, reason);
  return true;
}

void Agent::armStopAt() {
  if (!stopAtUnixS_) return;
  auto left = std::chrono::seconds(*stopAtUnixS_) - std::chrono::system_clock::now().time_since_epoch();
  stopAtTimer_.expires_after(std::max<std::chrono::steady_clock::duration>(
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(left), std::chrono::steady_clock::duration::zero()));
  stopAtTimer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) onStopAt();
  });
}

void Agent::onStopAt() {
  // A stop already asked (or failed), or the job stopping by a signal: nothing left to ask.
  if (stopping_ == Stopping::kDone || stopping_ == Stopping::kSignal || stop_ || pendingStop_) return;
  if (askStop(stopboard::kReasonDeadline)) return;
  // No rank asks yet (still starting, between rounds before any asked, or an unmodified script):
  // asked again each second.
  if (!stopAtWaiting_) {
    stopAtWaiting_ = true;
    logger()->warn("--stop_at's time came, but no rank of the job asks stop_requested yet: asking again each second");
  }
  stopAtTimer_.expires_after(std::chrono::seconds(1));
  stopAtTimer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) onStopAt();
  });
}

void Agent::startPendingStop() {
  if (!pendingStop_ || stop_) return;
  int64_t reason = *pendingStop_;
  pendingStop_.reset();
  // The board is new: its horizon is 0 and no rank has asked. Frozen now, with the step posted
  // (here, or once the other nodes offered theirs), every rank is told to stop at its first ask.
  stop_ = CoordinatedStop{.reason = reason, .at = std::chrono::steady_clock::now()};
  armStopTimer();
  if (agreement_) {
    logger()->warn("asking every node to stop at the new round's first step ({} came while the group restarted)",
                   reasonName(reason));
    agreement_->request(reason);
    return;
  }
  onStopRequested(reason);
  if (stop_ && stop_->frozenHorizon >= 0) onStopAgreed(stop_->frozenHorizon, reason);
}

void Agent::armStopTimer() {
  if (options_.stopTimeoutS <= 0 || !stop_ || stop_->timerArmed) return;
  stop_->timerArmed = true;
  stopTimer_.expires_after(fromSeconds(options_.stopTimeoutS));
  stopTimer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) onStopTimeout(fmt::format("not every rank stopped within {} s (--stop_timeout)", options_.stopTimeoutS));
  });
}

void Agent::onStopRequested(int64_t reason) {
  if ((stop_ && stop_->frozenHorizon >= 0) || stopping_ == Stopping::kDone) return;
  if (!stop_) stop_ = CoordinatedStop{.reason = reason, .at = std::chrono::steady_clock::now()};
  auto frozen = stopboard::freeze(stopBoard_);
  if (!frozen.ok()) {
    onStopTimeout("cannot freeze the ranks' stop board: " + std::string(frozen.status().message()));
    return;
  }
  stop_->frozenHorizon = frozen->horizon;
  if (agreement_) {
    logger()->warn("the job is asked to stop ({}): this node's horizon is step {}; waiting for the other nodes'",
                   reasonName(reason), stop_->frozenHorizon);
    agreement_->offer(stop_->frozenHorizon);
  }
  if (group_ && !group_->allExited()) armStopTimer();
  publishStatus();
}

void Agent::onStopAgreed(int64_t step, int64_t reason) {
  if (!stop_ || stop_->step >= 0 || stopping_ == Stopping::kDone) return;
  auto posted = stopboard::post(stopBoard_, step, reason);
  if (!posted.ok()) {
    onStopTimeout(fmt::format("cannot post the stop step {} to the ranks' stop board: {}", step,
                              std::string(posted.status().message())));
    return;
  }
  stop_->step = posted->stopStep;
  logger()->warn("stopping on request ({}): every rank stops at {} (stop_requested); they have {} s to "
                 "exit (--stop_timeout)", reasonName(reason),
                 stop_->step == 0 ? std::string("the first step it asks") : fmt::format("step {}", stop_->step),
                 options_.stopTimeoutS);
  publishStatus();
}

void Agent::onStopAgreementFailed(const std::string& why) {
  logger()->error("the nodes cannot agree on a stop step: {}; notices now keep their usual meaning", why);
  // Its thread has ended (it posted this as its last act): destroying it waits for nothing.
  agreement_.reset();
  if (stop_) onStopTimeout("the nodes cannot agree on a stop step: " + why);
}

std::string Agent::reasonName(int64_t reason) {
  if (reason == stopboard::kReasonRequest) return "rendezvousctl stop";
  if (reason == stopboard::kReasonDeadline) return "--stop_at";
  if (signalOf(reason) > 0) return signalName(signalOf(reason)) + " to a node's launch";
  return fmt::format("reason {}", reason);
}

void Agent::onStopTimeout(const std::string& why) {
  if (!stop_ || stop_->failed || stopping_ != Stopping::kNo) return;
  stop_->failed = why;
  if (!group_ || group_->allExited()) return;
  std::vector<std::string> left;
  for (const auto& w : group_->workers()) {
    if (!w->exit) left.push_back(fmt::format("rank {} (local_rank {}, pid {})", w->spec.globalRank, w->spec.localRank, w->pid));
  }
  logger()->error("the stop on request failed: {}; {} rank(s) still running: {}", why, left.size(), fmt::join(left, ", "));
  stopping_ = Stopping::kSignal;
  stopSignal_ = SIGTERM;
  stopStarted_ = std::chrono::steady_clock::now();
  stopGroup(SIGTERM, "the stop on request failed");
  publishStatus();
}

int64_t Agent::stoppedStep() const {
  if (!stop_ || stop_->step < 0) return -1;
  int64_t step = stop_->step;
  // Step 0 is posted only before any rank asked (a notice kept over a restart): each rank
  // stopped at the first step it asked, the step the board holds for it.
  if (step == 0) {
    if (auto board = stopboard::read(stopBoard_); board.ok()) {
      for (int64_t s : board->asked) step = std::max(step, s);
    }
  }
  return step;
}

bool Agent::ranksStopped() const {
  if (!stop_ || stop_->step < 0 || stop_->frozenHorizon < 0) return false;
  auto board = stopboard::read(stopBoard_);
  if (!board.ok()) return true;  // cannot tell: as the stop said
  // A rank that reaches this node's frozen horizon must lock the board there (it was promised
  // only the steps below it), so its last ask is at least the horizon; one that ended before it
  // never got that far. (Past the horizon a rank may answer from the stop step it learned,
  // without asking again: its last ask is not the stop step.)
  int64_t h = stop_->frozenHorizon;
  return std::any_of(board->asked.begin(), board->asked.end(), [h](int64_t s) { return s >= h; });
}

void Agent::resumeFromStopRecord() {
  stopRecord_ = stopRecordPath(options_.stopRecord, layout_.ownSharedDir ? "" : layout_.sharedDir, layout_.runId);
  if (stopRecord_.empty()) return;
  auto record = readStopRecord(stopRecord_);
  if (record.status().code() == absl::StatusCode::kNotFound) return;
  if (!record.ok()) {
    logger()->error("{}; the ranks get no MUSTER_RESUMED_FROM_STEP", std::string(record.status().message()));
    return;
  }
  env_[contract::kResumedFromStep] = std::to_string(record->step);
  resumedFrom_ = record->step;
  logger()->warn("run '{}' resumes: it stopped at step {} on request ({}) at {}; the ranks get {}={} ({})",
                 record->runId, record->step, record->reason, localTimeText(record->unixMs / 1000),
                 contract::kResumedFromStep, record->step, stopRecord_);
}

void Agent::keepStopStep() {
  int64_t step = stoppedStep();
  if (!stopRecord_.empty() && step >= 0) {
    StopRecord record{.runId = layout_.runId,
                      .step = step,
                      .reason = signalOf(stop_->reason) > 0 ? signalName(signalOf(stop_->reason)) : reasonName(stop_->reason),
                      .unixMs = std::chrono::duration_cast<std::chrono::milliseconds>(
                                    std::chrono::system_clock::now().time_since_epoch())
                                    .count()};
    if (auto s = writeStopRecord(stopRecord_, record); s.ok()) {
      logger()->info("the stop step {} is kept in {}: the job's next start gives it to its ranks as {}", step,
                     stopRecord_, contract::kResumedFromStep);
    } else {
      logger()->error("the stop step {} is not kept for the next start: {}", step, std::string(s.message()));
    }
  }
  if (!options_.requeue || (multiNode_ && at_.groupRank != 0)) return;
  if (resumedFrom_ && step <= *resumedFrom_) {
    // A run that made no step since it resumed (a --stop_at already past) would come back
    // to stop again, forever.
    std::fprintf(stderr, "launch: not requeued (--requeue): the job stopped at step %lld, where it resumed\n",
                 static_cast<long long>(step));
    return;
  }
  if (auto s = requeueSlurmJob(options_.slurmJob); s.ok()) {
    std::fprintf(stderr, "launch: requeued Slurm job %s (--requeue): it comes back and resumes\n",
                 options_.slurmJob.c_str());
    logger()->info("requeued Slurm job {} (--requeue)", options_.slurmJob);
  } else {
    std::fprintf(stderr, "launch: could not requeue Slurm job %s (--requeue): %s\n", options_.slurmJob.c_str(),
                 std::string(s.message()).c_str());
  }
}

void Agent::forgetStopStep() {
  if (stopRecord_.empty()) return;
  std::error_code ec;
  if (std::filesystem::remove(stopRecord_, ec)) {
    logger()->info("the job succeeded: its stop record {} is removed (a next start begins afresh)", stopRecord_);
  }
}

void Agent::printStopSummary() const {
  if (!stop_ || !group_) return;
  // Which ranks never asked, as the board says now (a rank that asked late still asked).
  std::vector<int64_t> asked;
  if (auto board = stopboard::read(stopBoard_); board.ok()) asked = board->asked;
  size_t clean = 0;
  std::vector<std::string> not_clean;
  for (const auto& w : group_->workers()) {
    const auto& e = w->exit;
    if (e && e->code == 0 && e->signal == 0) {
      ++clean;
      continue;
    }
    int local = w->spec.localRank;
    bool never = local >= 0 && local < static_cast<int>(asked.size()) && asked[local] == stopboard::kNone;
    not_clean.push_back(fmt::format("rank {} (local_rank {}, pid {}) {}{}", w->spec.globalRank, local, w->pid,
                                    e ? describeExit(*e) : std::string("did not exit"),
                                    never ? ", never asked stop_requested" : ""));
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - stop_->at).count();
  int64_t step = stoppedStep();
  std::string at = stop_->step < 0   ? "before a stop step was agreed"
                   : stop_->step == 0 ? fmt::format("at step {} (the round's first)", step)
                                      : fmt::format("at step {}", step);
  std::string why = signalOf(stop_->reason) > 0 ? signalName(signalOf(stop_->reason)) : reasonName(stop_->reason);
  size_t all = group_->workers().size();
  if (stop_->failed) {
    std::fprintf(stderr, "launch: the stop %s on request (%s) failed: %s; %zu of %zu ranks stopped cleanly\n",
                 at.c_str(), why.c_str(), stop_->failed->c_str(), clean, all);
  } else {
    std::fprintf(stderr, "launch: stopped %s on request (%s); %zu of %zu ranks stopped cleanly in %.3f s\n",
                 at.c_str(), why.c_str(), clean, all, secs);
  }
  for (const auto& line : not_clean) std::fprintf(stderr, "launch:   %s\n", line.c_str());
  logger()->info("{} {} on request ({}): {} of {} ranks stopped cleanly", stop_->failed ? "the stop failed" : "stopped",
                 at, why, clean, all);
}

}  // namespace muster::launcher
