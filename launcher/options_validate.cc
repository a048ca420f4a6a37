// launch's options checked together (validateLaunchOptions), after what a Slurm step fills in
// (takeFromSlurm); and the three steps in order (parseLaunchOptions).
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/net.h"
#include "etcd/client.h"
#include "etcd/options.h"
#include "launcher/devices.h"
#include "launcher/option_values.h"
#include "launcher/options.h"
#include "launcher/slurm.h"
#include "launcher/worker_command.h"

namespace muster::launcher {
namespace {

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
    return flags::bad("--rdzv_endpoint", v,
               "HOST[:PORT] or [IPV6][:PORT], a port 0-65535 (e.g. node0:29400, [::1]:29400)");
  }
  o.rdzvHost = split->host;
  if (split->port) o.rdzvPort = *split->port;
  return absl::OkStatus();
}

// --rdzv_backend=etcd: a list of the cluster's members, TLS and auth in --rdzv_conf.
absl::Status validateEtcd(LaunchOptions& o) {
  if (o.rdzvEndpoint.empty()) {
    return absl::InvalidArgumentError(fmt::format(
        "--rdzv_backend={} needs --rdzv_endpoint=HOST:PORT[,HOST:PORT...], the etcd cluster's members",
        o.rdzvBackend));
  }
  bool https = false;
  auto endpoints = etcd::parseEndpoints(o.rdzvEndpoint, &https);
  if (!endpoints.ok()) return absl::InvalidArgumentError(fmt::format("--rdzv_endpoint: {}", std::string(endpoints.status().message())));
  auto first = net::splitHostPort(endpoints->front());
  if (first) {
    o.rdzvHost = first->host;
    o.rdzvPort = first->port.value_or(2379);
  }
  if (auto s = etcd::checkConf(o.rdzvConf.given, https, "--rdzv_conf"); !s.ok()) return s;
  if (!o.rdzvTlsCa.empty()) {
    return absl::InvalidArgumentError(
        "--rdzv_tls_ca is for a rendezvousd; for etcd over TLS give --rdzv_conf protocol=https,cacert=CA.pem");
  }
  if (o.rdzvConf.isHost.value_or(false)) {
    return absl::InvalidArgumentError("--rdzv_conf is_host=true: with etcd no node hosts the rendezvous");
  }
  return absl::OkStatus();
}

}  // namespace

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
  if (o.slurmJob.empty() && (o.requeue || (o.stopAt && o.stopAt->slurm))) {
    return absl::InvalidArgumentError(fmt::format("{}: launch is not inside a Slurm job (no SLURM_JOB_ID{})",
                                                  o.requeue ? "--requeue" : "--stop_at=slurm",
                                                  o.slurm ? "" : ", or --slurm=off"));
  }
  if (o.rdzvBackend != "static" && o.rdzvBackend != "c10d" && o.rdzvBackend != "muster" && !o.etcd()) {
    return absl::InvalidArgumentError(fmt::format(
        "--rdzv_backend={} is not supported; expected static, c10d, muster, etcd or etcd-v2", o.rdzvBackend));
  }
  if (o.etcd()) return validateEtcd(o);
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
