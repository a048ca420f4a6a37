// rendezvousctl runs and status, live, on real jobs: two launch nodes on loopback whose
// rendezvous is node 0's own (no rendezvousd), their ranks real processes; the views as text
// and JSON, and the --watch view in a real terminal (tmux: capture-pane), resized too small
// and back, while a node is killed.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <set>
#include <fstream>
#include <regex>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/support/child.h"
#include "tests/support/programs.h"

namespace muster {
namespace {

using testing::Child;
using testing::ctlPath;
using testing::freePort;
using testing::launchPath;
namespace fs = std::filesystem;
using std::chrono::milliseconds;
using nlohmann::json;
constexpr milliseconds kRun{120000};

class Status : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::freshTestDir("muster-status");
    endpoint_ = "127.0.0.1:" + std::to_string(freePort());
    // Each rank says it is up, writes a line every 0.2 s, and ends once `go` is there.
    worker_ = testing::writeScript(dir_ / "w.sh", "touch " + (dir_ / "up_").string() + "$RANK\nwhile [ ! -e " +
                                                      (dir_ / "go").string() + " ]; do echo tick; sleep 0.2; done\n");
  }
  void TearDown() override {
    nodes_.clear();
    fs::remove_all(dir_);
  }
  // Node n: node 0 hosts the rendezvous (c10d, as torchrun's first node does).
  Child& node(int n, int nproc = 2) {
    nodes_.push_back(std::make_unique<Child>(std::vector<std::string>{
        launchPath(), "--nnodes=2", "--nproc_per_node=" + std::to_string(nproc), "--rdzv_backend=c10d",
        "--rdzv_endpoint=" + endpoint_, "--rdzv_id=live", "--max_restarts=1", "--hang_timeout=600",
        "--rdzv_conf=keep_alive_interval=0.5,keep_alive_max_attempt=4,last_call_timeout=1,is_host=" +
            std::string(n == 0 ? "1" : "0"),
        "--log_dir=" + (dir_ / ("logs" + std::to_string(n))).string(), "--no_python", worker_}));
    return *nodes_.back();
  }
  // rendezvousctl ARGS against node 0's rendezvous: exit code and stdout (stderr after it).
  std::pair<int, std::string> ctl(std::vector<std::string> args) {
    std::vector<std::string> argv{ctlPath(), "--addr=" + endpoint_, "--timeout=10"};
    argv.insert(argv.end(), args.begin(), args.end());
    Child c(argv);
    auto e = c.wait(milliseconds(30000));
    if (!e) return {-1, "timed out"};
    return {e->code, c.stdoutText() + c.stderrText()};
  }
  // `status --json` until `ok(reply)` holds, or the deadline.
  json statusUntil(const std::function<bool(const json&)>& ok, milliseconds timeout = milliseconds(30000)) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    json last;
    while (std::chrono::steady_clock::now() < deadline) {
      auto [code, out] = ctl({"status", "--run=live", "--json"});
      if (code == 0) {
        last = json::parse(out, nullptr, false);
        if (!last.is_discarded() && ok(last)) return last;
      }
      std::this_thread::sleep_for(milliseconds(200));
    }
    return last;
  }
  bool up(int ranks) {
    for (int r = 0; r < ranks; ++r) {
      if (!testing::awaitPath(dir_ / ("up_" + std::to_string(r)), kRun)) return false;
    }
    return true;
  }

  fs::path dir_;
  std::string endpoint_, worker_;
  std::vector<std::unique_ptr<Child>> nodes_;
};

// Every rank with a status: the view has them all.
bool everyRankReported(const json& s, size_t ranks) {
  size_t n = 0;
  for (const auto& node : s.value("nodes", json::array())) {
    if (node.contains("status")) n += node["status"].value("ranks", json::array()).size();
  }
  return n == ranks;
}

TEST_F(Status, RunsAndStatusShowARunningJobsNodesAndRanks) {
  auto& a = node(0);
  auto& b = node(1, 3);
  ASSERT_TRUE(up(5)) << a.stderrText() << b.stderrText();
  // Until every rank's first line has reached launch (a report may come before it).
  auto outputSeen = [](const json& s) {
    if (!everyRankReported(s, 5)) return false;
    for (const auto& node : s["nodes"]) {
      for (const auto& r : node["status"]["ranks"]) {
        if (r["output_age_ms"].get<int64_t>() < 0) return false;
      }
    }
    return true;
  };
  auto s = statusUntil(outputSeen);
  ASSERT_TRUE(outputSeen(s)) << s.dump(2);
  EXPECT_EQ(s["run"]["state"], "RUNNING");
  EXPECT_EQ(s["run"]["nodes"], 2);
  EXPECT_EQ(s["run"]["ranks"], 5);
  std::set<int> launchPids;
  int rank = 0;
  for (const auto& node : s["nodes"]) {
    EXPECT_EQ(node["host"], "127.0.0.1");
    launchPids.insert(node["status"]["launch_pid"].get<int>());
    EXPECT_EQ(node["status"]["restarts_left"], 1);
    EXPECT_NE(node["status"]["version"].get<std::string>().find("commit"), std::string::npos) << node.dump();
    EXPECT_LT(node["heartbeat_age_ms"].get<int64_t>(), 5000) << node.dump();
    for (const auto& r : node["status"]["ranks"]) {
      EXPECT_EQ(r["rank"], rank++);
      EXPECT_EQ(r["state"], "RUNNING");
      int pid = r["pid"].get<int>();
      EXPECT_TRUE(fs::exists("/proc/" + std::to_string(pid))) << r.dump();
      EXPECT_GT(r["rss_bytes"].get<uint64_t>(), 0u) << r.dump();
      // The ranks write a line every 0.2 s, which launch sees (--hang_timeout).
      EXPECT_GE(r["output_age_ms"].get<int64_t>(), 0) << r.dump();
      EXPECT_LT(r["output_age_ms"].get<int64_t>(), 5000) << r.dump();
    }
  }
  EXPECT_EQ(launchPids, (std::set<int>{a.pid(), b.pid()}));
  // The text views.
  auto [code, runs] = ctl({"runs"});
  EXPECT_EQ(code, 0) << runs;
  EXPECT_TRUE(std::regex_search(runs, std::regex(R"(live\s+running\s+0\s+2\s+2\s+2\s+5\s)"))) << runs;
  auto [scode, text] = ctl({"status", "--run=live"});
  EXPECT_EQ(scode, 0) << text;
  EXPECT_NE(text.find("run live: running, round 0, 2 node(s) (min 2, max 2), 5 rank(s)"), std::string::npos) << text;
  // b's node has three ranks, whichever group rank it got (the order of joins decides).
  std::smatch m;
  ASSERT_TRUE(std::regex_search(text, m, std::regex(R"(ranks (\d+)-(\d+)  launch pid )" + std::to_string(b.pid()))))
      << text;
  EXPECT_EQ(std::stoi(m[2]) - std::stoi(m[1]), 2) << text;
  EXPECT_TRUE(std::regex_search(text, std::regex("\n  " + m[2].str() + R"(\s+2\s+\d+\s+running\s)"))) << text;
  // The job ends; the run is finished, and says when it is forgotten.
  std::ofstream(dir_ / "go") << "";
  EXPECT_EQ(b.wait(kRun)->code, 0) << b.stderrText();
  // Node 0's launch serves the rendezvous until it exits: ask before it does... it has exited
  // by now, taking its service along: a job without rendezvousd is seen while it runs.
  EXPECT_EQ(a.wait(kRun)->code, 0) << a.stderrText();
}

TEST_F(Status, AFailedRankShowsItsExitAndTheRestartsLeft) {
  // Rank 3 fails at once in the first round; the restart's round runs on.
  worker_ = testing::writeScript(dir_ / "f.sh", "[ \"$RANK\" = 3 ] && [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] && exit 7\n"
                                                "touch " + (dir_ / "up_").string() + "$RANK\nwhile [ ! -e " +
                                                    (dir_ / "go").string() + " ]; do sleep 0.2; done\n");
  auto& a = node(0);
  auto& b = node(1);
  auto s = statusUntil([](const json& s) {
    return s["run"]["round"] == 1 && everyRankReported(s, 4) && s["run"]["state"] == "RUNNING";
  });
  // What both nodes said so far (a running child's output is read only when asked).
  a.drain();
  b.drain();
  ASSERT_EQ(s["run"]["round"], 1) << s.dump(2) << "\nnode 0:\n" << a.stderrText() << "\nnode 1:\n" << b.stderrText()
                                   << "\nlast status: " << ctl({"status", "--run=live", "--json"}).second;
  for (const auto& node : s["nodes"]) EXPECT_EQ(node["status"]["restarts_left"], 0) << node.dump();
  std::ofstream(dir_ / "go") << "";
  EXPECT_EQ(a.wait(kRun)->code, 0) << a.stderrText();
  EXPECT_EQ(b.wait(kRun)->code, 0) << b.stderrText();
}

TEST_F(Status, BadRequestsAreOneLine) {
  auto& a = node(0);
  auto& b = node(1);
  ASSERT_TRUE(up(4));
  auto [code, out] = ctl({"status", "--run=nope"});
  EXPECT_EQ(code, 1);
  EXPECT_NE(out.find("rendezvousctl: status of run 'nope' at " + endpoint_ + ": no run 'nope' here"), std::string::npos)
      << out;
  auto [missing, usage] = ctl({"status"});
  EXPECT_EQ(missing, 2) << usage;
  EXPECT_NE(usage.find("--run is required"), std::string::npos) << usage;
  auto [both, clash] = ctl({"status", "--run=live", "--json", "--watch"});
  EXPECT_EQ(both, 2) << clash;
  Child nowhere({ctlPath(), "--addr=127.0.0.1:" + std::to_string(freePort()), "--timeout=1", "runs"});
  auto e = nowhere.wait(milliseconds(30000));
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, 1);
  EXPECT_NE(nowhere.stderrText().find("rendezvousctl: runs at 127.0.0.1:"), std::string::npos) << nowhere.stderrText();
  std::ofstream(dir_ / "go") << "";
  a.wait(kRun);
  b.wait(kRun);
}

// tmux: a real terminal, its screen read back with capture-pane. A tmux server of its own
// (-L): the machine's default one is anyone's, with its environment and its sessions.
class Tmux {
 public:
  explicit Tmux(const std::string& name) : name_(name + std::to_string(getpid())) {}
  ~Tmux() { run("kill-server 2>/dev/null"); }
  bool start(const std::string& command, int cols, int rows) {
    return run("new-session -d -s " + name_ + " -x " + std::to_string(cols) + " -y " + std::to_string(rows) + " '" +
               command + "'") == 0;
  }
  void resize(int cols, int rows) {
    run("resize-window -t " + name_ + " -x " + std::to_string(cols) + " -y " + std::to_string(rows));
  }
  void keys(const std::string& k) { run("send-keys -t " + name_ + " " + k); }
  std::string screen() {
    std::string out;
    FILE* p = popen(("tmux -L " + name_ + " capture-pane -p -t " + name_ + " 2>/dev/null").c_str(), "r");
    if (!p) return out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    pclose(p);
    return out;
  }
  // Waits until the screen matches `pattern`; the last screen either way.
  std::string awaitScreen(const std::string& pattern, milliseconds timeout = milliseconds(20000)) {
    std::regex re(pattern);
    auto deadline = std::chrono::steady_clock::now() + timeout;
    std::string s;
    do {
      s = screen();
      if (std::regex_search(s, re)) return s;
      std::this_thread::sleep_for(milliseconds(100));
    } while (std::chrono::steady_clock::now() < deadline);
    return s;
  }

 private:
  int run(const std::string& args) { return std::system(("tmux -L " + name_ + " " + args + " >/dev/null 2>&1").c_str()); }
  std::string name_;
};

TEST_F(Status, TheWatchViewRedrawsInPlaceFitsTheTerminalAndSeesANodeKilled) {
  if (std::system("tmux -V >/dev/null 2>&1") != 0) GTEST_SKIP() << "tmux is not installed (deploy/setup.sh installs it)";
  auto& a = node(0);
  auto& b = node(1);
  ASSERT_TRUE(up(4)) << a.stderrText() << b.stderrText();
  statusUntil([](const json& s) { return everyRankReported(s, 4); });
  Tmux tmux("muster-watch-");
  std::string exitFile = (dir_ / "watch_exit").string();
  ASSERT_TRUE(tmux.start(ctlPath() + " --addr=" + endpoint_ + " status --run=live --watch --interval=0.3; echo $? > " +
                             exitFile,
                         120, 30));
  std::string s = tmux.awaitScreen(R"(run live: running, round 0, 2 node\(s\))");
  EXPECT_NE(s.find("every 0.3s, q to quit"), std::string::npos) << s;
  EXPECT_TRUE(std::regex_search(s, std::regex(R"(node 0  127\.0\.0\.1  ranks 0-1)"))) << s;
  EXPECT_TRUE(std::regex_search(s, std::regex(R"(node 1  127\.0\.0\.1  ranks 2-3)"))) << s;
  // Narrow and short: every line cut to 40 columns, and what does not fit counted.
  tmux.resize(40, 8);
  s = tmux.awaitScreen(R"(more line\(s\))");
  EXPECT_NE(s.find("more line(s)"), std::string::npos) << s;
  for (size_t start = 0, end; start < s.size(); start = end + 1) {
    end = s.find('\n', start);
    if (end == std::string::npos) end = s.size();
    EXPECT_LE(end - start, 40u) << s;
  }
  // Too few rows says so, with the size; too few columns says as much as fits.
  tmux.resize(60, 2);
  s = tmux.awaitScreen(R"(terminal too small \(60x2\))");
  EXPECT_NE(s.find("terminal too small (60x2)"), std::string::npos) << s;
  tmux.resize(12, 2);
  s = tmux.awaitScreen("^too small");
  EXPECT_TRUE(std::regex_search(s, std::regex("^too small\n"))) << s;
  tmux.resize(120, 30);
  // A node killed while watching: the run's round ends, the next one waits for nodes.
  b.kill(SIGKILL);
  s = tmux.awaitScreen(R"(run live: (waiting|stopped))", milliseconds(30000));
  EXPECT_TRUE(std::regex_search(s, std::regex(R"(run live: (waiting|stopped))"))) << s;
  tmux.keys("q");
  ASSERT_TRUE(testing::awaitPath(exitFile, milliseconds(10000)));
  std::ifstream in(exitFile);
  int code = -1;
  in >> code;
  EXPECT_EQ(code, 0);
  a.kill(SIGTERM);
  a.wait(kRun);
}

}  // namespace
}  // namespace muster
