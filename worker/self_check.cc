// runSelfCheck: Gloo (or NCCL on the GPUs) through LibTorch, with exact expected values.
#include "worker/self_check.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <cstdio>

#include "worker/process_group.h"
#include "worker/shared_dir_channel.h"

namespace muster::worker {
namespace {

// Each rank reports "ok" or its error under this key; rank 0 reads them all.
std::string reportKey(int rank) { return fmt::format("muster/selfcheck/{}", rank); }

std::string checkCollectives(const Group& group, const WorkerEnv& env, const SelfCheckOptions& options) {
  Collectives& pg = *group.pg;
  int n = env.worldSize;
  // The tensors live where the backend works: NCCL's on this local rank's GPU.
  auto on = torch::TensorOptions().dtype(torch::kFloat32).device(groupDevice(group, env));
  // all_reduce: every rank contributes rank+1; the sum is n(n+1)/2, exact in float.
  auto t = torch::full({options.elements}, static_cast<float>(env.rank + 1), on);
  std::vector<at::Tensor> tensors{t};
  pg.allreduce(tensors)->wait(options.timeout);
  float expected = static_cast<float>(n * (n + 1) / 2);
  if (!torch::equal(t, torch::full_like(t, expected))) {
    return fmt::format("all_reduce gave {} where {} was expected", t[0].item<float>(), expected);
  }
  // broadcast from the last rank: a rank-dependent pattern arrives intact everywhere.
  int root = n - 1;
  auto b = env.rank == root ? torch::arange(options.elements, on) * 3 + 1
                            : torch::zeros({options.elements}, on);
  std::vector<at::Tensor> bt{b};
  c10d::BroadcastOptions bo;
  bo.rootRank = root;
  pg.broadcast(bt, bo)->wait(options.timeout);
  if (!torch::equal(b, torch::arange(options.elements, on) * 3 + 1)) {
    return fmt::format("broadcast from rank {} did not arrive intact", root);
  }
  pg.barrier()->wait(options.timeout);
  return "";
}

// The shared-dir channel: every rank's tensor reaches every other rank intact.
std::string checkChannel(const Group& group, const WorkerEnv& env, const SelfCheckOptions& options) {
  if (env.sharedDir.empty()) return "";  // not started by launch: no shared directory
  auto channel = SharedDirChannel::create(env, group.store, {.timeout = options.timeout});
  if (!channel.ok()) return std::string(channel.status().message());
  auto mine = torch::arange(1000, torch::kFloat64) + env.rank;
  auto all = (*channel)->allGather(mine, /*tag=*/0);
  if (!all.ok()) return std::string(all.status().message());
  for (int r = 0; r < env.worldSize; ++r) {
    if (!torch::equal((*all)[r], torch::arange(1000, torch::kFloat64) + r)) {
      return fmt::format("the shared-dir channel brought rank {}'s tensor back wrong", r);
    }
  }
  return "";
}

}  // namespace

int runSelfCheck(const WorkerEnv& env, const SelfCheckOptions& options) {
  auto start = std::chrono::steady_clock::now();
  GroupOptions go;
  go.backend = options.backend;
  go.timeout = options.timeout;
  auto group = createProcessGroup(env, go);
  if (!group.ok()) {
    std::fprintf(stderr, "self-check %s: %s\n", env.describe().c_str(),
                 std::string(group.status().message()).c_str());
    return 1;
  }
  GroupCloser closer(*group);
  if (env.rank == options.failRank) {
    std::fprintf(stderr, "self-check %s: exiting with code 3 before the all-reduce (--fail-rank)\n",
                 env.describe().c_str());
    std::fflush(stderr);
    std::_Exit(3);
  }
  std::string problem;
  try {
    problem = checkCollectives(*group, env, options);
    if (problem.empty()) problem = checkChannel(*group, env, options);
  } catch (const std::exception& e) {
    problem = e.what();
    problem = problem.substr(0, problem.find('\n'));
  }
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                std::chrono::steady_clock::now() - start).count();
  if (problem.empty()) {
    std::printf("self-check %s: %s group in %lld ms; all_reduce, broadcast, barrier, shared-dir "
                "channel ok (%lld ms)\n",
                env.describe().c_str(), group->backend.c_str(),
                static_cast<long long>(group->initTime.count()), static_cast<long long>(ms));
  } else {
    std::printf("self-check %s: FAILED: %s\n", env.describe().c_str(), problem.c_str());
  }
  std::fflush(stdout);
  auto& store = *group->store;
  try {
    store.set(reportKey(env.rank), std::vector<uint8_t>(problem.begin(), problem.end()));
    if (env.rank != 0) return problem.empty() ? 0 : 1;
    std::vector<std::string> failed;
    for (int r = 0; r < env.worldSize; ++r) {
      auto v = store.get(reportKey(r));
      if (!v.empty()) failed.push_back(fmt::format("rank {}: {}", r, std::string(v.begin(), v.end())));
    }
    if (failed.empty()) {
      std::printf("self-check passed: %d rank(s), %s, %d floats per collective\n", env.worldSize,
                  group->backend.c_str(), options.elements);
      return 0;
    }
    std::printf("self-check FAILED on %zu of %d rank(s):\n", failed.size(), env.worldSize);
    for (const auto& f : failed) std::printf("  %s\n", f.c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "self-check %s: the store failed: %s\n", env.describe().c_str(), e.what());
    return 1;
  }
}

}  // namespace muster::worker
