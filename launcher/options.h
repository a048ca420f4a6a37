// launch's command line: torchrun's flags (1.13 and 2.x spellings, PET_* defaults) and
// muster's own, parsed into LaunchOptions before anything starts.
#pragma once

#include <csignal>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/deadline.h"
#include "launcher/stop_at.h"
#include "launcher/torchrun_version.h"

namespace muster::launcher {

// Which of a worker's streams go where (torchrun's -r/--redirects and -t/--tee values).
struct StdSpec {
  bool out = false;
  bool err = false;
};

struct LaunchOptions {
  bool showVersion = false;  // --version: print it and exit; nothing else is parsed
  // Sizes.
  int minNodes = 1;
  int maxNodes = 1;
  std::string nprocPerNode = "1";  // as given: N, gpu, cpu or auto
  int localWorldSize = 1;          // resolved
  int nodeRank = 0;
  // Rendezvous.
  std::string rdzvBackend = "static";
  // etcd or etcd-v2 (torchrun's two names; both speak etcd's v3 API here).
  bool etcd() const { return rdzvBackend == "etcd" || rdzvBackend == "etcd-v2"; }
  std::string rdzvEndpoint;
  std::string rdzvHost;  // rdzvEndpoint parsed: "[::1]:29400" gives "::1" and 29400; a
  int rdzvPort = 29400;  // missing port is 29400 (torchrun's default); 0 hosts on a free port
  std::string rdzvId = "none";
  // --rdzv_conf KEY=VALUE,...: torchrun's keys, checked at parse time; others are kept (and
  // ignored) as torchrun's backends ignore what they do not know.
  struct RdzvConf {
    Millis joinTimeout{600000};        // join_timeout (seconds)
    Millis lastCall{30000};            // last_call_timeout
    Millis keepAliveInterval{5000};    // keep_alive_interval
    int keepAliveMaxAttempt = 3;       // keep_alive_max_attempt
    std::optional<bool> isHost;        // is_host: whether this node hosts the rendezvous
    std::map<std::string, std::string> given;  // every pair as given
  } rdzvConf;
  bool standalone = false;
  std::string masterAddr = "127.0.0.1";
  int masterPort = 29500;
  std::string localAddr;
  // Running the program.
  std::string program;
  std::vector<std::string> programArgs;
  bool module = false;
  bool noPython = false;
  bool runPath = false;
  std::string role = "default";
  int maxRestarts = 0;
  double monitorInterval = 0.1;  // accepted; muster sees exits as events
  std::string startMethod = "spawn";
  // torch.distributed.launch: append --local_rank=N (1.13) or --local-rank=N (2.x) to the
  // program's arguments unless useEnv.
  std::string legacyLaunch;  // "", "1.13" or "2"
  bool useEnv = false;
  // Logs.
  std::string logDir;
  std::map<int, StdSpec> redirects;  // local rank -> streams; key -1: every rank
  std::map<int, StdSpec> tee;
  std::optional<std::set<int>> localRanksFilter;
  bool prefixOutput = false;
  // torchrun 2.x.
  // Signals that stop the job, forwarded to every worker's process group (--signals_to_handle;
  // torchrun's default SIGTERM,SIGINT,SIGHUP,SIGQUIT). SIGUSR1/SIGUSR2 not listed here are
  // forwarded as notices and the job goes on (Slurm's --signal).
  std::vector<int> stopSignals;
  std::string signalsToHandle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";  // as given (2.14 exports it)
  bool virtualLocalRank = false;       // LOCAL_RANK=0, CUDA_VISIBLE_DEVICES one device
  std::string eventLogHandler = "null";  // null, console or dynamic_rendezvous
  // Empty: the flag was not given (a given flag has at least one filter, maybe "").
  std::vector<std::string> duplicateStdoutFilters, duplicateStderrFilters;
  std::string numaBinding;             // "", node, socket, exclusive, core-complex
  // TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE / --log_line_prefix_template: ${role_name},
  // ${local_rank}, ${rank}, ${hostname}; "" for torchrun's [role local_rank]:.
  std::string logLinePrefixTemplate;
  // muster's own.
  // Which torchrun launch follows where releases differ (torchrun_version.h); --legacy_launch
  // =1.13 implies 1.13 unless given.
  TorchrunVersion torchrun;
  double gracePeriodS = 30;  // SIGTERM -> SIGKILL (--shutdown_timeout, --grace_period)
  double killTimeoutS = 30;  // SIGKILL -> giving up on a worker stuck in the kernel
  // --hang_timeout: no rank's progress (output, file timer, heartbeat) for this long is a
  // hang: a stack roll-call, then a failure. 0: off.
  double hangTimeoutS = 0;
  // The coordinated stop (stop_requested): signals that ask for it once a rank has asked, and
  // how long the ranks have to reach the stop step and exit.
  std::vector<int> stopNotice{SIGUSR1};
  double stopTimeoutS = 60;
  std::optional<StopAt> stopAt;  // --stop_at: a time at which launch asks the stop by itself
  std::string stopRecord;        // --stop_record: where the stop step is kept (stop_record.h)
  bool requeue = false;          // --requeue: scontrol requeue the Slurm job after a clean stop
  bool stacks = true;           // --stacks=on: ranks answer a roll-call (Python hook, native handler)
  double stacksTimeoutS = 3;    // how long a roll-call waits for a rank
  std::string sharedDir;
  // A rendezvousd with TLS: the CA that signed its certificate (a PEM file), and the name to
  // check in it ("" for the endpoint's host).
  std::string rdzvTlsCa;
  std::string rdzvTlsServerName;
  std::string logLevel;
  bool slurm = true;  // --slurm=auto (default) or off
  // The workers' c10d store: launch's agent store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE
  // =True, --worker_store=agent, the default), or rank 0's own TCPStore (rank0; also what
  // TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 selects, as in torchrun).
  bool agentStore = true;

  // Canonical names (e.g. "--nnodes") of the flags set on the command line or by PET_*.
  std::set<std::string> given;
  // Inside a Slurm step: the job id and the flags taken from it ("--nnodes=2", ...).
  std::string slurmJob;
  std::vector<std::string> fromSlurm;
  bool masterAddrFromSlurm = false;  // masterAddr is a Slurm host name (see slurmNodeAddress)
  bool sharedDirFromSlurm = false;   // sharedDir is a default under SLURM_SUBMIT_DIR, to create

  StdSpec redirectFor(int localRank) const;
  StdSpec teeFor(int localRank) const;
  bool consoleShows(int localRank) const;
};

// launch reads its options in three steps, so that what Slurm fills in is checked like what
// was typed: parseLaunchFlags, then takeFromSlurm, then validateLaunchOptions.
//
// Parses argv (without argv[0]); `env` supplies PET_* defaults, PYTHON_EXEC and CPU/GPU
// counts come from the host. Checks each value alone. Errors: INVALID_ARGUMENT with one line
// that names the flag. Help: NOT_FOUND carrying the usage text (print it, exit 0).
// --version before PROGRAM: showVersion, and nothing after it is read.
absl::StatusOr<LaunchOptions> parseLaunchFlags(const std::vector<std::string>& args,
                                               const std::map<std::string, std::string>& env);

// Inside a Slurm allocation (SLURM_JOB_ID, unless --slurm=off): the flags not given, from
// SLURM_* (slurm.h's applySlurmStep). Touches nothing outside `options` (settleSlurmStep does,
// once the options are valid). Errors: INVALID_ARGUMENT naming the variable or the mismatch.
absl::Status takeFromSlurm(LaunchOptions& options, const std::map<std::string, std::string>& env);

// Checks the options together (backend, endpoint, node counts and rank, devices, numactl) and
// resolves --rdzv_endpoint into rdzvHost/rdzvPort. Errors: INVALID_ARGUMENT, one line.
absl::Status validateLaunchOptions(LaunchOptions& options,
                                   const std::map<std::string, std::string>& env);

// The three steps in order, for callers that want them at once (tests, tools).
absl::StatusOr<LaunchOptions> parseLaunchOptions(const std::vector<std::string>& args,
                                                 const std::map<std::string, std::string>& env);

// torchrun's comma_separated_list: "a,,b,c" -> {"a,b", "c"}.
std::vector<std::string> commaSeparatedList(const std::string& value);

std::string launchUsage();

}  // namespace muster::launcher
