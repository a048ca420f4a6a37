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
      } else {
        EXPECT_EQ(mine, value) << key << " for rank " << rank;
      }
    }
  }
}

// The workers' store lives in the agent, as under torchrun 1.13's static rendezvous: a rank 0
// that is done early does not take the store away from the others.
TEST_F(Compat, RankZeroLeavingFirstDoesNotTakeTheStoreAway) {
  unsetenv("OMP_NUM_THREADS");
  std::string script = source("tests/compat/agent_store.py");
  run({kPython, source("tests/compat/torchrun_py311.py"), "--nproc_per_node=3",
       "--master_port=" + std::to_string(freePort()), script, "leave", (dir_ / "torch").string()});
  run({buildDir() + "/launcher/launch", "--nproc_per_node=3",
       "--master_port=" + std::to_string(freePort()), script, "leave", (dir_ / "muster").string()});
  for (int rank = 1; rank < 3; ++rank) {
    EXPECT_EQ(result("torch", rank)["ok"], true);
    EXPECT_EQ(result("muster", rank), result("torch", rank)) << "rank " << rank;
  }
  // Under the c10d rendezvous too (torch 1.13's c10d lets rank 0's worker host the store, and
  // its job dies here; torchrun >= 2.5 shares the agent's, as launch does).
  fs::remove_all(dir_ / "muster");
  fs::create_directories(dir_ / "muster");
  run({buildDir() + "/launcher/launch", "--nproc_per_node=3", "--rdzv_backend=c10d",
       "--rdzv_endpoint=localhost:0", script, "leave", (dir_ / "muster").string()});
  for (int rank = 1; rank < 3; ++rank) EXPECT_EQ(result("muster", rank)["ok"], true);
}

// A restarted group gets a fresh key space: attempt 1 does not see attempt 0's keys, under
// torchrun (its /worker/attempt_N prefix) and under launch (a namespace per round).
TEST_F(Compat, ARestartedGroupDoesNotSeeTheLastAttemptsKeys) {
  unsetenv("OMP_NUM_THREADS");
  std::string script = source("tests/compat/agent_store.py");
  run({kPython, source("tests/compat/torchrun_py311.py"), "--nproc_per_node=2",
       "--max_restarts=1", "--monitor_interval=0.2", "--master_port=" + std::to_string(freePort()),
       script, "restart", (dir_ / "torch").string()});
  run({buildDir() + "/launcher/launch", "--nproc_per_node=2", "--max_restarts=1",
       "--grace_period=5", "--master_port=" + std::to_string(freePort()), script, "restart",
       (dir_ / "muster").string()});
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(result("torch", rank)["saw_attempt_0"], false);
    EXPECT_EQ(result("muster", rank), result("torch", rank)) << "rank " << rank;
  }
}

// --worker_store=rank0 keeps the old way for scripts that start their own TCPStore on
// MASTER_PORT (and TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 selects it, as in torchrun).
TEST_F(Compat, Rank0WorkerStoreSwitchLetsAScriptHostItsOwnStore) {
  std::string body =
      "import os, datetime, torch.distributed as d\n"
      "r = int(os.environ['RANK'])\n"
      "s = d.TCPStore(os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT']), 2, r == 0, "
      "datetime.timedelta(seconds=30))\n"
      "s.set(f'k{r}', 'v'); s.wait(['k0', 'k1'])\n"
      "print(os.environ['TORCHELASTIC_USE_AGENT_STORE'], flush=True)\n";
  fs::path script = dir_ / "own_store.py";
  std::ofstream(script) << body;
  for (std::string how : {"--worker_store=rank0", "env"}) {
    std::vector<std::string> env = {"OMP_NUM_THREADS=", "PYTHON_EXEC=" + std::string(kPython)};
    std::vector<std::string> argv = {buildDir() + "/launcher/launch", "--nproc_per_node=2",
                                     "--master_port=" + std::to_string(freePort())};
    if (how == "env") {
      env.push_back("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1");
    } else {
      argv.push_back(how);
    }
    argv.push_back(script.string());
    Child c(argv, env);
    auto exit = c.wait(kRun);
    ASSERT_TRUE(exit.has_value());
    EXPECT_EQ(exit->code, 0) << how << ": " << c.stderrText();
    // Both ranks print (their lines may interleave on the shared console).
    std::string out = c.stdoutText();
    EXPECT_EQ(std::count(out.begin(), out.end(), 'F'), 2) << how << ": " << out;
    EXPECT_EQ(out.find("True"), std::string::npos) << how << ": " << out;
  }
  // With the agent store (the default) the port is launch's: the script's own server cannot
  // bind it, and the message says what to do.
  Child c({buildDir() + "/launcher/launch", "--nproc_per_node=2",
           "--master_port=" + std::to_string(freePort()), script.string()},
          {"OMP_NUM_THREADS=", "PYTHON_EXEC=" + std::string(kPython)});
  auto exit = c.wait(kRun);
  ASSERT_TRUE(exit.has_value());
  EXPECT_NE(exit->code, 0);
}

// One job, a C++ rank (muster's c10d adapter over gRPC) and a Python rank (torch's TCPStore
// client on MASTER_PORT, under the agent-store prefix): each sees what the other set.
TEST_F(Compat, CppAndPythonRanksOfOneJobShareTheStore) {
  std::string tool = buildDir() + "/tests/integration/channel_tool";
  std::string py =
      "import os, sys, datetime, torch.distributed as d\n"
      "t = d.TCPStore(os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT']), "
      "int(os.environ['WORLD_SIZE']), False, datetime.timedelta(seconds=60))\n"
      "s = d.PrefixStore('/worker/attempt_' + os.environ['TORCHELASTIC_RESTART_COUNT'], t)\n"
      "s.set('from-python', 'py-value')\n"
      "print('python got', s.get('from-cpp').decode(), flush=True)\n";
  std::ofstream(dir_ / "mixed.py") << py;
  std::string body = "if [ \"$RANK\" = 0 ]; then\n  " + tool +
                     " store-set from-cpp cpp-value && " + tool +
                     " store-get from-python\nelse\n  exec " + kPython + " " +
                     (dir_ / "mixed.py").string() + "\nfi\n";
  fs::path script = dir_ / "mixed.sh";
  std::ofstream(script) << "#!/bin/bash\n" << body;
  fs::permissions(script, fs::perms::owner_all);
  Child c({buildDir() + "/launcher/launch", "--nproc_per_node=2", "--master_port=0", script.string()},
          {"OMP_NUM_THREADS="});
  auto exit = c.wait(kRun);
  ASSERT_TRUE(exit.has_value());
  ASSERT_EQ(exit->code, 0) << c.stderrText();
  EXPECT_NE(c.stdoutText().find("python got cpp-value"), std::string::npos) << c.stdoutText();
  EXPECT_NE(c.stdoutText().find("py-value"), std::string::npos) << c.stdoutText();
}

// torchrun's single-node c10d forms: a free port hosted here (no --rdzv_id: it is "none"),
// and an IPv6 endpoint. The same DDP step under both, to the bit.
TEST_F(Compat, RendezvousEndpointFormsRunAsUnderTorchrun) {
  unsetenv("OMP_NUM_THREADS");
  for (std::string endpoint : {std::string("localhost:0"), "[::1]:" + std::to_string(freePort())}) {
    fs::remove_all(dir_ / "torch");
    fs::remove_all(dir_ / "muster");
    fs::create_directories(dir_ / "torch");
    fs::create_directories(dir_ / "muster");
    std::vector<std::string> flags{"--nproc_per_node=2", "--rdzv_backend=c10d",
                                   "--rdzv_endpoint=" + endpoint};
    std::vector<std::string> theirs{kPython, source("tests/compat/torchrun_py311.py")};
    std::vector<std::string> ours{buildDir() + "/launcher/launch"};
    for (auto* argv : {&theirs, &ours}) {
      argv->insert(argv->end(), flags.begin(), flags.end());
      argv->push_back(source("tests/compat/ddp_step.py"));
      argv->push_back((dir_ / (argv == &theirs ? "torch" : "muster")).string());
      run(*argv);
    }
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(result("muster", rank)["params"], result("torch", rank)["params"]) << endpoint;
      EXPECT_EQ(result("muster", rank)["allreduce"], 3.0) << endpoint;
      EXPECT_EQ(result("muster", rank)["env"]["TORCHELASTIC_RUN_ID"], "none") << endpoint;
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
