// launch benchmark: wall time of a trivial --nproc_per_node=4 job under launch and under
// torchrun (default flags, and --monitor_interval=0.1), measured in one run, with the ratio.
// The torchrun is the host's (Debian's 1.13), or another torch's with --torchrun "CMD" (under
// tests/compat/with_torch.sh: --torchrun "$MUSTER_TEST_TORCHRUN"; 2.x's default interval is 0.1 s);
// launch's overhead (wall minus the slowest worker's own run time); `launch --version` against
// /bin/true (loading the program); and the time from one worker's failure to all workers gone.
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>
#include <thread>

#include "tests/bench/bench_process.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;

using muster::bench::nowNs;

int runQuiet(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid;
  if (posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ) != 0) return -1;
  posix_spawn_file_actions_destroy(&fa);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

long long readNumber(const fs::path& p, int index = 0) {
  std::ifstream in(p);
  long long v = 0;
  for (int i = 0; i <= index; ++i) in >> v;
  return v;
}

struct Timing {
  double wallMs = 0, overheadMs = 0;
};

// Median over `reps` runs of a trivial job.
Timing trivial(const std::vector<std::string>& launcher, const std::string& worker, int nproc,
               int reps, const fs::path& dir) {
  std::vector<double> walls, overheads;
  for (int i = 0; i < reps; ++i) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::vector<std::string> args = launcher;
    args.insert(args.end(), {worker, "run", dir.string()});
    long long t0 = nowNs();
    int rc = runQuiet(args);
    long long t1 = nowNs();
    if (rc != 0) throw std::runtime_error("a trivial run failed: " + args[0]);
    long long slowest = 0;
    for (int r = 0; r < nproc; ++r) {
      fs::path f = dir / ("run_" + std::to_string(r));
      slowest = std::max(slowest, readNumber(f, 1) - readNumber(f, 0));
    }
    walls.push_back((t1 - t0) / 1e6);
    overheads.push_back((t1 - t0 - slowest) / 1e6);
  }
  std::sort(walls.begin(), walls.end());
  std::sort(overheads.begin(), overheads.end());
  return {walls[walls.size() / 2], overheads[overheads.size() / 2]};
}

// Median wall milliseconds of `reps` runs of a command that only starts and ends.
double bare(const std::vector<std::string>& args, int reps) {
  std::vector<double> walls;
  for (int i = 0; i < reps; ++i) {
    long long t0 = nowNs();
    if (runQuiet(args) != 0) throw std::runtime_error("failed: " + args[0]);
    walls.push_back((nowNs() - t0) / 1e6);
  }
  std::sort(walls.begin(), walls.end());
  return walls[walls.size() / 2];
}

// Milliseconds from rank 0's failure until the last other worker got SIGTERM and left.
double failover(const std::vector<std::string>& launcher, const std::string& worker, int nproc,
                const fs::path& dir) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<std::string> args = launcher;
  args.insert(args.end(), {worker, "failover", dir.string()});
  runQuiet(args);
  long long fail = readNumber(dir / "fail");
  long long last = 0;
  for (int r = 1; r < nproc; ++r) {
    fs::path f = dir / ("term_" + std::to_string(r));
    if (!fs::exists(f)) return -1;  // killed without SIGTERM
    last = std::max(last, readNumber(f));
  }
  return (last - fail) / 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"launch_bench: launch vs torchrun on a trivial job"};
  int nproc = 4, reps = 5, torchReps = 1;
  std::string build = fs::path(fs::read_symlink("/proc/self/exe")).parent_path().parent_path().parent_path();
  std::string source = MUSTER_SOURCE_DIR_DEFAULT;
  std::string python = "/usr/bin/python3";
  app.add_option("--nproc", nproc)->capture_default_str();
  app.add_option("--reps", reps, "runs of launch per figure (median)")->capture_default_str();
  app.add_option("--torch-reps", torchReps, "runs of torchrun per figure")->capture_default_str();
  std::string torchrunCmd;
  app.add_option("--torchrun", torchrunCmd,
                 "the reference torchrun as a command line (default: Debian's 1.13 under "
                 "/usr/bin/python3)");
  std::string torchVersion = "1.13";
  app.add_option("--torch-version", torchVersion, "its torch's version, for the report")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  std::string worker = build + "/tests/bench/trivial_worker";
  std::string launch = build + "/launcher/launch";
  std::string torchrun = source + "/tests/compat/torchrun_py311.py";
  fs::path dir = fs::temp_directory_path() / ("muster-launch-bench-" + std::to_string(getpid()));
  std::string n = "--nproc_per_node=" + std::to_string(nproc);
  std::vector<std::string> ours{launch, n, "--master_port=29555"};
  std::vector<std::string> torchDefault{python, torchrun};
  if (!torchrunCmd.empty()) {
    torchDefault.clear();
    std::istringstream words(torchrunCmd);
    for (std::string w; words >> w;) torchDefault.push_back(w);
  }
  torchDefault.insert(torchDefault.end(), {n, "--master_port=29556", "--no_python"});
  std::vector<std::string> torchFast = torchDefault;
  torchFast.push_back("--monitor_interval=0.1");

  std::printf("launch benchmark: --nproc_per_node=%d of a trivial C++ program, %d cores, torchrun of torch %s\n",
              nproc, static_cast<int>(std::thread::hardware_concurrency()), torchVersion.c_str());
  Timing l = trivial(ours, worker, nproc, reps, dir);
  Timing td = trivial(torchDefault, worker, nproc, torchReps, dir);
  Timing tf = trivial(torchFast, worker, nproc, torchReps, dir);
  std::printf("%-36s %10s %14s\n", "", "wall ms", "overhead ms");
  std::printf("%-36s %10.1f %14.1f\n", "launch", l.wallMs, l.overheadMs);
  std::printf("%-36s %10.1f %14.1f\n", "torchrun (default flags)", td.wallMs, td.overheadMs);
  std::printf("%-36s %10.1f %14.1f\n", "torchrun --monitor_interval=0.1", tf.wallMs,
              tf.overheadMs);
  std::printf("ratio torchrun/launch: %.0fx (default), %.0fx (--monitor_interval=0.1)\n",
              td.wallMs / l.wallMs, tf.wallMs / l.wallMs);
  // What loading the program costs, against a C program that does nothing.
  double version = bare({launch, "--version"}, reps), trueMs = bare({"/bin/true"}, reps);
  std::printf("launch --version (load, parse, exit) %.2f ms; /bin/true %.2f ms\n", version, trueMs);
  double lf = failover(ours, worker, nproc, dir);
  double tff = failover(torchFast, worker, nproc, dir);
  double tfd = failover(torchDefault, worker, nproc, dir);
  std::printf("failure of rank 0 -> every other worker got SIGTERM and left:\n");
  std::printf("  launch %.2f ms; torchrun %.1f ms (default), %.1f ms (--monitor_interval=0.1)\n",
              lf, tfd, tff);
  fs::remove_all(dir);
  return 0;
}
