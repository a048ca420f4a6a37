// WorkerEnv: the launcher's variables, read and cross-checked.
#include "worker/worker_env.h"

#include <gtest/gtest.h>

namespace muster::worker {
namespace {

using Env = std::map<std::string, std::string>;

Env launched() {
  return {{"RANK", "3"},          {"WORLD_SIZE", "8"},
          {"LOCAL_RANK", "1"},    {"LOCAL_WORLD_SIZE", "2"},
          {"GROUP_RANK", "1"},    {"GROUP_WORLD_SIZE", "4"},
          {"MASTER_ADDR", "h0"},  {"MASTER_PORT", "29500"},
          {"TORCHELASTIC_RESTART_COUNT", "2"}, {"TORCHELASTIC_RUN_ID", "job7"},
          {"MUSTER_STORE_ADDR", "h0:29400"},   {"MUSTER_STORE_NAMESPACE", "job7/2"},
          {"MUSTER_STORE_TOKEN_FILE", "/t"},   {"MUSTER_SHARED_DIR", "/nfs/j"}};
}

std::string error(const Env& env) {
  auto w = WorkerEnv::fromEnvironment(env);
  EXPECT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(w.status().message());
}

TEST(WorkerEnv, TheRoundIsMusterRoundNotTheRestartCount) {
  auto env = launched();
  env["MUSTER_ROUND"] = "5";  // an elastic join: round 5 after 2 restarts
  auto w = WorkerEnv::fromEnvironment(env);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->round, 5);
  EXPECT_EQ(w->restartCount, 2);
  env["MUSTER_ROUND"] = "x";
  EXPECT_NE(error(env).find("MUSTER_ROUND"), std::string::npos);
}

TEST(WorkerEnv, ReadsEverythingLaunchSets) {
  auto w = WorkerEnv::fromEnvironment(launched());
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->rank, 3);
  EXPECT_EQ(w->worldSize, 8);
  EXPECT_EQ(w->localRank, 1);
  EXPECT_EQ(w->localWorldSize, 2);
  EXPECT_EQ(w->groupRank, 1);
  EXPECT_EQ(w->groupWorldSize, 4);
  EXPECT_EQ(w->restartCount, 2);
  EXPECT_EQ(w->runId, "job7");
  EXPECT_EQ(w->masterAddr, "h0");
  EXPECT_EQ(w->masterPort, 29500);
  EXPECT_EQ(w->storeAddr, "h0:29400");
  EXPECT_EQ(w->storeNamespace, "job7/2");
  EXPECT_EQ(w->sharedDir, "/nfs/j");
  EXPECT_FALSE(w->standalone);
  EXPECT_EQ(w->describe(), "rank 3/8 (local 1/2, node 1/4)");
  EXPECT_EQ(w->round, 2) << "without MUSTER_ROUND (another launcher) the restart count stands in";
}

TEST(WorkerEnv, NoVariablesIsAWorldOfOne) {
  auto w = WorkerEnv::fromEnvironment({{"PATH", "/bin"}});
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(w->standalone);
  EXPECT_EQ(w->worldSize, 1);
  EXPECT_EQ(w->rank, 0);
}

TEST(WorkerEnv, TorchrunWithoutMusterVariablesUsesMasterAddr) {
  Env env = launched();
  env.erase("MUSTER_STORE_ADDR");
  env.erase("MUSTER_STORE_NAMESPACE");
  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  auto w = WorkerEnv::fromEnvironment(env);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(w->storeAddr.empty());
  EXPECT_TRUE(w->useAgentStore);
}

TEST(WorkerEnv, InconsistentOrMissingVariablesAreNamed) {
  Env env = launched();
  env["RANK"] = "8";
  EXPECT_EQ(error(env), "RANK=8 is out of range for WORLD_SIZE=8");
  env = launched();
  env["LOCAL_RANK"] = "2";
  EXPECT_NE(error(env).find("LOCAL_RANK=2 is out of range for LOCAL_WORLD_SIZE=2"),
            std::string::npos);
  env = launched();
  env.erase("WORLD_SIZE");
  EXPECT_NE(error(env).find("WORLD_SIZE is not set"), std::string::npos);
  env = launched();
  env["RANK"] = "two";
  EXPECT_NE(error(env).find("RANK=two is invalid"), std::string::npos);
  env = launched();
  env["WORLD_SIZE"] = "0";
  EXPECT_NE(error(env).find("WORLD_SIZE=0 is invalid"), std::string::npos);
  env = launched();
  env["MASTER_PORT"] = "70000";
  EXPECT_NE(error(env).find("MASTER_PORT=70000"), std::string::npos);
  env = launched();
  env.erase("MUSTER_STORE_NAMESPACE");
  EXPECT_NE(error(env).find("MUSTER_STORE_NAMESPACE"), std::string::npos);
  env = launched();
  env.erase("MUSTER_STORE_ADDR");
  env.erase("MASTER_ADDR");
  EXPECT_NE(error(env).find("no store"), std::string::npos);
  env = launched();
  env["LOCAL_WORLD_SIZE"] = "16";
  env["LOCAL_RANK"] = "1";
  EXPECT_NE(error(env).find("LOCAL_WORLD_SIZE=16 is larger than WORLD_SIZE=8"),
            std::string::npos);
}

}  // namespace
}  // namespace muster::worker
