// launch against the reference: one torch's own torchrun and torch.distributed.launch running
// the same unmodified scripts in the same test. The torch is the host's (Debian's PyTorch 1.13
// under /usr/bin/python3) or, run by tests/compat/with_torch.sh, a Debian root's (2.6, 2.14):
// MUSTER_TEST_PYTHON, MUSTER_TEST_TORCHRUN, MUSTER_TEST_LEGACY and MUSTER_TEST_TORCH say which.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "tests/support/child.h"
#include "tests/support/programs.h"
#include "tests/support/torch_under_test.h"

namespace muster {
namespace {

using testing::buildDir;
using testing::launchPath;
using testing::Child;
using testing::freePort;
namespace fs = std::filesystem;
using nlohmann::json;

constexpr std::chrono::milliseconds kRun{120000};

std::string source(const std::string& rel) { return (fs::path(testing::sourceDir()) / rel).string(); }

const testing::TorchUnderTest& torch() { return testing::torchUnderTest(); }

std::vector<std::string> torchrun(std::vector<std::string> args, bool legacy = false) {
  return testing::torchrunArgv(std::move(args), legacy);
}

// launch, told which torchrun to follow, with these arguments.
std::vector<std::string> launch(std::vector<std::string> args) {
  std::vector<std::string> argv{launchPath()};
  argv.insert(argv.end(), torch().launchFlags.begin(), torch().launchFlags.end());
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

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
    // PYTHON_EXEC for launch only: torch's torchrun runs its ranks with its own Python.
    std::vector<std::string> env{"OMP_NUM_THREADS="};
    if (argv[0] == launchPath()) env.push_back("PYTHON_EXEC=" + torch().python);
    Child c(argv, env);
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
  run(torchrun({"--nproc_per_node=2", "--master_port=" + std::to_string(torchPort),
                source("tests/compat/ddp_step.py"), (dir_ / "torch").string()}));
  run(launch({"--nproc_per_node=2", "--master_port=" + std::to_string(ourPort),
              source("tests/compat/ddp_step.py"), (dir_ / "muster").string()}));
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
  run(torchrun({"--nproc_per_node=3", "--master_port=" + std::to_string(freePort()), script,
                "leave", (dir_ / "torch").string()}));
  run(launch({"--nproc_per_node=3", "--master_port=" + std::to_string(freePort()), script,
              "leave", (dir_ / "muster").string()}));
  for (int rank = 1; rank < 3; ++rank) {
    EXPECT_EQ(result("torch", rank)["ok"], true);
    EXPECT_EQ(result("muster", rank), result("torch", rank)) << "rank " << rank;
  }
  // Under the c10d rendezvous too (torch 1.13's c10d lets rank 0's worker host the store, and
  // its job dies here; torchrun >= 2.5 shares the agent's, as launch does).
  fs::remove_all(dir_ / "muster");
  fs::create_directories(dir_ / "muster");
  run(launch({"--nproc_per_node=3", "--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0",
              script, "leave", (dir_ / "muster").string()}));
  for (int rank = 1; rank < 3; ++rank) EXPECT_EQ(result("muster", rank)["ok"], true);
}

// A restarted group gets a fresh key space under launch (a namespace per round), whatever the
// torch: attempt 1 does not see attempt 0's keys. torchrun 1.13 does the same (its
// /worker/attempt_N prefix): the results must be equal. torchrun 2.x keeps one agent store for
// every attempt without a prefix ("a new TCPStore for every retry", says its comment; not so):
// attempt 1 sees attempt 0's keys, and its Gloo group may read attempt 0's addresses and fail
// (seen under 2.14). launch keeps the isolation; torchrun 2.x's result is printed, not compared.
TEST_F(Compat, ARestartedGroupDoesNotSeeTheLastAttemptsKeys) {
  unsetenv("OMP_NUM_THREADS");
  std::string script = source("tests/compat/agent_store.py");
  run(launch({"--nproc_per_node=2", "--max_restarts=1", "--grace_period=5",
              "--master_port=" + std::to_string(freePort()), script, "restart",
              (dir_ / "muster").string()}));
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(result("muster", rank)["saw_attempt_0"], false) << "rank " << rank;
    EXPECT_EQ(result("muster", rank)["attempt"], 1) << "rank " << rank;
  }
  std::vector<std::string> theirs = torchrun({"--nproc_per_node=2", "--max_restarts=1",
                                              "--monitor_interval=0.2",
                                              "--master_port=" + std::to_string(freePort()),
                                              script, "restart", (dir_ / "torch").string()});
  if (torch().major1) {
    run(theirs);
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(result("muster", rank), result("torch", rank)) << "rank " << rank;
    }
    return;
  }
  // Seen under 2.14: exit 1 (Gloo refused at attempt 0's address), or a hang; stopped at 45 s.
  Child c(theirs, {"OMP_NUM_THREADS="});
  auto exit = c.wait(std::chrono::seconds(45));
  std::string how = exit ? "exit " + std::to_string(exit->code) : "no end in 45 s (stopped)";
  if (!exit) {
    // torchrun and its workers (whose arguments name this folder).
    std::system(("pkill -KILL -f '" + (dir_ / "torch").string() + "'").c_str());
  }
  std::string seen;
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream in(dir_ / "torch" / (std::to_string(rank) + ".json"));
    seen += " rank " + std::to_string(rank) + ": " +
            (in.good() ? json::parse(in).dump() : std::string("wrote nothing"));
  }
  std::printf("torchrun %s, restarted: %s;%s\n", torch().version.c_str(), how.c_str(), seen.c_str());
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
    std::vector<std::string> env = {"OMP_NUM_THREADS=", "PYTHON_EXEC=" + torch().python};
    std::vector<std::string> argv = launch({"--nproc_per_node=2", "--master_port=" + std::to_string(freePort())});
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
  // With the agent store (the default) the port is the agent's, under torchrun as under
  // launch: the script's own server cannot bind it. torch 1.13 and 2.6 fail there; 2.14's
  // TCPStore forgives the failed bind on the agent's MASTER_ADDR:MASTER_PORT and is a client.
  // launch succeeds or fails as that torch's torchrun does.
  std::map<std::string, int> exits;
  for (std::string who : {"torchrun", "launch"}) {
    std::vector<std::string> args{"--nproc_per_node=2", "--master_port=" + std::to_string(freePort()),
                                  script.string()};
    std::vector<std::string> env{"OMP_NUM_THREADS="};
    if (who == "launch") env.push_back("PYTHON_EXEC=" + torch().python);
    Child c(who == "launch" ? launch(args) : torchrun(args), env);
    auto exit = c.wait(kRun);
    ASSERT_TRUE(exit.has_value()) << who;
    exits[who] = exit->code;
  }
  EXPECT_EQ(exits["launch"] == 0, exits["torchrun"] == 0)
      << "launch exit " << exits["launch"] << ", torchrun " << torch().version << " exit "
      << exits["torchrun"];
  std::printf("own store on the agent's port, torch %s: torchrun exit %d, launch exit %d\n",
              torch().version.c_str(), exits["torchrun"], exits["launch"]);
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
                     " store-get from-python\nelse\n  exec " + torch().python + " " +
                     (dir_ / "mixed.py").string() + "\nfi\n";
  fs::path script = dir_ / "mixed.sh";
  std::ofstream(script) << "#!/bin/bash\n" << body;
  fs::permissions(script, fs::perms::owner_all);
  Child c(launch({"--nproc_per_node=2", "--master_port=0", script.string()}), {"OMP_NUM_THREADS="});
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
    std::vector<std::string> theirs = torchrun({}), ours = launch({});
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
  std::string legacy = torch().major1 ? "--legacy_launch=1.13" : "--legacy_launch=2";
  run(torchrun({"--nproc_per_node=2", "--master_port=" + std::to_string(freePort()),
                source("tests/compat/local_rank_arg.py"), (dir_ / "torch").string()},
               /*legacy=*/true));
  run(launch({legacy, "--nproc_per_node=2", "--master_port=" + std::to_string(freePort()),
              source("tests/compat/local_rank_arg.py"), (dir_ / "muster").string()}));
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
  run(launch({legacy, "--use_env", "--nproc_per_node=2", "--master_port=" + std::to_string(freePort()),
              source("tests/compat/local_rank_arg.py"), (dir_ / "muster").string()}));
  EXPECT_TRUE(result("muster", 1)["arg"].is_null());
  EXPECT_EQ(result("muster", 1)["env"], "1");
}

}  // namespace
}  // namespace muster
