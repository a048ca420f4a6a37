// Agent: what watches the ranks besides their exits: the stack roll-call (on a hang, a
// failure, an expired file timer, or on demand), the hang timer and torchrun's file timer.
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "common/log.h"
#include "common/net.h"
#include "launcher/agent.h"
#include "launcher/python_hook.h"

namespace muster::launcher {
namespace fs = std::filesystem;

namespace {

// The roll-call's signal: a real-time one, past those glibc and common runtimes take.
int stacksSignal() { return SIGRTMIN + 6; }

// What the ranks that answered wrote goes to their log folders (attempt_N/<local>/stacks.txt):
// a log folder holds a rank's stacks only once they were taken. `ranks` is in `targets`' order.
void copyAnswers(const std::vector<RollCallTarget>& targets, const std::vector<stacks::RankStacks>& ranks,
                 spdlog::logger& log) {
  for (size_t i = 0; i < targets.size() && i < ranks.size(); ++i) {
    const auto& t = targets[i];
    if (ranks[i].answer != stacks::Answer::kAnswered || t.stacksFile.empty() || t.logCopy.empty()) continue;
    std::error_code ec;
    fs::copy_file(t.stacksFile, t.logCopy, fs::copy_options::overwrite_existing, ec);
    if (ec) log.warn("cannot copy rank {}'s stacks to {}: {}", t.rank, t.logCopy, ec.message());
  }
}

}  // namespace

void Agent::prepareWatchdogs() {
  if (options_.stacks) {
    auto hook = writePythonHook(layout_.runtimeDir);
    if (hook.ok()) {
      pythonHookDir_ = *hook;
    } else {
      logger()->warn("{}: Python ranks will not answer a stack roll-call", std::string(hook.status().message()));
    }
    stacksSignal_ = stacksSignal();
  }
  // torchrun's file timer, and the FIFO that carries progress: one FIFO serves both.
  auto enabled = env_.find("TORCHELASTIC_ENABLE_FILE_TIMER");
  bool fileTimer = enabled != env_.end() && enabled->second == "1";
  if (fileTimer) {
    auto given = env_.find("TORCHELASTIC_TIMER_FILE");
    timerFile_ = given != env_.end() && !given->second.empty() ? given->second
                                                              : (fs::path(layout_.runtimeDir) / "watchdog_timer").string();
  }
  if (fileTimer || options_.hangTimeoutS > 0) {
    std::string path = fileTimer ? timerFile_ : (fs::path(layout_.runtimeDir) / "progress.fifo").string();
    auto server = FileTimerServer::start(io_, path,
                                         {.onRequest = [this](pid_t pid) { onTimerRequest(pid); },
                                          .onExpired = [this](const TimerRequest& r) { onTimerExpired(r); }});
    if (server.ok()) {
      timerServer_ = std::move(*server);
      if (fileTimer) logger()->info("file timer: reading requests from {}", path);
    } else if (fileTimer) {
      timerFile_ = std::string(server.status().message());  // prepare() says it and stops
    } else {
      logger()->warn("{}: heartbeats will not count as progress", std::string(server.status().message()));
    }
  }
  auto control = ControlSocket::start(io_, [this](const std::string& command, std::function<void(std::string)> reply) {
    onControl(command, std::move(reply));
  });
  if (control.ok()) {
    control_ = std::move(*control);
  } else {
    logger()->warn("{}: rendezvousctl stacks --pid {} will not answer", std::string(control.status().message()),
                   getpid());
  }
}

std::vector<RollCallTarget> Agent::rollCallTargets(pid_t only) const {
  std::vector<RollCallTarget> out;
  if (!group_) return out;
  for (const auto& w : group_->workers()) {
    if (w->exit || w->pid <= 0 || (only > 0 && w->pid != only)) continue;
    out.push_back({.rank = w->spec.globalRank, .localRank = w->spec.localRank, .pid = w->pid,
                   .stacksFile = w->spec.stacksFile, .logCopy = w->spec.stacksLogCopy});
  }
  return out;
}

void Agent::takeStacks(std::string reason, std::vector<RollCallTarget> targets, StacksTaken then) {
  rollCalls_.push_back([this, reason = std::move(reason), targets = std::move(targets), then = std::move(then)] {
    auto started = std::chrono::steady_clock::now();
    // With --stacks=off no rank has a handler (nor a stacks file): each is reported as such.
    rollCall(io_, targets, stacksSignal_, fromSeconds(options_.stacksTimeoutS),
             stacksHost(), [this, reason, then, started, targets](std::vector<stacks::RankStacks> ranks) {
               bool anyAnswered = std::any_of(ranks.begin(), ranks.end(), [](const auto& r) {
                 return r.answer == stacks::Answer::kAnswered || r.answer == stacks::Answer::kNoAnswer;
               });
               std::string report = stacks::fullReport(ranks, reason);
               lastStacksFile_.clear();
               if (anyAnswered) {
                 copyAnswers(targets, ranks, *logger());
                 std::string file = (fs::path(layout_.runDir) / fmt::format("stacks-{}.txt", ++reports_)).string();
                 std::ofstream(file) << report;
                 lastStacksFile_ = file;
                 double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
                 std::string text = "launch: " + stacks::summary(ranks, reason) +
                                    fmt::format("launch: every thread's stack: {} (taken in {:.0f} ms)\n", file, ms);
                 std::fwrite(text.data(), 1, text.size(), stderr);
                 std::fflush(stderr);
                 report += fmt::format("\n(written to {})\n", file);
               } else {
                 logger()->debug("roll-call ({}): no rank has a stack handler", reason);
               }
               then(ranks, report);
               rollCallRunning_ = false;
               runNextRollCall();
             });
  });
  runNextRollCall();
}

void Agent::runNextRollCall() {
  if (rollCallRunning_ || rollCalls_.empty()) return;
  rollCallRunning_ = true;
  auto next = std::move(rollCalls_.front());
  rollCalls_.pop_front();
  next();
}

void Agent::armHangTimer() {
  if (options_.hangTimeoutS <= 0) return;
  hangTimer_.expires_at(lastProgress_ + fromSeconds(options_.hangTimeoutS));
  hangTimer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || !group_ || stopping_ != Stopping::kNo || group_->allExited()) return;
    if (std::chrono::steady_clock::now() < lastProgress_ + fromSeconds(options_.hangTimeoutS)) {
      armHangTimer();  // progress came meanwhile
      return;
    }
    onHang();
  });
}

void Agent::onHang() {
  std::string why = fmt::format("no rank showed progress for {:g} s (--hang_timeout)", options_.hangTimeoutS);
  logger()->error("{}: taking every rank's stack, then stopping the group", why);
  stopping_ = Stopping::kFailure;
  stopStarted_ = std::chrono::steady_clock::now();
  rootLocalRank_ = -1;
  hangWhy_ = why;
  WorkerGroup* round = group_.get();
  takeStacks(why, rollCallTargets(), [this, round, why](const auto& ranks, const std::string&) {
    if (group_.get() != round || stopping_ != Stopping::kFailure) return;
    if (!lastStacksFile_.empty() && !ranks.empty()) {
      // The odd ones out, as the summary's first line names them.
      hangWhy_ = fmt::format("{}; {}; every stack in {}", why, stacks::describeGroup(ranks, stacks::groupRanks(ranks).front()),
                             lastStacksFile_);
    }
    stopGroup(SIGTERM, why);
  });
}

void Agent::onTimerExpired(const TimerRequest& r) {
  const WorkerState* worker = nullptr;
  if (group_) {
    for (const auto& w : group_->workers()) {
      if (!w->exit && (w->pid == r.pid || getpgid(r.pid) == w->pid)) worker = w.get();
    }
  }
  if (worker == nullptr) {
    logger()->warn("file timer '{}' of pid {} expired, but pid {} is not one of this round's workers; it is not "
                   "signalled", r.scope, r.pid, r.pid);
    return;
  }
  logger()->error("rank {} (local_rank {}, pid {}): file timer '{}' expired; taking its stack, then sending {} to "
                  "pid {}", worker->spec.globalRank, worker->spec.localRank, worker->pid, r.scope,
                  signalName(r.signal), r.pid);
  causes_[worker->pid] = fmt::format("its file timer '{}' expired and launch sent {}", r.scope, signalName(r.signal));
  pid_t leader = worker->pid;
  WorkerGroup* round = group_.get();
  takeStacks(fmt::format("rank {}'s file timer '{}' expired", worker->spec.globalRank, r.scope),
             rollCallTargets(leader), [this, r, round, leader](const auto&, const std::string&) {
               // Still this round's worker (the pid may have been reaped and reused meanwhile).
               if (group_.get() != round || stopping_ == Stopping::kDone) return;
               if (r.pid == leader ? group_->owns(leader) : getpgid(r.pid) == leader) kill(r.pid, r.signal);
             });
}

void Agent::onControl(const std::string& command, std::function<void(std::string)> reply) {
  if (command != "stacks") {
    reply(fmt::format("launch: unknown command '{:.64}' (known: stacks)\n", command));
    return;
  }
  auto targets = rollCallTargets();
  if (targets.empty()) {
    reply("launch: no worker is running now\n");
    return;
  }
  logger()->info("stack roll-call asked for on launch's control socket");
  takeStacks("asked for (rendezvousctl stacks)", std::move(targets),
             [reply](const auto&, const std::string& report) { reply(report); });
}

std::string Agent::stacksHost() const { return rdzv_ ? rdzv_->node().host : net::hostName(); }

void Agent::onStacksAsked(uint64_t request) {
  logger()->info("stack roll-call {} asked for through the rendezvous", request);
  takeStacks("asked for through the rendezvous (rendezvousctl stacks --run)", rollCallTargets(),
             [this, request](const auto& ranks, const std::string&) {
               if (rdzv_) rdzv_->putStacks(request, stacks::toJson(ranks).dump());
             });
}

void Agent::explain(Failure& f) {
  if (auto it = causes_.find(f.pid); it != causes_.end()) {
    f.cause = it->second;
    return;
  }
  if (f.exit.signal == SIGKILL) f.cause = oom_.explain(f.pid);
}

}  // namespace muster::launcher
