// Agent: signals and shutdown: which signals stop the job and which are passed on as notices,
// and what is left after the workers: orphans reaped, leftovers of the group killed.
#include "launcher/agent.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "launcher/processes.h"

namespace muster::launcher {

void Agent::armSignals() {
  signals_.async_wait([this](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    if (sig == SIGCHLD) {
      if (group_) group_->reap();
      reapOrphans();
    } else if (requestStop(sig)) {
      // A stop at one step: the ranks were told (agent_stop.cc).
    } else if ((sig == SIGUSR1 || sig == SIGUSR2) &&
               std::find(options_.stopSignals.begin(), options_.stopSignals.end(), sig) ==
                   options_.stopSignals.end()) {
      // Notices, not stops (Slurm's --signal=USR1@SECONDS before preemption or the time
      // limit): pass them on and keep going; the workers decide (checkpoint, exit).
      if (group_ && !group_->allExited()) {
        logger()->warn("launch got {}; forwarding it to the workers", signalName(sig));
        group_->signalAll(sig);
      } else {
        logger()->warn("launch got {} with no worker running; ignoring it", signalName(sig));
      }
    } else if (stopping_ != Stopping::kDone) {
      if (stopping_ == Stopping::kSignal && sig == stopSignal_) {
        // A second Ctrl-C: do not wait out the grace period.
        logger()->warn("{} again: killing the workers now", signalName(sig));
        if (group_) killGroup();
      } else {
        logger()->warn("launch got {}; forwarding it to the workers", signalName(sig));
        if (!group_ || group_->allExited()) {
          // Nothing running (still joining, or waiting for the other nodes): stop now.
          if (multiNode_) report(false, fmt::format("launch got {}", signalName(sig)));
          finish(128 + sig);
          return;
        }
        stopping_ = Stopping::kSignal;
        stopSignal_ = sig;
        stopStarted_ = std::chrono::steady_clock::now();
        stopGroup(sig, fmt::format("launch got {}", signalName(sig)));
      }
    }
    if (stopping_ != Stopping::kDone) armSignals();
  });
}

void Agent::reapOrphans() {
  // launch is a child subreaper: a worker's descendants whose parent died come to it. Reap
  // them as they exit (peeking first, so that a worker's exit stays the group's to reap).
  while (true) {
    siginfo_t info{};
    if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) return;
    pid_t pid = info.si_pid;
    if (group_ && group_->owns(pid)) {
      group_->reap();
      if (group_ && group_->owns(pid)) return;  // not reapable yet
      continue;
    }
    waitpid(pid, nullptr, WNOHANG);
  }
}

void Agent::killLeftovers() {
  // Every process below launch, but the orphan guard, once the round's workers have all
  // exited: daemons that left their worker's process group (setsid, double fork) came to
  // launch as their subreaper, and go with the round.
  // Pass after pass until one finds nothing new: what a killed one had below it comes to
  // launch as it dies, and what forked during a pass is seen by the next.
  std::vector<pid_t> killed;
  std::set<pid_t> seen;
  for (int pass = 0; pass < 8; ++pass) {
    auto leftovers = descendantsOf(getpid(), reaper_.pid());
    if (!leftovers.ok()) {
      logger()->warn("could not look for processes the workers left behind: {}",
                     std::string(leftovers.status().message()));
      break;
    }
    size_t before = killed.size();
    for (pid_t p : *leftovers) {
      kill(p, SIGKILL);
      if (seen.insert(p).second) killed.push_back(p);
    }
    if (killed.size() == before) break;
  }
  if (killed.empty()) return;
  logger()->warn("killed {} process(es) the workers left behind outside their process groups "
                 "(pids {}): a daemon (setsid, double fork) does not outlive the job",
                 killed.size(), fmt::join(killed, ","));
}

}  // namespace muster::launcher
