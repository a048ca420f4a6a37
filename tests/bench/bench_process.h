// What the benches that run clients in processes of their own share: starting a process, a
// start line for such processes, a clock they share, and reading a process's CPU time.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace muster::bench {

// The start line: a client process says it is ready, then waits for this signal. It is
// blocked from the process's first instruction (spawn(..., gated)), so that every thread it
// starts inherits the block and only waitForStart takes it.
inline constexpr int kStartSignal = SIGUSR1;

// Starts `args` (args[0] is the program's path), its stdout into `out` when given; -1 when
// it cannot. `gated`: with kStartSignal blocked, for a process that calls waitForStart.
inline pid_t spawn(const std::vector<std::string>& args, const std::string& out = "", bool gated = false) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!out.empty()) {
    posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  if (gated) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, kStartSignal);
    posix_spawnattr_setsigmask(&attr, &set);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  }
  pid_t pid = -1;
  int failed = posix_spawn(&pid, argv[0], &actions, &attr, argv.data(), environ);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  return failed == 0 ? pid : -1;
}

// A gated client process, once loaded and set up: creates `readyPath`, then waits for the
// start signal. Loading LibTorch costs each bench process a large share of a second of CPU;
// without the line, the processes that start first are measured while the others load.
inline void waitForStart(const std::string& readyPath) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, kStartSignal);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::ofstream(readyPath).put('\n');
  int signal = 0;
  sigwait(&set, &signal);
}

// The parent: once every one of `pids` has created its ready file, sends each the start
// signal. False (nothing sent) when one ended first or `timeout` passed.
inline bool startWhenReady(const std::vector<pid_t>& pids, const std::vector<std::string>& readyPaths,
                           std::chrono::seconds timeout = std::chrono::seconds(300)) {
  auto end = std::chrono::steady_clock::now() + timeout;
  for (size_t i = 0; i < pids.size(); ++i) {
    while (!std::filesystem::exists(readyPaths[i])) {
      siginfo_t info{};
      bool ended = waitid(P_PID, static_cast<id_t>(pids[i]), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
                   info.si_pid == pids[i];
      if (ended || std::chrono::steady_clock::now() > end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  for (pid_t pid : pids) kill(pid, kStartSignal);
  return true;
}

// Spawns a gated process for each of `argvs` (stdout into outs[i] when `outs` is given), each
// to create readies[i] (stale ones are removed first) and wait for the start line, then starts
// them together. The pids; when one cannot be spawned or ends before it is ready, every one is
// killed (a caller's waitpid then sees it).
inline std::vector<pid_t> spawnTogether(const std::vector<std::vector<std::string>>& argvs,
                                        const std::vector<std::string>& readies,
                                        const std::vector<std::string>& outs = {}) {
  std::vector<pid_t> pids;
  bool spawned = true;
  for (size_t i = 0; i < argvs.size() && spawned; ++i) {
    std::filesystem::remove(readies[i]);
    pid_t pid = spawn(argvs[i], outs.empty() ? "" : outs[i], true);
    spawned = pid >= 0;
    if (spawned) pids.push_back(pid);
  }
  if (!spawned || !startWhenReady(pids, readies)) {
    for (pid_t pid : pids) kill(pid, SIGKILL);
  }
  return pids;
}

// Nanoseconds on the monotonic clock, which the processes of one machine share.
inline int64_t nowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

// CPU seconds (user and system) so far: RUSAGE_SELF, or RUSAGE_CHILDREN (those waited for).
inline double cpuSeconds(int who = RUSAGE_SELF) {
  rusage usage{};
  getrusage(who, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

}  // namespace muster::bench
