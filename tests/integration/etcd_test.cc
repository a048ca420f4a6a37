// --rdzv_backend=etcd on a real 3-member etcd cluster (Debian's etcd-server, started by the
// test): two launch agents as nodes on loopback run a job whose rendezvous lives in etcd, keep
// running when etcd's leader is killed, fail with one line when the whole cluster goes, see a
// killed node within the keep-alive bound, and refuse bad endpoints, a wrong CA and a wrong
// password with one line each.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>
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
  std::unique_ptr<Child> node(std::vector<std::string> f, const std::string& program) {
    std::vector<std::string> argv{launchPath()};
    argv.insert(argv.end(), f.begin(), f.end());
    argv.push_back(program);
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

}  // namespace
}  // namespace muster
