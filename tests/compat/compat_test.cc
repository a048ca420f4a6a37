// launch against the reference: Debian's PyTorch 1.13 (torchrun and torch.distributed.launch)
// running the same unmodified scripts in the same test.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/support/child.h"

namespace muster {
namespace {

using testing::buildDir;
using testing::Child;
using testing::freePort;
namespace fs = std::filesystem;
using nlohmann::json;

constexpr std::chrono::milliseconds kRun{120000};
constexpr char kPython[] = "/usr/bin/python3";

std::string source(const std::string& rel) { return (fs::path(testing::sourceDir()) / rel).string(); }

class Compat : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = muster::testing::freshTestDir("muster-compat");
    fs::create_directories(dir_ / "torch");
    fs::create_directories(dir_ / "muster");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs and expects success; the environment has no OMP_NUM_THREADS, as a fresh shell.
  void run(std::vector<std::string> argv) {
    Child c(argv, {"OMP_NUM_THREADS=", "PYTHON_EXEC=" + std::string(kPython)});
    auto exit = c.wait(kRun);
    ASSERT_TRUE(exit.has_value()) << "timed out: " << argv[0];
    ASSERT_EQ(exit->code, 0) << c.stderrText();
  }
  json result(const std::string& who, int rank) {
    std::ifstream in(dir_ / who / (std::to_string(rank) + ".json"));
    EXPECT_TRUE(in.good()) << who << " rank " << rank << " wrote nothing";
    return in.good() ? json::parse(in) : json();
  }
  fs::path dir_;
};

TEST_F(Compat, DdpTrainingStepIsTheSameUnderLaunchAndTorchrun) {
  int torchPort = freePort(), ourPort = freePort();
  // OMP_NUM_THREADS must be unset (not empty) for both, as in a fresh shell.
  unsetenv("OMP_NUM_THREADS");
  run({kPython, source("tests/compat/torchrun_py311.py"), "--nproc_per_node=2",
       "--master_port=" + std::to_string(torchPort), source("tests/compat/ddp_step.py"),
       (dir_ / "torch").string()});
  run({buildDir() + "/launcher/launch", "--nproc_per_node=2",
       "--master_port=" + std::to_string(ourPort), source("tests/compat/ddp_step.py"),
       (dir_ / "muster").string()});
  for (int rank = 0; rank < 2; ++rank) {
    json theirs = result("torch", rank), ours = result("muster", rank);
    ASSERT_FALSE(theirs.is_null());
    ASSERT_FALSE(ours.is_null());
    EXPECT_EQ(ours["world"], 2);
    EXPECT_EQ(ours["allreduce"], 3.0);
    // The same parameters after the step, to the bit: same data, same reduction.
    EXPECT_EQ(ours["params"], theirs["params"]) << "rank " << rank;
    for (auto& [key, value] : theirs["env"].items()) {
      const json& mine = ours["env"][key];
      if (key == "MASTER_PORT") {
        EXPECT_EQ(mine, std::to_string(ourPort));
        EXPECT_EQ(value, std::to_string(torchPort));
      } else if (key == "TORCHELASTIC_ERROR_FILE") {
        std::string suffix = "/attempt_0/" + std::to_string(rank) + "/error.json";
        EXPECT_TRUE(mine.get<std::string>().ends_with(suffix)) << mine;
        EXPECT_TRUE(value.get<std::string>().ends_with(suffix)) << value;
      } else if (key == "TORCHELASTIC_USE_AGENT_STORE") {
        // The one documented difference: rank 0's worker hosts the workers' TCPStore, as
        // under torchrun's c10d rendezvous, since muster's agent store speaks gRPC.
        EXPECT_EQ(value, "True");
        EXPECT_EQ(mine, "False");
      } else {
        EXPECT_EQ(mine, value) << key << " for rank " << rank;
      }
    }
  }
}

TEST_F(Compat, LegacyLaunchPassesLocalRankAsTorchDistributedLaunchDoes) {
  unsetenv("OMP_NUM_THREADS");
  run({kPython, source("tests/compat/torchrun_py311.py"), "--legacy", "--nproc_per_node=2",
       "--master_port=" + std::to_string(freePort()), source("tests/compat/local_rank_arg.py"),
       (dir_ / "torch").string()});
  run({buildDir() + "/launcher/launch", "--legacy_launch=1.13", "--nproc_per_node=2",
       "--master_port=" + std::to_string(freePort()), source("tests/compat/local_rank_arg.py"),
       (dir_ / "muster").string()});
  for (int rank = 0; rank < 2; ++rank) {
    json theirs = result("torch", rank), ours = result("muster", rank);
    EXPECT_EQ(theirs["arg"], rank);
    EXPECT_EQ(ours["arg"], theirs["arg"]);
    EXPECT_EQ(ours["env"], theirs["env"]);
    EXPECT_EQ(ours["argv"][0], theirs["argv"][0]);  // --local_rank=N first, as torch puts it
  }
  // --use_env: no argument, LOCAL_RANK only.
  fs::remove_all(dir_ / "muster");
  fs::create_directories(dir_ / "muster");
  run({buildDir() + "/launcher/launch", "--legacy_launch=1.13", "--use_env",
       "--nproc_per_node=2", "--master_port=" + std::to_string(freePort()),
       source("tests/compat/local_rank_arg.py"), (dir_ / "muster").string()});
  EXPECT_TRUE(result("muster", 1)["arg"].is_null());
  EXPECT_EQ(result("muster", 1)["env"], "1");
}

}  // namespace
}  // namespace muster
