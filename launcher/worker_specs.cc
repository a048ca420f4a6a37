// workerSpecs: each rank's environment, command and output, from the job and the round.
#include "launcher/worker_specs.h"

#include <cctype>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/contract.h"
#include "launcher/numa.h"
#include "launcher/python_hook.h"
#include "launcher/worker_command.h"

namespace muster::launcher {
namespace fs = std::filesystem;

std::string attemptDirectory(const std::string& runDir, uint64_t round) {
  return (fs::path(runDir) / fmt::format("attempt_{}", round)).string();
}

std::vector<WorkerSpec> workerSpecs(const JobSpec& job, const RoundPlacement& at) {
  const LaunchOptions& o = job.options;
  const JobLayout& layout = job.layout;
  fs::path attemptDir = attemptDirectory(layout.runDir, at.round);
  std::string ns = contract::roundNamespace(layout.runId, at.round);
  std::vector<WorkerSpec> specs;
  for (int local = 0; local < o.localWorldSize; ++local) {
    WorkerSpec spec;
    spec.localRank = local;
    spec.globalRank = at.rankOffset + local;
    fs::path rankDir = attemptDir / std::to_string(local);
    spec.env = job.env;
    auto& e = spec.env;
    e["LOCAL_RANK"] = std::to_string(local);
    if (o.virtualLocalRank) {
      // Each worker sees its own device as device 0 (torchrun's --virtual-local-rank). The
      // options checked that CUDA_VISIBLE_DEVICES lists one for every worker.
      e["LOCAL_RANK"] = "0";
      std::string device = std::to_string(local);
      if (auto it = job.env.find("CUDA_VISIBLE_DEVICES"); it != job.env.end()) {
        std::vector<absl::string_view> devices = absl::StrSplit(it->second, ',');
        if (static_cast<size_t>(local) < devices.size()) {
          device = std::string(absl::StripAsciiWhitespace(devices[static_cast<size_t>(local)]));
        }
      }
      e["CUDA_VISIBLE_DEVICES"] = device;
    }
    e["RANK"] = std::to_string(spec.globalRank);
    e["GROUP_RANK"] = std::to_string(at.groupRank);
    e["ROLE_RANK"] = std::to_string(at.roleWorldSize > 0 ? at.roleRankOffset + local : spec.globalRank);
    e["ROLE_NAME"] = o.role;
    e["LOCAL_WORLD_SIZE"] = std::to_string(o.localWorldSize);
    e["WORLD_SIZE"] = std::to_string(at.worldSize);
    e["GROUP_WORLD_SIZE"] = std::to_string(at.groupWorldSize);
    e["ROLE_WORLD_SIZE"] = std::to_string(at.roleWorldSize > 0 ? at.roleWorldSize : at.worldSize);
    e["MASTER_ADDR"] = at.masterAddr;
    e["MASTER_PORT"] = std::to_string(at.masterPort);
    e["TORCHELASTIC_RESTART_COUNT"] = std::to_string(at.restartCount);
    e["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(o.maxRestarts);
    e["TORCHELASTIC_RUN_ID"] = layout.runId;
    // The workers' c10d store: this job's agent store at MASTER_ADDR:MASTER_PORT (as
    // torchrun's static rendezvous and torchrun >= 2.5's c10d), or with --worker_store=rank0
    // rank 0's own TCPStore there.
    e["TORCHELASTIC_USE_AGENT_STORE"] = o.agentStore ? "True" : "False";
    // NCCL's async error handling on unless the user set it, by the name this torch reads.
    if (const char* name = o.torchrun.ncclAsyncErrorHandlingVariable(); !job.env.count(name)) {
      e[name] = "1";
    }
    // torchrun 2.11 and later export its --signals_to_handle (set in its own environment, so it wins).
    if (o.torchrun.exportsSignalsToHandle()) e["TORCHELASTIC_SIGNALS_TO_HANDLE"] = o.signalsToHandle;
    spec.errorFile = (rankDir / "error.json").string();
    e["TORCHELASTIC_ERROR_FILE"] = spec.errorFile;
    e[contract::kStoreAddr] = job.storeEndpoint;
    e[contract::kStoreNamespace] = ns;
    e[contract::kRound] = std::to_string(at.round);
    if (!layout.token.empty()) {
      e[contract::kStoreTokenFile] = layout.tokenFile;
    } else {
      e.erase(contract::kStoreTokenFile);  // launch's own (several nodes) names no file here
    }
    if (!o.rdzvTlsCa.empty()) {
      e[contract::kStoreTlsCa] = o.rdzvTlsCa;
      if (!o.rdzvTlsServerName.empty()) e[contract::kStoreTlsServerName] = o.rdzvTlsServerName;
    }
    if (!layout.sharedDir.empty()) e[contract::kSharedDir] = layout.sharedDir;
    e[contract::kRunDir] = layout.runDir;
    e[contract::kJobId] = layout.jobId;
    if (job.stacksSignal > 0) {
      // In launch's runtime folder: the file is open in the rank from its start, and is the
      // log folder's only once a roll-call took stacks (then copied to rankDir).
      spec.stacksFile = (fs::path(layout.runtimeDir) / "stacks" / fmt::format("attempt_{}", at.round) /
                         fmt::format("{}.txt", local)).string();
      spec.stacksLogCopy = (rankDir / "stacks.txt").string();
      e[contract::kStacksFile] = spec.stacksFile;
      e[contract::kStacksSignal] = std::to_string(job.stacksSignal);
      if (!job.pythonHookDir.empty()) e["PYTHONPATH"] = pythonPathWithHook(job.env, job.pythonHookDir);
    }
    if (!job.timerFile.empty()) e["TORCHELASTIC_TIMER_FILE"] = job.timerFile;
    if (!job.progressFifo.empty()) e[contract::kProgressFifo] = job.progressFifo;
    if (!job.stopBoard.empty()) {
      e[contract::kStopFile] = job.stopBoard;
      e[contract::kStopSlot] = std::to_string(local);
    }
    spec.watchOutput = job.watchOutput;

    StdSpec redirect = o.redirectFor(local), tee = o.teeFor(local);
    bool shown = o.consoleShows(local);
    spec.stdoutToConsole = shown && (!redirect.out || tee.out);
    spec.stderrToConsole = shown && (!redirect.err || tee.err);
    if (redirect.out || tee.out) spec.stdoutFile = (rankDir / "stdout.log").string();
    if (redirect.err || tee.err) spec.stderrFile = (rankDir / "stderr.log").string();
    if (o.prefixOutput || tee.out || tee.err) {
      spec.prefix = linePrefix(o, local, spec.globalRank, job.hostName);
    }
    // The filtered file is there whenever its filters are given, as torchrun opens it then
    // (empty when no shown rank tees that stream); only a shown, tee'd rank's lines go to it.
    if (!o.duplicateStdoutFilters.empty()) {
      spec.filteredStdoutFile = (attemptDir / "filtered_stdout.log").string();
      if (shown && tee.out) spec.stdoutFilters = o.duplicateStdoutFilters;
    }
    if (!o.duplicateStderrFilters.empty()) {
      spec.filteredStderrFile = (attemptDir / "filtered_stderr.log").string();
      if (shown && tee.err) spec.stderrFilters = o.duplicateStderrFilters;
    }
    spec.argv = job.command;
    for (auto& arg : spec.argv) {
      arg = absl::StrReplaceAll(arg, {{"${local_rank}", std::to_string(local)}});
    }
    specs.push_back(std::move(spec));
  }
  return specs;
}

std::string linePrefix(const LaunchOptions& options, int localRank, int globalRank,
                       const std::string& hostName) {
  if (options.logLinePrefixTemplate.empty()) {
    return fmt::format("[{}{}]:", options.role, localRank);
  }
  std::map<std::string, std::string> values{{"role_name", options.role},
                                            {"local_rank", std::to_string(localRank)},
                                            {"rank", std::to_string(globalRank)},
                                            {"hostname", hostName}};
  const std::string& t = options.logLinePrefixTemplate;
  std::string out;
  for (size_t i = 0; i < t.size();) {
    if (t[i] == '$' && i + 1 < t.size() && t[i + 1] == '$') {
      out += '$';
      i += 2;
      continue;
    }
    if (t[i] == '$') {
      bool braced = i + 1 < t.size() && t[i + 1] == '{';
      size_t start = i + (braced ? 2 : 1), end = start;
      while (end < t.size() && (absl::ascii_isalnum(static_cast<unsigned char>(t[end])) || t[end] == '_')) ++end;
      std::string name = t.substr(start, end - start);
      bool closed = !braced || (end < t.size() && t[end] == '}');
      auto it = values.find(name);
      if (!name.empty() && closed && it != values.end()) {
        out += it->second;
        i = end + (braced ? 1 : 0);
        continue;
      }
    }
    out += t[i++];
  }
  return out;
}

absl::Status makeRankDirectories(const std::vector<WorkerSpec>& specs) {
  for (const auto& spec : specs) {
    fs::path dir = fs::path(spec.errorFile).parent_path();
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) {
      return absl::InternalError(fmt::format("cannot create the log directory '{}' of local rank {}: {}",
                                             dir.string(), spec.localRank, ec.message()));
    }
    // Made here, not only by a stream that writes to them: a rank whose stream is not read
    // (not tee'd) still has torchrun's empty file.
    for (const auto* filtered : {&spec.filteredStdoutFile, &spec.filteredStderrFile}) {
      if (!filtered->empty()) std::ofstream(*filtered, std::ios::app);  // app: made, never emptied
    }
    // A round number can come again (a restarted rendezvousd): its roll-call file starts empty.
    if (!spec.stacksFile.empty()) {
      fs::path stacksDir = fs::path(spec.stacksFile).parent_path();
      fs::create_directories(stacksDir, ec);
      if (ec) {
        return absl::InternalError(fmt::format("cannot create '{}' for local rank {}'s stacks: {}",
                                               stacksDir.string(), spec.localRank, ec.message()));
      }
      std::ofstream(spec.stacksFile, std::ios::trunc);
      // A roll-call's copy from the round's last run, if the number came again, is not this one's.
      fs::remove(spec.stacksLogCopy, ec);
    }
  }
  return absl::OkStatus();
}

absl::Status bindToNuma(std::vector<WorkerSpec>& specs, const LaunchOptions& options,
                        const std::map<std::string, std::string>& env) {
  if (options.numaBinding.empty()) return absl::OkStatus();
  auto path = env.find("PATH");
  std::string numactl = findExecutable("numactl", path != env.end() ? path->second : "/usr/bin:/bin");
  for (auto& spec : specs) {
    auto cpus = numaCpusForGpu({.mode = options.numaBinding, .gpu = spec.localRank}, env);
    if (!cpus.ok()) return absl::FailedPreconditionError(cpus.status().message());
    spec.argv.insert(spec.argv.begin(), {numactl, "--physcpubind=" + *cpus});
  }
  return absl::OkStatus();
}

}  // namespace muster::launcher
