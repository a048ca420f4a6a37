// The shared directory over a real network file system: one network-namespace host serves a
// directory, the other mounts it with sshfs (FUSE over TCP across the hosts' bridge), so that
// caching, rename and unlink behave as on a network share and not as one local directory. And
// a worker stuck in that file system's kernel code, where SIGKILL cannot reach it.
// Needs root, iproute2, FUSE and sshfs; skips, saying why, where any is missing.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/support/child.h"
#include "tests/support/programs.h"
#include "tests/support/netns.h"
#include "tests/support/sshfs.h"

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
constexpr milliseconds kRun{240000};

std::string tool() { return buildDir() + "/tests/integration/channel_tool"; }

class NetworkFs : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::freshTestDir("muster-netfs");
    exported_ = dir_ / "export";
    mounted_ = dir_ / "mount";
    fs::create_directories(exported_);
    if (geteuid() != 0) GTEST_SKIP() << "network namespaces and FUSE mounts need root";
    if (!net_.create()) GTEST_SKIP() << "cannot create network namespaces here";
    mount_ = std::make_unique<testing::SshfsMount>(net_, 1, 2);
    if (!mount_->mount(exported_.string(), mounted_.string())) {
      std::string why = mount_->why();
      mount_.reset();
      GTEST_SKIP() << "no sshfs mount here: " << why;
    }
  }
  void TearDown() override {
    mount_.reset();  // before the hosts go
    net_.remove();
    fs::remove_all(dir_);
  }
  std::vector<std::string> in(int host, std::vector<std::string> argv) {
    std::vector<std::string> out{"/usr/bin/nsenter", "--net=" + net_.path(host), "--"};
    out.insert(out.end(), argv.begin(), argv.end());
    return out;
  }
  std::string script(const std::string& name, const std::string& body) {
    fs::path p = dir_ / name;
    std::ofstream(p) << "#!/bin/bash\n" << body;
    fs::permissions(p, fs::perms::owner_all);
    return p.string();
  }

  fs::path dir_, exported_, mounted_;
  testing::NetnsNetwork net_{"nf", 215};
  std::unique_ptr<testing::SshfsMount> mount_;
};

// Every channel operation between a rank on the serving host (its local directory) and a rank
// on the mounting host (through sshfs), and a 256 MiB tensor mapped through FUSE.
TEST_F(NetworkFs, ChannelOperationsBetweenTheServerAndTheMount) {
  Child daemon(in(1, {rendezvousdPath(), "--host", net_.address(1), "--port", "0"}));
  auto line = daemon.waitForLine(R"(listening on ([0-9.]+:\d+))", kRun);
  ASSERT_TRUE(line.has_value()) << daemon.stderrText();
  for (const std::vector<std::string>& mode : {std::vector<std::string>{"all"}, {"big", "256"}}) {
    std::string job = mode[0];
    std::vector<std::unique_ptr<Child>> ranks;
    for (int r = 0; r < 2; ++r) {
      std::vector<std::string> argv{tool()};
      argv.insert(argv.end(), mode.begin(), mode.end());
      ranks.push_back(std::make_unique<Child>(
          in(r + 1, argv),
          std::vector<std::string>{"RANK=" + std::to_string(r), "WORLD_SIZE=2", "LOCAL_RANK=0",
                                   "LOCAL_WORLD_SIZE=1", "GROUP_RANK=" + std::to_string(r), "GROUP_WORLD_SIZE=2",
                                   "MUSTER_STORE_ADDR=" + (*line)[1], "MUSTER_STORE_NAMESPACE=" + job + "/0",
                                   "MUSTER_JOB_ID=" + job,
                                   "MUSTER_SHARED_DIR=" + (r == 0 ? exported_ : mounted_).string()}));
    }
    for (auto& r : ranks) {
      auto exit = r->wait(kRun);
      ASSERT_TRUE(exit.has_value());
      EXPECT_EQ(exit->code, 0) << job << ": " << r->stdoutText() << r->stderrText();
    }
    // "big": rank 0 (local directory) sends, rank 1 receives through the mount.
    const Child& shows = *ranks[job == "all" ? 0 : 1];
    EXPECT_NE(shows.stdoutText().find(job == "all" ? "every operation ok" : "received 256 MiB intact"),
              std::string::npos)
        << shows.stdoutText();
  }
}

// A two-node job whose --shared_dir is the exported directory on node 0 and the sshfs mount
// on node 1: launch's probe sees one directory, the workers' self-check passes its channel
// round, and a successful job leaves nothing behind in it.
TEST_F(NetworkFs, ATwoNodeJobSharesTheMountedDirectory) {
  int port = freePort();
  auto node = [&](int rank, const fs::path& shared) {
    return std::make_unique<Child>(
        in(rank + 1, {launchPath(), "--nnodes=2", "--node_rank=" + std::to_string(rank), "--nproc_per_node=2",
                      "--master_addr=" + net_.address(1), "--master_port=" + std::to_string(port),
                      "--shared_dir", shared.string(), workerPath(), "--timeout=120"}),
        std::vector<std::string>{"OMP_NUM_THREADS=1"});
  };
  auto a = node(0, exported_);
  auto b = node(1, mounted_);
  auto ea = a->wait(kRun), eb = b->wait(kRun);
  ASSERT_TRUE(ea.has_value() && eb.has_value());
  EXPECT_EQ(ea->code, 0) << a->stdoutText() << a->stderrText();
  EXPECT_EQ(eb->code, 0) << b->stdoutText() << b->stderrText();
  EXPECT_NE(a->stdoutText().find("self-check passed: 4 rank(s), gloo"), std::string::npos) << a->stdoutText();
  EXPECT_NE(a->stdoutText().find("channel ok"), std::string::npos) << a->stdoutText();
  EXPECT_TRUE(fs::is_empty(exported_)) << "a successful job leaves nothing in the shared directory";
}

// A worker reading from a file server that stopped answering is stuck in the kernel: SIGKILL
// does not end it. launch once waited for it forever; now it says which process is stuck, in
// which state, and exits after --kill_timeout.
TEST_F(NetworkFs, AWorkerStuckInTheKernelIsReportedAndLaunchExitsWithoutIt) {
  std::ofstream(exported_ / "data") << "payload\n";
  std::string pid1 = (dir_ / "pid_1").string();
  // Rank 1 reads through the mount; rank 0 fails once rank 1 waits in FUSE's request code
  // and sshfs has taken the request: only then does a fatal signal leave it waiting
  // uninterruptibly (a request still queued in the kernel is abandoned, and cat dies). sshfs
  // takes it as soon as it runs, so the wait must have lasted a while (20 looks, 0.2 s or
  // more), not just begun.
  std::string body = "if [ \"$RANK\" = 1 ]; then echo $$ > " + pid1 + ".tmp; mv " + pid1 + ".tmp " + pid1 +
                     "; exec cat " + (mounted_ / "data").string() +
                     "; fi\n"
                     "seen=0\n"
                     "for i in $(seq 3000); do\n"
                     "  if [ -e " + pid1 + " ] && grep -q -E 'fuse|request_wait' /proc/$(cat " + pid1 +
                     ")/wchan 2>/dev/null; then seen=$((seen + 1)); else seen=0; fi\n"
                     "  [ $seen -ge 20 ] && exit 1\n"
                     "  sleep 0.01\n"
                     "done\nexit 3\n";
  std::string worker = script("stuck.sh", body);
  ASSERT_TRUE(mount_->stopServer());
  Child c({launchPath(), "--master_port=0", "--nproc_per_node=2", "--grace_period=0.5", "--kill_timeout=2", worker});
  auto exit = c.wait(kRun);
  mount_->resumeServer();
  ASSERT_TRUE(exit.has_value()) << "launch waited on a worker SIGKILL cannot end";
  EXPECT_EQ(exit->code, 1) << c.stderrText();
  std::string err = c.stderrText();
  EXPECT_NE(err.find("rank 1 (local_rank 1): its process"), std::string::npos) << err;
  EXPECT_NE(err.find("is still there after SIGKILL: D (disk sleep)"), std::string::npos) << err;
  EXPECT_NE(err.find("--kill_timeout"), std::string::npos) << err;
  EXPECT_NE(err.find("root cause: rank 0"), std::string::npos) << err;
}

}  // namespace
}  // namespace muster
