// Each rank's environment, command and output as pure functions of the options, the job
// layout and the round's placement: torchrun's variables and muster's contract.
#include "launcher/worker_specs.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/contract.h"

namespace muster::launcher {
namespace {

using Env = std::map<std::string, std::string>;

LaunchOptions options(const std::vector<std::string>& args, const Env& env = {}) {
  auto o = parseLaunchOptions(args, env);
  EXPECT_TRUE(o.ok()) << o.status();
  return o.ok() ? *o : LaunchOptions{};
}

JobLayout layout() {
  JobLayout l;
  l.runId = "job7";
  l.jobId = "job7";
  l.runDir = "/nonexistent/logs/job7_abc";
  l.sharedDir = "/nonexistent/shared";
  l.token = "secret";
  l.tokenFile = "/nonexistent/logs/job7_abc/store.token";
  return l;
}

RoundPlacement secondNodeOfTwo() {
  return {.round = 5, .restartCount = 1, .groupRank = 1, .groupWorldSize = 2, .worldSize = 4,
          .rankOffset = 2, .masterAddr = "10.0.0.1", .masterPort = 29501};
}

std::vector<WorkerSpec> specs(const LaunchOptions& o, const Env& env, const JobLayout& l,
                              const RoundPlacement& at, const std::vector<std::string>& command) {
  return workerSpecs({.options = o, .env = env, .command = command, .layout = l,
                      .storeEndpoint = "10.0.0.1:7000", .hostName = "node-b"},
                     at);
}

TEST(WorkerSpecs, EachRankGetsTorchrunsVariablesForItsPlaceInTheRound) {
  auto o = options({"--nproc_per_node=2", "--nnodes=2", "--max_restarts=3", "--role=trainer",
                    "--rdzv_id=job7", "prog"});
  Env env{{"PATH", "/usr/bin"}, {"NCCL_ASYNC_ERROR_HANDLING", "0"}};
  auto l = layout();
  auto s = specs(o, env, l, secondNodeOfTwo(), {"/bin/prog", "--local_rank=${local_rank}", "x"});
  ASSERT_EQ(s.size(), 2u);
  const auto& e = s[1].env;
  EXPECT_EQ(s[1].localRank, 1);
  EXPECT_EQ(s[1].globalRank, 3);
  Env want{{"LOCAL_RANK", "1"},          {"RANK", "3"},
           {"GROUP_RANK", "1"},          {"ROLE_RANK", "3"},
           {"ROLE_NAME", "trainer"},     {"LOCAL_WORLD_SIZE", "2"},
           {"WORLD_SIZE", "4"},          {"GROUP_WORLD_SIZE", "2"},
           {"ROLE_WORLD_SIZE", "4"},     {"MASTER_ADDR", "10.0.0.1"},
           {"MASTER_PORT", "29501"},     {"TORCHELASTIC_RESTART_COUNT", "1"},
           {"TORCHELASTIC_MAX_RESTARTS", "3"}, {"TORCHELASTIC_RUN_ID", "job7"},
           {"TORCHELASTIC_USE_AGENT_STORE", "True"},
           {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"},
           {"TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT"},
           // Inherited: launch (as torchrun 2.14) does not set the old name.
           {"NCCL_ASYNC_ERROR_HANDLING", "0"},
           {"PATH", "/usr/bin"},
           {"TORCHELASTIC_ERROR_FILE", "/nonexistent/logs/job7_abc/attempt_5/1/error.json"},
           {contract::kStoreAddr, "10.0.0.1:7000"},
           {contract::kStoreNamespace, contract::roundNamespace("job7", 5)},
           {contract::kRound, "5"},
           {contract::kStoreTokenFile, "/nonexistent/logs/job7_abc/store.token"},
           {contract::kSharedDir, "/nonexistent/shared"},
           {contract::kRunDir, "/nonexistent/logs/job7_abc"},
           {contract::kJobId, "job7"}};
  for (const auto& [name, value] : want) {
    auto it = e.find(name);
    ASSERT_NE(it, e.end()) << name;
    EXPECT_EQ(it->second, value) << name;
  }
  EXPECT_EQ(e.size(), want.size()) << "no variable beyond torchrun's and the contract's";
  EXPECT_EQ(s[1].errorFile, "/nonexistent/logs/job7_abc/attempt_5/1/error.json");
  EXPECT_EQ(s[0].argv, (std::vector<std::string>{"/bin/prog", "--local_rank=0", "x"}));
  EXPECT_EQ(s[1].argv, (std::vector<std::string>{"/bin/prog", "--local_rank=1", "x"}));
  EXPECT_EQ(s[0].env.at("RANK"), "2");
  EXPECT_EQ(s[0].env.at("LOCAL_RANK"), "0");
  // Pure: nothing was made on disk.
  EXPECT_FALSE(std::filesystem::exists("/nonexistent"));
}

// What differs between torchrun's releases follows --torchrun_version: 2.14 (the default) and
// 2.11 set TORCH_NCCL_ASYNC_ERROR_HANDLING and TORCHELASTIC_SIGNALS_TO_HANDLE, 2.6 the first
// only, 1.13 NCCL_ASYNC_ERROR_HANDLING only; a value the user set is kept.
TEST(WorkerSpecs, TheVariablesThatChangedBetweenReleasesFollowTorchrunVersion) {
  struct Want {
    std::vector<std::string> flags;
    std::map<std::string, std::string> set;
    std::vector<std::string> unset;
  };
  std::vector<Want> cases{
      {{}, {{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"}, {"TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGUSR1"}},
       {"NCCL_ASYNC_ERROR_HANDLING"}},
      {{"--torchrun_version=2.11.0+cu130"},
       {{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"}, {"TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGUSR1"}},
       {"NCCL_ASYNC_ERROR_HANDLING"}},
      {{"--torchrun_version=2.10"}, {{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"}},
       {"NCCL_ASYNC_ERROR_HANDLING", "TORCHELASTIC_SIGNALS_TO_HANDLE"}},
      {{"--torchrun_version=2.6.0+cu124"}, {{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"}},
       {"NCCL_ASYNC_ERROR_HANDLING", "TORCHELASTIC_SIGNALS_TO_HANDLE"}},
      {{"--torchrun_version=2.1"}, {{"NCCL_ASYNC_ERROR_HANDLING", "1"}},
       {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCHELASTIC_SIGNALS_TO_HANDLE"}},
      {{"--legacy_launch=1.13"}, {{"NCCL_ASYNC_ERROR_HANDLING", "1"}},
       {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCHELASTIC_SIGNALS_TO_HANDLE"}},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args = c.flags;
    args.insert(args.end(), {"--signals_to_handle=SIGTERM,SIGUSR1", "--master_port=1", "prog"});
    auto s = specs(options(args), {}, layout(), {}, {"/bin/prog"});
    ASSERT_EQ(s.size(), 1u);
    for (const auto& [name, value] : c.set) {
      EXPECT_EQ(s[0].env.count(name) ? s[0].env.at(name) : "(unset)", value) << name << " " << args[0];
    }
    for (const auto& name : c.unset) EXPECT_EQ(s[0].env.count(name), 0u) << name << " " << args[0];
  }
  // The user's own value wins, by either name.
  auto s = specs(options({"--master_port=1", "prog"}), {{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"}},
                 layout(), {}, {"/bin/prog"});
  EXPECT_EQ(s[0].env.at("TORCH_NCCL_ASYNC_ERROR_HANDLING"), "3");
}

TEST(WorkerSpecs, NoTokenMeansNoTokenFileAndNoSharedDirMeansNone) {
  auto o = options({"--nproc_per_node=1", "prog"});
  auto l = layout();
  l.token.clear();
  l.sharedDir.clear();
  Env env{{std::string(contract::kStoreTokenFile), ""}};
  auto s = specs(o, env, l, {.masterAddr = "127.0.0.1", .masterPort = 1}, {"/bin/prog"});
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].env.count(contract::kStoreTokenFile), 0u);
  EXPECT_EQ(s[0].env.count(contract::kSharedDir), 0u);
  EXPECT_EQ(s[0].env.at("TORCHELASTIC_RESTART_COUNT"), "0");
  EXPECT_EQ(s[0].env.at(contract::kRound), "0");
}

TEST(WorkerSpecs, VirtualLocalRankGivesEachWorkerItsOneDeviceAsDeviceZero) {
  Env env{{"CUDA_VISIBLE_DEVICES", "3, 5"}};
  auto o = options({"--nproc_per_node=2", "--virtual-local-rank", "prog"}, env);
  auto s = specs(o, env, layout(), {}, {"/bin/prog"});
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].env.at("LOCAL_RANK"), "0");
  EXPECT_EQ(s[1].env.at("LOCAL_RANK"), "0");
  EXPECT_EQ(s[0].env.at("CUDA_VISIBLE_DEVICES"), "3");
  EXPECT_EQ(s[1].env.at("CUDA_VISIBLE_DEVICES"), "5");
}

TEST(WorkerSpecs, RedirectsAndTeeChooseTheFilesAndTheConsole) {
  auto o = options({"--nproc_per_node=3", "--redirects=3", "--tee=0:3,1:2", "--local_ranks_filter=0,1",
                    "prog"});
  auto s = specs(o, {}, layout(), {}, {"/bin/prog"});
  ASSERT_EQ(s.size(), 3u);
  std::string attempt = "/nonexistent/logs/job7_abc/attempt_0/";
  // Rank 0: both streams to files and, tee'd, to the console with its prefix.
  EXPECT_TRUE(s[0].stdoutToConsole);
  EXPECT_TRUE(s[0].stderrToConsole);
  EXPECT_EQ(s[0].stdoutFile, attempt + "0/stdout.log");
  EXPECT_EQ(s[0].stderrFile, attempt + "0/stderr.log");
  EXPECT_EQ(s[0].prefix, "[default0]:");
  // Rank 1: stderr tee'd, stdout only to its file.
  EXPECT_FALSE(s[1].stdoutToConsole);
  EXPECT_TRUE(s[1].stderrToConsole);
  EXPECT_EQ(s[1].stdoutFile, attempt + "1/stdout.log");
  // Rank 2: redirected, not tee'd (and the filter leaves it off the console anyway).
  EXPECT_FALSE(s[2].stdoutToConsole);
  EXPECT_FALSE(s[2].stderrToConsole);
  EXPECT_EQ(s[2].stderrFile, attempt + "2/stderr.log");
}

TEST(WorkerSpecs, LinePrefixTemplateIsFilledInAsPythonsSafeSubstitute) {
  auto o = options({"--log_line_prefix_template=[${role_name}/$rank@${hostname}:${local_rank}] $$ $nope ${rank",
                    "--role=w", "prog"});
  EXPECT_EQ(linePrefix(o, 1, 9, "node-b"), "[w/9@node-b:1] $ $nope ${rank");
  auto plain = options({"--role=trainer", "prog"});
  EXPECT_EQ(linePrefix(plain, 2, 9, "node-b"), "[trainer2]:");
}

TEST(WorkerSpecs, RankDirectoriesAreMadeForTheRoundAndTheirFailureIsNamed) {
  auto dir = std::filesystem::temp_directory_path() / ("specs-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  auto l = layout();
  l.runDir = dir.string();
  auto s = specs(options({"--nproc_per_node=2", "prog"}), {}, l, {.round = 2}, {"/bin/prog"});
  ASSERT_TRUE(makeRankDirectories(s).ok());
  EXPECT_TRUE(std::filesystem::is_directory(dir / "attempt_2" / "1"));
  std::filesystem::remove_all(dir);
  // A file where the run directory should be.
  { std::ofstream(dir.string()) << "x"; }
  auto failed = makeRankDirectories(s);
  EXPECT_FALSE(failed.ok());
  EXPECT_NE(failed.message().find("local rank 0"), std::string::npos) << failed;
  std::filesystem::remove(dir);
}

}  // namespace
}  // namespace muster::launcher
