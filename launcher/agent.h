// The agent: one per node. Hosts the store (node 0), runs rounds of workers, stops them on a
// failure or a signal, restarts within --max_restarts, and reports the root cause.
// Its parts, by what changes together: agent.cc (the event loop and the round state machine),
// agent_nodes.cc (the rendezvous with other nodes), agent_watchdogs.cc (hangs, file timers and
// roll-calls), agent_signals.cc (signals and shutdown), agent_stop.cc (the coordinated stop at
// one step), agent_report.cc (the failure summary and torchelastic's events).
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <string>
#include <vector>

#include <boost/asio.hpp>
#include <spdlog/spdlog.h>

#include "launcher/console.h"
#include "launcher/control_socket.h"
#include "launcher/failure_report.h"
#include "launcher/file_timer.h"
#include "launcher/job_layout.h"
#include "launcher/node_rendezvous.h"
#include "launcher/oom.h"
#include "launcher/options.h"
#include "launcher/reaper.h"
#include "launcher/roll_call.h"
#include "launcher/shared_dir_probe.h"
#include "launcher/stop_agreement.h"
#include "launcher/worker_group.h"
#include "launcher/worker_specs.h"
#include "rendezvous/server/rendezvous_server.h"
#include "rendezvous/transport/tcpstore_front.h"

namespace muster::launcher {

struct ElasticEvent;

// Lifetime: run() once. Thread-safety: run() owns the calling thread; everything happens on
// its io_context.
class Agent {
 public:
  Agent(LaunchOptions options, std::map<std::string, std::string> env,
        std::vector<std::string> command);
  ~Agent();

  // Runs the job to its end and returns launch's exit code: 0 when every worker succeeded,
  // 1 when workers failed (after the restarts), 128+N when launch got signal N, kStoppedExit
  // when the ranks stopped together on a notice (stop_requested), 1 when launch itself could
  // not run (the reason is logged).
  int run();

  // The exit code of a job that stopped cleanly at one step on request: neither success nor
  // failure (EX_TEMPFAIL: come back later), for a scheduler to requeue it.
  static constexpr int kStoppedExit = 75;

 private:
  // launch's log ("launch"), which every part of the agent writes to.
  static std::shared_ptr<spdlog::logger> logger();

  absl::Status prepare();
  absl::Status prepareMultiNode();
  // --rdzv_backend=etcd: the rendezvous in an etcd cluster, the store served here.
  absl::Status prepareEtcd();
  // This node as the rendezvous knows it; `host`:`port` is the rendezvous (for the route).
  NodeRendezvous::Node thisNode(const std::string& host, int port) const;
  // The workers' store port (with the agent's store) and their threads, once rdzv_ is made.
  absl::Status holdPortAndSettle();
  // OMP_NUM_THREADS=1 for the workers when several share the node and it is not set.
  void settleThreads();
  absl::Status startRound();
  // Multi-node: joins the next round; onJoined continues on the loop.
  void startJoin();
  void onJoined(absl::StatusOr<muster::v1::Assignment> result);
  void onRemoteEvent(const muster::v1::RoundEvent& event);
  void onRemoteError(const std::string& why);
  // Stops the group because of another node (or the service gone), or decides at once when
  // nothing runs here.
  void stopForRemote();
  // Tells the rendezvous how this node's round ended; `then` runs on the loop once the
  // service has it (or could not be told). finish() waits a moment for reports still out.
  void report(bool succeeded, const std::string& message, NodeRendezvous::Reported then = {});
  // The answer to this node's success report: finishes on the round's end when it says it.
  void onReported(const std::optional<muster::v1::RoundEvent>& ended);
  // After a worker failed (and the report is in): the next round, or the end.
  void restartOrEnd();
  // Multi-node: the shared directory's probe (shared_dir_probe.h) on a thread of its own,
  // then the round's workers.
  void onProbed(const absl::Status& shared);
  void stopProbe();
  void onWorkerExit(const WorkerState& worker);
  void stopGroup(int sig, const std::string& why);
  // SIGKILLs the group; --kill_timeout later, gives up on what is still there (stuck_).
  void killGroup();
  void onRoundSettled();
  // Deletes the finished round's keys and channel directory before the next round.
  void dropRound();
  // launch is a child subreaper: reaps adopted descendants as they exit.
  void reapOrphans();
  // SIGKILLs every process still below launch (but the orphan guard) once the round's workers
  // have exited: daemons that left their process group.
  void killLeftovers();
  void finish(int code);
  // The workers' store (TORCHELASTIC_USE_AGENT_STORE=True): holds MASTER_PORT from the moment
  // it is chosen (`fd`), and serves it once this node is group rank 0.
  absl::Status holdWorkerPort(const std::string& host, int port);
  absl::Status serveWorkerStore();
  void armSignals();
  // The coordinated stop (agent_stop.cc): on a notice `sig`, when a rank of the round has asked
  // stop_requested, every rank is told the same stop step; false when the notice is not one
  // (no rank asked, nothing runs), for the signal's usual handling.
  bool requestStop(int sig);
  // The job is asked to stop for `reason` (a notice's signal, stopboard::kReason*): true when
  // taken (the ranks are told, or the next round's will be); false when no rank of the job asks
  // stop_requested yet, nothing runs, or a stop by signal is under way.
  bool askStop(int64_t reason);
  // "launch got SIGUSR1", "--stop_at's time came": a log line's start.
  static std::string stopCause(int64_t reason);
  // The step the ranks stopped at (the posted step; for step 0, posted before any rank asked,
  // the step each was at); -1 before one was agreed.
  int64_t stoppedStep() const;
  // Whether some rank of the round reached the stop step (was told to stop), rather than all
  // ending on their own before it.
  bool ranksStopped() const;
  // The stop record (stop_record.h): read at the start (MUSTER_RESUMED_FROM_STEP to the ranks),
  // written after a clean stop (then --requeue), removed after a success.
  void resumeFromStopRecord();
  void keepStopStep();
  void forgetStopStep();
  // --stop_at: the stop is asked at stopAtUnixS_, and each second after until a rank asks.
  void armStopAt();
  void onStopAt();
  // Whether some rank of the job has asked stop_requested, in this round or an earlier one (the
  // round's board read now, when there is one).
  bool ranksAsk();
  // A notice kept while the group restarts: the new round's ranks stop at their first step.
  void startPendingStop();
  // The job is asked to stop (this node's notice, or another node's through the agreement):
  // freezes the board (and offers its horizon to the other nodes); then the step is posted.
  void onStopRequested(int64_t reason);
  void onStopAgreed(int64_t step, int64_t reason);
  static std::string reasonName(int64_t reason);
  // The round's stop board: in launch's runtime folder, one per round.
  std::string stopBoardPath() const;
  void armStopTimer();
  // The stop failed (its timeout, a board or agreement error): the ranks still running are
  // stopped as on a failure, and launch exits 1.
  void onStopTimeout(const std::string& why);
  void onStopAgreementFailed(const std::string& why);
  // "stopped at step S on request (SIGUSR1); N of N ranks stopped cleanly", and what did not.
  void printStopSummary() const;
  // The roll-call and what it serves (roll_call.h): launch's own set-up (the Python hook, the
  // file timer's FIFO, the control socket), a roll-call of `targets` whose report goes to a
  // file in the run directory and whose summary to the console (one at a time: a second waits
  // for the first), the hang timer, and an expired file timer.
  void prepareWatchdogs();
  using StacksTaken = std::function<void(const std::vector<stacks::RankStacks>&, const std::string& report)>;
  void takeStacks(std::string reason, std::vector<RollCallTarget> targets, StacksTaken then);
  void runNextRollCall();
  // The running workers (all of them, or only `pid`'s), as roll-call targets.
  std::vector<RollCallTarget> rollCallTargets(pid_t only = -1) const;
  void progress() { lastProgress_ = std::chrono::steady_clock::now(); }
  // A file-timer request (or the progress FIFO's) from `pid`: progress, and that rank's.
  void onTimerRequest(pid_t pid);
  // What this node says of itself and its ranks to the rendezvous (rendezvousctl status),
  // now and every keep_alive_interval while a round runs here (agent_status.cc).
  void publishStatus();
  void armStatusTimer();
  void armHangTimer();
  void onHang();
  void onTimerExpired(const TimerRequest& request);
  void onControl(const std::string& command, std::function<void(std::string)> reply);
  // A roll-call of the whole run (rendezvousctl stacks --run): this node's ranks' stacks go
  // back to the rendezvous.
  void onStacksAsked(uint64_t request);
  // This node as its ranks' stacks name it: its address across nodes, else the host name.
  std::string stacksHost() const;
  // What launch knows of a worker's end beyond its exit (an expired timer, the OOM killer).
  void explain(Failure& failure);
  void printFailureReport() const;
  // --event_log_handler=console: one torchelastic event line on stderr.
  void emit(ElasticEvent e) const;
  // Every worker's START (running) or end (SUCCEEDED, FAILED, TERMINATED) event.
  void emitWorkerEvents();
  void emitRendezvousEvents(double durationMs);

  LaunchOptions options_;
  std::map<std::string, std::string> env_;
  // The group rank and size of the last round started, as torchelastic's events show them.
  std::optional<std::pair<int, int>> shownGroup_;
  std::vector<std::string> command_;
  boost::asio::io_context io_;
  boost::asio::signal_set signals_;
  boost::asio::steady_timer graceTimer_;
  boost::asio::steady_timer killTimer_;
  boost::asio::steady_timer reportTimer_;
  Reaper reaper_;
  std::unique_ptr<rendezvous::RendezvousServer> store_;
  std::unique_ptr<WorkerGroup> group_;
  // The workers' store: TCPStore's protocol on MASTER_PORT, over store_'s state when this
  // node hosts it, else over a state of its own.
  int workerPortFd_ = -1;
  int workerPort_ = 0;
  std::shared_ptr<rendezvous::MemoryStore> frontMemory_;
  std::unique_ptr<rendezvous::TcpStoreFront> front_;

  JobLayout layout_;
  RoundPlacement at_;  // this node's place in the current round
  // Multi-node.
  bool multiNode_ = false;
  bool hostsStore_ = false;
  std::string endpoint_;  // muster's store: in-process (one node), node 0's or a rendezvousd
  std::string tlsCaPem_;  // --rdzv_tls_ca's certificate: TLS to the rendezvousd
  std::unique_ptr<NodeRendezvous> rdzv_;
  std::thread probeThread_;
  std::atomic<bool> probeCancelled_{false};
  bool localDone_ = false;
  std::string runtimeDir_;  // makeRuntimeDir's, made before the guard (which removes it)
  // A watch's UNKNOWN end that came while this node's success report was out: its answer
  // decides (onReported).
  std::optional<muster::v1::RoundEvent> heldEnd_;
  // The round's end was taken (from the watch, the report's answer or the watch's error):
  // whatever says it again is not acted on twice (two restarts for one failure).
  bool endTaken_ = false;
  bool standaloneService_ = false;  // the rendezvous is a rendezvousd (it may restart)
  bool failureAnnounced_ = false;   // "the job failed: ..." is printed
  // Why the group was stopped from outside: another node's failure, loss or arrival, or the
  // rendezvous gone.
  enum class Remote { kNone, kWaiting, kFailed, kLost, kGone } remote_ = Remote::kNone;
  std::string remoteWhy_;

  enum class Stopping { kNo, kFailure, kSignal, kRemote, kDone };
  Stopping stopping_ = Stopping::kNo;
  int stopSignal_ = 0;
  int rootLocalRank_ = -1;
  std::optional<Failure> rootCause_;
  std::vector<Failure> failures_;
  std::chrono::steady_clock::time_point stopStarted_;
  std::chrono::steady_clock::time_point roundStarted_;
  int exitCode_ = 1;
  bool killArmed_ = false;  // the round's kill timer is running
  bool stuck_ = false;      // a process outlived SIGKILL: no restart
  // The workers' console output, written off the event loop (made in run(), after the
  // orphan guard's fork, since they start threads).
  std::unique_ptr<ConsoleStream> stdout_, stderr_;
  std::map<std::string, WorkerGroup::LogLoss> lostLogs_;
  std::chrono::steady_clock::time_point launched_, joinStarted_;
  // The roll-call, the hang timer, the file timer.
  int stacksSignal_ = 0;  // 0: --stacks=off
  std::string pythonHookDir_;
  std::string timerFile_, progressFifo_;
  std::unique_ptr<FileTimerServer> timerServer_;
  std::unique_ptr<ControlSocket> control_;
  OomWitness oom_;
  boost::asio::steady_timer hangTimer_;
  boost::asio::steady_timer statusTimer_;
  std::chrono::steady_clock::time_point lastProgress_;
  std::string hangWhy_;                  // the round ended as a hang: why, and where its stacks are
  std::map<pid_t, std::string> causes_;  // worker pid -> what launch did to it (its file timer)
  std::deque<std::function<void()>> rollCalls_;  // waiting for the one running
  bool rollCallRunning_ = false;
  int reports_ = 0;  // stacks-N.txt
  std::string lastStacksFile_;  // the last roll-call's report, "" when it wrote none
  // The coordinated stop: the round's stop board, and the stop once one was asked for.
  std::string stopBoard_;
  struct CoordinatedStop {
    int64_t reason = 0;   // the notice's signal, or stopboard::kReason*
    std::chrono::steady_clock::time_point at;
    int64_t step = -1;           // the stop step, once posted
    int64_t frozenHorizon = -1;  // this node's horizon when frozen
    bool timerArmed = false;
    std::optional<std::string> failed;  // why the stop failed (its timeout, an error)
  };
  std::optional<CoordinatedStop> stop_;
  bool stopAware_ = false;              // some rank of the job asked stop_requested
  std::optional<int64_t> pendingStop_;  // a notice that came while the group restarted
  std::optional<int64_t> stopAtUnixS_;  // --stop_at, resolved (Slurm's end time less the margin)
  bool stopAtWaiting_ = false;          // its time came before any rank asked
  std::string stopRecord_;              // the stop record's file, "" for none
  std::optional<int64_t> resumedFrom_;  // the step this start resumed from (the record's)
  boost::asio::steady_timer stopTimer_;
  boost::asio::steady_timer stopAtTimer_;
  std::unique_ptr<StopAgreement> agreement_;  // multi-node: the step every node agrees on
};

}  // namespace muster::launcher
