// Slurm: read the step from SLURM_* variables, fill the absent flags, find node 0's address.
#include "launcher/slurm.h"

#include <fmt/format.h>

#include <algorithm>
#include <boost/process.hpp>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <functional>

#include "common/log.h"
#include "launcher/options.h"
#include "launcher/worker_command.h"

namespace muster::launcher {
namespace {

namespace bp = boost::process;

using Env = std::map<std::string, std::string>;

std::optional<std::string> lookup(const Env& env, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (auto it = env.find(name); it != env.end() && !it->second.empty()) return it->second;
  }
  return std::nullopt;
}

absl::StatusOr<int> count(const Env& env, std::initializer_list<const char*> names, int min) {
  for (const char* name : names) {
    auto it = env.find(name);
    if (it == env.end() || it->second.empty()) continue;
    try {
      size_t used = 0;
      long v = std::stol(it->second, &used);
      if (used == it->second.size() && v >= min && v <= 1'000'000) return static_cast<int>(v);
    } catch (...) {
    }
    return absl::InvalidArgumentError(fmt::format(
        "{}={} is not an integer >= {}; is this a Slurm job?", name, it->second, min));
  }
  return -1;
}

}  // namespace

absl::StatusOr<std::string> firstSlurmHost(const std::string& hostList) {
  auto malformed = [&] {
    return absl::InvalidArgumentError(
        fmt::format("Slurm host list '{}' is malformed (expected e.g. node[01-04],gpu7)", hostList));
  };
  std::string host;
  size_t i = 0;
  while (i < hostList.size() && hostList[i] != ',') {
    char c = hostList[i];
    if (c == ']') return malformed();
    if (c != '[') {
      host += c;
      ++i;
      continue;
    }
    auto close = hostList.find(']', i);
    if (close == std::string::npos) return malformed();
    // The range's first member, zero padding kept: "[08-09,12]" -> "08".
    std::string first;
    for (size_t j = i + 1; j < close && hostList[j] != ',' && hostList[j] != '-'; ++j) {
      if (!std::isdigit(static_cast<unsigned char>(hostList[j]))) return malformed();
      first += hostList[j];
    }
    if (first.empty()) return malformed();
    host += first;
    i = close + 1;
  }
  if (host.empty()) return malformed();
  return host;
}

absl::StatusOr<std::optional<SlurmStep>> slurmStepFromEnv(const Env& env) {
  auto jobId = lookup(env, {"SLURM_JOB_ID", "SLURM_JOBID"});
  if (!jobId) return std::optional<SlurmStep>();
  SlurmStep s;
  s.jobId = *jobId;
  // srun sets SLURM_STEP_ID for its tasks; the batch script's shell has none (or "batch").
  auto stepId = lookup(env, {"SLURM_STEP_ID", "SLURM_STEPID"});
  s.inStep = stepId && std::isdigit(static_cast<unsigned char>((*stepId)[0])) &&
             *stepId != "4294967294" && *stepId != "4294967291";
  absl::StatusOr<int> nodes =
      s.inStep ? count(env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES"}, 1)
               : count(env, {"SLURM_JOB_NUM_NODES", "SLURM_NNODES"}, 1);
  if (!nodes.ok()) return nodes.status();
  s.numNodes = *nodes;
  auto nodeId = count(env, {"SLURM_NODEID"}, 0);
  if (!nodeId.ok()) return nodeId.status();
  s.nodeId = *nodeId;
  if (s.inStep) {
    auto tasks = count(env, {"SLURM_STEP_NUM_TASKS"}, 1);
    if (!tasks.ok()) return tasks.status();
    s.numTasks = std::max(*tasks, 0);
  }
  auto list = s.inStep ? lookup(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"})
                       : lookup(env, {"SLURM_JOB_NODELIST", "SLURM_NODELIST"});
  if (list) {
    auto first = firstSlurmHost(*list);
    if (!first.ok()) return first.status();
    s.firstHost = *first;
  }
  s.submitDir = lookup(env, {"SLURM_SUBMIT_DIR"}).value_or("");
  return std::optional<SlurmStep>(s);
}

absl::StatusOr<std::vector<std::string>> applySlurmStep(LaunchOptions& o, const SlurmStep& step) {
  std::vector<std::string> took;
  auto given = [&](const char* flag) { return o.given.count(flag) > 0; };
  bool staticRdzv = o.rdzvBackend == "static" && !o.standalone;
  if (!step.inStep && step.numNodes > 1 && !given("--nnodes")) {
    return absl::InvalidArgumentError(fmt::format(
        "Slurm job {} has {} nodes but launch is not running under srun: start one launch per "
        "node with 'srun --ntasks-per-node=1 launch ...' (or give --nnodes)",
        step.jobId, step.numNodes));
  }
  if (step.inStep && step.numTasks > step.numNodes && !given("--node_rank") && staticRdzv) {
    return absl::InvalidArgumentError(fmt::format(
        "srun started {} tasks on {} nodes in Slurm job {}; launch runs once per node and starts "
        "the workers itself: use 'srun --ntasks-per-node=1'",
        step.numTasks, step.numNodes, step.jobId));
  }
  if (!given("--nnodes") && step.numNodes > 0 && !o.standalone) {
    o.minNodes = o.maxNodes = step.numNodes;
    took.push_back(fmt::format("--nnodes={}", step.numNodes));
  }
  if (staticRdzv && !given("--node_rank") && step.nodeId >= 0) {
    o.nodeRank = step.nodeId;
    took.push_back(fmt::format("--node_rank={}", step.nodeId));
  }
  // One node keeps 127.0.0.1; several need node 0's address.
  if (staticRdzv && !given("--master_addr") && !step.firstHost.empty() && o.maxNodes > 1) {
    o.masterAddr = step.firstHost;
    o.masterAddrFromSlurm = true;
    took.push_back(fmt::format("--master_addr={}", step.firstHost));
  }
  if (staticRdzv && !given("--master_port")) {
    bool numeric = !step.jobId.empty() &&
                   std::all_of(step.jobId.begin(), step.jobId.end(),
                               [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    // The last 9 digits decide the port (job id mod 1000); a non-numeric id is hashed.
    size_t h = numeric ? static_cast<size_t>(std::stoull(step.jobId.substr(
                             step.jobId.size() > 9 ? step.jobId.size() - 9 : 0)))
                       : std::hash<std::string>{}(step.jobId);
    o.masterPort = 29500 + static_cast<int>(h % 1000);
    took.push_back(fmt::format("--master_port={}", o.masterPort));
  }
  if (!given("--shared_dir") && o.maxNodes > 1 && !step.submitDir.empty()) {
    // The submit directory is on the cluster filesystem on most sites; launch's probe at the
    // rendezvous fails the job before any worker starts where it is not.
    o.sharedDir = step.submitDir + "/.muster-shared";
    o.sharedDirFromSlurm = true;
    took.push_back(fmt::format("--shared_dir={}", o.sharedDir));
  }
  if (!given("--rdzv_id") && !o.standalone) {
    o.rdzvId = step.jobId;
    took.push_back(fmt::format("--rdzv_id={}", step.jobId));
  }
  return took;
}

void settleSlurmStep(LaunchOptions& o) {
  std::string took;
  for (const auto& t : o.fromSlurm) took += " " + t;
  if (o.masterAddrFromSlurm) {
    std::string host = o.masterAddr;
    o.masterAddr = slurmNodeAddress(host);
    if (o.masterAddr != host) took += " (" + host + "'s NodeAddr: " + o.masterAddr + ")";
  }
  std::error_code ec;
  if (o.sharedDirFromSlurm) std::filesystem::create_directories(o.sharedDir, ec);
  log::get("launch")->info("inside Slurm job {}: took{} from SLURM_* (flags given on the command line win)",
                           o.slurmJob, took.empty() ? " nothing" : took);
}

std::string nodeAddrFromScontrol(const std::string& output) {
  // One line of KEY=VALUE pairs; NodeAddr's value ends at the next space.
  size_t at = 0;
  while ((at = output.find("NodeAddr=", at)) != std::string::npos) {
    if (at == 0 || output[at - 1] == ' ' || output[at - 1] == '\n') {
      size_t start = at + 9;
      size_t end = output.find_first_of(" \n", start);
      return output.substr(start, end == std::string::npos ? std::string::npos : end - start);
    }
    at += 9;
  }
  return "";
}

std::string slurmNodeAddress(const std::string& host) {
  try {
    const char* path = std::getenv("PATH");
    std::string scontrol = findExecutable("scontrol", path != nullptr ? path : "/usr/bin:/bin");
    if (scontrol.empty()) return host;
    bp::ipstream out;
    bp::child c(bp::exe = scontrol, bp::args = {"show", "node", "-o", host},
                bp::std_out > out, bp::std_err > bp::null, bp::std_in < bp::null);
    std::string text, line;
    while (std::getline(out, line)) text += line + "\n";
    // Its output is closed: it has exited or is exiting (scontrol bounds its own waits with
    // slurm.conf's MessageTimeout). Boost 1.81's wait_for sleeps out its whole timeout.
    c.wait();
    if (c.exit_code() != 0) return host;
    auto addr = nodeAddrFromScontrol(text);
    return addr.empty() ? host : addr;
  } catch (const std::exception&) {
    return host;
  }
}

absl::Status requeueSlurmJob(const std::string& jobId) {
  const char* path = std::getenv("PATH");
  std::string scontrol = findExecutable("scontrol", path != nullptr ? path : "/usr/bin:/bin");
  if (scontrol.empty()) return absl::NotFoundError("scontrol is not on PATH");
  try {
    bp::ipstream err;
    bp::child c(bp::exe = scontrol, bp::args = {"requeue", jobId}, bp::std_out > bp::null, bp::std_err > err,
                bp::std_in < bp::null);
    std::string errors;
    for (std::string line; std::getline(err, line);) errors += (errors.empty() ? "" : " ") + line;
    c.wait();
    if (c.exit_code() != 0) {
      return absl::UnavailableError(fmt::format("scontrol requeue {} exited {}: {}", jobId, c.exit_code(),
                                                errors.empty() ? "no message" : errors));
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(fmt::format("scontrol requeue {}: {}", jobId, e.what()));
  }
  return absl::OkStatus();
}

}  // namespace muster::launcher
