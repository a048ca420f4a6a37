// --rdzv_backend=etcd on a real 3-member etcd cluster (Debian's etcd-server, started by the
// test): two launch agents as nodes on loopback run a job whose rendezvous lives in etcd, keep
// running when etcd's leader is killed, fail with one line when the whole cluster goes, see a
// killed node within the keep-alive bound, and refuse bad endpoints, a wrong CA and a wrong
// password with one line each.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <regex>
#include <thread>

#include "tests/support/child.h"
#include "tests/support/etcd_cluster.h"
#include "tests/support/programs.h"

namespace muster {
namespace {

using testing::Child;
using testing::EtcdCluster;
using testing::EtcdOptions;
using testing::launchPath;
namespace fs = std::filesystem;
using std::chrono::milliseconds;
constexpr milliseconds kRun{120000};

bool haveEtcd() { return fs::exists("/usr/bin/etcd") && fs::exists("/usr/bin/etcdctl"); }

class Etcd : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!haveEtcd()) GTEST_SKIP() << "etcd-server is not installed (deploy/setup.sh installs it)";
    dir_ = muster::testing::freshTestDir("muster-etcd-job");
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  void startCluster(EtcdOptions options = {}) {
    cluster_ = std::make_unique<EtcdCluster>(options);
    ASSERT_TRUE(cluster_->start()) << cluster_->why();
  }
  std::string script(const std::string& body) {
    return muster::testing::writeScript(dir_ / ("w" + std::to_string(scripts_++) + ".sh"), body);
  }
  // Each rank writes its environment to env_<rank>, then runs `then`.
  std::string recorder(const std::string& then = "") {
    return script("env > " + (dir_ / "env_").string() + "$RANK\n" + then);
  }
  std::vector<std::string> flags(const std::string& nnodes, int nproc, const std::string& extraConf = "",
                                 const std::string& endpoints = "") {
    return {"--nnodes=" + nnodes,
            "--nproc_per_node=" + std::to_string(nproc),
            "--rdzv_backend=etcd",
            "--rdzv_endpoint=" + (endpoints.empty() ? cluster_->endpoints() : endpoints),
            "--rdzv_id=job-etcd",
            "--rdzv_conf=last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3,join_timeout=60" + extraConf};
  }
  std::unique_ptr<Child> node(std::vector<std::string> f, const std::string& program,
                              const std::vector<std::string>& args = {}) {
    std::vector<std::string> argv{launchPath()};
    argv.insert(argv.end(), f.begin(), f.end());
    argv.push_back(program);
    argv.insert(argv.end(), args.begin(), args.end());
    return std::make_unique<Child>(argv);
  }
  std::map<std::string, std::string> env(int rank) {
    return muster::testing::readEnvFile(dir_ / ("env_" + std::to_string(rank)));
  }
  bool awaitFile(const std::string& name, milliseconds timeout = kRun) {
    return muster::testing::awaitPath(dir_ / name, timeout);
  }
  // Waits for `node` to end and checks its exit code, naming what it said otherwise.
  static void expectExit(Child& node, int code) {
    auto e = node.wait(kRun);
    ASSERT_TRUE(e) << "still running after " << kRun.count() << " ms: " << node.stderrText();
    EXPECT_EQ(e->code, code) << node.stderrText();
  }
  // The ranks wait for `go` before they end.
  std::string waiter() {
    return recorder("touch " + (dir_ / "up_").string() + "$RANK\nwhile [ ! -e " + (dir_ / "go").string() +
                    " ]; do sleep 0.05; done\n");
  }

  fs::path dir_;
  int scripts_ = 0;
  std::unique_ptr<EtcdCluster> cluster_;
};

TEST_F(Etcd, TwoNodesRunAJobWhoseRendezvousIsInEtcd) {
  startCluster();
  std::string w = recorder();
  auto a = node(flags("2", 2), w);
  auto b = node(flags("2", 2), w);
  expectExit(*a, 0);
  expectExit(*b, 0);
  std::set<std::string> groupRanks;
  for (int rank = 0; rank < 4; ++rank) {
    auto e = env(rank);
    EXPECT_EQ(e["WORLD_SIZE"], "4");
    EXPECT_EQ(e["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(e["MASTER_ADDR"], env(0)["MASTER_ADDR"]);
    EXPECT_EQ(e["MASTER_PORT"], env(0)["MASTER_PORT"]);
    EXPECT_EQ(e["TORCHELASTIC_RUN_ID"], "job-etcd");
    groupRanks.insert(e["GROUP_RANK"]);
  }
  EXPECT_EQ(groupRanks, (std::set<std::string>{"0", "1"}));
  // The run's state is in etcd, finished; every node's own keys went with its lease.
  auto keys = cluster_->etcdctl({"get", "--prefix", "/muster/runs/job-etcd/", "--keys-only"});
  EXPECT_NE(keys.find("/muster/runs/job-etcd/state"), std::string::npos) << keys;
  EXPECT_EQ(keys.find("/join/"), std::string::npos) << keys;
  auto state = cluster_->etcdctl({"get", "--print-value-only", "/muster/runs/job-etcd/state"});
  EXPECT_NE(state.find("\"phase\":\"finished\""), std::string::npos) << state;
  // A late joiner is told the run is over.
  auto late = node(flags("2", 1), w);
  expectExit(*late, 1);
  EXPECT_NE(late->stderrText().find("has already finished"), std::string::npos) << late->stderrText();
}

TEST_F(Etcd, TheJobKeepsRunningWhenEtcdsLeaderIsKilled) {
  startCluster();
  std::string w = waiter();
  auto a = node(flags("2", 1), w);
  auto b = node(flags("2", 1), w);
  ASSERT_TRUE(awaitFile("up_0") && awaitFile("up_1"));
  int leader = cluster_->leader();
  ASSERT_GE(leader, 0);
  cluster_->kill(leader);
  // Longer than the keep-alive bound (3 s): the nodes' leases live on through the election.
  std::this_thread::sleep_for(milliseconds(5000));
  std::ofstream(dir_ / "go") << "";
  expectExit(*a, 0);
  expectExit(*b, 0);
}

TEST_F(Etcd, ARoundCompletesWhileEtcdsLeaderIsDown) {
  startCluster();
  int leader = cluster_->leader();
  ASSERT_GE(leader, 0);
  cluster_->kill(leader);
  std::string w = recorder();
  auto a = node(flags("2", 1), w);
  auto b = node(flags("2", 1), w);
  expectExit(*a, 0);
  expectExit(*b, 0);
}

TEST_F(Etcd, AKilledNodeIsSeenLostWithinTheKeepAliveBound) {
  startCluster();
  std::string w = waiter();
  auto a = node(flags("2", 1), w);
  auto b = node(flags("2", 1), w);
  ASSERT_TRUE(awaitFile("up_0") && awaitFile("up_1"));
  auto killed = std::chrono::steady_clock::now();
  b->kill(SIGKILL);
  auto ea = a->wait(kRun);
  auto seen = std::chrono::steady_clock::now() - killed;
  ASSERT_TRUE(ea);
  EXPECT_EQ(ea->code, 1);
  // The lease's time to live is keep_alive_interval x keep_alive_max_attempt = 3 s; etcd
  // checks expiry every 0.5 s.
  EXPECT_LT(seen, milliseconds(6000)) << std::chrono::duration_cast<milliseconds>(seen).count() << " ms";
  EXPECT_NE(a->stderrText().find("was lost: its etcd lease ended"), std::string::npos) << a->stderrText();
}

TEST_F(Etcd, AWorkerFailureFailsEveryNodeAndARestartRunsAgain) {
  startCluster();
  // Round 0: rank 1 fails; round 1 (the restart): everybody succeeds.
  std::string w = script("if [ \"$RANK\" = 1 ] && [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then exit 3; fi\n"
                         "touch " + (dir_ / "ok_").string() + "${RANK}_$TORCHELASTIC_RESTART_COUNT\n");
  auto f = flags("2", 1);
  f.push_back("--max_restarts=1");
  auto a = node(f, w);
  auto b = node(f, w);
  expectExit(*a, 0);
  expectExit(*b, 0);
  EXPECT_TRUE(fs::exists(dir_ / "ok_0_1") && fs::exists(dir_ / "ok_1_1"));
}

TEST_F(Etcd, LosingTheWholeClusterFailsTheJobWithOneLineNamingTheEndpoints) {
  startCluster();
  std::string w = waiter();
  auto a = node(flags("2", 1), w);
  auto b = node(flags("2", 1), w);
  ASSERT_TRUE(awaitFile("up_0") && awaitFile("up_1"));
  auto gone = std::chrono::steady_clock::now();
  for (int i = 0; i < cluster_->size(); ++i) cluster_->kill(i);
  auto ea = a->wait(kRun), eb = b->wait(kRun);
  auto took = std::chrono::steady_clock::now() - gone;
  ASSERT_TRUE(ea && eb);
  EXPECT_EQ(ea->code, 1);
  EXPECT_EQ(eb->code, 1);
  // Within the keep-alive bound (3 s) and the workers' stop.
  EXPECT_LT(took, milliseconds(15000)) << std::chrono::duration_cast<milliseconds>(took).count() << " ms";
  EXPECT_NE(a->stderrText().find("launch: etcd at " + cluster_->endpoints()), std::string::npos) << a->stderrText();
}

TEST_F(Etcd, EndpointsWhereNothingListensAreOneLine) {
  startCluster({.members = 1});
  int nothing = muster::testing::freePort();
  auto a = node(flags("1", 1, ",join_timeout=5", "127.0.0.1:" + std::to_string(nothing)), recorder());
  auto ea = a->wait(kRun);
  ASSERT_TRUE(ea);
  EXPECT_EQ(ea->code, 1);
  EXPECT_NE(a->stderrText().find("etcd at 127.0.0.1:" + std::to_string(nothing)), std::string::npos) << a->stderrText();
  auto bad = node(flags("1", 1, "", "http://h1:2379/path"), recorder());
  expectExit(*bad, 2);  // a bad flag
  EXPECT_NE(bad->stderrText().find("is not an etcd endpoint"), std::string::npos) << bad->stderrText();
}

TEST_F(Etcd, TlsAndAuthWorkAndAWrongCaOrPasswordIsOneLine) {
  startCluster({.members = 1, .tls = true, .auth = true});
  fs::path good = dir_ / "password", wrong = dir_ / "wrong";
  std::ofstream(good) << cluster_->password() << "\n";
  std::ofstream(wrong) << "not-" << cluster_->password() << "\n";
  auto conf = [&](const std::string& ca, const fs::path& password) {
    return ",protocol=https,cacert=" + ca + ",user=" + cluster_->user() + ",password_file=" + password.string();
  };
  auto ok = node(flags("1", 1, conf(cluster_->ca(), good)), recorder());
  expectExit(*ok, 0);

  auto badCa = node(flags("1", 1, conf(cluster_->otherCa(), good) + ",join_timeout=5"), recorder());
  expectExit(*badCa, 1);
  EXPECT_NE(badCa->stderrText().find("launch: rendezvous at"), std::string::npos) << badCa->stderrText();

  auto badPassword = node(flags("1", 1, conf(cluster_->ca(), wrong)), recorder());
  expectExit(*badPassword, 1);
  EXPECT_NE(badPassword->stderrText().find("refused user 'root'"), std::string::npos) << badPassword->stderrText();
}

// Elastic: a third node that comes while two run (--nnodes=2:3) is taken in by a new round,
// which is not counted as a restart; rounds of two keep running until it comes.
TEST_F(Etcd, AThirdNodeIsTakenInByANewRoundWithoutUsingARestart) {
  startCluster();
  std::string w = script("r=$MUSTER_ROUND\nenv > " + (dir_ / "env_").string() + "${r}_$RANK\n"
                         "[ \"$WORLD_SIZE\" != 3 ] && { echo up > " + (dir_ / "up_").string() +
                         "$RANK; sleep 60 & wait; }\nexit 0\n");
  auto f = flags("2:3", 1);
  f.push_back("--max_restarts=0");
  auto a = node(f, w);
  auto b = node(f, w);
  ASSERT_TRUE(awaitFile("up_0") && awaitFile("up_1"));
  auto c = node(f, w);
  expectExit(*a, 0);
  expectExit(*b, 0);
  expectExit(*c, 0);
  int round = 1;
  while (round < 10 && !fs::exists(dir_ / ("env_" + std::to_string(round) + "_2"))) ++round;
  auto e = muster::testing::readEnvFile(dir_ / ("env_" + std::to_string(round) + "_2"));
  EXPECT_EQ(e["WORLD_SIZE"], "3") << a->stderrText() << c->stderrText();
  EXPECT_EQ(e["TORCHELASTIC_RESTART_COUNT"], "0");
  EXPECT_NE(a->stderrText().find("not counted as a restart"), std::string::npos) << a->stderrText();
}

// A launch that stops (SIGTERM) takes its lease with it: the other node sees it gone at once,
// not at the lease's end (20 s here).
TEST_F(Etcd, ANodeThatStopsIsSeenGoneAtOnceNotAtItsLeasesEnd) {
  startCluster();
  std::string w = waiter();
  auto slow = flags("2", 1);
  slow.back() = "--rdzv_conf=last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=20,join_timeout=60";
  auto a = node(slow, w);
  auto b = node(slow, w);
  ASSERT_TRUE(awaitFile("up_0") && awaitFile("up_1"));
  auto stopped = std::chrono::steady_clock::now();
  b->kill(SIGTERM);
  auto ea = a->wait(kRun);
  auto seen = std::chrono::steady_clock::now() - stopped;
  ASSERT_TRUE(ea);
  EXPECT_EQ(ea->code, 1) << a->stderrText();
  EXPECT_LT(seen, milliseconds(8000)) << std::chrono::duration_cast<milliseconds>(seen).count() << " ms";
  expectExit(*b, 128 + SIGTERM);
}

// --hang_timeout on an etcd job: the node whose rank hangs names it with its stack, and the
// job stops on every node.
TEST_F(Etcd, AHungRankIsReportedWithItsStackAndEveryNodeStops) {
  startCluster();
  std::string stuck = muster::testing::buildDir() + "/tests/integration/stuck_worker";
  auto f = flags("2", 2);
  f.insert(f.end(), {"--hang_timeout=3", "--no_python"});
  auto a = node(f, stuck, {"2"});
  auto b = node(f, stuck, {"2"});
  expectExit(*a, 1);
  expectExit(*b, 1);
  std::string both = a->stderrText() + b->stderrText();
  EXPECT_NE(both.find("no rank showed progress for 3 s (--hang_timeout)"), std::string::npos) << both;
  EXPECT_TRUE(std::regex_search(both, std::regex(R"(  rank 2: [^\n]*stuck_in_native_loader\(\))"))) << both;
}

// The anchor: torchrun 1.13's own etcd backends (etcd, etcd-v2: python3-etcd on etcd's v2 API)
// and launch, with the same flags (one member's endpoint, as torchrun takes one; TLS with the
// keys each torchrun backend names: cacert= for etcd, ca_cert= for etcd-v2) on the same
// cluster, run the same two-node DDP
// step: the same parameters to the bit, the same all-reduce, the same variables where torchrun
// 1.13's etcd backends and launch --torchrun_version=1.13 agree by design.
TEST_F(Etcd, TorchrunsEtcdBackendsAndLaunchRunTheSameDdpStepOnOneCluster) {
  if (std::system("/usr/bin/python3 -c 'import etcd, torch.distributed' 2>/dev/null") != 0) {
    GTEST_SKIP() << "python3-etcd or python3-torch is not installed (deploy/setup.sh installs them)";
  }
  startCluster({.members = 3, .tls = true});
  unsetenv("OMP_NUM_THREADS");
  std::string ddp = muster::testing::sourceDir() + "/tests/compat/ddp_step.py";
  auto run = [&](const std::string& who, const std::string& backend) {
    fs::create_directories(dir_ / who);
    std::vector<std::unique_ptr<Child>> nodes;
    for (int n = 0; n < 2; ++n) {
      std::vector<std::string> argv;
      if (who.rfind("torchrun", 0) == 0) {
        argv = {"/usr/bin/python3", muster::testing::sourceDir() + "/tests/compat/torchrun_py311.py"};
      } else {
        argv = {launchPath(), "--torchrun_version=1.13"};
      }
      argv.insert(argv.end(), {"--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=" + backend,
                               "--rdzv_endpoint=" + cluster_->endpoint(0), "--rdzv_id=ddp-" + who,
                               // torchrun's etcd backend names its CA cacert=, its etcd-v2 backend ca_cert=.
                               "--rdzv_conf=protocol=https," + std::string(backend == "etcd" ? "cacert=" : "ca_cert=") +
                                   cluster_->ca() + ",last_call_timeout=1",
                               ddp, (dir_ / who).string()});
      nodes.push_back(std::make_unique<Child>(argv, std::vector<std::string>{"PYTHON_EXEC=/usr/bin/python3"}));
    }
    for (auto& n : nodes) expectExit(*n, 0);
  };
  run("torchrun-etcd", "etcd");
  run("torchrun-etcd-v2", "etcd-v2");
  run("launch-etcd", "etcd");
  run("launch-etcd-v2", "etcd-v2");
  auto result = [&](const std::string& who, int rank) {
    std::ifstream in(dir_ / who / (std::to_string(rank) + ".json"));
    EXPECT_TRUE(in.good()) << who << " rank " << rank << " wrote nothing";
    return in.good() ? nlohmann::json::parse(in) : nlohmann::json();
  };
  // Where torchrun's etcd backends and launch differ on purpose: the workers' store is
  // launch's (USE_AGENT_STORE), not one rank 0 opens at a port of its own; the error file's
  // folder is each launcher's own.
  const std::set<std::string> theirOwn{"MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
                                       "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_RUN_ID"};
  for (const char* torch : {"torchrun-etcd", "torchrun-etcd-v2"}) {
    for (const char* ours : {"launch-etcd", "launch-etcd-v2"}) {
      for (int rank = 0; rank < 2; ++rank) {
        auto theirs = result(torch, rank), mine = result(ours, rank);
        ASSERT_FALSE(theirs.is_null() || mine.is_null());
        EXPECT_EQ(mine["allreduce"], 3.0);
        EXPECT_EQ(mine["params"], theirs["params"]) << ours << " against " << torch << ", rank " << rank;
        for (auto& [key, value] : theirs["env"].items()) {
          if (theirOwn.count(key)) continue;
          EXPECT_EQ(mine["env"][key], value) << key << ": " << ours << " against " << torch << ", rank " << rank;
        }
        EXPECT_EQ(mine["env"]["TORCHELASTIC_USE_AGENT_STORE"], "True");
      }
    }
  }
}

// etcd's roles grant a user some prefixes: with etcd_prefix= (torchrun's etcd backend's key) a
// run lives where the user may write; elsewhere the user is refused in one line.
TEST_F(Etcd, AUserWhoseRoleGrantsOnePrefixRunsThereWithEtcdPrefix) {
  startCluster({.members = 1, .auth = true});
  bool ok = false;
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"role", "add", "team-a"},
           {"role", "grant-permission", "team-a", "--prefix=true", "readwrite", "/jobs/team-a/"},
           {"user", "add", "alice:alice-password"},
           {"user", "grant-role", "alice", "team-a"}}) {
    cluster_->etcdctl(args, &ok);
    ASSERT_TRUE(ok) << args[0] << " " << args[1];
  }
  std::ofstream(dir_ / "alice") << "alice-password\n";
  std::string alice = ",user=alice,password_file=" + (dir_ / "alice").string();
  auto a = node(flags("1", 1, alice + ",etcd_prefix=/jobs/team-a"), recorder());
  expectExit(*a, 0);
  auto state = cluster_->etcdctl({"get", "--print-value-only", "/jobs/team-a/job-etcd/state"});
  EXPECT_NE(state.find("\"phase\":\"finished\""), std::string::npos) << state;
  auto refused = node(flags("1", 1, alice + ",join_timeout=5"), recorder());
  expectExit(*refused, 1);
  EXPECT_NE(refused->stderrText().find("permission denied"), std::string::npos) << refused->stderrText();
}

// A node that asks for another --nnodes than the run's is refused in one line, before it joins:
// the running round goes on untouched (no restart for it).
TEST_F(Etcd, ALateNodeAskingForOtherNnodesIsRefusedAndTheRunGoesOn) {
  startCluster();
  std::string w = waiter();
  auto f = flags("2:3", 1);
  auto a = node(f, w);
  auto b = node(f, w);
  ASSERT_TRUE(awaitFile("up_0") && awaitFile("up_1"));
  auto late = node(flags("1:4", 1), w);
  expectExit(*late, 1);
  EXPECT_NE(late->stderrText().find("asks for --nnodes=1:4 but run 'job-etcd' runs with --nnodes=2:3"),
            std::string::npos)
      << late->stderrText();
  std::ofstream(dir_ / "go") << "";
  expectExit(*a, 0);
  expectExit(*b, 0);
  EXPECT_EQ(a->stderrText().find("restarting"), std::string::npos) << a->stderrText();
}

// Nodes of different --roles: each role's ranks count apart (ROLE_RANK, ROLE_WORLD_SIZE), as
// torchrun's agent counts them; before, every role was given RANK and WORLD_SIZE.
TEST_F(Etcd, EachRoleCountsItsOwnRanks) {
  startCluster();
  std::string w = recorder();
  auto ps = flags("2", 2), trainer = flags("2", 1);
  ps.push_back("--role=ps");
  trainer.push_back("--role=trainer");
  auto a = node(ps, w);
  auto b = node(trainer, w);
  expectExit(*a, 0);
  expectExit(*b, 0);
  std::map<std::string, std::set<std::string>> roleRanks;
  for (int rank = 0; rank < 3; ++rank) {
    auto e = env(rank);
    EXPECT_EQ(e["WORLD_SIZE"], "3");
    EXPECT_EQ(e["ROLE_WORLD_SIZE"], e["ROLE_NAME"] == "ps" ? "2" : "1") << rank;
    EXPECT_EQ(e["ROLE_RANK"], e["LOCAL_RANK"]) << rank;  // one node of each role
    roleRanks[e["ROLE_NAME"]].insert(e["ROLE_RANK"]);
  }
  EXPECT_EQ(roleRanks, (std::map<std::string, std::set<std::string>>{{"ps", {"0", "1"}}, {"trainer", {"0"}}}));
}

// Keys of the run that launch did not write (another program's, a hand edit, a launch of
// another version) are read as one line, never a crash: a join key is left out of the round;
// a state key, without which no node can go on, ends each node's rendezvous with its name.
TEST_F(Etcd, AKeyLaunchDidNotWriteIsOneLineNeverACrash) {
  startCluster();
  bool ok = false;
  // Before any node: a state whose round is not a number.
  cluster_->etcdctl({"put", "/muster/runs/job-etcd/state", R"({"round":"x","phase":"gathering"})"}, &ok);
  ASSERT_TRUE(ok);
  auto first = node(flags("1", 1), recorder());
  expectExit(*first, 1);
  EXPECT_NE(first->stderrText().find("etcd key /muster/runs/job-etcd/state holds what launch does not write "
                                     "(\"round\" should be an integer from 0)"),
            std::string::npos)
      << first->stderrText();
  cluster_->etcdctl({"del", "/muster/runs/job-etcd/state"}, &ok);
  ASSERT_TRUE(ok);
  // A running round: a join key for the next round with no host is left out (the round is not
  // restarted for it), then the state is overwritten with nodes that are not a list.
  std::string w = waiter();
  auto a = node(flags("2:3", 1), w);
  auto b = node(flags("2:3", 1), w);
  ASSERT_TRUE(awaitFile("up_0") && awaitFile("up_1"));
  cluster_->etcdctl({"put", "/muster/runs/job-etcd/join/1/stray", R"({"id":"stray","local_world_size":1,"min":2,"max":3})"},
                    &ok);
  ASSERT_TRUE(ok);
  std::string said;
  for (int i = 0; i < 100 && said.find("stray") == std::string::npos; ++i) {
    std::this_thread::sleep_for(milliseconds(100));
    a->drain();
    b->drain();
    said = a->stderrText() + b->stderrText();
  }
  EXPECT_NE(said.find("etcd key /muster/runs/job-etcd/join/1/stray holds what launch does not write "
                      "(\"host\" should be a string): delete it, or give another --rdzv_id; ignored"),
            std::string::npos)
      << said;
  EXPECT_EQ(said.find("restarting"), std::string::npos) << said;
  cluster_->etcdctl({"put", "/muster/runs/job-etcd/state", R"({"round":0,"phase":"running","nodes":"all"})"}, &ok);
  ASSERT_TRUE(ok);
  for (auto* n : {a.get(), b.get()}) {
    auto e = n->wait(kRun);
    ASSERT_TRUE(e) << n->stderrText();
    EXPECT_EQ(e->code, 1) << n->stderrText();
    EXPECT_NE(n->stderrText().find("etcd key /muster/runs/job-etcd/state holds what launch does not write "
                                   "(\"nodes\" should be an array of nodes)"),
              std::string::npos)
        << n->stderrText();
  }
}

// rendezvousctl runs and status read a run kept in etcd: its nodes, their ranks and what each
// launch said of itself; then the run finished, and when etcd forgets it.
TEST_F(Etcd, RunsAndStatusReadTheRunFromEtcd) {
  startCluster();
  std::string w = waiter();
  // A run whose first round gathers (one node of two): join keys, no state yet.
  auto aloneFlags = flags("2", 1);
  for (auto& f : aloneFlags) {
    if (f == "--rdzv_id=job-etcd") f = "--rdzv_id=job-alone";
  }
  auto alone = node(aloneFlags, w);
  auto a = node(flags("2", 2), w);
  auto b = node(flags("2", 2), w);
  ASSERT_TRUE(awaitFile("up_0") && awaitFile("up_1") && awaitFile("up_2") && awaitFile("up_3"));
  auto ctl = [&](std::vector<std::string> args) {
    std::vector<std::string> argv{muster::testing::ctlPath(), "--timeout=10"};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back("--etcd=" + cluster_->endpoints());
    Child c(argv);
    auto e = c.wait(milliseconds(30000));
    return std::make_pair(e ? e->code : -1, c.stdoutText() + c.stderrText());
  };
  nlohmann::json s;
  for (int i = 0; i < 100; ++i) {
    auto [code, out] = ctl({"status", "--run=job-etcd", "--json"});
    s = nlohmann::json::parse(out, nullptr, false);
    size_t ranks = 0;
    if (code == 0 && s.is_object()) {
      for (const auto& n : s["nodes"]) ranks += n.contains("status") ? n["status"]["ranks"].size() : 0;
    }
    if (ranks == 4) break;
    std::this_thread::sleep_for(milliseconds(200));
  }
  ASSERT_TRUE(s.is_object()) << s;
  EXPECT_EQ(s["run"]["state"], "RUNNING") << s.dump(2);
  EXPECT_EQ(s["run"]["ranks"], 4) << s.dump(2);
  ASSERT_EQ(s["nodes"].size(), 2u) << s.dump(2);
  std::set<int> launchPids;
  for (const auto& n : s["nodes"]) {
    ASSERT_TRUE(n.contains("status")) << s.dump(2);
    launchPids.insert(n["status"]["launch_pid"].get<int>());
    for (const auto& r : n["status"]["ranks"]) {
      EXPECT_EQ(r["state"], "RUNNING") << r.dump();
      EXPECT_TRUE(fs::exists("/proc/" + std::to_string(r["pid"].get<int>()))) << r.dump();
    }
  }
  EXPECT_EQ(launchPids, (std::set<int>{a->pid(), b->pid()}));
  auto [code, runs] = ctl({"runs"});
  EXPECT_EQ(code, 0) << runs;
  EXPECT_TRUE(std::regex_search(runs, std::regex(R"(job-etcd\s+running\s+0\s+2\s+2\s+2\s+4\s)"))) << runs;
  EXPECT_TRUE(std::regex_search(runs, std::regex(R"(job-alone\s+waiting\s+0\s+1\s+2\s+2\s+-\s)"))) << runs;
  auto [acode, aloneOut] = ctl({"status", "--run=job-alone", "--json"});
  ASSERT_EQ(acode, 0) << aloneOut;
  auto as = nlohmann::json::parse(aloneOut, nullptr, false);
  ASSERT_TRUE(as.is_object()) << aloneOut;
  EXPECT_EQ(as["run"]["state"], "WAITING") << aloneOut;
  ASSERT_EQ(as["nodes"].size(), 1u) << aloneOut;
  EXPECT_EQ(as["nodes"][0]["group_rank"], -1) << aloneOut;
  // A key that holds what launch never writes: one line, not a crash.
  bool ok = false;
  cluster_->etcdctl({"put", "/muster/runs/junk/state", R"({"round":"x","phase":"running","nodes":[1]})"}, &ok);
  ASSERT_TRUE(ok);
  auto [jcode, junk] = ctl({"runs"});
  EXPECT_EQ(jcode, 1) << junk;
  EXPECT_NE(junk.find("hold what launch does not write"), std::string::npos) << junk;
  auto [jscode, junkStatus] = ctl({"status", "--run=junk"});
  EXPECT_EQ(jscode, 1) << junkStatus;
  EXPECT_NE(junkStatus.find("run 'junk''s keys hold what launch does not write"), std::string::npos) << junkStatus;
  cluster_->etcdctl({"del", "/muster/runs/junk/state"}, &ok);
  // The gathering node leaves (its lease revoked): its run is gone from the view.
  alone->kill(SIGTERM);
  alone->wait(milliseconds(30000));
  auto [gcode, gone] = ctl({"runs"});
  EXPECT_EQ(gcode, 0) << gone;
  EXPECT_EQ(gone.find("job-alone"), std::string::npos) << gone;
  std::ofstream(dir_ / "go") << "";
  expectExit(*a, 0);
  expectExit(*b, 0);
  auto [done, after] = ctl({"runs"});
  EXPECT_EQ(done, 0) << after;
  EXPECT_TRUE(std::regex_search(after, std::regex(R"(job-etcd\s+finished, forgotten in \dm\d\ds)"))) << after;
  auto [none, missing] = ctl({"status", "--run=nope"});
  EXPECT_EQ(none, 1);
  EXPECT_NE(missing.find("no run 'nope' in etcd at"), std::string::npos) << missing;
}

}  // namespace
}  // namespace muster
