// Agent: the coordinated stop. On a notice (--stop_notice, SIGUSR1 by default) to a job whose
// ranks ask stop_requested(step), launch freezes the round's stop board and posts its horizon as
// the stop step: every rank is told to stop at that step, and to go on at every step before it
// (common/stop_board.h). The ranks save what they need and exit 0; launch exits kStoppedExit.
// Ranks that never asked get the notice as before; ranks not gone by --stop_timeout are stopped
// as a failure and named.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/deadline.h"
#include "common/stop_board.h"
#include "launcher/stop_agreement.h"
#include "launcher/agent.h"
#include "launcher/failure_report.h"
#include "launcher/worker_group.h"

namespace muster::launcher {

std::string Agent::stopBoardPath() const {
  return (std::filesystem::path(layout_.runtimeDir) / fmt::format("stop-board-{}", at_.round)).string();
}

bool Agent::requestStop(int sig) {
  bool notice = std::find(options_.stopNotice.begin(), options_.stopNotice.end(), sig) != options_.stopNotice.end();
  if (!notice || !group_ || group_->allExited() || stopBoard_.empty() || stopping_ != Stopping::kNo) return false;
  if (stop_) {
    if (stop_->step >= 0) {
      logger()->warn("launch got {} again: the ranks already stop at step {}", signalName(sig), stop_->step);
    } else {
      logger()->warn("launch got {} again: the nodes are already agreeing on a stop step", signalName(sig));
    }
    return true;
  }
  auto board = stopboard::read(stopBoard_);
  if (!board.ok()) {
    logger()->error("launch got {} and cannot read the ranks' stop board: {}; handling it as a plain signal",
                    signalName(sig), std::string(board.status().message()));
    return false;
  }
  bool asked = std::any_of(board->asked.begin(), board->asked.end(), [](int64_t s) { return s != stopboard::kNone; });
  if (!asked) return false;  // an unmodified script: today's handling
  if (agreement_) {
    // Every node's horizon makes the step: the request goes through the store, and this node
    // takes it as the others do (onStopRequested, then onStopAgreed).
    logger()->warn("launch got {}: asking every node to stop at one step (stop_requested)", signalName(sig));
    agreement_->request(sig);
    return true;
  }
  onStopRequested(sig);
  if (stop_ && stop_->frozenHorizon >= 0) onStopAgreed(stop_->frozenHorizon, sig);
  return true;
}

void Agent::onStopRequested(int64_t reason) {
  if (stop_ || stopping_ == Stopping::kDone) return;
  int sig = reason > 0 && reason < 1000 ? static_cast<int>(reason) : 0;
  auto frozen = stopboard::freeze(stopBoard_);
  if (!frozen.ok()) {
    logger()->error("cannot freeze the ranks' stop board: {}; the ranks are stopped as on a failure",
                    std::string(frozen.status().message()));
    stop_ = CoordinatedStop{.sig = sig, .reason = reason, .at = std::chrono::steady_clock::now()};
    onStopTimeout();
    return;
  }
  CoordinatedStop stop;
  stop.sig = sig;
  stop.reason = reason;
  stop.at = std::chrono::steady_clock::now();
  stop.frozenHorizon = frozen->horizon;
  bool running = group_ && !group_->allExited();
  if (running) {
    for (const auto& w : group_->workers()) {
      int local = w->spec.localRank;
      if (!w->exit && local >= 0 && local < static_cast<int>(frozen->asked.size()) &&
          frozen->asked[local] == stopboard::kNone) {
        stop.neverAsked.push_back(local);
      }
    }
  }
  stop_ = stop;
  if (agreement_) {
    logger()->warn("the job is asked to stop ({}): this node's horizon is step {}; waiting for the other nodes'",
                   reasonName(reason), stop_->frozenHorizon);
    agreement_->offer(stop_->frozenHorizon);
  }
  if (!running) return;
  if (!stop_->neverAsked.empty() && sig > 0) {
    // They keep the signal's usual meaning: a notice passed on.
    logger()->warn("local rank(s) {} never asked stop_requested: passing {} on to them",
                   fmt::join(stop_->neverAsked, ","), signalName(sig));
    for (const auto& w : group_->workers()) {
      bool never = std::find(stop_->neverAsked.begin(), stop_->neverAsked.end(), w->spec.localRank) !=
                   stop_->neverAsked.end();
      if (never && !w->exit && w->pid > 0) kill(-w->pid, sig);
    }
  }
  if (options_.stopTimeoutS > 0) {
    stopTimer_.expires_after(fromSeconds(options_.stopTimeoutS));
    stopTimer_.async_wait([this](const boost::system::error_code& ec) {
      if (!ec) onStopTimeout();
    });
  }
}

void Agent::onStopAgreed(int64_t step, int64_t reason) {
  if (!stop_ || stop_->step >= 0 || stopping_ == Stopping::kDone) return;
  auto posted = stopboard::post(stopBoard_, step, reason);
  if (!posted.ok()) {
    logger()->error("cannot post the stop step {} to the ranks' stop board: {}; the ranks are stopped as on a "
                    "failure", step, std::string(posted.status().message()));
    onStopTimeout();
    return;
  }
  stop_->step = posted->stopStep;
  logger()->warn("stopping on request ({}): every rank stops at step {} (stop_requested); they have {} s to "
                 "exit (--stop_timeout)", reasonName(reason), stop_->step, options_.stopTimeoutS);
  publishStatus();
}

std::string Agent::reasonName(int64_t reason) {
  if (reason == stopboard::kReasonRequest) return "rendezvousctl stop";
  if (reason == stopboard::kReasonDeadline) return "--stop_at";
  if (reason > 0 && reason < 1000) return signalName(static_cast<int>(reason)) + " to a node's launch";
  return fmt::format("reason {}", reason);
}

void Agent::onStopTimeout() {
  if (!stop_ || !group_ || group_->allExited() || stopping_ != Stopping::kNo) return;
  stop_->timedOut = true;
  std::vector<std::string> left;
  for (const auto& w : group_->workers()) {
    if (!w->exit) left.push_back(fmt::format("rank {} (local_rank {}, pid {})", w->spec.globalRank, w->spec.localRank, w->pid));
  }
  logger()->error("{} rank(s) did not stop within {} s of {} (--stop_timeout): {}", left.size(),
                  options_.stopTimeoutS, stop_->sig > 0 ? signalName(stop_->sig) : reasonName(stop_->reason),
                  fmt::join(left, ", "));
  stopping_ = Stopping::kSignal;
  stopSignal_ = SIGTERM;
  stopStarted_ = std::chrono::steady_clock::now();
  stopGroup(SIGTERM, stop_->step >= 0 ? fmt::format("the stop at step {} timed out", stop_->step)
                                      : std::string("the stop timed out before the nodes agreed on its step"));
}

void Agent::printStopSummary() const {
  if (!stop_ || !group_) return;
  size_t clean = 0;
  std::vector<std::string> not_clean;
  for (const auto& w : group_->workers()) {
    const auto& e = w->exit;
    if (e && e->code == 0 && e->signal == 0) {
      ++clean;
      continue;
    }
    bool never = std::find(stop_->neverAsked.begin(), stop_->neverAsked.end(), w->spec.localRank) !=
                 stop_->neverAsked.end();
    not_clean.push_back(fmt::format("rank {} (local_rank {}, pid {}) {}{}", w->spec.globalRank, w->spec.localRank,
                                    w->pid, e ? describeExit(*e) : std::string("did not exit"),
                                    never ? ", never asked stop_requested" : ""));
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - stop_->at).count();
  std::string at = stop_->step >= 0 ? fmt::format("at step {}", stop_->step) : "before a stop step was agreed";
  std::string why = stop_->sig > 0 ? signalName(stop_->sig) : reasonName(stop_->reason);
  std::fprintf(stderr, "launch: stopped %s on request (%s); %zu of %zu ranks stopped cleanly in %.3f s\n",
               at.c_str(), why.c_str(), clean, group_->workers().size(), secs);
  for (const auto& line : not_clean) std::fprintf(stderr, "launch:   %s\n", line.c_str());
  logger()->info("stopped {} on request ({}): {} of {} ranks stopped cleanly", at, why, clean,
                 group_->workers().size());
}

}  // namespace muster::launcher
