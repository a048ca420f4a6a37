// Agent: the event loop of launch, and the round state machine it runs: start a round's
// workers, stop them on a failure, a signal or another node's news, restart or end.
#include "launcher/agent.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/contract.h"
#include "common/files.h"
#include "common/log.h"
#include "common/net.h"
#include "common/stop_board.h"
#include "launcher/console.h"
#include "launcher/events.h"
#include "launcher/processes.h"
#include "rendezvous/store/local_store.h"
#include "rendezvous/client/store_client.h"

namespace muster::launcher {
namespace fs = std::filesystem;

namespace {

// How long launch, once done, waits for a report to the rendezvous that is still on its way.
constexpr Millis kLastReportWait{2000};

}  // namespace

std::shared_ptr<spdlog::logger> Agent::logger() {
  static auto l = log::get("launch");
  return l;
}

Agent::Agent(LaunchOptions options, std::map<std::string, std::string> env,
             std::vector<std::string> command)
    : options_(std::move(options)),
      env_(std::move(env)),
      command_(std::move(command)),
      signals_(io_),
      graceTimer_(io_),
      killTimer_(io_),
      reportTimer_(io_),
      hangTimer_(io_),
      statusTimer_(io_),
      stopTimer_(io_),
      stopAtTimer_(io_) {}

Agent::~Agent() {
  stopProbe();
  rdzv_.reset();  // before io_
}

absl::Status Agent::prepare() {
  multiNode_ = options_.maxNodes > 1 || (options_.rdzvBackend != "static" && !options_.standalone);
  at_.worldSize = options_.localWorldSize;
  auto layout = makeJobLayout(options_, env_, multiNode_, runtimeDir_);
  if (!layout.ok()) return layout.status();
  layout_ = std::move(*layout);
  resumeFromStopRecord();
  prepareWatchdogs();
  if (timerServer_ == nullptr && !timerFile_.empty()) {
    return absl::FailedPreconditionError(fmt::format("TORCHELASTIC_ENABLE_FILE_TIMER=1: {}", timerFile_));
  }
  if (multiNode_) return prepareMultiNode();

  if (options_.standalone || options_.rdzvBackend != "static") {
    // As torchrun's c10d rendezvous: --local_addr or the host's name (socket.getfqdn()), and
    // a port of our choosing.
    at_.masterAddr = !options_.localAddr.empty() ? options_.localAddr : net::canonicalHostName();
    at_.masterPort = 0;
  } else {
    at_.masterAddr = options_.masterAddr;
    // 0: a free port, so that jobs side by side on one host do not collide on 29500.
    at_.masterPort = options_.masterPort;
  }
  if (options_.agentStore) {
    // The workers reach the store at MASTER_ADDR, so bind what it names (loopback for the
    // default 127.0.0.1), and hold the port from now on.
    if (auto s = holdWorkerPort(at_.masterAddr, at_.masterPort); !s.ok()) return s;
    at_.masterPort = workerPort_;
  } else if (at_.masterPort == 0) {
    at_.masterPort = net::freeTcpPort();  // rank 0's worker binds it
  }
  // The store, in-process, on loopback, guarded by a token only this job's workers can read.
  rendezvous::ServerOptions server;
  server.host = "127.0.0.1";
  server.port = 0;
  server.token = layout_.token;
  server.announce = false;
  // The workers' and the agent's store clients move their sessions to its direct path.
  server.directPort = 0;
  // One node's ranks: a thread for gRPC's queue and one for the direct path, not a thread per
  // core each (8 to 64 queues and up to 8 loops on a large node, for a handful of clients).
  server.threads = 1;
  auto started = rendezvous::RendezvousServer::start(server);
  if (!started.ok()) return started.status();
  store_ = std::move(*started);
  endpoint_ = store_->address();
  if (options_.agentStore) {
    if (auto s = serveWorkerStore(); !s.ok()) return s;
  }
  settleThreads();
  return absl::OkStatus();
}

void Agent::settleThreads() {
  if (!env_.count("OMP_NUM_THREADS") && options_.localWorldSize > 1) {
    logger()->warn(
        "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to "
        "avoid your system being overloaded, please further tune the variable for optimal "
        "performance in your application as needed.");
    env_["OMP_NUM_THREADS"] = "1";
  }
}

absl::Status Agent::holdWorkerPort(const std::string& host, int port) {
  std::string why;
  workerPortFd_ = net::listenTcp(host, port, why);
  if (workerPortFd_ < 0) {
    return absl::UnavailableError(fmt::format(
        "cannot hold the workers' store port (MASTER_PORT): {}; choose another --master_port "
        "(0 picks a free one), or --worker_store=rank0 if your script starts its own TCPStore "
        "there",
        why));
  }
  workerPort_ = net::boundPort(workerPortFd_);
  return absl::OkStatus();
}

absl::Status Agent::serveWorkerStore() {
  if (!front_) {
    if (workerPortFd_ < 0) return absl::InternalError("no port is held for the workers' store");
    frontMemory_ = store_ ? store_->memory() : std::make_shared<rendezvous::MemoryStore>();
    auto front = rendezvous::TcpStoreFront::start(frontMemory_, workerPortFd_,
                                                  {.runId = layout_.runId, .round = at_.round});
    workerPortFd_ = -1;  // the front owns it now
    if (!front.ok()) return front.status();
    front_ = std::move(*front);
    logger()->debug("workers' store (TCPStore protocol) on port {}", front_->port());
  }
  front_->setRound(at_.round);
  return absl::OkStatus();
}

absl::Status Agent::startRound() {
  stopping_ = Stopping::kNo;
  killArmed_ = false;
  group_ = std::make_unique<WorkerGroup>(io_, reaper_,
                                         [this](const WorkerState& w) { onWorkerExit(w); },
                                         WorkerGroup::Consoles{stdout_.get(), stderr_.get()});
  group_->onSettled([this] { onRoundSettled(); });
  group_->onOutput([this] { progress(); });
  roundStarted_ = std::chrono::steady_clock::now();
  hangWhy_.clear();
  causes_.clear();
  oom_.baseline();
  stop_.reset();
  stopBoard_ = stopBoardPath();
  auto specs = workerSpecs({.options = options_,
                            .env = env_,
                            .command = command_,
                            .layout = layout_,
                            .storeEndpoint = endpoint_,
                            .hostName = net::hostName(),
                            .stacksSignal = stacksSignal_,
                            .pythonHookDir = pythonHookDir_,
                            .timerFile = timerServer_ && !timerFile_.empty() ? timerServer_->path() : "",
                            .progressFifo = timerServer_ ? timerServer_->path() : "",
                            .watchOutput = options_.hangTimeoutS > 0,
                            .stopBoard = stopBoard_},
                           at_);
  if (auto s = makeRankDirectories(specs); !s.ok()) return s;
  if (auto s = stopboard::create(stopBoard_, static_cast<int>(specs.size())); !s.ok()) return s;
  if (multiNode_) {
    agreement_ = std::make_unique<StopAgreement>(
        io_,
        StopAgreementSetup{.endpoint = endpoint_,
                           .token = layout_.token,
                           .tlsCaPem = tlsCaPem_,
                           .tlsServerName = options_.rdzvTlsServerName,
                           .storeNamespace = stopboard::storeNamespace(layout_.runId, at_.round),
                           .groupRank = at_.groupRank,
                           .groupWorldSize = at_.groupWorldSize},
        StopAgreement::Handlers{
            .requested = [this](int64_t reason) { onStopRequested(reason); },
            .agreed = [this](int64_t step, int64_t reason) { onStopAgreed(step, reason); },
            .failed = [this](const std::string& why) { onStopAgreementFailed(why); }});
  }
  if (auto s = bindToNuma(specs, options_, env_); !s.ok()) return s;
  auto status = group_->start(std::move(specs));
  if (!status.ok()) return status;
  std::string pids;
  for (const auto& w : group_->workers()) pids += (pids.empty() ? "" : ",") + std::to_string(w->pid);
  emitWorkerEvents();
  logger()->info("round {}: started {} workers of world size {} (pids {}); run {}, logs in {}",
                 at_.round, group_->workers().size(), at_.worldSize, pids, layout_.runId, layout_.runDir);
  progress();
  armHangTimer();
  startPendingStop();
  publishStatus();
  armStatusTimer();
  return absl::OkStatus();
}

void Agent::onWorkerExit(const WorkerState& w) {
  publishStatus();
  const WorkerExit& e = *w.exit;
  bool failed = e.code != 0 || e.signal != 0;
  double secs = std::chrono::duration<double>(e.at - w.started).count();
  if (!failed) {
    logger()->debug("rank {} (local_rank {}, pid {}) finished in {:.3f} s", w.spec.globalRank,
                    w.spec.localRank, w.pid, secs);
  } else if (stopping_ == Stopping::kNo) {
    logger()->error("rank {} (local_rank {}, pid {}) {} after {:.3f} s", w.spec.globalRank,
                    w.spec.localRank, w.pid, describeExit(e), secs);
  } else {
    logger()->debug("rank {} (local_rank {}, pid {}) {} while the group stops", w.spec.globalRank,
                    w.spec.localRank, w.pid, describeExit(e));
  }
  if (failed && stopping_ == Stopping::kNo) {
    stopping_ = Stopping::kFailure;
    stopStarted_ = e.at;
    rootLocalRank_ = w.spec.localRank;
    // The report waits for the group to settle, so that stderr's last lines are complete;
    // only which worker failed first is noted now. The survivors' stacks are taken first:
    // where they stand says what the failure left them waiting for.
    std::string why = fmt::format("rank {} failed", w.spec.globalRank);
    auto survivors = rollCallTargets();
    if (stacksSignal_ == 0 || survivors.empty()) {
      stopGroup(SIGTERM, why);
    } else {
      WorkerGroup* round = group_.get();
      takeStacks(fmt::format("rank {} {}; the others before they are stopped", w.spec.globalRank, describeExit(e)),
                 std::move(survivors), [this, round, why](const auto&, const std::string&) {
                   if (group_.get() == round && stopping_ == Stopping::kFailure) stopGroup(SIGTERM, why);
                 });
    }
  }
  if (group_->allExited()) {
    // Whatever the workers left behind in their process groups goes too: no orphans.
    killGroup();
    killLeftovers();
  }
}

void Agent::stopGroup(int sig, const std::string& why) {
  if (!group_) return;
  size_t running = 0;
  for (const auto& w : group_->workers()) running += w->exit ? 0 : 1;
  if (running > 0) {
    logger()->info("{}: sending {} to {} worker(s); SIGKILL after {} s", why, signalName(sig),
                   running, options_.gracePeriodS);
  }
  group_->signalAll(sig);
  graceTimer_.expires_after(fromSeconds(options_.gracePeriodS));
  graceTimer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || !group_ || group_->allExited()) return;
    size_t left = 0;
    for (const auto& w : group_->workers()) left += w->exit ? 0 : 1;
    logger()->warn("{} worker(s) still running {} s after the stop began; sending SIGKILL", left,
                   options_.gracePeriodS);
    killGroup();
  });
}

void Agent::killGroup() {
  group_->signalAll(SIGKILL);
  if (killArmed_) return;
  killArmed_ = true;
  killTimer_.expires_after(fromSeconds(options_.killTimeoutS));
  killTimer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || !group_ || group_->settled()) return;
    // SIGKILL cannot end a process the kernel holds (state D: a hung file system or device).
    // Waiting on would wedge launch for good: say what is stuck, and go on without it.
    for (const auto& line : group_->abandon()) logger()->error("{}", line);
    logger()->error("launch goes on without what is still there {} s after SIGKILL (--kill_timeout); no "
                    "restart while it may hold the job's resources", options_.killTimeoutS);
    stuck_ = true;
  });
}

void Agent::onRoundSettled() {
  graceTimer_.cancel();
  killTimer_.cancel();
  // Stopped by a signal, torchelastic's agent records only its own FAILED.
  if (stopping_ != Stopping::kSignal) emitWorkerEvents();
  if (group_) {
    for (const auto& [file, loss] : group_->logLosses()) lostLogs_[file] = loss;
  }
  double roundSecs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - roundStarted_).count();
  if (stopping_ == Stopping::kNo && stop_ && !ranksStopped()) {
    // Every rank ended on its own before the stop step (its loop was done): a success.
    logger()->info("the ranks ended on their own before the stop step ({}): the job is done",
                   stop_->step >= 0 ? fmt::format("step {}", stop_->step) : std::string("not agreed yet"));
  } else if (stopping_ == Stopping::kNo && stop_) {
    printStopSummary();
    if (!multiNode_) {
      finish(kStoppedExit);
      return;
    }
    // Every node's ranks stop at the same step: the job has stopped when every node says so.
    localDone_ = true;
    report(true, "", [this](const std::optional<muster::v1::RoundEvent>& ended) { onReported(ended); });
    logger()->info("waiting for the other nodes' ranks to stop");
    return;
  }
  if (stopping_ == Stopping::kNo) {
    logger()->info("all {} workers finished successfully in {:.3f} s", group_->workers().size(),
                   roundSecs);
    if (!multiNode_) {
      finish(0);
      return;
    }
    // The job succeeds when every node has: wait for the service to say so (or for a failure).
    localDone_ = true;
    report(true, "", [this](const std::optional<muster::v1::RoundEvent>& ended) { onReported(ended); });
    if (stopping_ == Stopping::kNo) logger()->info("waiting for the other nodes to finish");
    return;
  }
  if (stopping_ == Stopping::kSignal && stop_ && stop_->failed) {
    printStopSummary();
    if (multiNode_) report(false, "the stop on request failed: " + *stop_->failed);
    finish(1);
    return;
  }
  if (stopping_ == Stopping::kSignal) {
    if (multiNode_) report(false, fmt::format("launch got {}", signalName(stopSignal_)));
    finish(128 + stopSignal_);
    return;
  }
  if (stopping_ == Stopping::kRemote && stop_) {
    // Another node failed, was lost or joined while the job stopped on request: the job ends
    // here (a new round would forget the notice).
    if (rdzv_) rdzv_->stopWatch();
    printStopSummary();
    std::fprintf(stderr, "launch: the stop on request did not complete on every node: %s\n", remoteWhy_.c_str());
    finish(1);
    return;
  }
  if (stopping_ == Stopping::kRemote) {
    if (rdzv_) rdzv_->stopWatch();
    dropRound();
    if (stuck_) {
      std::fprintf(stderr, "launch: %s; no restart: a worker could not be killed\n", remoteWhy_.c_str());
      finish(1);
      return;
    }
    if (remote_ == Remote::kGone && standaloneService_ && at_.restartCount < options_.maxRestarts) {
      // rendezvousd restarted (systemd, a rescheduled pod): it comes back empty, so every
      // agent re-joins as a new round; the join waits for it, with back-off, up to the join
      // timeout.
      ++at_.restartCount;
      logger()->warn("{}; re-joining it as a new round ({} of {} restarts; waiting up to {} s)",
                     remoteWhy_, at_.restartCount, options_.maxRestarts, options_.rdzvConf.joinTimeout.count() / 1000);
      stopping_ = Stopping::kNo;
      startJoin();
      return;
    }
    if (remote_ == Remote::kGone) {
      std::fprintf(stderr, "launch: %s; %s\n", remoteWhy_.c_str(),
                   options_.etcd()       ? "the job cannot go on without its rendezvous"
                   : hostsStore_         ? "this node hosted it"
                   : standaloneService_ ? "no restart is left to re-join it (--max_restarts)"
                                        : "it was hosted by node 0's launch, which is gone (run a "
                                          "standalone rendezvousd to make the store outlive any node)");
      finish(1);
      return;
    }
    if (remote_ == Remote::kWaiting) {
      logger()->info("{}: restarting the group to take it in (not counted as a restart)", remoteWhy_);
      stopping_ = Stopping::kNo;
      startJoin();
      return;
    }
    if (at_.restartCount < options_.maxRestarts) {
      ++at_.restartCount;
      logger()->warn("{}; restarting the group ({} of {} restarts)", remoteWhy_, at_.restartCount, options_.maxRestarts);
      stopping_ = Stopping::kNo;
      startJoin();
      return;
    }
    if (!failureAnnounced_) std::fprintf(stderr, "launch: the job failed: %s\n", remoteWhy_.c_str());
    finish(1);
    return;
  }
  // A failure: the first worker that failed is the root cause. Others that failed in a way
  // our SIGTERM/SIGKILL does not explain are failures too.
  rootCause_.reset();
  failures_.clear();
  for (const auto& w : group_->workers()) {
    if (w->spec.localRank == rootLocalRank_) {
      rootCause_ = describeFailure(*w);
      explain(*rootCause_);
      continue;
    }
    const WorkerExit& e = *w->exit;
    if ((e.code != 0 || e.signal != 0) && !endedByStop(e)) {
      failures_.push_back(describeFailure(*w));
      explain(failures_.back());
    }
  }
  auto stopMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                          stopStarted_)
                    .count();
  if (rootCause_) {
    logger()->info("group stopped {:.1f} ms after rank {} failed", stopMs, rootCause_->globalRank);
  } else {
    logger()->info("group stopped {:.1f} ms after {}", stopMs, hangWhy_.empty() ? "a failure" : "the hang was seen");
  }
  if (multiNode_) {
    // Close the watch once the report is in: a watch that closes first looks like a lost node.
    report(false,
           rootCause_ ? fmt::format("rank {} {}", rootCause_->globalRank, describeExit(rootCause_->exit))
           : !hangWhy_.empty() ? "hung: " + hangWhy_
                               : std::string("a worker failed"),
           [this](const auto&) {
             if (rdzv_) rdzv_->stopWatch();
             if (stopping_ != Stopping::kDone) restartOrEnd();
           });
    return;
  }
  restartOrEnd();
}

void Agent::restartOrEnd() {
  // A failure while the ranks stop on request ends the job: it was to end anyway.
  if (at_.restartCount < options_.maxRestarts && !stuck_ && !stop_) {
    if (rootCause_) {
      logger()->warn("restarting the group ({} of {} restarts) after rank {} {}",
                     at_.restartCount + 1, options_.maxRestarts, rootCause_->globalRank,
                     describeExit(rootCause_->exit));
    } else if (!hangWhy_.empty()) {
      logger()->warn("restarting the group ({} of {} restarts) after a hang: {}", at_.restartCount + 1,
                     options_.maxRestarts, hangWhy_);
    }
    ++at_.restartCount;
    dropRound();
    if (multiNode_) {
      stopping_ = Stopping::kNo;
      startJoin();
      return;
    }
    at_.round = at_.restartCount;
    if (front_) front_->setRound(at_.round);
    auto status = startRound();
    if (!status.ok()) {
      logger()->error("{}", std::string(status.message()));
      finish(1);
    }
    return;
  }
  printFailureReport();
  finish(1);
}

void Agent::dropRound() {
  agreement_.reset();
  ranksAsk();  // before the board goes: whether a notice between rounds is kept (requestStop)
  if (!stopBoard_.empty()) {
    std::error_code gone;
    fs::remove(stopBoard_, gone);
    stopBoard_.clear();
  }
  // The next round gets a fresh namespace and channel directory (a restarted rendezvousd may
  // hand out the same round number again).
  std::error_code ec;
  if (!layout_.sharedDir.empty()) fs::remove_all(contract::roundDirectory(layout_.sharedDir, layout_.jobId, at_.round), ec);
  std::string ns = contract::roundNamespace(layout_.runId, at_.round);
  if (store_) rendezvous::LocalStore(store_->memory(), ns).clear().IgnoreError();
  if (frontMemory_ && (!store_ || frontMemory_ != store_->memory())) {
    rendezvous::LocalStore(frontMemory_, ns).clear().IgnoreError();
  }
}

void Agent::finish(int code) {
  if (stopping_ != Stopping::kDone) {
    // torchelastic's agent SUCCEEDED when it ran the job to its end, its workers' failures
    // told by their own events; FAILED when it could not (a rendezvous, a signal, a hang).
    ElasticEvent e;
    e.state = code == 0 || code == kStoppedExit || rootCause_ ? "SUCCEEDED" : "FAILED";
    if (e.state == "FAILED") e.rawError = fmt::format("launch exits with code {}", code);
    emit(e);
  }
  if (stopping_ != Stopping::kDone) {
    if (code == kStoppedExit) keepStopStep();
    if (code == 0) forgetStopStep();
  }
  exitCode_ = code;
  stopping_ = Stopping::kDone;
  signals_.cancel();
  graceTimer_.cancel();
  killTimer_.cancel();
  hangTimer_.cancel();
  statusTimer_.cancel();
  stopTimer_.cancel();
  stopAtTimer_.cancel();
  agreement_.reset();
  if (rdzv_) rdzv_->stopJoining();
  if (!rdzv_ || rdzv_->pendingReports() == 0) {
    io_.stop();
    return;
  }
  // A report still on its way stops the loop when it is in; the service may be gone, so it
  // gets a moment, not its whole deadline.
  reportTimer_.expires_after(kLastReportWait);
  reportTimer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec && rdzv_) rdzv_->cancel();
  });
}

int Agent::run() {
  launched_ = std::chrono::steady_clock::now();
  raiseFileLimit();
  // Orphaned descendants of the workers (double-forked daemons) come to launch, not to init,
  // so that they end with the job.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  // launch's private folder, then the guard, which removes it when launch is killed. The
  // guard must be forked before any thread starts (the store's are next).
  auto runtime = makeRuntimeDir(env_);
  if (!runtime.ok()) {
    std::fprintf(stderr, "launch: %s\n", std::string(runtime.status().message()).c_str());
    return 1;
  }
  runtimeDir_ = *runtime;
  if (auto s = reaper_.start(runtimeDir_); !s.ok()) {
    logger()->error("cannot start the orphan guard: {}", std::string(s.message()));
    std::error_code ec;
    std::filesystem::remove_all(runtimeDir_, ec);
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);
  // After the guard's fork: these start threads.
  stdout_ = std::make_unique<ConsoleStream>(STDOUT_FILENO);
  stderr_ = std::make_unique<ConsoleStream>(STDERR_FILENO);
  // --signals_to_handle stop the job; SIGUSR1/2 are notices unless listed there.
  std::set<int> caught(options_.stopSignals.begin(), options_.stopSignals.end());
  caught.insert({SIGUSR1, SIGUSR2, SIGCHLD});
  caught.insert(options_.stopNotice.begin(), options_.stopNotice.end());
  for (int sig : caught) signals_.add(sig);
  armSignals();
  auto prepared = prepare();
  if (!prepared.ok()) {
    std::fprintf(stderr, "launch: %s\n", std::string(prepared.message()).c_str());
    layout_.discard();  // no worker ran: nothing to look at
    return prepared.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  if (options_.stopAt) {
    auto at = stopTime(*options_.stopAt, options_.slurmJob);
    if (!at.ok()) {
      std::fprintf(stderr, "launch: %s\n", std::string(at.status().message()).c_str());
      layout_.discard();
      return at.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
    }
    stopAtUnixS_ = *at;
    if (stopAtUnixS_) {
      logger()->info("the job is asked to stop at {} ({}) (--stop_at)", localTimeText(*stopAtUnixS_),
                     options_.stopAt->slurm ? fmt::format("the Slurm job's end less {} s", options_.stopAt->marginS)
                                            : "the time given");
      armStopAt();
    } else {
      logger()->info("--stop_at=slurm: Slurm job {} has no end time: no stop is asked", options_.slurmJob);
    }
  }
  if (multiNode_) {
    startJoin();
  } else {
    emitRendezvousEvents(0.0);
    auto started = startRound();
    if (!started.ok()) {
      std::fprintf(stderr, "launch: %s\n", std::string(started.message()).c_str());
      group_.reset();
      layout_.cleanUp(false);
      return 1;
    }
  }
  io_.run();
  group_.reset();
  // The workers' last lines reach the console before launch's own last words, if the reader
  // takes them within a moment; a reader that never reads does not hold launch.
  stdout_->drain(Millis(2000));
  stderr_->drain(Millis(2000));
  for (const auto& [file, loss] : lostLogs_) {
    std::fprintf(stderr, "launch: %zu byte(s) of output were lost: %s could not be written (%s)\n",
                 loss.bytes, file.c_str(), loss.error.c_str());
  }
  if (size_t dropped = stdout_->droppedBytes() + stderr_->droppedBytes(); dropped > 0) {
    std::fprintf(stderr, "launch: %zu byte(s) of worker output were not shown: the console did not "
                 "take them (a stalled or closed reader)\n", dropped);
  }
  stopProbe();
  // Cancels a join still waiting and closes the watch; waits only for their callbacks.
  rdzv_.reset();
  if (front_) front_->shutdown();
  control_.reset();
  timerServer_.reset();
  if (workerPortFd_ >= 0) close(workerPortFd_);
  if (store_) store_->shutdown(Millis(200));
  layout_.cleanUp(exitCode_ == 0);
  return exitCode_;
}

}  // namespace muster::launcher
