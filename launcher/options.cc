// launch's flag table and parser. Hand-written rather than CLI11: torchrun stops at the first
// positional (the program) and passes the rest untouched, reads PET_* defaults, takes both
// --x_y and --x-y, and takes a prefix of one flag's names as argparse does (--redirect for
// --redirects); a table keeps these rules in one place. Each value is parsed by
// option_values.h, the options are checked together in options_validate.cc, the host's devices
// counted in devices.cc, and the worker's command made in worker_command.cc.
#include "launcher/options.h"

#include <fmt/format.h>

#include <csignal>
#include <functional>

#include "absl/strings/ascii.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "launcher/devices.h"
#include "launcher/option_values.h"

namespace muster::launcher {
namespace {

using namespace flags;  // NOLINT: the table reads best with the short names

struct Flag {
  std::vector<std::string> names;  // every spelling, e.g. --nproc_per_node --nproc-per-node
  std::string pet;                 // PET_* default, "" for none
  bool takesValue = true;
  std::function<absl::Status(LaunchOptions&, const std::string&)> apply;
  std::string help;
};

// A list of signal names (SIGTERM,SIGUSR1) launch can catch.
absl::StatusOr<std::vector<int>> signalList(const char* flagName, const std::string& v) {
  const std::string expected = "signal names separated by commas (e.g. SIGTERM,SIGINT,SIGUSR1)";
  std::vector<int> sigs;
  for (absl::string_view part : absl::StrSplit(v, ',')) {
    std::string name(absl::StripAsciiWhitespace(part));
    int sig = 0;
    if (name.rfind("SIG", 0) != 0 || !signalNumber(name.substr(3), sig)) {
      return bad(flagName, v, expected + "; '" + name + "' is none");
    }
    if (sig == SIGKILL || sig == SIGSTOP || sig == SIGCHLD) {
      return bad(flagName, v, "signals launch can catch (" + name + " cannot be handled)");
    }
    sigs.push_back(sig);
  }
  return sigs;
}

std::vector<Flag> flagTable() {
  std::vector<Flag> t;
  auto str = [](std::string LaunchOptions::*field) {
    return [field](LaunchOptions& o, const std::string& v) {
      o.*field = v;
      return absl::OkStatus();
    };
  };
  auto flag = [](bool LaunchOptions::*field) {
    return [field](LaunchOptions& o, const std::string&) {
      o.*field = true;
      return absl::OkStatus();
    };
  };
  auto seconds = [](const char* name, double LaunchOptions::*field) {
    return [name, field](LaunchOptions& o, const std::string& v) -> absl::Status {
      auto s = toSeconds(name, v);
      if (!s.ok()) return s.status();
      o.*field = *s;
      return absl::OkStatus();
    };
  };
  t.push_back({{"--nnodes"}, "PET_NNODES", true,
               [](LaunchOptions& o, const std::string& v) -> absl::Status {
                 const std::string expected = "N or MIN:MAX with 1 <= MIN <= MAX (e.g. 1:4)";
                 std::vector<std::string> parts = absl::StrSplit(v, ':');
                 if (parts.size() > 2) return bad("--nnodes", v, expected);
                 auto lo = toInt("--nnodes", parts[0], 1, expected);
                 auto hi = toInt("--nnodes", parts.back(), 1, expected);
                 if (!lo.ok() || !hi.ok() || *lo > *hi) return bad("--nnodes", v, expected);
                 o.minNodes = *lo;
                 o.maxNodes = *hi;
                 return absl::OkStatus();
               },
               "nodes: N or MIN:MAX (default 1)"});
  t.push_back({{"--nproc_per_node", "--nproc-per-node"}, "PET_NPROC_PER_NODE", true,
               str(&LaunchOptions::nprocPerNode), "workers per node: N, gpu, cpu or auto"});
  t.push_back({{"--rdzv_backend", "--rdzv-backend"}, "PET_RDZV_BACKEND", true,
               str(&LaunchOptions::rdzvBackend), "static (default), c10d, muster, or etcd (etcd-v2)"});
  t.push_back({{"--rdzv_endpoint", "--rdzv-endpoint"}, "PET_RDZV_ENDPOINT", true,
               str(&LaunchOptions::rdzvEndpoint), "HOST:PORT of the rendezvous store (etcd: its members, comma-separated)"});
  t.push_back({{"--rdzv_id", "--rdzv-id"}, "PET_RDZV_ID", true, str(&LaunchOptions::rdzvId),
               "job id (default none)"});
  t.push_back({{"--rdzv_conf", "--rdzv-conf"}, "PET_RDZV_CONF", true,
               [](LaunchOptions& o, const std::string& v) { return parseRdzvConf(v, o.rdzvConf); },
               "KEY=VALUE,... (join_timeout, last_call_timeout, ...)"});
  t.push_back({{"--standalone"}, "PET_STANDALONE", false, flag(&LaunchOptions::standalone),
               "single node with its own rendezvous (as torchrun)"});
  t.push_back({{"--max_restarts", "--max-restarts"}, "PET_MAX_RESTARTS", true,
               [](LaunchOptions& o, const std::string& v) -> absl::Status {
                 auto n = toInt("--max_restarts", v, 0, "an integer >= 0");
                 if (!n.ok()) return n.status();
                 o.maxRestarts = *n;
                 return absl::OkStatus();
               },
               "restarts of the whole group before failing (default 0)"});
  t.push_back({{"--monitor_interval", "--monitor-interval"}, "PET_MONITOR_INTERVAL", true,
               seconds("--monitor_interval", &LaunchOptions::monitorInterval),
               "accepted for torchrun compatibility; exits are seen at once"});
  t.push_back({{"--start_method", "--start-method"}, "PET_START_METHOD", true,
               [](LaunchOptions& o, const std::string& v) -> absl::Status {
                 if (v != "spawn" && v != "fork" && v != "forkserver") {
                   return bad("--start_method", v, "spawn, fork or forkserver");
                 }
                 o.startMethod = v;
                 return absl::OkStatus();
               },
               "accepted for torchrun compatibility"});
  t.push_back({{"--role"}, "PET_ROLE", true, str(&LaunchOptions::role),
               "worker role (default default)"});
  t.push_back({{"-m", "--module"}, "PET_MODULE", false, flag(&LaunchOptions::module),
               "run PROGRAM as a Python module (python -m)"});
  t.push_back({{"--no_python", "--no-python"}, "PET_NO_PYTHON", false,
               flag(&LaunchOptions::noPython), "run PROGRAM directly, not under Python"});
  t.push_back({{"--run_path", "--run-path"}, "PET_RUN_PATH", false,
               flag(&LaunchOptions::runPath), "run PROGRAM as a Python script path"});
  t.push_back({{"--log_dir", "--log-dir"}, "PET_LOG_DIR", true, str(&LaunchOptions::logDir),
               "directory for logs and error files"});
  t.push_back({{"-r", "--redirects"}, "PET_REDIRECTS", true,
               [](LaunchOptions& o, const std::string& v) -> absl::Status {
                 auto s = parseStd("--redirects", v);
                 if (!s.ok()) return s.status();
                 o.redirects = *s;
                 return absl::OkStatus();
               },
               "send streams to files: 0 none, 1 out, 2 err, 3 both, or RANK:N,..."});
  t.push_back({{"-t", "--tee"}, "PET_TEE", true,
               [](LaunchOptions& o, const std::string& v) -> absl::Status {
                 auto s = parseStd("--tee", v);
                 if (!s.ok()) return s.status();
                 o.tee = *s;
                 return absl::OkStatus();
               },
               "copy streams to files and the console (same values as --redirects)"});
  t.push_back({{"--local_ranks_filter", "--local-ranks-filter"}, "PET_LOCAL_RANKS_FILTER", true,
               [](LaunchOptions& o, const std::string& v) -> absl::Status {
                 std::set<int> ranks;
                 for (absl::string_view part : absl::StrSplit(v, ',')) {
                   auto r = toInt("--local_ranks_filter", std::string(part), 0,
                                  "local ranks separated by commas (e.g. 0,1)");
                   if (!r.ok()) return r.status();
                   ranks.insert(*r);
                 }
                 o.localRanksFilter = ranks;
                 return absl::OkStatus();
               },
               "show only these local ranks' output on the console"});
  t.push_back({{"--logs_specs", "--logs-specs"}, "PET_LOGS_SPECS", true,
               [](LaunchOptions&, const std::string& v) -> absl::Status {
                 if (v != "default" && !v.empty()) {
                   return bad("--logs_specs", v,
                              "default (custom LogsSpecs classes are Python; use --log_dir, "
                              "--redirects and --tee)");
                 }
                 return absl::OkStatus();
               },
               "accepted with the value default"});
  t.push_back({{"--node_rank", "--node-rank"}, "PET_NODE_RANK", true,
               [](LaunchOptions& o, const std::string& v) -> absl::Status {
                 auto n = toInt("--node_rank", v, 0, "an integer >= 0");
                 if (!n.ok()) return n.status();
                 o.nodeRank = *n;
                 return absl::OkStatus();
               },
               "this node's rank (static rendezvous)"});
  t.push_back({{"--master_addr", "--master-addr"}, "PET_MASTER_ADDR", true,
               str(&LaunchOptions::masterAddr), "address of node 0 (default 127.0.0.1)"});
  t.push_back({{"--master_port", "--master-port"}, "PET_MASTER_PORT", true,
               [](LaunchOptions& o, const std::string& v) -> absl::Status {
                 auto n = toInt("--master_port", v, 0, "a port 0-65535");
                 if (!n.ok() || *n > 65535) return bad("--master_port", v, "a port 0-65535");
                 o.masterPort = *n;
                 return absl::OkStatus();
               },
               "port on node 0 (default 29500; 0 picks a free one)"});
  t.push_back({{"--local_addr", "--local-addr"}, "PET_LOCAL_ADDR", true,
               str(&LaunchOptions::localAddr), "this node's address as the others reach it"});
  t.push_back({{"--slurm"}, "MUSTER_SLURM", true,
               [](LaunchOptions& o, const std::string& v) -> absl::Status {
                 if (v != "auto" && v != "off") return bad("--slurm", v, "auto or off");
                 o.slurm = v == "auto";
                 return absl::OkStatus();
               },
               "auto (default): inside srun, absent --nnodes, --node_rank, --master_addr, "
               "--master_port, --rdzv_id and --shared_dir come from SLURM_*; off: ignore Slurm"});
  t.push_back({{"--use_env", "--use-env"}, "PET_USE_ENV", false, flag(&LaunchOptions::useEnv),
               "with --legacy_launch: do not append --local_rank"});
  t.push_back({{"--legacy_launch", "--legacy-launch"}, "MUSTER_LEGACY_LAUNCH", true,
               [](LaunchOptions& o, const std::string& v) -> absl::Status {
                 if (v != "1.13" && v != "2") return bad("--legacy_launch", v, "1.13 or 2");
                 o.legacyLaunch = v;
                 return absl::OkStatus();
               },
               "behave as python -m torch.distributed.launch of PyTorch 1.13 "
               "(--local_rank=N) or 2 (--local-rank=N)"});
  t.push_back({{"--torchrun_version", "--torchrun-version"}, "MUSTER_TORCHRUN_VERSION", true,
               [](LaunchOptions& o, const std::string& v) -> absl::Status {
                 auto version = TorchrunVersion::parse(v);
                 if (!version.ok()) return version.status();
                 o.torchrun = *version;
                 return absl::OkStatus();
               },
               "where torchrun's releases differ, do as this torch's does (default 2.14; 1.13: "
               "NCCL_ASYNC_ERROR_HANDLING, one node on 127.0.0.1:29500); torch.__version__ works"});
  t.push_back({{"--prefix_output", "--prefix-output"}, "MUSTER_PREFIX_OUTPUT", false,
               flag(&LaunchOptions::prefixOutput),
               "prefix console lines with the role and local rank ([default0]:)"});
  t.push_back({{"--grace_period", "--grace-period"}, "MUSTER_GRACE_PERIOD", true,
               seconds("--grace_period", &LaunchOptions::gracePeriodS),
               "seconds between SIGTERM and SIGKILL when stopping workers (default 30)"});
  t.push_back({{"--kill_timeout", "--kill-timeout"}, "MUSTER_KILL_TIMEOUT", true,
               seconds("--kill_timeout", &LaunchOptions::killTimeoutS),
               "seconds to wait for workers after SIGKILL; one still there is reported with its "
               "kernel state and launch exits without it (default 30)"});
  t.push_back({{"--hang_timeout", "--hang-timeout"}, "PET_HANG_TIMEOUT", true,
               seconds("--hang_timeout", &LaunchOptions::hangTimeoutS),
               "seconds without progress from any rank (a line of output, a file timer request, "
               "a heartbeat) after which the job counts as hung: every rank's stack is taken and "
               "the job fails or restarts (default 0: off)"});
  t.push_back({{"--stacks"}, "MUSTER_STACKS", true,
               [](LaunchOptions& o, const std::string& v) -> absl::Status {
                 if (v != "on" && v != "off") return bad("--stacks", v, "on or off");
                 o.stacks = v == "on";
                 return absl::OkStatus();
               },
               "on (default): ranks answer a stack roll-call (on a hang, a failure, an expired file "
               "timer, rendezvousctl stacks) through a Python start-up hook or the worker "
               "library; off: no hook"});
  t.push_back({{"--stacks_timeout", "--stacks-timeout"}, "MUSTER_STACKS_TIMEOUT", true,
               seconds("--stacks_timeout", &LaunchOptions::stacksTimeoutS),
               "seconds a roll-call waits for a rank's stacks (default 3)"});
  t.push_back({{"--shared_dir", "--shared-dir"}, "MUSTER_SHARED_DIR", true,
               str(&LaunchOptions::sharedDir), "directory every rank can read (MUSTER_SHARED_DIR)"});
  t.push_back({{"--rdzv_tls_ca", "--rdzv-tls-ca"}, "MUSTER_RDZV_TLS_CA", true,
               str(&LaunchOptions::rdzvTlsCa),
               "PEM file of the CA that signed a rendezvousd's TLS certificate: join it over TLS "
               "(the workers reach its store the same way)"});
  t.push_back({{"--rdzv_tls_server_name", "--rdzv-tls-server-name"}, "MUSTER_RDZV_TLS_SERVER_NAME",
               true, str(&LaunchOptions::rdzvTlsServerName),
               "name to check in the rendezvousd's certificate (default: the endpoint's host)"});
  t.push_back({{"--worker_store", "--worker-store"}, "MUSTER_WORKER_STORE", true,
               [](LaunchOptions& o, const std::string& v) -> absl::Status {
                 if (v != "agent" && v != "rank0") return bad("--worker_store", v, "agent or rank0");
                 o.agentStore = v == "agent";
                 return absl::OkStatus();
               },
               "agent (default): launch serves the workers' TCPStore on MASTER_PORT "
               "(TORCHELASTIC_USE_AGENT_STORE=True); rank0: rank 0's worker hosts its own"});
  t.push_back({{"--signals_to_handle", "--signals-to-handle"}, "PET_SIGNALS_TO_HANDLE", true,
               [](LaunchOptions& o, const std::string& v) -> absl::Status {
                 auto sigs = signalList("--signals_to_handle", v);
                 if (!sigs.ok()) return sigs.status();
                 o.stopSignals = *sigs;
                 o.signalsToHandle = v;
                 return absl::OkStatus();
               },
               "signals that stop the job, forwarded to every worker (default "
               "SIGTERM,SIGINT,SIGHUP,SIGQUIT); SIGUSR1/2 not listed are forwarded as notices"});
  t.push_back({{"--shutdown_timeout", "--shutdown-timeout"}, "PET_SHUTDOWN_TIMEOUT", true,
               seconds("--shutdown_timeout", &LaunchOptions::gracePeriodS),
               "seconds between the stop signal and SIGKILL (TORCH_ELASTIC_SHUTDOWN_TIMEOUT; "
               "default 30; as --grace_period)"});
  t.push_back({{"--stop_notice", "--stop-notice"}, "MUSTER_STOP_NOTICE", true,
               [](LaunchOptions& o, const std::string& v) -> absl::Status {
                 auto sigs = signalList("--stop_notice", v);
                 if (!sigs.ok()) return sigs.status();
                 o.stopNotice = *sigs;
                 return absl::OkStatus();
               },
               "signals that stop a job whose ranks ask stop_requested(step) at one step on every "
               "rank (default SIGUSR1, Slurm's --signal; add SIGTERM for Kubernetes); before a rank "
               "asked, they are handled as without this flag"});
  t.push_back({{"--stop_timeout", "--stop-timeout"}, "MUSTER_STOP_TIMEOUT", true,
               seconds("--stop_timeout", &LaunchOptions::stopTimeoutS),
               "seconds the ranks have, from a stop notice, to reach the stop step and exit; then "
               "they are stopped as a failure (SIGTERM, then SIGKILL after the grace period; "
               "default 60; 0: no limit)"});
  t.push_back({{"--stop_at", "--stop-at"}, "MUSTER_STOP_AT", true,
               [](LaunchOptions& o, const std::string& v) -> absl::Status {
                 auto at = parseStopAt(v);
                 if (!at.ok()) return at.status();
                 o.stopAt = *at;
                 return absl::OkStatus();
               },
               "when launch asks the job to stop at one step by itself, as on a --stop_notice: Unix "
               "seconds, a local time YYYY-MM-DDTHH:MM:SS, or slurm[-SECONDS]: the Slurm job's end "
               "time (squeue) less SECONDS (default 300) for the checkpoint"});
  t.push_back({{"--stop_record", "--stop-record"}, "MUSTER_STOP_RECORD", true, str(&LaunchOptions::stopRecord),
               "file where a clean stop keeps its step, which the job's next start gives its ranks as "
               "MUSTER_RESUMED_FROM_STEP (default: <shared dir>/.muster-stopped-<run id>.json when a "
               "shared dir is given, else none)"});
  t.push_back({{"--requeue"}, "MUSTER_REQUEUE", false, flag(&LaunchOptions::requeue),
               "after a clean stop on request, requeue the Slurm job (scontrol requeue "
               "$SLURM_JOB_ID; node 0 does it): it comes back and resumes"});
  t.push_back({{"--virtual_local_rank", "--virtual-local-rank"}, "PET_VIRTUAL_LOCAL_RANK", false,
               flag(&LaunchOptions::virtualLocalRank),
               "LOCAL_RANK=0 for every worker, CUDA_VISIBLE_DEVICES narrowed to its own device"});
  t.push_back({{"--event_log_handler", "--event-log-handler"}, "PET_EVENT_LOG_HANDLER", true,
               [](LaunchOptions& o, const std::string& v) -> absl::Status {
                 if (v != "null" && v != "console" && v != "dynamic_rendezvous") {
                   return bad("--event_log_handler", v, "null, console or dynamic_rendezvous");
                 }
                 o.eventLogHandler = v;
                 return absl::OkStatus();
               },
               "console: one JSON line on stderr per agent and worker event, as torchelastic's"});
  auto filters = [](std::vector<std::string> LaunchOptions::*field) {
    return [field](LaunchOptions& o, const std::string& v) {
      o.*field = commaSeparatedList(v);
      return absl::OkStatus();
    };
  };
  t.push_back({{"--duplicate_stdout_filters", "--duplicate-stdout-filters"},
               "PET_DUPLICATE_STDOUT_FILTERS", true, filters(&LaunchOptions::duplicateStdoutFilters),
               "copy tee'd stdout lines containing any of these (a,b; ',,' is a comma) to "
               "attempt_N/filtered_stdout.log"});
  t.push_back({{"--duplicate_stderr_filters", "--duplicate-stderr-filters"},
               "PET_DUPLICATE_STDERR_FILTERS", true, filters(&LaunchOptions::duplicateStderrFilters),
               "the same for stderr, to attempt_N/filtered_stderr.log"});
  t.push_back({{"--numa_binding", "--numa-binding"}, "", true,
               [](LaunchOptions& o, const std::string& v) -> absl::Status {
                 if (v != "node" && v != "socket" && v != "exclusive" && v != "core-complex") {
                   return bad("--numa_binding", v, "node, socket, exclusive or core-complex");
                 }
                 o.numaBinding = v;
                 return absl::OkStatus();
               },
               "bind each worker to the CPUs near its GPU (node, socket, exclusive, "
               "core-complex); needs GPUs and numactl"});
  t.push_back({{"--log_line_prefix_template", "--log-line-prefix-template"},
               "PET_LOG_LINE_PREFIX_TEMPLATE", true, str(&LaunchOptions::logLinePrefixTemplate),
               "console line prefix: ${role_name} ${local_rank} ${rank} ${hostname} "
               "(TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE)"});
  t.push_back({{"--log_level", "--log-level"}, "MUSTER_LOG_LEVEL", true,
               str(&LaunchOptions::logLevel), "launch's own log level (info)"});
  return t;
}

}  // namespace

std::vector<std::string> commaSeparatedList(const std::string& value) {
  const std::string placeholder = std::string(1, '\0');
  std::string v = value;
  for (size_t pos; (pos = v.find(",,")) != std::string::npos;) v.replace(pos, 2, placeholder);
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(v, ',')) {
    std::string item(part);
    for (char& c : item) {
      if (c == '\0') c = ',';
    }
    out.push_back(item);
  }
  return out;
}

StdSpec LaunchOptions::redirectFor(int localRank) const {
  if (auto it = redirects.find(localRank); it != redirects.end()) return it->second;
  if (auto it = redirects.find(-1); it != redirects.end()) return it->second;
  return {};
}

StdSpec LaunchOptions::teeFor(int localRank) const {
  if (auto it = tee.find(localRank); it != tee.end()) return it->second;
  if (auto it = tee.find(-1); it != tee.end()) return it->second;
  return {};
}

bool LaunchOptions::consoleShows(int localRank) const {
  return !localRanksFilter || localRanksFilter->count(localRank) > 0;
}

std::string launchUsage() {
  std::string out =
      "usage: launch [FLAGS] PROGRAM [ARGS...]\n"
      "  A drop-in for torchrun / python -m torch.distributed.launch. PROGRAM is a Python\n"
      "  script (run under $PYTHON_EXEC or python3), a module with -m, or an executable.\n"
      "  Everything after PROGRAM goes to it untouched. Flags take --x_y or --x-y,\n"
      "  --flag=value or --flag value; PET_<FLAG> environment variables give defaults.\n\n";
  out += fmt::format("  {:<44} {}\n", "-h, --help", "this text");
  out += fmt::format("  {:<44} {}\n", "--version", "muster's version, its commit, and whether NCCL is built in");
  for (const auto& f : flagTable()) {
    std::string names;
    for (const auto& n : f.names) names += (names.empty() ? "" : ", ") + n;
    out += fmt::format("  {:<44} {}\n", names + (f.takesValue ? " V" : ""), f.help);
  }
  return out;
}

absl::StatusOr<LaunchOptions> parseLaunchFlags(const std::vector<std::string>& args,
                                               const std::map<std::string, std::string>& env) {
  LaunchOptions o;
  if (auto it = env.find("TORCH_DISABLE_SHARE_RDZV_TCP_STORE"); it != env.end() && it->second == "1") {
    o.agentStore = false;
  }
  o.stopSignals = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
  // torchrun's lower-precedence defaults: flags and PET_* override them.
  if (auto it = env.find("TORCH_ELASTIC_SHUTDOWN_TIMEOUT"); it != env.end()) {
    auto s = toSeconds("--shutdown_timeout", it->second);
    if (!s.ok()) {
      return absl::InvalidArgumentError(fmt::format(
          "{} (from TORCH_ELASTIC_SHUTDOWN_TIMEOUT={})", std::string(s.status().message()), it->second));
    }
    o.gracePeriodS = *s;
  }
  if (auto it = env.find("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"); it != env.end()) {
    o.logLinePrefixTemplate = it->second;
  }
  auto table = flagTable();
  // A flag by its name, or as torchrun's argparse takes it (allow_abbrev), by a prefix of one
  // flag's long names alone (--redirect for --redirects); a prefix of several is ambiguous.
  auto find = [&](const std::string& name) -> absl::StatusOr<const Flag*> {
    for (const auto& f : table) {
      for (const auto& n : f.names) {
        if (n == name) return &f;
      }
    }
    std::vector<const Flag*> matches;
    std::vector<std::string> names;
    if (name.size() > 2 && name.rfind("--", 0) == 0) {
      for (const auto& f : table) {
        for (const auto& n : f.names) {
          if (n.rfind(name, 0) != 0) continue;
          if (matches.empty() || matches.back() != &f) matches.push_back(&f);
          names.push_back(n);
        }
      }
    }
    if (matches.size() == 1) return matches[0];
    if (matches.empty()) return absl::InvalidArgumentError(fmt::format("unknown flag {} (see launch --help)", name));
    return absl::InvalidArgumentError(
        fmt::format("ambiguous flag {}: it could be {}", name, absl::StrJoin(names, ", ")));
  };
  // PET_* defaults first; flags on the command line override them.
  for (const auto& f : table) {
    auto it = env.find(f.pet);
    if (f.pet.empty() || it == env.end()) continue;
    if (!f.takesValue) {
      if (isTrue(it->second)) {
        auto s = f.apply(o, it->second);
        if (!s.ok()) return s;
        o.given.insert(f.names[0]);
      }
      continue;
    }
    auto s = f.apply(o, it->second);
    o.given.insert(f.names[0]);
    if (!s.ok()) {
      // The variable's value as given, cut: the message is one line, however long the value.
      const std::string& v = it->second;
      return absl::InvalidArgumentError(fmt::format("{} (from {}={}{})", std::string(s.message()), f.pet,
                                                    v.substr(0, 64), v.size() > 64 ? "..." : ""));
    }
  }
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "-h" || arg == "--help") return absl::NotFoundError(launchUsage());
    if (arg == "--version") {
      o.showVersion = true;
      return o;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // the program
    std::string name = arg, value;
    bool inlineValue = false;
    if (auto eq = arg.find('='); eq != std::string::npos && arg.rfind("--", 0) == 0) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      inlineValue = true;
    }
    auto found = find(name);
    if (!found.ok()) return found.status();
    const Flag* f = *found;
    if (f->takesValue) {
      if (!inlineValue) {
        if (i + 1 >= args.size()) {
          return absl::InvalidArgumentError(fmt::format("{} needs a value", name));
        }
        value = args[++i];
      }
    } else if (inlineValue && !isTrue(value)) {
      continue;  // --flag=0 leaves it off
    }
    auto s = f->apply(o, value);
    if (!s.ok()) return s;
    o.given.insert(f->names[0]);
  }
  if (i >= args.size()) {
    return absl::InvalidArgumentError("no PROGRAM given (see launch --help)");
  }
  o.program = args[i];
  o.programArgs.assign(args.begin() + static_cast<long>(i) + 1, args.end());
  auto nproc = resolveNproc(o.nprocPerNode, env);
  if (!nproc.ok()) return nproc.status();
  o.localWorldSize = *nproc;
  if (o.standalone) {
    o.rdzvBackend = "c10d";
    o.minNodes = o.maxNodes = 1;
  }
  // torch.distributed.launch of 1.13 sets 1.13's variables.
  if (o.legacyLaunch == "1.13" && !o.given.count("--torchrun_version")) o.torchrun = {1, 13};
  if (auto it = env.find("MUSTER_LOG_LEVEL"); it != env.end() && o.logLevel.empty()) {
    o.logLevel = it->second;
  }
  return o;
}

}  // namespace muster::launcher
