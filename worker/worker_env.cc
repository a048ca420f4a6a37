// WorkerEnv: parsing and cross-checking the launcher's variables.
#include "worker/worker_env.h"

#include <fmt/format.h>

#include <cstdlib>

#include "common/contract.h"
#include "worker/stack_dump.h"

extern char** environ;

namespace muster::worker {
namespace {

using Env = std::map<std::string, std::string>;

absl::StatusOr<int> number(const Env& env, const std::string& name, int min) {
  auto it = env.find(name);
  if (it == env.end()) {
    return absl::InvalidArgumentError(fmt::format(
        "{} is not set, but other launcher variables are (RANK, WORLD_SIZE, ...): start the "
        "program with launch or torchrun, or set none of them for a single process",
        name));
  }
  try {
    size_t used = 0;
    long long v = std::stoll(it->second, &used);
    if (used == it->second.size() && v >= min && v <= 1'000'000) return static_cast<int>(v);
  } catch (...) {
  }
  return absl::InvalidArgumentError(
      fmt::format("{}={} is invalid; expected an integer >= {}", name, it->second, min));
}

}  // namespace

absl::StatusOr<WorkerEnv> WorkerEnv::fromEnvironment(const Env& env) {
  WorkerEnv w;
  static const char* kCore[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
  bool any = false;
  for (const char* k : kCore) any = any || env.count(k) > 0;
  if (!any) {
    w.standalone = true;
    w.jobId = "standalone";
    if (auto it = env.find(contract::kSharedDir); it != env.end()) w.sharedDir = it->second;
    return w;
  }
  auto get = [&](const char* name, int min, int& out) -> absl::Status {
    auto v = number(env, name, min);
    if (!v.ok()) return v.status();
    out = *v;
    return absl::OkStatus();
  };
  for (auto [name, min, field] : {std::tuple{"RANK", 0, &w.rank},
                                  std::tuple{"WORLD_SIZE", 1, &w.worldSize},
                                  std::tuple{"LOCAL_RANK", 0, &w.localRank},
                                  std::tuple{"LOCAL_WORLD_SIZE", 1, &w.localWorldSize}}) {
    if (auto s = get(name, min, *field); !s.ok()) return s;
  }
  // torchrun sets these too; programs started by older launchers may not.
  auto optional = [&](const char* name, int min, int& out) {
    return env.count(name) ? get(name, min, out) : absl::OkStatus();
  };
  w.groupWorldSize = w.worldSize / w.localWorldSize;
  if (auto s = optional("GROUP_RANK", 0, w.groupRank); !s.ok()) return s;
  if (auto s = optional("GROUP_WORLD_SIZE", 1, w.groupWorldSize); !s.ok()) return s;
  if (auto s = optional("TORCHELASTIC_RESTART_COUNT", 0, w.restartCount); !s.ok()) return s;
  // The round: launch's; under another launcher (torchrun) the restart count stands in.
  w.round = w.restartCount;
  if (auto s = optional(contract::kRound, 0, w.round); !s.ok()) return s;
  if (w.rank >= w.worldSize) {
    return absl::InvalidArgumentError(
        fmt::format("RANK={} is out of range for WORLD_SIZE={}", w.rank, w.worldSize));
  }
  if (w.localRank >= w.localWorldSize) {
    return absl::InvalidArgumentError(fmt::format(
        "LOCAL_RANK={} is out of range for LOCAL_WORLD_SIZE={}", w.localRank, w.localWorldSize));
  }
  if (w.localWorldSize > w.worldSize) {
    return absl::InvalidArgumentError(fmt::format(
        "LOCAL_WORLD_SIZE={} is larger than WORLD_SIZE={}", w.localWorldSize, w.worldSize));
  }
  if (w.groupRank >= w.groupWorldSize) {
    return absl::InvalidArgumentError(fmt::format(
        "GROUP_RANK={} is out of range for GROUP_WORLD_SIZE={}", w.groupRank, w.groupWorldSize));
  }
  auto str = [&](const char* name, std::string& out) {
    if (auto it = env.find(name); it != env.end()) out = it->second;
  };
  str("TORCHELASTIC_RUN_ID", w.runId);
  w.jobId = w.runId;
  str(contract::kJobId, w.jobId);
  str("MASTER_ADDR", w.masterAddr);
  if (env.count("MASTER_PORT")) {
    auto port = number(env, "MASTER_PORT", 1);
    if (!port.ok() || *port > 65535) {
      return absl::InvalidArgumentError(
          fmt::format("MASTER_PORT={} is invalid; expected a port 1-65535", env.at("MASTER_PORT")));
    }
    w.masterPort = *port;
  }
  if (auto it = env.find("TORCHELASTIC_USE_AGENT_STORE"); it != env.end()) {
    w.useAgentStore = it->second == "True" || it->second == "true" || it->second == "1";
  }
  str(contract::kStoreAddr, w.storeAddr);
  str(contract::kStoreNamespace, w.storeNamespace);
  str(contract::kStoreTokenFile, w.tokenFile);
  str(contract::kStoreTlsCa, w.tlsCaFile);
  str(contract::kStoreTlsServerName, w.tlsServerName);
  str(contract::kSharedDir, w.sharedDir);
  if (w.storeAddr.empty() && (w.masterAddr.empty() || w.masterPort == 0) && w.worldSize > 1) {
    return absl::InvalidArgumentError(
        "neither MUSTER_STORE_ADDR nor MASTER_ADDR/MASTER_PORT is set: the ranks have no store "
        "to meet at; start the program with launch");
  }
  if (!w.storeAddr.empty() && w.storeNamespace.empty()) {
    return absl::InvalidArgumentError(
        "MUSTER_STORE_ADDR is set but MUSTER_STORE_NAMESPACE is not; start the program with "
        "launch");
  }
  return w;
}

absl::StatusOr<WorkerEnv> WorkerEnv::fromProcess() {
  installStackDump();
  Env env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    auto eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  return fromEnvironment(env);
}

std::string WorkerEnv::describe() const {
  return fmt::format("rank {}/{} (local {}/{}, node {}/{})", rank, worldSize, localRank,
                     localWorldSize, groupRank, groupWorldSize);
}

}  // namespace muster::worker
