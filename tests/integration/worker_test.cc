// The worker self-check as real processes: Gloo groups under launch, a missing rank, bad
// variables, a rank that dies mid-collective, and the NCCL path where there is a GPU.
#include <gtest/gtest.h>

#include <regex>

#include "tests/support/child.h"
#include "tests/support/programs.h"

namespace muster {
namespace {

using testing::buildDir;
using testing::launchPath;
using testing::rendezvousdPath;
using testing::workerPath;
using testing::Child;
constexpr std::chrono::milliseconds kRun{120000};


class WorkerGroups : public ::testing::TestWithParam<int> {};

TEST_P(WorkerGroups, SelfCheckPassesWithExactResults) {
  int n = GetParam();
  Child c({launchPath(), "--nproc_per_node=" + std::to_string(n), "--master_port=0",
           workerPath(), "--timeout=60"});
  auto exit = c.wait(kRun);
  ASSERT_TRUE(exit.has_value());
  ASSERT_EQ(exit->code, 0) << c.stdoutText() << c.stderrText();
  std::string out = c.stdoutText();
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(std::regex_search(out, std::regex("self-check rank " + std::to_string(r) + "/" +
                                                  std::to_string(n) +
                                                  " .*all_reduce, broadcast, barrier, shared-dir channel ok")))
        << out;
  }
  EXPECT_NE(out.find("self-check passed: " + std::to_string(n) + " rank(s), gloo"),
            std::string::npos)
      << out;
}

INSTANTIATE_TEST_SUITE_P(Sizes, WorkerGroups, ::testing::Values(2, 4));

TEST(Worker, MissingRankIsNamedWithinTheTimeout) {
  // World of 3 on a standalone store, only ranks 0 and 1 start.
  Child daemon({rendezvousdPath(), "--host", "127.0.0.1", "--port", "0"});
  auto line = daemon.waitForLine(R"(listening on (127\.0\.0\.1:\d+))", kRun);
  ASSERT_TRUE(line.has_value()) << daemon.stderrText();
  std::vector<std::unique_ptr<Child>> ranks;
  auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(std::make_unique<Child>(
        std::vector<std::string>{workerPath(), "--timeout=1.5"},
        std::vector<std::string>{"RANK=" + std::to_string(r), "WORLD_SIZE=3",
                                 "LOCAL_RANK=" + std::to_string(r), "LOCAL_WORLD_SIZE=3",
                                 "MUSTER_STORE_ADDR=" + (*line)[1], "MUSTER_STORE_NAMESPACE=t/0"}));
  }
  for (auto& c : ranks) {
    auto exit = c->wait(kRun);
    ASSERT_TRUE(exit.has_value());
    EXPECT_EQ(exit->code, 1);
    EXPECT_NE(c->stderrText().find("rank 2 of 3 did not arrive within 1.5 s"), std::string::npos)
        << c->stderrText();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(Worker, InconsistentVariablesAreOneLineAndExitTwo) {
  Child c({workerPath()}, {"RANK=4", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1"});
  auto exit = c.wait(kRun);
  EXPECT_EQ(exit->code, 2);
  EXPECT_EQ(c.stderrText(), "worker: RANK=4 is out of range for WORLD_SIZE=2\n");
}

TEST(Worker, RankDyingMidCollectiveMakesLaunchStopTheGroup) {
  auto start = std::chrono::steady_clock::now();
  Child c({launchPath(), "--nproc_per_node=3", "--master_port=0", workerPath(), "--timeout=60",
           "--fail-rank=1"});
  auto exit = c.wait(kRun);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->code, 1);
  // Far sooner than the collective's 60 s timeout: launch stopped the others.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_NE(c.stderrText().find("root cause: rank 1 (local_rank 1"), std::string::npos)
      << c.stderrText();
  EXPECT_NE(c.stderrText().find("exited with code 3"), std::string::npos);
}

// The NCCL path on whatever GPUs this machine has: one rank per GPU, two at most. Skipped
// where nccl_check was not built or no GPU is visible.
TEST(Worker, NcclSelfCheckOnTheGpus) {
  std::string check = buildDir() + "/worker/nccl_check";
  if (access(check.c_str(), X_OK) != 0) GTEST_SKIP() << "built without NCCL";
  Child probe({check, "1024"});
  auto probed = probe.wait(kRun);
  ASSERT_TRUE(probed);
  if (probed->code == 77) GTEST_SKIP() << "no GPU";
  ASSERT_EQ(probed->code, 0) << probe.stderrText();
  std::smatch m;
  std::string said = probe.stdoutText();
  ASSERT_TRUE(std::regex_search(said, m, std::regex(R"( on GPU 0 of (\d+), NCCL (\S+):)"))) << said;
  int gpus = std::stoi(m[1]);
  int nproc = std::min(gpus, 2);
  std::printf("%d GPU(s), NCCL %s: %d rank(s)\n", gpus, m[2].str().c_str(), nproc);
  Child c({launchPath(), "--nproc_per_node=" + std::to_string(nproc), "--master_port=0", check,
           "1048576", "3"});
  auto exit = c.wait(kRun);
  ASSERT_TRUE(exit);
  ASSERT_EQ(exit->code, 0) << c.stdoutText() << c.stderrText();
  for (int r = 0; r < nproc; ++r) {
    EXPECT_NE(c.stdoutText().find("rank " + std::to_string(r) + "/" + std::to_string(nproc)),
              std::string::npos) << c.stdoutText();
  }
  EXPECT_NE(c.stdoutText().find("all_reduce of 1048576 floats exact"), std::string::npos);
  EXPECT_NE(c.stdoutText().find("broadcast exact"), std::string::npos);
  EXPECT_NE(c.stdoutText().find("busbw"), std::string::npos);

  // More ranks than GPUs: NCCL would refuse a GPU twice in one communicator; nccl_check says
  // so in one line per rank before it tries, and the job fails.
  Child over({launchPath(), "--nproc_per_node=" + std::to_string(gpus + 1), "--master_port=0",
              check, "1024"});
  auto overExit = over.wait(kRun);
  ASSERT_TRUE(overExit);
  EXPECT_NE(overExit->code, 0);
  EXPECT_NE(over.stderrText().find("NCCL needs a GPU per rank"), std::string::npos)
      << over.stderrText();
}

}  // namespace
}  // namespace muster
