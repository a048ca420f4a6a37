// The shared-dir channel between real processes: under launch, with 1 GiB, a sender killed
// mid-write, the directory left empty after a job, and two network-namespace "nodes".
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/support/child.h"
#include "tests/support/programs.h"

namespace muster {
namespace {

using testing::buildDir;
using testing::launchPath;
using testing::rendezvousdPath;
using testing::Child;
namespace fs = std::filesystem;
constexpr std::chrono::milliseconds kRun{180000};

std::string tool() { return buildDir() + "/tests/integration/channel_tool"; }

class Channel : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = muster::testing::freshTestDir("muster-chanit");
  }
  void TearDown() override { fs::remove_all(dir_); }
  size_t entries(const fs::path& p) {
    size_t n = 0;
    for (const auto& e : fs::recursive_directory_iterator(p)) n += e.is_regular_file() ? 1 : 0;
    return n;
  }
  fs::path dir_;
};

TEST_F(Channel, EveryOperationUnderLaunchAndNothingLeftAfterwards) {
  Child c({launchPath(), "--nproc_per_node=3", "--master_port=0", "--shared_dir", dir_.string(),
           tool(), "all"});
  auto exit = c.wait(kRun);
  ASSERT_EQ(exit->code, 0) << c.stdoutText() << c.stderrText();
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(c.stdoutText().find("rank " + std::to_string(r) + ": every operation ok"),
              std::string::npos);
  }
  EXPECT_EQ(entries(dir_), 0u) << "a successful job leaves nothing in the shared directory";
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(Channel, OneGibibyteTensorArrivesIntact) {
  Child c({launchPath(), "--nproc_per_node=2", "--master_port=0", "--shared_dir", dir_.string(),
           tool(), "big", "1024"});
  auto exit = c.wait(kRun);
  ASSERT_EQ(exit->code, 0) << c.stdoutText() << c.stderrText();
  EXPECT_NE(c.stdoutText().find("received 1024 MiB intact"), std::string::npos) << c.stdoutText();
}

TEST_F(Channel, SenderKilledMidWriteIsAClearErrorAndNoPartialFileIsRead) {
  Child daemon({rendezvousdPath(), "--host", "127.0.0.1", "--port", "0"});
  auto line = daemon.waitForLine(R"(listening on (127\.0\.0\.1:\d+))", kRun);
  ASSERT_TRUE(line.has_value());
  auto envFor = [&](int r) {
    return std::vector<std::string>{"RANK=" + std::to_string(r), "WORLD_SIZE=2",
                                    "LOCAL_RANK=" + std::to_string(r), "LOCAL_WORLD_SIZE=2",
                                    "MUSTER_STORE_ADDR=" + (*line)[1], "MUSTER_STORE_NAMESPACE=k/0",
                                    "MUSTER_SHARED_DIR=" + dir_.string(), "MUSTER_JOB_ID=k"};
  };
  Child receiver({tool(), "recv", "0", "3"}, envFor(0));
  Child sender({tool(), "send", "4096", "60"}, envFor(1));
  // Kill the sender as soon as its temporary data file appears (bounded wait). Only a p2p file:
  // rank 0's start-up probe writes a .tmp file too, and killing the sender then (before its own
  // probe) left the receiver waiting for it the whole probe timeout.
  fs::path round = dir_ / "k" / "0";
  bool killed = false;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!killed && std::chrono::steady_clock::now() < deadline) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(round, ec)) {
      if (e.path().extension() == ".tmp" && e.path().filename().string().rfind(".p2p.", 0) == 0) {
        sender.kill(SIGKILL);
        killed = true;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(killed) << "the sender never started writing";
  auto exit = receiver.wait(kRun);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->code, 1);
  EXPECT_NE(receiver.stderrText().find("rank 1 did not announce"), std::string::npos)
      << receiver.stderrText();
  EXPECT_NE(receiver.stderrText().find("p2p.1.0.0.0.mt"), std::string::npos);
  EXPECT_FALSE(fs::exists(round / "p2p.1.0.0.0.mt")) << "a half-written file was put in place";
}

// Two "nodes": network namespaces joined by a veth pair, the store in one of them, both
// sharing one directory (as over NFS). Needs root and iproute2.
class NetnsNodes : public Channel {
 protected:
  void SetUp() override {
    Channel::SetUp();
    if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
    tag_ = "mst" + std::to_string(getpid() % 100000);
    int subnet = 100 + getpid() % 100;
    addrA_ = "10.213." + std::to_string(subnet) + ".1";
    addrB_ = "10.213." + std::to_string(subnet) + ".2";
    teardown();  // namespaces of these names are a killed test's of the same pid
    std::string script =
        "set -e; ip netns add " + tag_ + "a; ip netns add " + tag_ + "b; "
        "ip link add " + tag_ + "x type veth peer name " + tag_ + "y; "
        "ip link set " + tag_ + "x netns " + tag_ + "a; ip link set " + tag_ + "y netns " + tag_ + "b; "
        "ip -n " + tag_ + "a addr add " + addrA_ + "/24 dev " + tag_ + "x; "
        "ip -n " + tag_ + "b addr add " + addrB_ + "/24 dev " + tag_ + "y; "
        "ip -n " + tag_ + "a link set " + tag_ + "x up; ip -n " + tag_ + "b link set " + tag_ + "y up; "
        "ip -n " + tag_ + "a link set lo up; ip -n " + tag_ + "b link set lo up";
    if (std::system(("(" + script + ") >/dev/null 2>&1").c_str()) != 0) {
      teardown();
      GTEST_SKIP() << "cannot create network namespaces here";
    }
    made_ = true;
  }
  void TearDown() override {
    if (made_) teardown();
    Channel::TearDown();
  }
  void teardown() {
    std::system(("ip netns del " + tag_ + "a >/dev/null 2>&1; ip netns del " + tag_ +
                 "b >/dev/null 2>&1").c_str());
  }
  std::vector<std::string> in(const std::string& ns, std::vector<std::string> argv) {
    std::vector<std::string> out{"/usr/bin/nsenter", "--net=/run/netns/" + tag_ + ns, "--"};
    out.insert(out.end(), argv.begin(), argv.end());
    return out;
  }
  std::string tag_, addrA_, addrB_;
  bool made_ = false;
};

TEST_F(NetnsNodes, TwoNodesShareOneDirectory) {
  Child daemon(in("a", {rendezvousdPath(), "--host", addrA_, "--port", "0"}));
  auto line = daemon.waitForLine(R"(listening on ([0-9.]+:\d+))", kRun);
  ASSERT_TRUE(line.has_value()) << daemon.stderrText();
  std::vector<std::unique_ptr<Child>> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(std::make_unique<Child>(
        in(r == 0 ? "a" : "b", {tool(), "all"}),
        std::vector<std::string>{"RANK=" + std::to_string(r), "WORLD_SIZE=2", "LOCAL_RANK=0",
                                 "LOCAL_WORLD_SIZE=1", "GROUP_RANK=" + std::to_string(r),
                                 "GROUP_WORLD_SIZE=2", "MUSTER_STORE_ADDR=" + (*line)[1],
                                 "MUSTER_STORE_NAMESPACE=two/0", "MUSTER_JOB_ID=two",
                                 "MUSTER_SHARED_DIR=" + dir_.string()}));
  }
  for (auto& r : ranks) {
    auto exit = r->wait(kRun);
    ASSERT_TRUE(exit.has_value());
    EXPECT_EQ(exit->code, 0) << r->stderrText();
    EXPECT_NE(r->stdoutText().find("every operation ok"), std::string::npos);
  }
}

TEST_F(NetnsNodes, DirectoryLocalToEachNodeIsCaughtAtStart) {
  Child daemon(in("a", {rendezvousdPath(), "--host", addrA_, "--port", "0"}));
  auto line = daemon.waitForLine(R"(listening on ([0-9.]+:\d+))", kRun);
  ASSERT_TRUE(line.has_value());
  std::vector<std::unique_ptr<Child>> ranks;
  for (int r = 0; r < 2; ++r) {
    fs::path local = dir_ / ("node" + std::to_string(r));  // each node its own "shared" dir
    fs::create_directories(local);
    ranks.push_back(std::make_unique<Child>(
        in(r == 0 ? "a" : "b", {tool(), "all", "1", "10"}),
        std::vector<std::string>{"RANK=" + std::to_string(r), "WORLD_SIZE=2", "LOCAL_RANK=0",
                                 "LOCAL_WORLD_SIZE=1", "MUSTER_STORE_ADDR=" + (*line)[1],
                                 "MUSTER_STORE_NAMESPACE=loc/0", "MUSTER_JOB_ID=loc",
                                 "MUSTER_SHARED_DIR=" + local.string()}));
  }
  for (auto& r : ranks) {
    auto exit = r->wait(kRun);
    EXPECT_EQ(exit->code, 1);
    EXPECT_NE(r->stderrText().find("is not shared by every rank: rank 1 cannot see"),
              std::string::npos)
        << r->stderrText();
  }
}

}  // namespace
}  // namespace muster
