// The stack roll-call with real ranks: a hung PyTorch gloo job (1.13 on the host; 2.6 and 2.14
// under with_torch.sh), torchrun's file timer
// (against Debian's torchrun in the same test), a roll-call on demand of a job that runs on,
// C++ ranks through the worker library's handler, a stopped rank, and the OOM killer.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "tests/support/child.h"
#include "tests/support/programs.h"
#include "tests/support/netns.h"
#include "tests/support/torch_under_test.h"

namespace muster {
namespace {

using testing::buildDir;
using testing::ctlPath;
using testing::launchPath;
using testing::Child;
using testing::freePort;
namespace fs = std::filesystem;
using std::chrono::milliseconds;

constexpr milliseconds kRun{120000};

// The ranks' Python and its torchrun: the host's (Debian's PyTorch 1.13), or under
// tests/compat/with_torch.sh a Debian root's (torch 2.6 on Python 3.13, 2.14 on 3.14).
const std::string kPython = testing::torchUnderTest().python;

std::string stuckWorker() { return buildDir() + "/tests/integration/stuck_worker"; }
std::string source(const std::string& rel) { return (fs::path(testing::sourceDir()) / rel).string(); }
std::string hangScript() { return source("tests/integration/stacks/hang.py"); }

bool haveTorch() { return std::system((kPython + " -c 'import torch.distributed' 2>/dev/null").c_str()) == 0; }

std::vector<std::string> torchrun(std::vector<std::string> args) { return testing::torchrunArgv(std::move(args)); }

// The pids the ranks print ("rank R pid P ready"), by rank.
std::map<int, pid_t> readyRanks(Child& c, int n, milliseconds timeout) {
  std::map<int, pid_t> pids;
  for (int r = 0; r < n; ++r) {
    auto line = c.waitForLine("rank " + std::to_string(r) + " pid (\\d+) ready", timeout, false);
    if (!line) break;
    pids[r] = std::stoi((*line)[1]);
  }
  return pids;
}

// The report file launch's console output names ("every thread's stack: FILE"), read whole.
std::string wholeReport(const std::string& err) {
  std::smatch file;
  if (!std::regex_search(err, file, std::regex(R"(every thread's stack: (\S+stacks-1\.txt))"))) return "";
  std::ifstream in(file[1].str());
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

class Stacks : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::freshTestDir("muster-stacks"); }
  void TearDown() override { fs::remove_all(dir_); }

  std::vector<std::string> launch(std::vector<std::string> args) {
    std::vector<std::string> argv{launchPath(), "--master_port=0", "--log_dir=" + (dir_ / "logs").string()};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }
  // rendezvousctl stacks --pid PID: its exit code and output.
  std::pair<int, std::string> askForStacks(pid_t launchPid) {
    Child ctl({ctlPath(), "--timeout=30", "stacks", "--pid=" + std::to_string(launchPid)});
    auto exit = ctl.wait(milliseconds(60000));
    if (!exit) return {-1, "rendezvousctl timed out"};
    return {exit->code, ctl.stdoutText() + ctl.stderrText()};
  }
  fs::path dir_;
};

TEST_F(Stacks, AHungGlooJobEndsWithTheStuckRankAndTheOthersInAllReduce) {
  if (!haveTorch()) GTEST_SKIP() << "no PyTorch under " << kPython;
  auto started = std::chrono::steady_clock::now();
  // No output counts as no progress from the start: under load (ctest -j4 on 2 cores) three
  // ranks importing torch and forming the group took over 5 s, and the hang was called before
  // rank 1 got stuck. 15 s covers their start; the hang itself is called 15 s after "ready".
  Child c(launch({"--nproc_per_node=3", "--hang_timeout=15", "--no_python", kPython, hangScript()}),
          {"OMP_NUM_THREADS=1"});
  auto exit = c.wait(kRun);
  ASSERT_TRUE(exit.has_value());
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::string err = c.stderrText();
  EXPECT_EQ(exit->code, 1) << err;
  EXPECT_LT(secs, 60) << err;
  EXPECT_NE(err.find("no rank showed progress for 15 s (--hang_timeout)"), std::string::npos) << err;
  // The odd one out first, then the others in all_reduce.
  std::smatch stuck, others;
  ASSERT_TRUE(std::regex_search(err, stuck, std::regex(R"(  rank 1: stuck_in_loader \(hang\.py:\d+\) <- train_step \(hang\.py:\d+\))")))
      << err;
  // torch 2.x calls all_reduce through its logging decorator.
  ASSERT_TRUE(std::regex_search(err, others, std::regex(R"(  ranks 0,2: all_reduce \(distributed_c10d\.py:\d+\) <- (wrapper \(c10d_logger\.py:\d+\) <- )?train_step \(hang\.py:\d+\))")))
      << err;
  EXPECT_LT(stuck.position(0), others.position(0));
  EXPECT_NE(err.find("launch: root cause: the job hung:"), std::string::npos) << err;
  // The whole report is in the run directory.
  std::string report = wholeReport(err);
  EXPECT_NE(report.find("every thread of rank 1:"), std::string::npos) << report;
  EXPECT_NE(report.find("hang.py"), std::string::npos) << report;
  // Each rank's own answer is in its log folder, copied there once its stacks were taken (the
  // file the rank writes into lives in launch's runtime folder, gone with launch).
  int copies = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir_ / "logs")) {
    if (e.path().filename() != "stacks.txt") continue;
    ++copies;
    std::ifstream in(e.path());
    std::string text((std::istreambuf_iterator<char>(in)), {});
    EXPECT_NE(text.find("hang.py"), std::string::npos) << e.path() << ":\n" << text;
    EXPECT_TRUE(std::regex_search(e.path().string(), std::regex(R"(/attempt_0/[012]/stacks\.txt$)"))) << e.path();
  }
  EXPECT_EQ(copies, 3);
}

TEST_F(Stacks, AnExpiredFileTimerKillsTheWorkerAsUnderTorchrunAndIsNamed) {
  if (!haveTorch()) GTEST_SKIP() << "no PyTorch under " << kPython;
  std::vector<std::string> env{"OMP_NUM_THREADS=1", "TORCHELASTIC_ENABLE_FILE_TIMER=1", "TIMER_SCOPE=load_batch"};
  // The reference: torchrun kills rank 1 when its 1 s timer expires. torchrun 2.14 then kills
  // itself with the same signal (its FileTimerServer's "Terminating the server process"),
  // leaving the other ranks, which this test's folder names, to be killed here.
  Child theirs(torchrun({"--nproc_per_node=3", "--master_port=" + std::to_string(freePort()), hangScript(),
                         dir_.string()}),
               env);
  auto theirExit = theirs.wait(kRun);
  ASSERT_TRUE(theirExit.has_value());
  std::string theirErr = theirs.stderrText();
  if (theirExit->signal == SIGKILL) {
    std::system(("pkill -KILL -f " + dir_.string()).c_str());
  } else {
    EXPECT_NE(theirExit->code, 0);
    EXPECT_TRUE(std::regex_search(theirErr, std::regex(R"(rank\s*: 1 \(local_rank: 1\)\s*\n\s*exitcode\s*: -9)")))
        << theirErr;
  }

  env.push_back("PYTHON_EXEC=" + kPython);
  Child ours(launch({"--nproc_per_node=3", hangScript()}), env);
  auto ourExit = ours.wait(kRun);
  ASSERT_TRUE(ourExit.has_value());
  std::string err = ours.stderrText();
  EXPECT_EQ(ourExit->code, 1) << err;
  EXPECT_TRUE(std::regex_search(err, std::regex(R"(rank\s*: 1 \(local_rank: 1\)\s*\n\s*exitcode\s*: -9)"))) << err;
  // Beyond torchrun: the scope, and the rank's stack at expiry.
  EXPECT_NE(err.find("launch: root cause: rank 1 (local_rank 1, pid"), std::string::npos) << err;
  EXPECT_NE(err.find("was killed by SIGKILL: its file timer 'load_batch' expired"), std::string::npos) << err;
  EXPECT_TRUE(std::regex_search(err, std::regex(R"(stack roll-call \(rank 1's file timer 'load_batch' expired\)[^\n]*\n  rank 1: stuck_in_loader \(hang\.py:\d+\))")))
      << err;}

TEST_F(Stacks, ARollCallOnDemandLeavesTheJobRunning) {
  if (!haveTorch()) GTEST_SKIP() << "no PyTorch under " << kPython;
  std::string go = (dir_ / "go").string();
  Child c(launch({"--nproc_per_node=3", "--no_python", kPython, hangScript()}),
          {"OMP_NUM_THREADS=1", "EXIT_WHEN=" + go});
  ASSERT_EQ(readyRanks(c, 3, kRun).size(), 3u) << c.stderrText();
  std::this_thread::sleep_for(milliseconds(1000));  // from "ready" into all_reduce
  auto [code, out] = askForStacks(c.pid());
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(  rank 1: stuck_in_loader \(hang\.py:\d+\))"))) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(  ranks 0,2: all_reduce \(distributed_c10d\.py:\d+\))"))) << out;
  EXPECT_NE(out.find("every thread of rank 0:"), std::string::npos) << out;
  // The job goes on and succeeds.
  std::ofstream(go) << "";
  auto exit = c.wait(kRun);
  ASSERT_TRUE(exit.has_value()) << c.stdoutText() << c.stderrText();
  EXPECT_EQ(exit->code, 0) << c.stderrText();
}

TEST_F(Stacks, CxxRanksShowTheirFunctionsThroughTheWorkerLibrary) {
  Child c(launch({"--nproc_per_node=3", "--hang_timeout=3", "--no_python", stuckWorker(), "1"}));
  auto exit = c.wait(kRun);
  ASSERT_TRUE(exit.has_value());
  std::string err = c.stderrText();
  EXPECT_EQ(exit->code, 1) << err;
  std::smatch stuck, others;
  ASSERT_TRUE(std::regex_search(err, stuck, std::regex(R"(  rank 1: [^\n]*stuck_in_native_loader\(\) \(stuck_worker\) <- main \(stuck_worker\))")))
      << err;
  ASSERT_TRUE(std::regex_search(err, others, std::regex(R"(  ranks 0,2: [^\n]*wait_for_the_others\(\) \(stuck_worker\) <- main)")))
      << err;
  EXPECT_LT(stuck.position(0), others.position(0));
  // Every thread: the helper's too.
  std::string report = wholeReport(err);
  EXPECT_NE(report.find("helper_thread_loop()"), std::string::npos) << report;
  EXPECT_NE(report.find(", native)"), std::string::npos) << report;
}

TEST_F(Stacks, WhenARankFailsTheSurvivorsStacksAreTakenBeforeTheyAreStopped) {
  Child c(launch({"--nproc_per_node=3", "--no_python", stuckWorker(), "-1"}), {"FAIL_RANK=1"});
  auto exit = c.wait(kRun);
  ASSERT_TRUE(exit.has_value());
  std::string err = c.stderrText();
  EXPECT_EQ(exit->code, 1) << err;
  EXPECT_TRUE(std::regex_search(err, std::regex(R"(stack roll-call \(rank 1 exited with code 3; the others before they are stopped\): 2 rank\(s\)[^\n]*\n  ranks 0,2: [^\n]*wait_for_the_others\(\))")))
      << err;
  EXPECT_NE(err.find("launch: root cause: rank 1 (local_rank 1, pid"), std::string::npos) << err;
}

TEST_F(Stacks, AStoppedRankIsReportedAsNotAnsweringWithinTheDeadline) {
  std::string go = (dir_ / "go").string();
  Child c(launch({"--nproc_per_node=2", "--stacks_timeout=1", "--no_python", stuckWorker(), "-1", go}));
  auto pids = readyRanks(c, 2, kRun);
  ASSERT_EQ(pids.size(), 2u) << c.stderrText();
  std::this_thread::sleep_for(milliseconds(300));  // from "ready" into wait_for_the_others()
  kill(pids[1], SIGSTOP);
  auto asked = std::chrono::steady_clock::now();
  auto [code, out] = askForStacks(c.pid());
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - asked).count();
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("rank 1: did not answer within the deadline: T (stopped)"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 0: wait_for_the_others()"), std::string::npos) << out;
  EXPECT_LT(secs, 10) << out;
  kill(pids[1], SIGCONT);
  std::ofstream(go) << "";
  auto exit = c.wait(kRun);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->code, 0) << c.stderrText();
}

TEST_F(Stacks, TheHookLeavesTheProgramsOwnSitecustomizeAndPathAsTheyWere) {
  fs::create_directories(dir_ / "site");
  std::ofstream(dir_ / "site" / "sitecustomize.py") << "MARK = \"the user's own\"\n";
  std::string go = (dir_ / "go").string();
  Child c(launch({"--nproc_per_node=1", "--no_python", kPython, "-c",
                  "import os, sys, sitecustomize; print('mark', sitecustomize.MARK, '|', os.environ.get('PYTHONPATH'), '|', "
                  "sys.path[1], '|', 'MUSTER_STACKS_FILE' in os.environ, flush=True)"}),
          {"PYTHONPATH=" + (dir_ / "site").string()});
  auto exit = c.wait(kRun);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->code, 0) << c.stderrText();
  std::string site = (dir_ / "site").string();
  EXPECT_NE(c.stdoutText().find("mark the user's own | " + site + " | " + site + " | False"), std::string::npos)
      << c.stdoutText() << c.stderrText();
}

TEST_F(Stacks, ARankThatExecsAwayFromItsHandlerIsNotSignalled) {
  // The hook installs faulthandler and writes its ready line; then the process becomes sleep,
  // same pid, no handler: the roll-call's signal would kill it.
  Child c(launch({"--nproc_per_node=1", "--no_python", kPython, "-c",
                  "import os; print('rank 0 pid %d ready' % os.getpid(), flush=True); "
                  "os.execv('/bin/sleep', ['sleep', '60'])"}));
  auto pids = readyRanks(c, 1, kRun);
  ASSERT_EQ(pids.size(), 1u) << c.stderrText();
  // Until the exec has happened.
  auto comm = [&] {
    std::ifstream in("/proc/" + std::to_string(pids[0]) + "/comm");
    std::string name;
    in >> name;
    return name;
  };
  for (int i = 0; i < 500 && comm() != "sleep"; ++i) std::this_thread::sleep_for(milliseconds(20));
  ASSERT_EQ(comm(), "sleep");
  auto [code, out] = askForStacks(c.pid());
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("rank 0: no stacks: it installed no handler"), std::string::npos) << out;
  std::this_thread::sleep_for(milliseconds(300));
  std::ifstream stat("/proc/" + std::to_string(pids[0]) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), {});
  EXPECT_NE(text.find("(sleep) S"), std::string::npos) << "the rank is gone: " << text;
  c.kill(SIGTERM);
  auto exit = c.wait(kRun);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->code, 128 + SIGTERM) << c.stderrText();
}

TEST_F(Stacks, WithoutARunningLaunchRendezvousctlSaysSo) {
  Child ctl({ctlPath(), "--timeout=5", "stacks", "--pid=999999"});
  auto exit = ctl.wait(milliseconds(30000));
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->code, 1);
  EXPECT_NE(ctl.stderrText().find("no launch with pid 999999 answers on this host"), std::string::npos)
      << ctl.stderrText();
}

// Two hosts (network namespaces), one run: `rendezvousctl stacks --run` asks every node
// through the rendezvous, and one report holds both nodes' ranks.
TEST_F(Stacks, OneRollCallThroughTheRendezvousCoversTwoNodes) {
  if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  testing::NetnsNetwork net("sk", 215);
  if (!net.create()) GTEST_SKIP() << "cannot create network namespaces here";
  std::string endpoint = net.address(1) + ":" + std::to_string(freePort());
  std::string go = (dir_ / "go").string();
  auto node = [&](int h) {
    return std::make_unique<Child>(std::vector<std::string>{
        "/usr/bin/nsenter", "--net=" + net.path(h), "--", launchPath(), "--nnodes=2", "--nproc_per_node=2",
        "--rdzv_backend=c10d", "--rdzv_endpoint=" + endpoint, "--rdzv_id=stk",
        "--rdzv_conf=keep_alive_interval=1,is_host=" + std::string(h == 1 ? "1" : "0"), "--log_dir=" + (dir_ / ("logs" + std::to_string(h))).string(),
        "--no_python", stuckWorker(), "2", go});
  };
  auto a = node(1);
  auto b = node(2);
  // Each node prints its own ranks' ready lines; together, all four.
  ASSERT_TRUE(testing::awaitReadyLines({a.get(), b.get()}, 4, milliseconds(30000))) << a->stderrText() << b->stderrText();
  std::this_thread::sleep_for(milliseconds(300));  // from "ready" into their functions
  Child ctl({"/usr/bin/nsenter", "--net=" + net.path(2), "--", ctlPath(), "--addr=" + endpoint, "--timeout=20",
             "stacks", "--run=stk"});
  auto exit = ctl.wait(milliseconds(60000));
  ASSERT_TRUE(exit.has_value());
  std::string out = ctl.stdoutText() + ctl.stderrText();
  EXPECT_EQ(exit->code, 0) << out;
  EXPECT_NE(out.find("4 rank(s) on 2 node(s)"), std::string::npos) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(  rank 2: [^\n]*stuck_in_native_loader\(\))"))) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(  ranks 0,1,3: [^\n]*wait_for_the_others\(\))"))) << out;
  EXPECT_NE(out.find("host " + net.address(1)), std::string::npos) << out;
  EXPECT_NE(out.find("host " + net.address(2)), std::string::npos) << out;
  // The job runs on, and ends well.
  std::ofstream(go) << "";
  auto ea = a->wait(kRun), eb = b->wait(kRun);
  ASSERT_TRUE(ea.has_value() && eb.has_value());
  EXPECT_EQ(ea->code, 0) << a->stderrText();
  EXPECT_EQ(eb->code, 0) << b->stderrText();
  net.remove();
}

// A memory cgroup made for the test (v2 where the memory controller is there, else v1),
// removed with it.
class MemoryCgroup {
 public:
  explicit MemoryCgroup(size_t limitBytes) {
    std::ifstream controllers("/sys/fs/cgroup/cgroup.controllers");
    std::string list((std::istreambuf_iterator<char>(controllers)), {});
    std::string name = "muster-oom-" + std::to_string(getpid());
    if (list.find("memory") != std::string::npos) {
      path_ = "/sys/fs/cgroup/" + name;
      rmdir(path_.c_str());  // a killed test's of the same pid, empty since its processes died
      if (!fs::create_directory(path_, ec_)) return;
      ok_ = write("memory.max", limitBytes);
      write("memory.swap.max", 0);
    } else if (fs::exists("/sys/fs/cgroup/memory/memory.limit_in_bytes")) {
      path_ = "/sys/fs/cgroup/memory/" + name;
      rmdir(path_.c_str());  // a killed test's of the same pid, empty since its processes died
      if (!fs::create_directory(path_, ec_)) return;
      ok_ = write("memory.limit_in_bytes", limitBytes);
      write("memory.memsw.limit_in_bytes", limitBytes);
    }
  }
  ~MemoryCgroup() {
    if (path_.empty()) return;
    for (int i = 0; i < 100 && rmdir(path_.c_str()) != 0 && errno == EBUSY; ++i) usleep(50000);
  }
  bool ok() const { return ok_; }
  std::string procs() const { return path_ + "/cgroup.procs"; }

 private:
  bool write(const std::string& file, size_t value) {
    std::ofstream out(path_ + "/" + file);
    out << value;
    out.flush();
    return out.good();
  }
  std::string path_;
  std::error_code ec_;
  bool ok_ = false;
};

TEST_F(Stacks, AWorkerTheOomKillerEndsIsReportedAsSuch) {
  if (geteuid() != 0) GTEST_SKIP() << "making a memory cgroup needs root";
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // launch's own memory under ASan (shadow, quarantine) is about 160 MiB, under TSan (shadow)
  // about 140 MiB: the worker must still be what grows past the limit, not launch.
  MemoryCgroup cgroup(640u << 20);
#else
  MemoryCgroup cgroup(160u << 20);
#endif
  if (!cgroup.ok()) GTEST_SKIP() << "no memory cgroup can be made here";
  // launch runs in the small cgroup; its worker allocates past it.
  std::string argv;
  for (const auto& a : launch({"--nproc_per_node=1", "--no_python", "/bin/bash", "-c",
                               "exec python3 -c 'b = []\nwhile True: b.append(b\"x\" * (16 << 20))'"})) {
    argv += "'" + std::regex_replace(a, std::regex("'"), "'\\''") + "' ";
  }
  Child c({"/bin/bash", "-c", "echo $$ > " + cgroup.procs() + " && exec " + argv});
  auto exit = c.wait(kRun);
  ASSERT_TRUE(exit.has_value());
  std::string err = c.stderrText();
  EXPECT_EQ(exit->code, 1) << err;
  EXPECT_NE(err.find("was killed by SIGKILL: the kernel's OOM killer"), std::string::npos) << err;
}

}  // namespace
}  // namespace muster
