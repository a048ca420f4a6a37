// launch's flag table and parser. Hand-written rather than CLI11: torchrun stops at the first
// positional (the program) and passes the rest untouched, reads PET_* defaults, and takes both
// --x_y and --x-y; a table keeps all three rules in one place.
#include "launcher/options.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

#include <cmath>
#include <dirent.h>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/net.h"
#include "launcher/slurm.h"

namespace muster::launcher {
namespace {

struct Flag {
  std::vector<std::string> names;  // every spelling, e.g. --nproc_per_node --nproc-per-node
  std::string pet;                 // PET_* default, "" for none
  bool takesValue = true;
  std::function<absl::Status(LaunchOptions&, const std::string&)> apply;
  std::string help;
};

absl::Status bad(const std::string& flag, const std::string& value, const std::string& expected) {
  return absl::InvalidArgumentError(
      fmt::format("{}={} is invalid; expected {}", flag, value, expected));
}

absl::StatusOr<int> toInt(const std::string& flag, const std::string& value, int min,
                          const std::string& expected) {
  try {
    size_t used = 0;
    long long v = std::stoll(value, &used);
    if (used != value.size() || v < min || v > 1'000'000'000) return bad(flag, value, expected);
    return static_cast<int>(v);
  } catch (...) {
    return bad(flag, value, expected);
  }
}

absl::StatusOr<double> toSeconds(const std::string& flag, const std::string& value) {
  try {
    size_t used = 0;
    double v = std::stod(value, &used);
    if (used != value.size() || !std::isfinite(v) || v < 0) {
      return bad(flag, value, "a number of seconds >= 0");
    }
    return v;
  } catch (...) {
    return bad(flag, value, "a number of seconds >= 0");
  }
}

// torchrun's Std.from_str: "3" for every rank, or "0:1,1:2" per local rank (1 out, 2 err,
// 3 both).
absl::StatusOr<std::map<int, StdSpec>> parseStd(const std::string& flag, const std::string& value) {
  auto one = [](int v) { return StdSpec{(v & 1) != 0, (v & 2) != 0}; };
  std::map<int, StdSpec> out;
  const std::string expected = "0-3, or LOCAL_RANK:0-3 pairs (e.g. 0:3,1:2)";
  if (value.find(':') == std::string::npos) {
    auto v = toInt(flag, value, 0, expected);
    if (!v.ok() || *v > 3) return bad(flag, value, expected);
    out[-1] = one(*v);
    return out;
  }
  for (absl::string_view part : absl::StrSplit(value, ',')) {
    std::vector<std::string> kv = absl::StrSplit(part, ':');
    if (kv.size() != 2) return bad(flag, value, expected);
    auto rank = toInt(flag, kv[0], 0, expected);
    auto v = toInt(flag, kv[1], 0, expected);
    if (!rank.ok() || !v.ok() || *v > 3) return bad(flag, value, expected);
    out[*rank] = one(*v);
  }
  return out;
}

int countCpus() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

// "TERM" -> SIGTERM, as Python's signal module names them (the inverse of signalName()).
bool signalNumber(const std::string& abbrev, int& sig) {
  for (int s = 1; s < NSIG; ++s) {
    const char* name = sigabbrev_np(s);
    if (name != nullptr && abbrev == name) {
      sig = s;
      return true;
    }
  }
  return false;
}

// --rdzv_conf's value into its typed form: one clear line for a malformed pair or value.
absl::Status parseRdzvConf(const std::string& v, LaunchOptions::RdzvConf& conf) {
  conf = LaunchOptions::RdzvConf{};
  if (v.empty()) return absl::OkStatus();
  for (absl::string_view part : absl::StrSplit(v, ',')) {
    std::vector<std::string> kv = absl::StrSplit(part, absl::MaxSplits('=', 1));
    if (kv.size() != 2 || kv[0].empty()) return bad("--rdzv_conf", v, "KEY=VALUE pairs separated by commas");
    const std::string &key = kv[0], &value = kv[1];
    conf.given[key] = value;
    auto wrong = [&](const char* expected) {
      return absl::InvalidArgumentError(
          fmt::format("--rdzv_conf {}={} is invalid; expected {}", key, value, expected));
    };
    double secs = 0;
    if (key == "join_timeout" || key == "last_call_timeout" || key == "keep_alive_interval") {
      if (!absl::SimpleAtod(value, &secs) || !std::isfinite(secs) || secs <= 0 || secs > 1e9) {
        return wrong("seconds > 0");
      }
      Millis ms(std::max<int64_t>(1, static_cast<int64_t>(secs * 1000)));
      (key == "join_timeout" ? conf.joinTimeout : key == "last_call_timeout" ? conf.lastCall : conf.keepAliveInterval) = ms;
    } else if (key == "keep_alive_max_attempt") {
      if (!absl::SimpleAtoi(value, &conf.keepAliveMaxAttempt) || conf.keepAliveMaxAttempt < 1) {
        return wrong("a whole number >= 1");
      }
    } else if (key == "is_host") {
      bool host = false;
      if (!absl::SimpleAtob(value, &host)) return wrong("true or false (1, 0, yes, no)");
      conf.isHost = host;
    }
  }
  return absl::OkStatus();
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
               str(&LaunchOptions::rdzvBackend), "static (default), c10d or muster"});
  t.push_back({{"--rdzv_endpoint", "--rdzv-endpoint"}, "PET_RDZV_ENDPOINT", true,
               str(&LaunchOptions::rdzvEndpoint), "HOST:PORT of the rendezvous store"});
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
                 const std::string expected =
                     "signal names separated by commas (e.g. SIGTERM,SIGINT,SIGUSR1)";
                 o.stopSignals.clear();
                 for (absl::string_view part : absl::StrSplit(v, ',')) {
                   std::string name(absl::StripAsciiWhitespace(part));
                   int sig = 0;
                   if (name.rfind("SIG", 0) == 0 && signalNumber(name.substr(3), sig)) {
                     if (sig == SIGKILL || sig == SIGSTOP || sig == SIGCHLD) {
                       return bad("--signals_to_handle", v, "signals launch can catch (" + name +
                                                                " cannot be handled)");
                     }
                     o.stopSignals.push_back(sig);
                   } else {
                     return bad("--signals_to_handle", v, expected + "; '" + name + "' is none");
                   }
                 }
                 o.signalsToHandle = v;
                 return absl::OkStatus();
               },
               "signals that stop the job, forwarded to every worker (default "
               "SIGTERM,SIGINT,SIGHUP,SIGQUIT); SIGUSR1/2 not listed are forwarded as notices"});
  t.push_back({{"--shutdown_timeout", "--shutdown-timeout"}, "PET_SHUTDOWN_TIMEOUT", true,
               seconds("--shutdown_timeout", &LaunchOptions::gracePeriodS),
               "seconds between the stop signal and SIGKILL (TORCH_ELASTIC_SHUTDOWN_TIMEOUT; "
               "default 30; as --grace_period)"});
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

// torchrun's parse_rendezvous_endpoint: HOST, HOST:PORT, [IPV6] or [IPV6]:PORT.
absl::Status parseEndpoint(LaunchOptions& o) {
  const std::string& v = o.rdzvEndpoint;
  auto split = net::splitHostPort(v);
  if (!split) {
    size_t colon = v.find(':');
    if (v.front() != '[' && colon != std::string::npos && v.find(':', colon + 1) != std::string::npos) {
      return absl::InvalidArgumentError(fmt::format(
          "--rdzv_endpoint={} is invalid; an IPv6 address needs brackets (e.g. [::1]:29400)", v));
    }
    return bad("--rdzv_endpoint", v,
               "HOST[:PORT] or [IPV6][:PORT], a port 0-65535 (e.g. node0:29400, [::1]:29400)");
  }
  o.rdzvHost = split->host;
  if (split->port) o.rdzvPort = *split->port;
  return absl::OkStatus();
}

bool isTrue(const std::string& v) { return !v.empty() && v != "0" && v != "false" && v != "False"; }

absl::StatusOr<int> resolveNproc(const std::string& value,
                                 const std::map<std::string, std::string>& env) {
  if (value == "cpu") return countCpus();
  if (value == "gpu") {
    int gpus = countGpus(env);
    if (gpus == 0) {
      return absl::InvalidArgumentError(
          "--nproc_per_node=gpu: this host has no usable GPU (no /dev/nvidiaN device, or "
          "CUDA_VISIBLE_DEVICES is empty); use a number or cpu");
    }
    return gpus;
  }
  if (value == "xpu") {
    int xpus = countXpus(env);
    if (xpus == 0) {
      return absl::InvalidArgumentError(
          "--nproc_per_node=xpu: this host has no usable Intel GPU (no /dev/dri render node of "
          "an Intel device with the i915 or xe driver, or ZE_AFFINITY_MASK is empty); use a "
          "number, cpu or gpu");
    }
    return xpus;
  }
  if (value == "auto") {
    int gpus = countGpus(env);
    return gpus > 0 ? gpus : countCpus();
  }
  auto n = toInt("--nproc_per_node", value, 1, "an integer >= 1, gpu, xpu, cpu or auto");
  if (!n.ok()) return n.status();
  return *n;
}

}  // namespace

int countGpus(const std::map<std::string, std::string>& env) {
  auto it = env.find("CUDA_VISIBLE_DEVICES");
  if (it != env.end()) {
    int n = 0;
    for (absl::string_view part : absl::StrSplit(it->second, ',')) {
      // CUDA stops at the first invalid entry; "-1" hides every device.
      if (part.empty() || part == "-1") break;
      ++n;
    }
    return n;
  }
  int n = 0;
  if (DIR* dir = opendir("/dev")) {
    while (dirent* entry = readdir(dir)) {
      std::string name = entry->d_name;
      if (name.size() > 6 && name.rfind("nvidia", 0) == 0 &&
          name.find_first_not_of("0123456789", 6) == std::string::npos) {
        ++n;
      }
    }
    closedir(dir);
  }
  return n;
}

int countXpus(const std::map<std::string, std::string>& env) {
  int n = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/sys/class/drm", ec)) {
    std::string name = entry.path().filename().string();
    if (name.rfind("renderD", 0) != 0) continue;
    std::ifstream vendor(entry.path() / "device" / "vendor");
    std::string id;
    vendor >> id;
    auto driver = std::filesystem::read_symlink(entry.path() / "device" / "driver", ec).filename().string();
    if (id == "0x8086" && (driver == "i915" || driver == "xe")) ++n;
  }
  if (auto it = env.find("ZE_AFFINITY_MASK"); it != env.end()) {
    std::vector<std::string> listed = absl::StrSplit(it->second, ',', absl::SkipEmpty());
    n = std::min(n, static_cast<int>(listed.size()));
  }
  return n;
}

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
  auto find = [&](const std::string& name) -> const Flag* {
    for (const auto& f : table) {
      for (const auto& n : f.names) {
        if (n == name) return &f;
      }
    }
    return nullptr;
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
      return absl::InvalidArgumentError(
          fmt::format("{} (from {}={})", std::string(s.message()), f.pet, it->second));
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
    const Flag* f = find(name);
    if (f == nullptr) {
      return absl::InvalidArgumentError(
          fmt::format("unknown flag {} (see launch --help)", name));
    }
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

absl::Status takeFromSlurm(LaunchOptions& o, const std::map<std::string, std::string>& env) {
  if (!o.slurm) return absl::OkStatus();
  auto step = slurmStepFromEnv(env);
  if (!step.ok()) return step.status();
  if (!step->has_value()) return absl::OkStatus();
  auto took = applySlurmStep(o, **step);
  if (!took.ok()) return took.status();
  o.slurmJob = (*step)->jobId;
  o.fromSlurm = *took;
  return absl::OkStatus();
}

absl::Status validateLaunchOptions(LaunchOptions& o, const std::map<std::string, std::string>& env) {
  if (o.module && o.noPython) {
    return absl::InvalidArgumentError("--module and --no_python cannot be used together");
  }
  if (o.virtualLocalRank) {
    if (auto it = env.find("CUDA_VISIBLE_DEVICES"); it != env.end()) {
      std::vector<std::string> devices = absl::StrSplit(it->second, ',');
      if (static_cast<int>(devices.size()) < o.localWorldSize) {
        return absl::InvalidArgumentError(fmt::format(
            "--virtual_local_rank gives each worker one device of CUDA_VISIBLE_DEVICES={}, but "
            "it lists {} for {} workers per node",
            it->second, devices.size(), o.localWorldSize));
      }
    }
  }
  if (!o.numaBinding.empty()) {
    if (countGpus(env) == 0) {
      return absl::InvalidArgumentError(fmt::format(
          "--numa_binding={} binds each worker to the CPUs near its GPU (local rank N -> GPU N), "
          "but this host has no usable GPU (no /dev/nvidiaN, or CUDA_VISIBLE_DEVICES is empty); "
          "drop the flag, or bind CPU workers yourself (numactl, taskset)",
          o.numaBinding));
    }
    std::string path = env.count("PATH") ? env.at("PATH") : "/usr/local/bin:/usr/bin:/bin";
    if (findExecutable("numactl", path).empty()) {
      return absl::InvalidArgumentError(fmt::format(
          "--numa_binding={} runs each worker under numactl, which is not on PATH (apt-get "
          "install numactl)",
          o.numaBinding));
    }
  }
  if (o.rdzvBackend != "static" && o.rdzvBackend != "c10d" && o.rdzvBackend != "muster") {
    return absl::InvalidArgumentError(fmt::format(
        "--rdzv_backend={} is not supported; expected static, c10d or muster (etcd is not "
        "offered: run rendezvousd and use --rdzv_backend=c10d)",
        o.rdzvBackend));
  }
  // torchrun >= 2.14: one node with neither a port nor an endpoint runs as --standalone, on
  // a free port (a port Slurm gave counts as given).
  bool portGiven = o.given.count("--master_port") > 0 ||
                   std::any_of(o.fromSlurm.begin(), o.fromSlurm.end(), [](const std::string& f) {
                     return f.rfind("--master_port=", 0) == 0;
                   });
  if (o.torchrun.oneNodeDefaultIsStandalone() && !o.standalone && o.rdzvBackend == "static" &&
      o.rdzvEndpoint.empty() && o.maxNodes == 1 && o.nodeRank == 0 && !portGiven) {
    o.standalone = true;
    o.rdzvBackend = "c10d";
  }
  if (!o.rdzvEndpoint.empty()) {
    if (auto s = parseEndpoint(o); !s.ok()) return s;
    if (o.rdzvPort == 0 && o.rdzvBackend != "static" && o.maxNodes > 1) {
      return absl::InvalidArgumentError(fmt::format(
          "--rdzv_endpoint={}: port 0 (a free port, hosted here) works for a one-node job only; "
          "give the port the other nodes can find for --nnodes={}",
          o.rdzvEndpoint, o.minNodes == o.maxNodes ? std::to_string(o.maxNodes)
                                                   : fmt::format("{}:{}", o.minNodes, o.maxNodes)));
    }
  }
  if (!o.rdzvTlsCa.empty() && (o.rdzvBackend == "static" || o.rdzvEndpoint.empty())) {
    return absl::InvalidArgumentError(
        "--rdzv_tls_ca joins a rendezvousd over TLS: give it with --rdzv_backend=c10d "
        "--rdzv_endpoint=HOST:PORT (node 0's own rendezvous speaks plaintext)");
  }
  if (o.rdzvBackend == "static" && o.minNodes != o.maxNodes) {
    return absl::InvalidArgumentError(fmt::format(
        "--nnodes={}:{} needs an elastic rendezvous; add --rdzv_backend=c10d "
        "--rdzv_endpoint=HOST:PORT",
        o.minNodes, o.maxNodes));
  }
  if (o.nodeRank >= o.maxNodes && o.rdzvBackend == "static") {
    return absl::InvalidArgumentError(fmt::format(
        "--node_rank={} is invalid for --nnodes={}; expected 0 to {}", o.nodeRank, o.maxNodes,
        o.maxNodes - 1));
  }
  return absl::OkStatus();
}

absl::StatusOr<LaunchOptions> parseLaunchOptions(const std::vector<std::string>& args,
                                                 const std::map<std::string, std::string>& env) {
  auto o = parseLaunchFlags(args, env);
  if (!o.ok() || o->showVersion) return o;
  if (auto s = takeFromSlurm(*o, env); !s.ok()) return s;
  if (auto s = validateLaunchOptions(*o, env); !s.ok()) return s;
  return o;
}

}  // namespace muster::launcher

namespace muster::launcher {
namespace {

bool isExecutableFile(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

// A file Python should run: *.py, or a "#!...python..." script.
bool looksLikePython(const std::string& path) {
  if (path.size() > 3 && path.compare(path.size() - 3, 3, ".py") == 0) return true;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  char head[128] = {};
  size_t n = std::fread(head, 1, sizeof(head) - 1, f);
  std::fclose(f);
  std::string first(head, n);
  first = first.substr(0, first.find('\n'));
  return first.rfind("#!", 0) == 0 && first.find("python") != std::string::npos;
}

}  // namespace

std::string findExecutable(const std::string& name, const std::string& path) {
  if (name.find('/') != std::string::npos) return isExecutableFile(name) ? name : "";
  for (absl::string_view dir : absl::StrSplit(path, ':')) {
    std::string candidate = (dir.empty() ? std::string(".") : std::string(dir)) + "/" + name;
    if (isExecutableFile(candidate)) return candidate;
  }
  return "";
}

absl::StatusOr<std::vector<std::string>> workerCommand(
    const LaunchOptions& o, const std::map<std::string, std::string>& env) {
  std::string path = env.count("PATH") ? env.at("PATH") : "/usr/local/bin:/usr/bin:/bin";
  auto python = [&]() -> absl::StatusOr<std::string> {
    std::string wanted = env.count("PYTHON_EXEC") ? env.at("PYTHON_EXEC") : "python3";
    std::string found = findExecutable(wanted, path);
    if (found.empty()) {
      return absl::InvalidArgumentError(fmt::format(
          "Python interpreter '{}' not found; set PYTHON_EXEC to the Python that has your "
          "packages (e.g. PYTHON_EXEC=/usr/bin/python3)",
          wanted));
    }
    return found;
  };
  std::vector<std::string> argv;
  if (o.module) {
    auto py = python();
    if (!py.ok()) return py.status();
    argv = {*py, "-u", "-m", o.program};
  } else {
    // A bare name is a file in the working folder (torchrun's `train.py`), else a program on
    // PATH, as exec finds it; a folder of that name here (a source tree's worker/) does not hide
    // the program on PATH.
    struct stat st {};
    bool exists = stat(o.program.c_str(), &st) == 0;
    std::string file = o.program;
    if (o.program.find('/') == std::string::npos && (!exists || S_ISDIR(st.st_mode))) {
      if (std::string onPath = findExecutable(o.program, path); !onPath.empty()) {
        file = onPath;
        exists = true;
      }
    }
    if (!exists) {
      return absl::InvalidArgumentError(fmt::format("program '{}' not found", o.program));
    }
    if (stat(file.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(fmt::format("program '{}' is a directory", o.program));
    }
    if (o.noPython) {
      if (!isExecutableFile(file)) {
        return absl::InvalidArgumentError(fmt::format(
            "program '{}' is not executable (--no_python runs it directly; chmod +x it)",
            o.program));
      }
      argv = {file};
    } else if (o.runPath || looksLikePython(file) || !isExecutableFile(file)) {
      auto py = python();
      if (!py.ok()) return py.status();
      argv = {*py, "-u", file};  // the script found: here, or on PATH
    } else {
      argv = {file};
    }
  }
  if (!o.legacyLaunch.empty() && !o.useEnv) {
    argv.push_back(o.legacyLaunch == "2" ? "--local-rank=${local_rank}"
                                         : "--local_rank=${local_rank}");
  }
  argv.insert(argv.end(), o.programArgs.begin(), o.programArgs.end());
  return argv;
}

}  // namespace muster::launcher
