// launch as a real process running real workers: environment, failures and their report,
// signals, the orphan guard, restarts, logs, and the store reachable from the workers.
// Over 700 lines on purpose: one case per behaviour of one program, each short and alone; the
// helpers they share are in tests/support/, and splitting by line count would scatter them.
#include <gtest/gtest.h>
#include <algorithm>
#include <cstring>
#include <fcntl.h>
#include <sys/mount.h>
#include <spawn.h>
#include <nlohmann/json.hpp>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <thread>

#include "tests/support/child.h"
#include "tests/support/programs.h"

namespace muster {
namespace {

using testing::ctlPath;
using testing::launchPath;
using testing::Child;
using testing::freePort;
namespace fs = std::filesystem;
using std::chrono::milliseconds;

constexpr milliseconds kRun{30000};


bool processExists(pid_t pid) {
  // A zombie has exited: it counts as gone.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return false;
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  auto close = text.rfind(')');
  return close != std::string::npos && text.size() > close + 2 && text[close + 2] != 'Z';
}

// Bounded wait for processes to disappear (they die asynchronously to the test).
bool allGone(const std::vector<pid_t>& pids, milliseconds timeout = milliseconds(5000)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    bool any = false;
    for (pid_t p : pids) any = any || processExists(p);
    if (!any) return true;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return false;
}

class LaunchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = muster::testing::freshTestDir("muster-launch");
    port_ = freePort();
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string script(const std::string& name, const std::string& body) {
    fs::path p = dir_ / name;
    std::ofstream(p) << "#!/bin/bash\n" << body;
    chmod(p.c_str(), 0755);
    return p.string();
  }
  std::vector<std::string> launch(std::vector<std::string> args) {
    std::vector<std::string> argv{launchPath(), "--master_port=" + std::to_string(port_)};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }
  std::string read(const std::string& name) {
    std::ifstream in(dir_ / name);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  std::map<std::string, std::string> envOf(const std::string& file) {
    std::map<std::string, std::string> env;
    std::ifstream in(dir_ / file);
    for (std::string line; std::getline(in, line);) {
      auto eq = line.find('=');
      if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
    }
    return env;
  }
  std::vector<pid_t> pidsIn(const std::string& prefix, int n) {
    std::vector<pid_t> pids;
    for (int r = 0; r < n; ++r) {
      std::string text = read(prefix + std::to_string(r));
      std::istringstream in(text);
      for (pid_t p; in >> p;) pids.push_back(p);
    }
    return pids;
  }
  // Waits until each rank has written its ready file.
  bool awaitFiles(const std::string& prefix, int n, milliseconds timeout = kRun) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      int have = 0;
      for (int r = 0; r < n; ++r) have += fs::exists(dir_ / (prefix + std::to_string(r))) ? 1 : 0;
      if (have == n) return true;
      std::this_thread::sleep_for(milliseconds(5));
    }
    return false;
  }

  fs::path dir_;
  int port_ = 0;
};

TEST_F(LaunchTest, EveryRankGetsTorchrunsVariables) {
  std::string dump = script("dump.sh", "env > " + (dir_ / "env_").string() + "$RANK\n");
  Child c(launch({"--nproc_per_node=3", "--max_restarts=2", "--role=trainer", dump}),
          {"OMP_NUM_THREADS="});
  auto exit = c.wait(kRun);
  ASSERT_TRUE(exit.has_value());
  ASSERT_EQ(exit->code, 0) << c.stderrText();
  std::set<std::string> errorFiles;
  for (int r = 0; r < 3; ++r) {
    auto env = envOf("env_" + std::to_string(r));
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(r));
    EXPECT_EQ(env["RANK"], std::to_string(r));
    EXPECT_EQ(env["GROUP_RANK"], "0");
    EXPECT_EQ(env["ROLE_RANK"], std::to_string(r));
    EXPECT_EQ(env["ROLE_NAME"], "trainer");
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "3");
    EXPECT_EQ(env["WORLD_SIZE"], "3");
    EXPECT_EQ(env["GROUP_WORLD_SIZE"], "1");
    EXPECT_EQ(env["ROLE_WORLD_SIZE"], "3");
    EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(env["MASTER_PORT"], std::to_string(port_));
    EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "0");
    EXPECT_EQ(env["TORCHELASTIC_MAX_RESTARTS"], "2");
    EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], "none");
    EXPECT_EQ(env["TORCHELASTIC_USE_AGENT_STORE"], "True");
    // As torchrun 2.14 (--torchrun_version's default): the new name only, and the signals.
    EXPECT_EQ(env.count("NCCL_ASYNC_ERROR_HANDLING"), 0u);
    EXPECT_EQ(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1");
    EXPECT_EQ(env["TORCHELASTIC_SIGNALS_TO_HANDLE"], "SIGTERM,SIGINT,SIGHUP,SIGQUIT");
    // OMP_NUM_THREADS was set but empty here: torchrun only fills it in when it is unset.
    EXPECT_EQ(env["OMP_NUM_THREADS"], "");
    EXPECT_TRUE(std::regex_match(env["TORCHELASTIC_ERROR_FILE"],
                                 std::regex(".*/none_[^/]+/attempt_0/" + std::to_string(r) +
                                            "/error.json")))
        << env["TORCHELASTIC_ERROR_FILE"];
    errorFiles.insert(env["TORCHELASTIC_ERROR_FILE"]);
    EXPECT_TRUE(std::regex_match(env["MUSTER_STORE_ADDR"], std::regex(R"(127\.0\.0\.1:\d+)")));
    EXPECT_EQ(env["MUSTER_STORE_NAMESPACE"], "none/0");
    EXPECT_FALSE(env["MUSTER_STORE_TOKEN_FILE"].empty());
    EXPECT_FALSE(env["MUSTER_SHARED_DIR"].empty());
  }
  EXPECT_EQ(errorFiles.size(), 3u);
}

TEST_F(LaunchTest, OmpNumThreadsIsOneOnlyWhenUnsetAndNprocAboveOne) {
  std::string dump = script("dump.sh", "env > " + (dir_ / "env_").string() + "$RANK\n");
  std::vector<std::string> argv = launch({"--nproc_per_node=2", dump});
  std::vector<std::string> envArgs;
  // The child inherits the test's environment; make sure OMP_NUM_THREADS is unset there.
  unsetenv("OMP_NUM_THREADS");
  Child c(argv);
  ASSERT_EQ(c.wait(kRun)->code, 0) << c.stderrText();
  EXPECT_EQ(envOf("env_0")["OMP_NUM_THREADS"], "1");
  EXPECT_NE(c.stderrText().find("Setting OMP_NUM_THREADS environment variable"),
            std::string::npos);
  Child single(launch({"--nproc_per_node=1", dump}));
  ASSERT_EQ(single.wait(kRun)->code, 0);
  EXPECT_EQ(envOf("env_0").count("OMP_NUM_THREADS"), 0u);
}

TEST_F(LaunchTest, ProgramArgumentsArriveUntouched) {
  std::string args = script("args.sh", "printf '%s\\n' \"$@\" > " + (dir_ / "args_").string() +
                                           "$LOCAL_RANK\n");
  Child c(launch({"--nproc_per_node=2", args, "--nproc_per_node=9", "-m", "x y",
                  "rank=${local_rank}"}));
  ASSERT_EQ(c.wait(kRun)->code, 0) << c.stderrText();
  EXPECT_EQ(read("args_1"), "--nproc_per_node=9\n-m\nx y\nrank=1\n");
}

TEST_F(LaunchTest, FailingRankStopsTheOthersAndIsNamedAsRootCause) {
  // Pid files are written under a temporary name and renamed, so that rank 1 never fails
  // before the others' files are whole. Ranks 0 and 2 record their sleep's pid too: it must be
  // gone with them (a search by name would also see other tests' processes).
  std::string pid = (dir_ / "pid_").string() + "$RANK";
  std::string body =
      "if [ \"$RANK\" = 1 ]; then\n"
      "  echo $$ > " + pid + ".tmp && mv " + pid + ".tmp " + pid + "\n"
      "  while [ ! -e " + (dir_ / "pid_0").string() + " ] || [ ! -e " + (dir_ / "pid_2").string() +
      " ]; do sleep 0.01; done\n"
      "  echo 'loading shard 7' >&2; echo 'RuntimeError: shard 7 is corrupt' >&2; exit 3\n"
      "fi\n"
      "sleep 60 & echo $$ $! > " + pid + ".tmp && mv " + pid + ".tmp " + pid + "\n"
      "wait\n";
  Child c(launch({"--nproc_per_node=3", script("w.sh", body)}));
  auto exit = c.wait(kRun);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->code, 1);
  std::string err = c.stderrText();
  std::vector<pid_t> failed;
  std::istringstream rank1(read("pid_1"));
  for (pid_t p; rank1 >> p;) failed.push_back(p);
  ASSERT_EQ(failed.size(), 1u);
  auto pids = pidsIn("pid_", 3);
  ASSERT_EQ(pids.size(), 5u) << "ranks 0 and 2: shell and sleep; rank 1: shell";
  EXPECT_NE(err.find("launch: root cause: rank 1 (local_rank 1, pid " + std::to_string(failed[0]) +
                     ") exited with code 3"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("    RuntimeError: shard 7 is corrupt"), std::string::npos) << err;
  EXPECT_NE(err.find("FAILED"), std::string::npos);
  EXPECT_NE(err.find("exitcode  : 3 (pid: " + std::to_string(failed[0]) + ")"), std::string::npos);
  EXPECT_NE(err.find("<NO_OTHER_FAILURES>"), std::string::npos) << err;
  // The root cause comes before the table.
  EXPECT_LT(err.find("root cause"), err.find("Root Cause (first observed failure)"));
  // Nothing of the others is left, their sleeps included.
  EXPECT_TRUE(allGone(pids));
}

TEST_F(LaunchTest, SignalDeathIsReportedByName) {
  Child c(launch({"--nproc_per_node=2",
                  script("segv.sh", "[ \"$RANK\" = 0 ] && kill -SEGV $$; sleep 60 & wait\n")}));
  auto exit = c.wait(kRun);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->code, 1);
  EXPECT_NE(c.stderrText().find("rank 0 (local_rank 0, pid"), std::string::npos);
  EXPECT_NE(c.stderrText().find("was killed by SIGSEGV"), std::string::npos) << c.stderrText();
  // torchrun 2.14's summary line: the signal after the pid.
  EXPECT_TRUE(std::regex_search(c.stderrText(), std::regex(R"(exitcode  : -11 \(pid: \d+\)  \(SIGSEGV\))")))
      << c.stderrText();
}

TEST_F(LaunchTest, TorchrunErrorFileIsShownInTheReport) {
  std::string body =
      "cat > \"$TORCHELASTIC_ERROR_FILE\" <<'JSON'\n"
      "{\"message\": {\"message\": \"ValueError: bad lr\", \"extraInfo\": {\"py_callstack\": "
      "\"Traceback (most recent call last):\\n  File \\\"train.py\\\", line 3\\nValueError: bad "
      "lr\", \"timestamp\": \"1700000000\"}}}\n"
      "JSON\n"
      "exit 1\n";
  Child c(launch({"--nproc_per_node=1", script("err.sh", body)}));
  ASSERT_EQ(c.wait(kRun)->code, 1);
  std::string err = c.stderrText();
  EXPECT_NE(err.find("error file "), std::string::npos) << err;
  EXPECT_NE(err.find("ValueError: bad lr"), std::string::npos) << err;
  EXPECT_NE(err.find("File \"train.py\", line 3"), std::string::npos) << err;
}

TEST_F(LaunchTest, KillMinusNineOfLaunchLeavesNoWorkerOrGrandchild) {
  // Written under a temporary name and renamed: once the file exists, both pids are in it.
  std::string pid = (dir_ / "pid_").string() + "$RANK";
  std::string body = "sleep 300 & echo $$ $! > " + pid + ".tmp && mv " + pid + ".tmp " + pid + "\nwait\n";
  Child c(launch({"--nproc_per_node=3", script("tree.sh", body)}));
  ASSERT_TRUE(awaitFiles("pid_", 3));
  auto pids = pidsIn("pid_", 3);
  ASSERT_EQ(pids.size(), 6u);
  for (pid_t p : pids) EXPECT_TRUE(processExists(p));
  c.kill(SIGKILL);
  ASSERT_TRUE(c.wait(kRun).has_value());
  EXPECT_TRUE(allGone(pids)) << "workers or their children outlived launch";
}

// The log folder holds what torchrun's does and nothing of launch's own: a log folder is
// copied into bug reports and buckets, and the store's token must never be in one. launch's
// files (the token, the Python hook, the ranks' stack files) are in a private runtime folder
// that goes with launch.
TEST_F(LaunchTest, TheLogFolderHoldsOnlyTheRanksLogsAndNoSecret) {
  std::string body = "echo \"out $RANK\"; echo \"err $RANK\" >&2\n"
                     "cp \"$MUSTER_STORE_TOKEN_FILE\" " + (dir_ / "token_").string() + "$RANK\n"
                     "echo \"$MUSTER_STORE_TOKEN_FILE\" > " + (dir_ / "where_").string() + "$RANK\n"
                     "stat -c %a \"$(dirname \"$MUSTER_STORE_TOKEN_FILE\")\" > " + (dir_ / "mode_").string() + "$RANK\n";
  std::string logs = (dir_ / "logs").string();
  Child c(launch({"--nproc_per_node=2", "--log_dir", logs, "--redirects=3", script("talk.sh", body)}));
  ASSERT_EQ(c.wait(kRun)->code, 0) << c.stderrText();
  std::string token = read("token_0");
  ASSERT_EQ(token.size(), 32u) << "a job's token: 16 random bytes in hex";
  std::string tokenFile = read("where_0");
  tokenFile.erase(tokenFile.find_last_not_of('\n') + 1);
  EXPECT_EQ(tokenFile.rfind(logs, 0), std::string::npos) << tokenFile << " is under the log folder";
  EXPECT_EQ(read("mode_0"), "700\n") << "launch's runtime folder is for its own user only";
  EXPECT_FALSE(fs::exists(fs::path(tokenFile).parent_path())) << "launch's runtime folder outlived it";
  std::set<std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(logs)) {
    std::string rel = fs::relative(e.path(), logs).string();
    files.insert(std::regex_replace(rel, std::regex("^none_[A-Za-z0-9]+"), "RUN") + (e.is_directory() ? "/" : ""));
    if (!e.is_regular_file()) continue;
    std::ifstream in(e.path());
    std::string text((std::istreambuf_iterator<char>(in)), {});
    EXPECT_EQ(text.find(token), std::string::npos) << "the store's token is in " << e.path();
  }
  std::set<std::string> torchruns{"RUN/", "RUN/attempt_0/", "RUN/attempt_0/0/", "RUN/attempt_0/1/",
                                  "RUN/attempt_0/0/stdout.log", "RUN/attempt_0/0/stderr.log",
                                  "RUN/attempt_0/1/stdout.log", "RUN/attempt_0/1/stderr.log"};
  EXPECT_EQ(files, torchruns);
}

TEST_F(LaunchTest, KillMinusNineOfLaunchRemovesItsRuntimeFolder) {
  std::string where = (dir_ / "where_").string() + "$RANK";
  std::string body = "echo \"$MUSTER_SHARED_DIR\" > " + (dir_ / "shared_").string() + "$RANK\n"
                     "echo \"$MUSTER_STORE_TOKEN_FILE\" > " + where + ".tmp && mv " + where + ".tmp " + where +
                     "\nexec sleep 300\n";
  Child c(launch({"--nproc_per_node=2", script("wait.sh", body)}));
  ASSERT_TRUE(awaitFiles("where_", 2));
  std::string tokenFile = read("where_0");
  tokenFile.erase(tokenFile.find_last_not_of('\n') + 1);
  fs::path runtime = fs::path(tokenFile).parent_path();
  ASSERT_TRUE(fs::exists(runtime / "store.token")) << runtime;
  c.kill(SIGKILL);
  ASSERT_TRUE(c.wait(kRun).has_value());
  // The orphan guard kills the workers, then removes the folder.
  auto deadline = std::chrono::steady_clock::now() + milliseconds(10000);
  while (fs::exists(runtime) && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(milliseconds(10));
  EXPECT_FALSE(fs::exists(runtime)) << runtime << " outlived launch's SIGKILL";
  // The job's temporary shared directory (no --shared_dir) was in it.
  std::string shared = read("shared_0");
  shared.erase(shared.find_last_not_of('\n') + 1);
  EXPECT_EQ(fs::path(shared).parent_path(), runtime);
  EXPECT_FALSE(fs::exists(shared)) << shared << " outlived launch's SIGKILL";
}

TEST_F(LaunchTest, SigtermIsForwardedAndLaunchExitsNonZero) {
  std::string body = "trap 'echo got-term > " + (dir_ / "term_").string() +
                     "$RANK; exit 0' TERM\necho ready > " + (dir_ / "ready_").string() +
                     "$RANK\nwhile true; do sleep 0.01; done\n";
  Child c(launch({"--nproc_per_node=2", script("trap.sh", body)}));
  ASSERT_TRUE(awaitFiles("ready_", 2));
  c.kill(SIGTERM);
  auto exit = c.wait(kRun);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->code, 128 + SIGTERM);
  EXPECT_EQ(read("term_0"), "got-term\n");
  EXPECT_EQ(read("term_1"), "got-term\n");
  EXPECT_NE(c.stderrText().find("launch got SIGTERM; forwarding it to the workers"),
            std::string::npos);
}

TEST_F(LaunchTest, OtherSignalsAreForwardedToo) {
  for (int sig : {SIGINT, SIGHUP, SIGQUIT}) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::string body = "trap 'echo got > " + (dir_ / "sig_").string() + "$RANK; exit 0' " +
                       std::to_string(sig) + "\necho ready > " + (dir_ / "ready_").string() +
                       "$RANK\nwhile true; do sleep 0.01; done\n";
    Child c(launch({"--nproc_per_node=2", script("trap.sh", body)}));
    ASSERT_TRUE(awaitFiles("ready_", 2));
    c.kill(sig);
    auto exit = c.wait(kRun);
    ASSERT_TRUE(exit.has_value());
    EXPECT_EQ(exit->code, 128 + sig);
    EXPECT_EQ(read("sig_0"), "got\n") << "signal " << sig;
    EXPECT_EQ(read("sig_1"), "got\n") << "signal " << sig;
  }
}

TEST_F(LaunchTest, Usr1AndUsr2AreNoticesPassedOnWithoutStopping) {
  // Slurm's --signal=USR1@T before preemption: each worker notes the notices it gets and
  // exits 0 after the second kind; launch neither stops nor dies of them.
  std::string body = "trap 'echo usr1 >> " + (dir_ / "sig_").string() +
                     "$RANK' USR1\ntrap 'echo usr2 >> " + (dir_ / "sig_").string() +
                     "$RANK; exit 0' USR2\necho ready > " + (dir_ / "ready_").string() +
                     "$RANK\nwhile true; do sleep 0.01; done\n";
  Child c(launch({"--nproc_per_node=2", script("notice.sh", body)}));
  ASSERT_TRUE(awaitFiles("ready_", 2));
  c.kill(SIGUSR1);
  auto deadline = std::chrono::steady_clock::now() + kRun;
  while ((read("sig_0").empty() || read("sig_1").empty()) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_FALSE(c.wait(milliseconds(200)).has_value()) << "launch stopped on SIGUSR1";
  c.kill(SIGUSR2);
  auto exit = c.wait(kRun);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->code, 0) << c.stderrText();
  EXPECT_EQ(read("sig_0"), "usr1\nusr2\n");
  EXPECT_EQ(read("sig_1"), "usr1\nusr2\n");
  EXPECT_NE(c.stderrText().find("launch got SIGUSR1; forwarding it to the workers"), std::string::npos);
}

// torchrun 2.x's --signals-to-handle: a listed SIGUSR1 stops the job (forwarded to every
// worker, SIGKILL after --shutdown-timeout), instead of being a notice; SIGTERM, not listed,
// is then not caught by launch.
TEST_F(LaunchTest, SignalsToHandleMakesUsr1AStopSignal) {
  std::string body = "trap 'echo usr1 > " + (dir_ / "sig_").string() + "$RANK; exit 0' USR1\necho ready > " +
                     (dir_ / "ready_").string() + "$RANK\nwhile true; do sleep 0.01; done\n";
  Child c(launch({"--nproc_per_node=2", "--signals-to-handle=SIGUSR1,SIGINT", "--shutdown-timeout=5",
                  script("stop.sh", body)}));
  ASSERT_TRUE(awaitFiles("ready_", 2));
  c.kill(SIGUSR1);
  auto exit = c.wait(kRun);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->code, 128 + SIGUSR1) << c.stderrText();
  EXPECT_EQ(read("sig_0"), "usr1\n");
  EXPECT_EQ(read("sig_1"), "usr1\n");
  EXPECT_NE(c.stderrText().find("SIGKILL after 5 s"), std::string::npos) << c.stderrText();
}

// --virtual-local-rank: every worker sees LOCAL_RANK=0 and only its own device.
TEST_F(LaunchTest, VirtualLocalRankNarrowsEachWorkerToItsDevice) {
  std::string dump = script("dump.sh", "env > " + (dir_ / "env_").string() + "$RANK\n");
  Child c(launch({"--nproc_per_node=2", "--virtual-local-rank", dump}),
          {"CUDA_VISIBLE_DEVICES=GPU-aaa, GPU-bbb"});
  ASSERT_EQ(c.wait(kRun)->code, 0) << c.stderrText();
  EXPECT_EQ(envOf("env_0")["LOCAL_RANK"], "0");
  EXPECT_EQ(envOf("env_1")["LOCAL_RANK"], "0");
  EXPECT_EQ(envOf("env_0")["CUDA_VISIBLE_DEVICES"], "GPU-aaa");
  EXPECT_EQ(envOf("env_1")["CUDA_VISIBLE_DEVICES"], "GPU-bbb");
  EXPECT_EQ(envOf("env_1")["RANK"], "1");
  unsetenv("CUDA_VISIBLE_DEVICES");
  Child plain(launch({"--nproc_per_node=2", "--virtual-local-rank", dump}));
  ASSERT_EQ(plain.wait(kRun)->code, 0) << plain.stderrText();
  EXPECT_EQ(envOf("env_1")["CUDA_VISIBLE_DEVICES"], "1");
}

// --event-log-handler=console: torchelastic's event lines, one JSON object each, as torchrun
// 2.14 prints them (tests/compat/output_parity.py compares them with it line by line).
TEST_F(LaunchTest, ConsoleEventLogPrintsTorchelasticEvents) {
  // The exit code each failed rank's event must carry.
  std::map<int, int> wantExit;
  auto events = [&wantExit](const std::string& err) {
    std::map<std::string, int> seen;
    std::istringstream lines(err);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("{\"name\": \"torchelastic.worker.status.", 0) != 0) continue;
      auto event = nlohmann::json::parse(line);
      std::string key = event["source"].get<std::string>() + " " + event["metadata"]["state"].get<std::string>();
      ++seen[key];
      EXPECT_EQ(event["timestamp"], 0);
      EXPECT_TRUE(event["metadata"]["metadata"].is_string()) << "torchelastic nests it as a string";
      auto inner = nlohmann::json::parse(event["metadata"]["metadata"].get<std::string>());
      if (key == "AGENT RENDEZVOUS" || key == "AGENT ASSIGN_WORKER_RANKS") {
        EXPECT_TRUE(event["metadata"]["group_rank"].is_null()) << "none before the first round";
        EXPECT_TRUE(event["metadata"]["duration_ms"].is_number());
      }
      if (key == "WORKER START") {
        EXPECT_EQ(inner["worker_pid"], nlohmann::json::array({nullptr})) << line;
        EXPECT_TRUE(event["metadata"]["worker_id"].is_string()) << line;
      }
      if (key == "WORKER FAILED") {
        // Rank 1's own exit, and rank 0's SIGTERM from launch: both failures to torchelastic.
        int rank = event["metadata"]["global_rank"];
        EXPECT_EQ(inner["exit_code"], nlohmann::json::array({wantExit.at(rank)})) << line;
        EXPECT_EQ(nlohmann::json::parse(event["metadata"]["raw_error"].get<std::string>())["message"],
                  "<NONE>");
      }
    }
    return seen;
  };
  // Rank 1 fails; rank 0, still running, is stopped by launch.
  wantExit = {{1, 4}, {0, -SIGTERM}};
  Child c(launch({"--nproc_per_node=2", "--event-log-handler=console",
                  script("ev.sh", "[ \"$RANK\" = 1 ] && exit 4\nsleep 30 & wait\n")}));
  ASSERT_EQ(c.wait(kRun)->code, 1);
  auto seen = events(c.stderrText());
  EXPECT_EQ(seen["AGENT RENDEZVOUS"], 1);
  EXPECT_EQ(seen["AGENT ASSIGN_WORKER_RANKS"], 1);
  EXPECT_EQ(seen["WORKER START"], 2);
  EXPECT_EQ(seen["WORKER FAILED"], 2);
  EXPECT_EQ(seen["AGENT SUCCEEDED"], 1) << "the agent ran the job to its end";
  Child ok(launch({"--nproc_per_node=2", "--event-log-handler=console", script("ok.sh", "exit 0\n")}));
  ASSERT_EQ(ok.wait(kRun)->code, 0);
  seen = events(ok.stderrText());
  EXPECT_EQ(seen["WORKER SUCCEEDED"], 2);
  EXPECT_EQ(seen["AGENT SUCCEEDED"], 1);
  // A rank that finished before another failed was TERMINATED.
  wantExit = {{0, 5}};
  Child early(launch({"--nproc_per_node=2", "--event-log-handler=console",
                      script("early.sh", "[ \"$RANK\" = 1 ] && exit 0\nsleep 1; exit 5\n")}));
  ASSERT_EQ(early.wait(kRun)->code, 1);
  seen = events(early.stderrText());
  EXPECT_EQ(seen["WORKER TERMINATED"], 1) << early.stderrText();
  // An agent stopped by a signal FAILED, and says nothing of its workers' ends.
  Child stopped(launch({"--nproc_per_node=2", "--event-log-handler=console",
                        script("stop.sh", "sleep 30 & wait\n")}));
  ASSERT_TRUE(stopped.waitForLine("started 2 workers", kRun));
  stopped.kill(SIGTERM);
  ASSERT_NE(stopped.wait(kRun)->code, 0);
  seen = events(stopped.stderrText());
  EXPECT_EQ(seen["AGENT FAILED"], 1) << stopped.stderrText();
  EXPECT_EQ(seen["WORKER FAILED"] + seen["WORKER TERMINATED"] + seen["WORKER SUCCEEDED"], 0);
}

// --duplicate-stdout-filters and the line prefix template (TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE).
TEST_F(LaunchTest, DuplicateFiltersAndPrefixTemplate) {
  std::string body = "echo \"step 1 loss=0.5\"; echo chatter; echo \"acc,top1 0.9\"\n";
  Child c(launch({"--nproc_per_node=2", "--tee=1", "--log_dir", (dir_ / "logs").string(),
                  "--duplicate-stdout-filters=loss,acc,,top1", script("dup.sh", body)}),
          {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=${role_name}/${rank}/${local_rank} $other|"});
  ASSERT_EQ(c.wait(kRun)->code, 0) << c.stderrText();
  EXPECT_NE(c.stdoutText().find("default/1/1 $other|chatter"), std::string::npos) << c.stdoutText();
  std::string filtered;
  for (const auto& e : fs::recursive_directory_iterator(dir_ / "logs")) {
    if (e.path().filename() == "filtered_stdout.log") {
      std::ifstream in(e.path());
      filtered.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
  }
  for (int r = 0; r < 2; ++r) {
    std::string p = "default/" + std::to_string(r) + "/" + std::to_string(r) + " $other|";
    EXPECT_NE(filtered.find(p + "step 1 loss=0.5\n"), std::string::npos) << filtered;
    EXPECT_NE(filtered.find(p + "acc,top1 0.9\n"), std::string::npos) << filtered;
  }
  EXPECT_EQ(filtered.find("chatter"), std::string::npos) << filtered;
}

// launch serves a store connection per rank, so it raises its own soft descriptor limit; the
// workers get the limit they were started with.
TEST_F(LaunchTest, LaunchRaisesItsDescriptorLimitButNotTheWorkers) {
  std::string body = "ulimit -Sn > " + (dir_ / "worker_").string() + "$RANK\n"
                     "grep 'Max open files' /proc/$PPID/limits | awk '{print $4}' > " +
                     (dir_ / "launch_").string() + "$RANK\n";
  std::string w = script("limits.sh", body);
  std::string cmd = "ulimit -Sn 512; exec " + launchPath() + " --master_port=0 " + w;
  Child c({"/bin/bash", "-c", cmd});
  ASSERT_EQ(c.wait(kRun)->code, 0) << c.stderrText();
  EXPECT_EQ(read("worker_0"), "512\n");
  std::ifstream hard("/proc/self/limits");
  std::string line, want;
  while (std::getline(hard, line)) {
    if (line.rfind("Max open files", 0) == 0) {
      std::istringstream words(line.substr(14));
      std::string soft, h;
      words >> soft >> h;
      want = h;
    }
  }
  EXPECT_EQ(read("launch_0"), want + "\n") << "launch's soft limit is its hard limit";
}

// Running out of descriptors while starting 200 workers is said as such (it once read "Bad
// file descriptor"), and the workers already started do not outlive the failed start.
TEST_F(LaunchTest, RunningOutOfDescriptorsIsSaidAndTheStartedWorkersGo) {
  std::string pid = (dir_ / "pid_").string() + "$RANK";
  std::string w = script("sleeper.sh", "echo $$ > " + pid + ".tmp && mv " + pid + ".tmp " + pid + "\nexec sleep 60\n");
  std::string cmd = "ulimit -n 128; exec " + launchPath() + " --master_port=0 --nproc_per_node=200 " + w;
  Child c({"/bin/bash", "-c", cmd});
  auto exit = c.wait(kRun);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->code, 1) << c.stderrText();
  EXPECT_NE(c.stderrText().find("Too many open files"), std::string::npos) << c.stderrText();
  EXPECT_NE(c.stderrText().find("ulimit -n"), std::string::npos) << c.stderrText();
  EXPECT_EQ(c.stderrText().find("Bad file descriptor"), std::string::npos) << c.stderrText();
  std::vector<pid_t> started;
  for (int r = 0; r < 200; ++r) {
    std::ifstream in(dir_ / ("pid_" + std::to_string(r)));
    for (pid_t p; in >> p;) started.push_back(p);
  }
  EXPECT_TRUE(allGone(started)) << started.size() << " workers had started";
}

// Workers start as from a fresh shell: no blocked or ignored signal (launch ignores SIGPIPE
// and blocks others), and no descriptor of launch's but 0, 1 and 2.
TEST_F(LaunchTest, WorkersStartWithDefaultSignalsAndOnlyTheStandardDescriptors) {
  std::string out = (dir_ / "state_").string() + "$RANK";
  std::string w = script("state.sh", "grep -E '^Sig(Blk|Ign):' /proc/self/status > " + out +
                                         "\nexec /bin/ls /proc/self/fd >> " + out + "\n");
  Child c(launch({"--nproc_per_node=2", "--prefix_output", "--tee=3", w}));
  ASSERT_EQ(c.wait(kRun)->code, 0) << c.stderrText();
  for (int r = 0; r < 2; ++r) {
    // ls's own descriptor for the directory it lists is 3 (>> opens stdout anew: it is 1).
    EXPECT_EQ(read("state_" + std::to_string(r)),
              "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n0\n1\n2\n3\n");
  }
}

// A reader that stops reading launch's stdout does not stall launch: SIGTERM is still acted
// on (the workers' output through launch goes to a bounded queue off the event loop).
TEST_F(LaunchTest, AStalledReaderDoesNotStallLaunch) {
  std::string body = "trap 'exit 0' TERM\necho ready > " + (dir_ / "ready_").string() +
                     "$RANK\nwhile true; do echo \"a line of output that nobody reads\"; done\n";
  std::vector<std::string> args = launch({"--nproc_per_node=2", "--prefix_output", "--grace_period=2",
                                          script("chatty.sh", body)});
  int stalled[2];
  ASSERT_EQ(pipe2(stalled, O_CLOEXEC), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, stalled[1], 1);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  ASSERT_EQ(posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  close(stalled[1]);
  ASSERT_TRUE(awaitFiles("ready_", 2));
  std::this_thread::sleep_for(milliseconds(500));  // long enough to fill the 64 KiB pipe
  kill(pid, SIGTERM);
  int status = 0;
  bool exited = false;
  auto deadline = std::chrono::steady_clock::now() + milliseconds(30000);
  while (!exited && std::chrono::steady_clock::now() < deadline) {
    exited = waitpid(pid, &status, WNOHANG) == pid;
    if (!exited) std::this_thread::sleep_for(milliseconds(10));
  }
  if (!exited) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  close(stalled[0]);
  ASSERT_TRUE(exited) << "launch did not act on SIGTERM while its stdout was stalled";
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM);
}

// launch --prefix_output prog | head -2: the reader goes away, and the workers see their own
// output's pipe closed, as under torchrun: they die of SIGPIPE and the job ends.
TEST_F(LaunchTest, AClosedStdoutEndsTheWorkersAsUnderTorchrun) {
  std::string w = script("yes.sh", "exec yes 'a line'\n");
  std::string cmd = "set -o pipefail; " + launchPath() + " --master_port=0 --nproc_per_node=2 --prefix_output " +
                    w + " | head -2";
  Child c({"/bin/bash", "-c", cmd});
  auto exit = c.wait(kRun);
  ASSERT_TRUE(exit.has_value()) << "the job did not end";
  std::string out = c.stdoutText();
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 2) << out;
  EXPECT_EQ(exit->code, 1) << c.stderrText();
  EXPECT_NE(c.stderrText().find("was killed by SIGPIPE"), std::string::npos) << c.stderrText();
}

// A log file that cannot be written (a full disk): one warning naming it at once, and the end
// says how much was lost where.
TEST_F(LaunchTest, AFullLogDiskIsReportedNotSilentlyLost) {
  fs::path logs = dir_ / "logs";
  fs::create_directories(logs);
  if (mount("tmpfs", logs.c_str(), "tmpfs", 0, "size=64k") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root): " << std::strerror(errno);
  }
  std::string w = script("much.sh", "head -c 1048576 /dev/zero | tr '\\0' 'x' | fold -w 100\n");
  Child c(launch({"--nproc_per_node=1", "--redirects=1", "--log_dir", logs.string(), w}));
  auto exit = c.wait(kRun);
  umount2(logs.c_str(), MNT_DETACH);
  ASSERT_TRUE(exit.has_value());
  std::string err = c.stderrText();
  EXPECT_NE(err.find("cannot write the log "), std::string::npos) << err;
  EXPECT_NE(err.find("No space left on device"), std::string::npos) << err;
  size_t warnings = 0;
  for (size_t at = 0; (at = err.find("cannot write the log ", at)) != std::string::npos; ++at) ++warnings;
  EXPECT_EQ(warnings, 1u) << "once, not per write";
  EXPECT_NE(err.find("byte(s) of output were lost: "), std::string::npos) << err;
  EXPECT_NE(err.find("stdout.log could not be written (No space left on device)"), std::string::npos) << err;
}

// A worker's double-forked daemon in a session of its own (out of the worker's process group)
// ends with the job: launch is the child subreaper that adopts it.
TEST_F(LaunchTest, ADoubleForkedDaemonDoesNotOutliveTheJob) {
  std::string pid = (dir_ / "daemon_").string() + "$RANK";
  std::string body = "( setsid sleep 300 & echo $! > " + pid + ".tmp && mv " + pid + ".tmp " + pid +
                     " )\nwhile [ ! -e " + pid + " ]; do sleep 0.01; done\nexit 0\n";
  Child c(launch({"--nproc_per_node=2", script("daemon.sh", body)}));
  auto exit = c.wait(kRun);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->code, 0) << c.stderrText();
  auto daemons = pidsIn("daemon_", 2);
  ASSERT_EQ(daemons.size(), 2u);
  EXPECT_TRUE(allGone(daemons)) << "a setsid daemon outlived the job";
  // One line names them (with the shells between, when those were still going).
  EXPECT_NE(c.stderrText().find("process(es) the workers left behind outside their process groups"),
            std::string::npos)
      << c.stderrText();
}

TEST_F(LaunchTest, WorkersIgnoringSigtermAreKilledAfterTheGracePeriod) {
  // Rank 0 fails once rank 1 ignores SIGTERM (its file appears after the trap is set).
  std::string body = "trap '' TERM\necho $$ > " + (dir_ / "pid_").string() +
                     "$RANK\nif [ \"$RANK\" = 0 ]; then\n  while [ ! -e " +
                     (dir_ / "pid_1").string() +
                     " ]; do sleep 0.01; done\n  exit 1\nfi\nwhile true; do sleep 0.01; done\n";
  auto start = std::chrono::steady_clock::now();
  Child c(launch({"--nproc_per_node=2", "--grace_period=0.3", script("stubborn.sh", body)}));
  auto exit = c.wait(kRun);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->code, 1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_NE(c.stderrText().find("sending SIGKILL"), std::string::npos) << c.stderrText();
  EXPECT_TRUE(allGone(pidsIn("pid_", 2)));
}

TEST_F(LaunchTest, RestartsRunANewRoundWithAFreshNamespace) {
  std::string body =
      "echo \"$TORCHELASTIC_RESTART_COUNT $MUSTER_STORE_NAMESPACE\" >> " +
      (dir_ / "rounds_").string() + "$RANK\n"
      "[ \"$TORCHELASTIC_RESTART_COUNT\" -lt 2 ] && [ \"$RANK\" = 1 ] && exit 7\n"
      "[ \"$TORCHELASTIC_RESTART_COUNT\" -lt 2 ] && { sleep 60 & wait; }\n"
      "exit 0\n";
  Child c(launch({"--nproc_per_node=2", "--max_restarts=3", script("flaky.sh", body)}));
  auto exit = c.wait(kRun);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->code, 0) << c.stderrText();
  EXPECT_EQ(read("rounds_1"), "0 none/0\n1 none/1\n2 none/2\n");
  EXPECT_NE(c.stderrText().find("restarting the group (1 of 3 restarts)"), std::string::npos);
  EXPECT_NE(c.stderrText().find("restarting the group (2 of 3 restarts)"), std::string::npos);
}

TEST_F(LaunchTest, RestartsRunOutAndTheLastFailureIsReported) {
  Child c(launch({"--nproc_per_node=1", "--max_restarts=1",
                  script("bad.sh", "echo \"attempt $TORCHELASTIC_RESTART_COUNT\" >&2; exit 4\n")}));
  auto exit = c.wait(kRun);
  EXPECT_EQ(exit->code, 1);
  EXPECT_NE(c.stderrText().find("    attempt 1"), std::string::npos) << c.stderrText();
}

TEST_F(LaunchTest, RedirectsSendOutputToFilesAndTeeAlsoToTheConsoleWithPrefix) {
  std::string body = "echo \"out $RANK\"; echo \"err $RANK\" >&2\n";
  std::string logs = (dir_ / "logs").string();
  Child c(launch({"--nproc_per_node=2", "--log_dir", logs, "-r", "3", "--tee=0:3",
                  script("talk.sh", body)}));
  ASSERT_EQ(c.wait(kRun)->code, 0) << c.stderrText();
  std::vector<fs::path> runs;
  for (const auto& e : fs::directory_iterator(logs)) runs.push_back(e.path());
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].filename().string().rfind("none_", 0), 0u);
  auto text = [&](const std::string& rel) {
    std::ifstream in(runs[0] / rel);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  EXPECT_EQ(text("attempt_0/0/stdout.log"), "out 0\n");
  EXPECT_EQ(text("attempt_0/1/stdout.log"), "out 1\n");
  EXPECT_EQ(text("attempt_0/1/stderr.log"), "err 1\n");
  // Rank 0 is tee'd (prefixed); rank 1 is only in its files.
  EXPECT_NE(c.stdoutText().find("[default0]:out 0"), std::string::npos) << c.stdoutText();
  EXPECT_EQ(c.stdoutText().find("out 1"), std::string::npos) << c.stdoutText();
  EXPECT_EQ(c.stderrText().find("err 1"), std::string::npos);
}

TEST_F(LaunchTest, LocalRanksFilterShowsOnlyTheChosenRanks) {
  Child c(launch({"--nproc_per_node=3", "--local-ranks-filter=1", "--prefix-output",
                  script("talk.sh", "echo \"hello from $RANK\"\n")}));
  ASSERT_EQ(c.wait(kRun)->code, 0);
  EXPECT_EQ(c.stdoutText(), "[default1]:hello from 1\n");
}

TEST_F(LaunchTest, WorkersReachTheStoreThroughMusterVariables) {
  std::string body =
      "ctl() { " + ctlPath() +
      " --addr \"$MUSTER_STORE_ADDR\" --ns \"$MUSTER_STORE_NAMESPACE\" --token-file "
      "\"$MUSTER_STORE_TOKEN_FILE\" \"$@\"; }\n"
      "ctl set \"hello/$RANK\" \"from rank $RANK\"\n"
      "ctl add arrived 1 >/dev/null\n"
      "ctl get \"hello/$(( (RANK + 1) % WORLD_SIZE ))\" > " + (dir_ / "got_").string() + "$RANK\n";
  Child c(launch({"--nproc_per_node=3", script("store.sh", body)}));
  ASSERT_EQ(c.wait(kRun)->code, 0) << c.stderrText();
  EXPECT_EQ(read("got_0"), "from rank 1\n");
  EXPECT_EQ(read("got_2"), "from rank 0\n");
}

TEST_F(LaunchTest, TheStoreRefusesClientsWithoutTheJobsToken) {
  std::string body = ctlPath() + " --addr \"$MUSTER_STORE_ADDR\" --timeout 5 num-keys\n";
  Child c(launch({"--nproc_per_node=1", script("nosy.sh", body)}));
  EXPECT_EQ(c.wait(kRun)->code, 1);
  EXPECT_NE(c.stderrText().find("UNAUTHENTICATED"), std::string::npos) << c.stderrText();
}

struct BadLaunch {
  std::vector<std::string> args;
  std::string mentions;
};

class LaunchRejects : public ::testing::TestWithParam<BadLaunch> {};

TEST_P(LaunchRejects, OneLineExitTwoAndNothingStarts) {
  // A plain data file stands for "not executable" ("DATA" in the parameters), in a folder of
  // this test's own that goes with it.
  struct Folder {
    fs::path path = [] {
      std::string name = (fs::temp_directory_path() / "muster-rejects-XXXXXX").string();
      return fs::path(mkdtemp(name.data()) ? name : "");
    }();
    ~Folder() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  } folder;
  ASSERT_FALSE(folder.path.empty()) << "mkdtemp: " << strerror(errno);
  fs::path data = folder.path / "data";
  std::ofstream(data) << "not a program\n";
  chmod(data.c_str(), 0644);
  std::vector<std::string> argv{launchPath()};
  for (const auto& a : GetParam().args) argv.push_back(a == "DATA" ? data.string() : a);
  Child c(argv);
  auto exit = c.wait(kRun);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->code, 2);
  EXPECT_EQ(c.stderrLines().size(), 1u) << c.stderrText();
  EXPECT_NE(c.stderrText().find(GetParam().mentions), std::string::npos) << c.stderrText();
  EXPECT_EQ(c.stderrText().find("started"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    Flags, LaunchRejects,
    ::testing::Values(BadLaunch{{"--bogus", "/bin/true"}, "unknown flag --bogus"},
                      BadLaunch{{"--nproc_per_node=0", "/bin/true"}, "--nproc_per_node=0"},
                      BadLaunch{{"--nnodes=a:b", "/bin/true"}, "--nnodes=a:b"},
                      BadLaunch{{"/no/such/program"}, "'/no/such/program' not found"},
                      BadLaunch{{"--no_python", "DATA"}, "not executable"},
                      BadLaunch{{"--nproc_per_node=2"}, "no PROGRAM"}));

TEST(LaunchHelp, PrintsEveryFlagAndExitsZero) {
  Child c({launchPath(), "--help"});
  ASSERT_EQ(c.wait(kRun)->code, 0);
  for (const char* flag : {"--nproc_per_node", "--nproc-per-node", "--rdzv_endpoint", "--tee",
                           "--local-ranks-filter", "--max_restarts", "--legacy_launch"}) {
    EXPECT_NE(c.stdoutText().find(flag), std::string::npos) << flag;
  }
}

}  // namespace
}  // namespace muster
