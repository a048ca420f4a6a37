// Several launch agents as nodes on loopback: static and elastic rounds, failures and losses
// seen by every node, duplicate ranks, a standalone rendezvousd, scaling down and up.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "tests/support/child.h"
#include "tests/support/programs.h"
#include "tests/support/netns.h"

namespace muster {
namespace {

using testing::buildDir;
using testing::launchPath;
using testing::rendezvousdPath;
using testing::workerPath;
using testing::Child;
using testing::freePort;
namespace fs = std::filesystem;
using std::chrono::milliseconds;
constexpr milliseconds kRun{120000};

class MultiNode : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = muster::testing::freshTestDir("muster-mn");
    fs::create_directories(dir_ / "shared");
    port_ = freePort();
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string script(const std::string& body) {
    return muster::testing::writeScript(dir_ / ("w" + std::to_string(scripts_++) + ".sh"), body);
  }
  // Records each rank's view, per round: env_<round>_<rank>.
  std::string recorder(const std::string& then = "") {
    return script("r=${MUSTER_STORE_NAMESPACE##*/}\nenv > " + (dir_ / "env_").string() +
                  "${r}_$RANK\n" + then);
  }
  std::unique_ptr<Child> node(std::vector<std::string> flags, const std::string& program,
                              bool sharedDir = true) {
    std::vector<std::string> argv{launchPath()};
    if (sharedDir) argv.insert(argv.end(), {"--shared_dir", (dir_ / "shared").string()});
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.push_back(program);
    return std::make_unique<Child>(argv);
  }
  std::vector<std::string> staticFlags(int nnodes, int rank, int nproc) {
    return {"--nnodes=" + std::to_string(nnodes), "--node_rank=" + std::to_string(rank),
            "--nproc_per_node=" + std::to_string(nproc), "--master_port=" + std::to_string(port_)};
  }
  std::vector<std::string> elasticFlags(const std::string& nnodes, int nproc, const std::string& endpoint,
                                        const std::string& extraConf = "") {
    return {"--nnodes=" + nnodes, "--nproc_per_node=" + std::to_string(nproc), "--rdzv_backend=c10d",
            "--rdzv_endpoint=" + endpoint, "--rdzv_id=job7", "--max_restarts=2",
            "--rdzv_conf=last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=2" + extraConf};
  }
  std::map<std::string, std::string> env(int round, int rank) {
    return muster::testing::readEnvFile(dir_ / ("env_" + std::to_string(round) + "_" + std::to_string(rank)));
  }
  bool awaitFile(const std::string& name, milliseconds timeout = kRun) {
    return muster::testing::awaitPath(dir_ / name, timeout);
  }

  fs::path dir_;
  int port_ = 0;
  int scripts_ = 0;
};

TEST_F(MultiNode, StaticTwoNodesWithDifferentProcessCounts) {
  std::string w = recorder();
  auto a = node(staticFlags(2, 0, 2), w);
  auto b = node(staticFlags(2, 1, 3), w);
  EXPECT_EQ(a->wait(kRun)->code, 0) << a->stderrText();
  EXPECT_EQ(b->wait(kRun)->code, 0) << b->stderrText();
  for (int r = 0; r < 5; ++r) {
    auto e = env(0, r);
    EXPECT_EQ(e["WORLD_SIZE"], "5");
    EXPECT_EQ(e["GROUP_WORLD_SIZE"], "2");
    EXPECT_EQ(e["GROUP_RANK"], r < 2 ? "0" : "1");
    EXPECT_EQ(e["LOCAL_RANK"], std::to_string(r < 2 ? r : r - 2));
    EXPECT_EQ(e["LOCAL_WORLD_SIZE"], r < 2 ? "2" : "3");
    EXPECT_EQ(e["MASTER_ADDR"], env(0, 0)["MASTER_ADDR"]);
    EXPECT_EQ(e["MASTER_PORT"], env(0, 0)["MASTER_PORT"]);
    EXPECT_EQ(e["MUSTER_STORE_ADDR"], "127.0.0.1:" + std::to_string(port_));
  }
  EXPECT_NE(env(0, 0)["MASTER_PORT"], std::to_string(port_)) << "the workers' store gets a port of its own";
}

TEST_F(MultiNode, SharedDirThatIsLocalToEachNodeIsCaughtBeforeWorkersStart) {
  std::string w = script("echo ran > " + (dir_ / "ran_").string() + "$RANK\n");
  fs::create_directories(dir_ / "local0");
  fs::create_directories(dir_ / "local1");
  auto fa = staticFlags(2, 0, 1), fb = staticFlags(2, 1, 1);
  fa.insert(fa.end(), {"--shared_dir", (dir_ / "local0").string()});  // the later flag wins
  fb.insert(fb.end(), {"--shared_dir", (dir_ / "local1").string()});
  auto a = node(fa, w);
  auto b = node(fb, w);
  EXPECT_EQ(a->wait(kRun)->code, 1);
  EXPECT_EQ(b->wait(kRun)->code, 1);
  EXPECT_NE(b->stderrText().find("is not shared: node 1 (127.0.0.1) cannot see"), std::string::npos)
      << b->stderrText();
  EXPECT_FALSE(fs::exists(dir_ / "ran_0")) << "no worker may start";
  EXPECT_FALSE(fs::exists(dir_ / "ran_1"));
}

// A plain two-node job needs no --shared_dir (a DDP script never uses it); the channel's
// create() then fails at once on every rank, naming the flag.
TEST_F(MultiNode, TwoNodesWithoutSharedDirRunAndTheChannelNamesTheFlag) {
  std::string w = recorder();
  auto a = node(staticFlags(2, 0, 1), w, false);
  auto b = node(staticFlags(2, 1, 1), w, false);
  EXPECT_EQ(a->wait(kRun)->code, 0) << a->stderrText();
  EXPECT_EQ(b->wait(kRun)->code, 0) << b->stderrText();
  EXPECT_EQ(env(0, 1).count("MUSTER_SHARED_DIR"), 0u);
  EXPECT_EQ(env(0, 1)["WORLD_SIZE"], "2");
  std::string tool = buildDir() + "/tests/integration/channel_tool";
  auto c = node(staticFlags(2, 0, 1), tool, false);
  auto d = node(staticFlags(2, 1, 1), tool, false);
  ASSERT_EQ(c->wait(kRun)->code, 1);
  ASSERT_EQ(d->wait(kRun)->code, 1);
  // Each rank fails at create(); the slower node may be stopped by the other's failure first.
  std::string both = c->stderrText() + d->stderrText();
  EXPECT_NE(both.find("this job spans 2 nodes and launch was given no --shared_dir"), std::string::npos)
      << both;
  for (auto* n : {c.get(), d.get()}) {
    bool own = n->stderrText().find("launch was given no --shared_dir") != std::string::npos;
    bool told = n->stderrText().find("the job failed: node") != std::string::npos;
    EXPECT_TRUE(own || told) << n->stderrText();
  }
}

TEST_F(MultiNode, StaticThreeNodes) {
  std::string w = recorder();
  std::vector<std::unique_ptr<Child>> nodes;
  for (int n = 2; n >= 0; --n) nodes.push_back(node(staticFlags(3, n, 1), w));  // any order
  for (auto& c : nodes) EXPECT_EQ(c->wait(kRun)->code, 0) << c->stderrText();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(env(0, r)["GROUP_RANK"], std::to_string(r));
}

TEST_F(MultiNode, AWorkerFailureFailsEveryNodeWithTheSameCode) {
  std::string w = script("if [ \"$RANK\" = 3 ]; then sleep 0.3; exit 5; fi\nsleep 60 & wait\n");
  auto start = std::chrono::steady_clock::now();
  auto a = node(staticFlags(2, 0, 2), w);
  auto b = node(staticFlags(2, 1, 2), w);
  auto ea = a->wait(kRun), eb = b->wait(kRun);
  EXPECT_EQ(ea->code, 1);
  EXPECT_EQ(eb->code, 1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_NE(a->stderrText().find("node 127.0.0.1 (group rank 1) failed: rank 3 exited with code 5"),
            std::string::npos) << a->stderrText();
  EXPECT_NE(b->stderrText().find("root cause: rank 3"), std::string::npos);
}

TEST_F(MultiNode, KilledAgentIsDetectedWithinTheKeepAliveTimeout) {
  std::string w = script("echo up > " + (dir_ / "up_").string() + "$RANK\nsleep 60 & wait\n");
  std::vector<std::string> conf{"--rdzv_conf=keep_alive_interval=1,keep_alive_max_attempt=2"};
  auto fa = staticFlags(2, 0, 1), fb = staticFlags(2, 1, 1);
  fa.insert(fa.end(), conf.begin(), conf.end());
  fb.insert(fb.end(), conf.begin(), conf.end());
  auto a = node(fa, w);
  auto b = node(fb, w);
  ASSERT_TRUE(awaitFile("up_0") && awaitFile("up_1"));
  auto killed = std::chrono::steady_clock::now();
  b->kill(SIGKILL);
  auto ea = a->wait(kRun);
  auto detected = std::chrono::steady_clock::now() - killed;
  EXPECT_EQ(ea->code, 1);
  // Within keep_alive_interval x keep_alive_max_attempt = 2 s (plus the timer's granularity);
  // usually at once, when the agent's watch stream drops with its process.
  EXPECT_LT(detected, std::chrono::milliseconds(2500)) << "detected after "
      << std::chrono::duration_cast<milliseconds>(detected).count() << " ms";
  EXPECT_NE(a->stderrText().find("(group rank 1) was lost"), std::string::npos) << a->stderrText();
}

TEST_F(MultiNode, LosingNodeZerosAgentSaysSoAndSuggestsRendezvousd) {
  std::string w = script("echo up > " + (dir_ / "up_").string() + "$RANK\nsleep 60 & wait\n");
  auto a = node(staticFlags(2, 0, 1), w);
  auto b = node(staticFlags(2, 1, 1), w);
  ASSERT_TRUE(awaitFile("up_0") && awaitFile("up_1"));
  a->kill(SIGKILL);
  auto eb = b->wait(kRun);
  EXPECT_EQ(eb->code, 1);
  EXPECT_NE(b->stderrText().find("went away"), std::string::npos) << b->stderrText();
  EXPECT_NE(b->stderrText().find("standalone rendezvousd"), std::string::npos) << b->stderrText();
}

TEST_F(MultiNode, DuplicateNodeRankIsAnErrorNamingBothNodes) {
  std::string w = script("echo up > " + (dir_ / "up_").string() + "$RANK\nsleep 60 & wait\n");
  auto a = node(staticFlags(2, 0, 1), w);
  auto b = node(staticFlags(2, 1, 1), w);
  ASSERT_TRUE(awaitFile("up_1"));
  auto dup = node(staticFlags(2, 1, 1), w);
  auto e = dup->wait(kRun);
  EXPECT_EQ(e->code, 1);
  EXPECT_NE(dup->stderrText().find("node rank 1 is claimed by two nodes"), std::string::npos)
      << dup->stderrText();
  a->kill(SIGTERM);
  b->kill(SIGTERM);
}

TEST_F(MultiNode, DisagreeingNnodesIsAnErrorNamingBothSizes) {
  std::string w = script("sleep 60 & wait\n");
  auto a = node(staticFlags(2, 0, 1), w);
  auto b = node(staticFlags(3, 1, 1), w);
  // Whichever join reaches the service first sets the run's size; the other is refused.
  auto e = b->wait(kRun);
  EXPECT_EQ(e->code, 1);
  if (b->stderrText().find("shutting down") != std::string::npos) {
    auto ea = a->wait(kRun);
    EXPECT_EQ(ea->code, 1);
    EXPECT_NE(a->stderrText().find("asks for --nnodes=2 but run 'none' was started with --nnodes=3"),
              std::string::npos) << a->stderrText();
  } else {
    EXPECT_NE(b->stderrText().find("asks for --nnodes=3 but run 'none' was started with --nnodes=2"),
              std::string::npos) << b->stderrText();
    a->kill(SIGTERM);
  }
}

// A node still joining when the service goes away (rendezvousd stopped, node 0's launch gone)
// says so and exits: it does not wait out the join timeout (600 s) for a service that may never
// come back. (Under load, MultiNode.DisagreeingNnodesIsAnErrorNamingBothSizes hung this way:
// node 1's join reached node 0's service first, node 0's own was refused and it exited, and
// node 1 asked again and again for 600 s.)
TEST_F(MultiNode, AJoinPendingWhenTheServiceStopsEndsAtOnceNamingIt) {
  Child daemon({rendezvousdPath(), "--host", "127.0.0.1", "--port", "0"},
               {"MUSTER_LOG_LEVEL=debug"});
  auto line = daemon.waitForLine(R"(listening on (127\.0\.0\.1:\d+))", kRun);
  ASSERT_TRUE(line.has_value());
  auto a = node(elasticFlags("2", 1, (*line)[1]), script("exit 0\n"));
  ASSERT_TRUE(daemon.waitForLine("waits for the round", kRun).has_value()) << daemon.stderrText();
  auto struck = std::chrono::steady_clock::now();
  daemon.kill(SIGTERM);
  auto exited = a->wait(kRun);
  auto took = std::chrono::steady_clock::now() - struck;
  ASSERT_TRUE(exited.has_value()) << a->stderrText();
  EXPECT_EQ(exited->code, 1) << a->stderrText();
  EXPECT_NE(a->stderrText().find("the rendezvous is shutting down"), std::string::npos) << a->stderrText();
  EXPECT_LT(took, milliseconds(10000)) << a->stderrText();
}

// A run id is not spent for good: while the service remembers the finished run, a job with the
// same --rdzv_id is told so (with when and how to go on); once it is forgotten
// (--finished-run-ttl), the same id starts a new run. It said "has already finished" forever.
TEST_F(MultiNode, ARunIdCanBeUsedAgainOnceTheFinishedRunIsForgotten) {
  Child daemon({rendezvousdPath(), "--host", "127.0.0.1", "--port", "0",
                "--finished-run-ttl", "1"},
               {"MUSTER_LOG_LEVEL=debug"});
  auto line = daemon.waitForLine(R"(listening on (127\.0\.0\.1:\d+))", kRun);
  ASSERT_TRUE(line.has_value()) << daemon.stderrText();
  std::string ok = script("exit 0\n");
  auto first = node(elasticFlags("1", 1, (*line)[1]), ok);
  EXPECT_EQ(first->wait(kRun)->code, 0) << first->stderrText();
  auto second = node(elasticFlags("1", 1, (*line)[1]), ok);
  EXPECT_EQ(second->wait(kRun)->code, 1) << second->stderrText();
  EXPECT_NE(second->stderrText().find("run 'job7' has already finished"), std::string::npos)
      << second->stderrText();
  EXPECT_NE(second->stderrText().find("--finished-run-ttl"), std::string::npos) << second->stderrText();
  ASSERT_TRUE(daemon.waitForLine("forgot finished run 'job7'", kRun).has_value()) << daemon.stderrText();
  auto third = node(elasticFlags("1", 1, (*line)[1]), ok);
  EXPECT_EQ(third->wait(kRun)->code, 0) << third->stderrText();
}

// launch joins a rendezvousd that speaks TLS (--rdzv_tls_ca), and its workers reach the
// store over TLS too (MUSTER_STORE_TLS_CA). RendezvousClient had no TLS: launch could not join
// such a daemon at all.
TEST_F(MultiNode, JoinsARendezvousdOverTlsAndTheWorkersUseItsStoreOverTls) {
  std::string crt = (dir_ / "tls.crt").string(), key = (dir_ / "tls.key").string();
  std::string make = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
                     "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout " + key +
                     " -out " + crt + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(make.c_str()), 0) << "openssl could not make a test certificate";
  Child daemon({rendezvousdPath(), "--host", "127.0.0.1", "--port", "0",
                "--tls-cert", crt, "--tls-key", key});
  auto line = daemon.waitForLine(R"(listening on (127\.0\.0\.1:\d+))", kRun);
  ASSERT_TRUE(line.has_value()) << daemon.stderrText();
  std::string tool = buildDir() + "/tests/integration/channel_tool";
  std::string out = (dir_ / "got").string();
  std::string w = script("set -e\n" + tool + " store-set greeting over-tls\n" + tool +
                         " store-get greeting > " + out + "\necho \"$MUSTER_STORE_TLS_CA\" >> " + out + "\n");
  auto flags = elasticFlags("1", 1, (*line)[1]);
  flags.insert(flags.end(), {"--rdzv_tls_ca", crt, "--rdzv_tls_server_name", "localhost"});
  auto a = node(flags, w);
  auto exit = a->wait(kRun);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->code, 0) << a->stderrText() << daemon.stderrText();
  std::ifstream got(out);
  std::string value, ca;
  std::getline(got, value);
  std::getline(got, ca);
  EXPECT_EQ(value, "over-tls");
  EXPECT_EQ(ca, crt);
  // Without the CA the handshake never succeeds: the join ends at its timeout, naming the
  // endpoint, and launch exits 1.
  auto plain = node(elasticFlags("1", 1, (*line)[1], ",join_timeout=2"), w);
  auto failed = plain->wait(kRun);
  ASSERT_TRUE(failed.has_value());
  EXPECT_EQ(failed->code, 1) << plain->stderrText();
  EXPECT_NE(plain->stderrText().find("rendezvous at " + (*line)[1] + " failed"), std::string::npos)
      << plain->stderrText();
}

TEST_F(MultiNode, StandaloneRendezvousdOutlivesTheLossOfANode) {
  Child daemon({rendezvousdPath(), "--host", "127.0.0.1", "--port", "0"});
  auto line = daemon.waitForLine(R"(listening on (127\.0\.0\.1:\d+))", kRun);
  ASSERT_TRUE(line.has_value());
  // Round 0 runs until a node is lost; later rounds succeed.
  std::string w = recorder("[ \"$r\" = 0 ] && { echo up > " + (dir_ / "up_").string() +
                           "$RANK; sleep 60 & wait; }\nexit 0\n");
  auto a = node(elasticFlags("2", 1, (*line)[1]), w);
  auto b = node(elasticFlags("2", 1, (*line)[1]), w);
  ASSERT_TRUE(awaitFile("up_0") && awaitFile("up_1"));
  a->kill(SIGKILL);
  auto c = node(elasticFlags("2", 1, (*line)[1]), w);  // a replacement
  EXPECT_EQ(b->wait(kRun)->code, 0) << b->stderrText();
  EXPECT_EQ(c->wait(kRun)->code, 0) << c->stderrText();
  EXPECT_EQ(env(1, 0)["WORLD_SIZE"], "2");
}

// rendezvousd restarts (systemd, a rescheduled pod) while a job runs: the agents re-join it as a
// new round, using a restart, and the job finishes; the restart count rises on every node.
TEST_F(MultiNode, AgentsRejoinARestartedRendezvousd) {
  int port = freePort();
  std::string addr = "127.0.0.1:" + std::to_string(port);
  auto daemon = std::make_unique<Child>(std::vector<std::string>{
      rendezvousdPath(), "--host", "127.0.0.1", "--port", std::to_string(port)});
  ASSERT_TRUE(daemon->waitForLine(R"(listening on)", kRun).has_value());
  // The first attempt runs until the daemon goes; the next one succeeds.
  std::string w = script("echo $TORCHELASTIC_RESTART_COUNT > " + (dir_ / "count_").string() +
                         "$RANK\n[ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] && { echo up > " +
                         (dir_ / "up_").string() + "$RANK; sleep 60 & wait; }\nexit 0\n");
  auto a = node(elasticFlags("2", 1, addr), w);
  auto b = node(elasticFlags("2", 1, addr), w);
  ASSERT_TRUE(awaitFile("up_0") && awaitFile("up_1"));
  daemon->kill(SIGKILL);
  ASSERT_TRUE(daemon->wait(kRun).has_value());
  daemon = std::make_unique<Child>(std::vector<std::string>{
      rendezvousdPath(), "--host", "127.0.0.1", "--port", std::to_string(port)});
  ASSERT_TRUE(daemon->waitForLine(R"(listening on)", kRun).has_value());
  auto ea = a->wait(kRun), eb = b->wait(kRun);
  ASSERT_TRUE(ea.has_value() && eb.has_value()) << a->stderrText() << b->stderrText();
  EXPECT_EQ(ea->code, 0) << a->stderrText();
  EXPECT_EQ(eb->code, 0) << b->stderrText();
  EXPECT_NE(a->stderrText().find("re-joining it as a new round (1 of 2 restarts"), std::string::npos)
      << a->stderrText();
  std::ifstream c0(dir_ / "count_0"), c1(dir_ / "count_1");
  std::string n0, n1;
  c0 >> n0;
  c1 >> n1;
  EXPECT_EQ(n0, "1");
  EXPECT_EQ(n1, "1");
}

// Without a restart left, losing rendezvousd ends the job, saying so.
TEST_F(MultiNode, LosingRendezvousdWithoutARestartLeftSaysSo) {
  Child daemon({rendezvousdPath(), "--host", "127.0.0.1", "--port", "0"});
  auto line = daemon.waitForLine(R"(listening on (127\.0\.0\.1:\d+))", kRun);
  ASSERT_TRUE(line.has_value());
  std::string w = script("echo up > " + (dir_ / "up_").string() + "$RANK; sleep 60 & wait\n");
  auto flags = elasticFlags("1", 1, (*line)[1]);
  flags.push_back("--max_restarts=0");  // the later flag wins
  auto a = node(flags, w);
  ASSERT_TRUE(awaitFile("up_0"));
  daemon.kill(SIGKILL);
  auto exit = a->wait(kRun);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->code, 1);
  EXPECT_NE(a->stderrText().find("no restart is left to re-join it"), std::string::npos) << a->stderrText();
}

TEST_F(MultiNode, ScaleDownFromThreeToTwo) {
  std::string endpoint = "127.0.0.1:" + std::to_string(port_);
  std::string w = recorder("[ \"$r\" = 0 ] && { echo up > " + (dir_ / "up_").string() +
                           "$RANK; sleep 60 & wait; }\nexit 0\n");
  auto a = node(elasticFlags("2:3", 1, endpoint, ",is_host=true"), w);
  auto b = node(elasticFlags("2:3", 1, endpoint, ",is_host=false"), w);
  auto c = node(elasticFlags("2:3", 1, endpoint, ",is_host=false"), w);
  ASSERT_TRUE(awaitFile("up_0") && awaitFile("up_1") && awaitFile("up_2"));
  EXPECT_EQ(env(0, 0)["WORLD_SIZE"], "3");
  c->kill(SIGKILL);
  EXPECT_EQ(a->wait(kRun)->code, 0) << a->stderrText();
  EXPECT_EQ(b->wait(kRun)->code, 0) << b->stderrText();
  EXPECT_EQ(env(1, 0)["WORLD_SIZE"], "2");
  EXPECT_EQ(env(1, 1)["TORCHELASTIC_RESTART_COUNT"], "1");
}

TEST_F(MultiNode, ScaleUpFromTwoToThreeWithoutUsingARestart) {
  std::string endpoint = "127.0.0.1:" + std::to_string(port_);
  // Every round of fewer than three nodes keeps running: under load a node may be late for the
  // scale-up's round (last_call_timeout=1), which then runs with two, and the next one has all
  // three; the job ends in the first round of three.
  std::string w = recorder("[ \"$WORLD_SIZE\" != 3 ] && { echo up > " + (dir_ / "up_").string() +
                           "$RANK; sleep 60 & wait; }\nexit 0\n");
  auto flags = [&](const std::string& host) {
    auto f = elasticFlags("2:3", 1, endpoint, ",is_host=" + host);
    f[5] = "--max_restarts=0";
    return f;
  };
  auto a = node(flags("true"), w);
  auto b = node(flags("false"), w);
  ASSERT_TRUE(awaitFile("up_0") && awaitFile("up_1"));
  EXPECT_EQ(env(0, 0)["WORLD_SIZE"], "2");
  auto c = node(flags("false"), w);
  EXPECT_EQ(a->wait(kRun)->code, 0) << a->stderrText();
  EXPECT_EQ(b->wait(kRun)->code, 0) << b->stderrText();
  EXPECT_EQ(c->wait(kRun)->code, 0) << c->stderrText();
  int round = 1;
  while (round < 10 && env(round, 2).empty()) ++round;
  EXPECT_EQ(env(round, 2)["WORLD_SIZE"], "3") << a->stderrText() << b->stderrText() << c->stderrText();
  EXPECT_EQ(env(round, 2)["TORCHELASTIC_RESTART_COUNT"], "0");
  EXPECT_NE(a->stderrText().find("not counted as a restart"), std::string::npos) << a->stderrText();
}

// A report to a rendezvous that does not answer (node 0's launch stopped) once blocked the
// event loop for its 10 s deadline: SIGTERM is acted on at once, and launch waits only a
// moment for the report before it exits.
TEST_F(MultiNode, SigtermIsActedOnAtOnceWhenTheRendezvousDoesNotAnswer) {
  std::string w = script("touch " + (dir_ / "up_").string() + "$RANK\nexec sleep 60\n");
  auto a = node(staticFlags(2, 0, 1), w);
  auto b = node(staticFlags(2, 1, 1), w);
  ASSERT_TRUE(awaitFile("up_0") && awaitFile("up_1")) << a->stderrText() << b->stderrText();
  a->kill(SIGSTOP);  // the rendezvous (hosted by node 0) stops answering
  auto struck = std::chrono::steady_clock::now();
  b->kill(SIGTERM);
  auto exited = b->wait(kRun);
  auto took = std::chrono::steady_clock::now() - struck;
  a->kill(SIGKILL);
  a->kill(SIGCONT);
  ASSERT_TRUE(exited);
  EXPECT_EQ(exited->code, 128 + SIGTERM) << b->stderrText();
  // The report's own deadline is 10 s; launch gives it 2 s once done.
  EXPECT_LT(took, milliseconds(7000)) << b->stderrText();
}

// After a restart and then an elastic join, the nodes' restart counts differ (1, 1 and 0 for
// the newcomer) in round 2: the workers' channel directory is keyed by the rendezvous round
// (MUSTER_ROUND), as launch's own, so the channel works (it once said "not shared").
TEST_F(MultiNode, TheChannelWorksAfterARestartAndAnElasticJoin) {
  std::string endpoint = "127.0.0.1:" + std::to_string(port_);
  std::string w = script("r=${MUSTER_STORE_NAMESPACE##*/}\n"
                         "[ \"$r\" = 0 ] && { [ \"$RANK\" = 0 ] && exit 1; sleep 60 & wait; exit 0; }\n"
                         "[ \"$r\" = 1 ] && { echo up > " + (dir_ / "up_").string() + "$RANK; sleep 60 & wait; exit 0; }\n"
                         "exec " + buildDir() + "/worker/worker --timeout=60\n");
  auto flags = [&](const std::string& host) { return elasticFlags("2:3", 1, endpoint, ",is_host=" + host); };
  auto a = node(flags("true"), w);
  auto b = node(flags("false"), w);
  ASSERT_TRUE(awaitFile("up_0") && awaitFile("up_1")) << a->stderrText() << b->stderrText();
  auto c = node(flags("false"), w);
  EXPECT_EQ(a->wait(kRun)->code, 0) << a->stdoutText() << a->stderrText();
  EXPECT_EQ(b->wait(kRun)->code, 0) << b->stdoutText() << b->stderrText();
  EXPECT_EQ(c->wait(kRun)->code, 0) << c->stdoutText() << c->stderrText();
  std::string out = a->stdoutText() + b->stdoutText() + c->stdoutText();
  EXPECT_NE(out.find("self-check passed: 3 rank(s), gloo"), std::string::npos) << out;
  EXPECT_EQ(out.find("not shared"), std::string::npos) << out;
}

}  // namespace
}  // namespace muster

namespace muster {
namespace {

// Two hosts in network namespaces, joined through a bridge that lives in a namespace of its
// own; 10.x addresses exist only inside them. Needs root and iproute2.
class NetnsHosts : public MultiNode {
 protected:
  void SetUp() override {
    MultiNode::SetUp();
    if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
    if (!net_.create()) GTEST_SKIP() << "cannot create network namespaces here";
  }
  void TearDown() override {
    net_.remove();
    MultiNode::TearDown();
  }
  std::unique_ptr<Child> hostNode(int h, std::vector<std::string> flags, std::vector<std::string> program,
                                  bool sharedDir = true, std::vector<std::string> env = {}) {
    std::vector<std::string> argv{"/usr/bin/nsenter", "--net=" + net_.path(h), "--",
                                  launchPath()};
    if (sharedDir) argv.insert(argv.end(), {"--shared_dir", (dir_ / "shared").string()});
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), program.begin(), program.end());
    // No GLOO_SOCKET_IFNAME: the workers find their address on the route to the master.
    env.insert(env.end(), {"PYTHON_EXEC=/usr/bin/python3", "OMP_NUM_THREADS=1"});
    return std::make_unique<Child>(argv, env);
  }
  testing::NetnsNetwork net_{"mh", 214};
};

TEST_F(NetnsHosts, TwoHostsRunGlooCollectivesAcrossTheirOwnAddresses) {
  std::string master = net_.address(1);
  auto flags = [&](int rank) {
    return std::vector<std::string>{"--nnodes=2", "--node_rank=" + std::to_string(rank), "--nproc_per_node=2",
                                    "--master_addr=" + master, "--master_port=" + std::to_string(port_)};
  };
  std::vector<std::string> check{workerPath(), "--timeout=60"};
  auto a = hostNode(1, flags(0), check);
  auto b = hostNode(2, flags(1), check);
  auto ea = a->wait(kRun), eb = b->wait(kRun);
  ASSERT_TRUE(ea.has_value() && eb.has_value());
  EXPECT_EQ(ea->code, 0) << a->stdoutText() << a->stderrText();
  EXPECT_EQ(eb->code, 0) << b->stdoutText() << b->stderrText();
  EXPECT_NE(a->stdoutText().find("self-check passed: 4 rank(s), gloo"), std::string::npos) << a->stdoutText();
  // The workers' store is group rank 0's own address, reachable from the other host.
  EXPECT_NE(b->stderrText().find("workers' store at " + master + ":"), std::string::npos) << b->stderrText();
}

// An unmodified PyTorch DDP script on two hosts, as a torchrun user starts it: no
// --shared_dir, the workers' store in node 0's launch at --master_addr.
TEST_F(NetnsHosts, TwoHostsRunAnUnmodifiedDdpScriptWithTheAgentStore) {
  std::string master = net_.address(1);
  auto flags = [&](int rank) {
    return std::vector<std::string>{"--nnodes=2", "--node_rank=" + std::to_string(rank), "--nproc_per_node=1",
                                    "--master_addr=" + master, "--master_port=" + std::to_string(port_)};
  };
  fs::create_directories(dir_ / "out");
  std::vector<std::string> ddp{testing::sourceDir() + "/tests/compat/ddp_step.py", (dir_ / "out").string()};
  // PyTorch's Gloo finds its address by the host's name unless told the interface (as under
  // torchrun); these hosts' names resolve to loopback.
  auto a = hostNode(1, flags(0), ddp, false, {"GLOO_SOCKET_IFNAME=" + net_.interfaceName(1)});
  auto b = hostNode(2, flags(1), ddp, false, {"GLOO_SOCKET_IFNAME=" + net_.interfaceName(2)});
  auto ea = a->wait(kRun), eb = b->wait(kRun);
  ASSERT_TRUE(ea.has_value() && eb.has_value());
  EXPECT_EQ(ea->code, 0) << a->stdoutText() << a->stderrText();
  EXPECT_EQ(eb->code, 0) << b->stdoutText() << b->stderrText();
  for (int r = 0; r < 2; ++r) {
    std::ifstream in(dir_ / "out" / (std::to_string(r) + ".json"));
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("\"TORCHELASTIC_USE_AGENT_STORE\": \"True\""), std::string::npos) << text;
    EXPECT_NE(text.find("\"allreduce\": 3.0"), std::string::npos) << text;
    EXPECT_NE(text.find("\"MASTER_ADDR\": \"" + master + "\""), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace muster
