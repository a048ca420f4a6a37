// descendantsOf's two ways over a real tree of processes: the children files and the scan of
// /proc find the same live processes, leave out zombies and the excepted subtree, and follow
// a process that left its session (setsid) and whose parent died.
#include "launcher/processes.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

#include "absl/status/status.h"
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace muster::launcher {
namespace {

// A child that sleeps until killed, and dies with the thread that forked it unless told not to
// (a thread's child, which must outlive its thread).
pid_t sleeper(bool dieWithThread = true) {
  pid_t pid = fork();
  if (pid == 0) {
    if (dieWithThread) prctl(PR_SET_PDEATHSIG, SIGKILL);
    execl("/bin/sleep", "sleep", "60", nullptr);
    _exit(127);
  }
  return pid;
}

// Reads a pid the child wrote to the pipe.
pid_t readPid(int fd) {
  pid_t pid = 0;
  EXPECT_EQ(read(fd, &pid, sizeof(pid)), static_cast<ssize_t>(sizeof(pid)));
  return pid;
}

// A sleeper with a sleeping child of its own; `child` gets the child's pid.
pid_t sleeperWithChild(pid_t* child) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    pid_t c = sleeper();
    (void)!write(fds[1], &c, sizeof(c));
    execl("/bin/sleep", "sleep", "60", nullptr);
    _exit(127);
  }
  *child = readPid(fds[0]);
  close(fds[0]);
  close(fds[1]);
  return pid;
}

std::vector<pid_t> sorted(std::vector<pid_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// Whether this kernel lists children per thread (CONFIG_PROC_CHILDREN): then the walk down
// must be the one taken.
bool kernelListsChildren() {
  return access(("/proc/self/task/" + std::to_string(gettid()) + "/children").c_str(), R_OK) == 0;
}

// The two ways, and descendantsOf, all giving `want`.
void expectBothWays(pid_t root, pid_t except, const std::vector<pid_t>& want) {
  EXPECT_EQ(sorted(descendantsByScan(root, except)), want);
  auto children = descendantsByChildren(root, except);
  if (kernelListsChildren()) {
    ASSERT_TRUE(children.ok()) << children.status();
    EXPECT_EQ(sorted(*children), want);
  } else {
    EXPECT_TRUE(absl::IsUnimplemented(children.status())) << children.status();
  }
  auto below = descendantsOf(root, except);
  ASSERT_TRUE(below.ok()) << below.status();
  EXPECT_EQ(sorted(*below), want);
}

// Kills what a test started, whatever way it ends.
struct KillAll {
  std::vector<pid_t> pids;
  ~KillAll() {
    for (pid_t p : pids) kill(p, SIGKILL);
    while (waitpid(-1, nullptr, WNOHANG) > 0) {
    }
  }
};

TEST(Processes, BothWaysFindTheSameTreeWithoutZombiesOrTheExceptedOne) {
  // Orphans come back to this process rather than init, as they do to launch.
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  // a: a sleeper with a child of its own (a -> b).
  pid_t b = 0;
  pid_t a = sleeperWithChild(&b);
  // d: a daemon whose parent exited after setsid: it was adopted by this process.
  int pipeD[2];
  ASSERT_EQ(pipe(pipeD), 0);
  pid_t shell = fork();
  if (shell == 0) {
    pid_t d = fork();
    if (d == 0) {
      setsid();
      execl("/bin/sleep", "sleep", "60", nullptr);
      _exit(127);
    }
    (void)!write(pipeD[1], &d, sizeof(d));
    _exit(0);
  }
  pid_t d = readPid(pipeD[0]);
  ASSERT_EQ(waitpid(shell, nullptr, 0), shell);
  // z: a zombie (exited, not reaped).
  pid_t z = fork();
  if (z == 0) _exit(0);
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, z, &info, WEXITED | WNOWAIT), 0);
  // e: the excepted one (the orphan guard, in launch), with a child below it.
  pid_t f = 0;
  pid_t e = sleeperWithChild(&f);
  KillAll cleanup{{a, b, d, e, f}};
  // t: a child forked by another thread of this process. The kernel lists it under that
  // thread, and under a thread still there once that one has ended.
  pid_t t = 0;
  std::thread forker([&] { t = sleeper(false); });
  forker.join();
  cleanup.pids.push_back(t);
  std::vector<pid_t> want = sorted({a, b, d, t});
  expectBothWays(getpid(), e, want);
  auto scan = descendantsByScan(getpid(), e);
  EXPECT_EQ(std::count(scan.begin(), scan.end(), f), 0);

  // While a thread that forked is still running, its child is listed under it.
  int started[2], done[2];
  ASSERT_EQ(pipe(started), 0);
  ASSERT_EQ(pipe(done), 0);
  pid_t u = 0;
  std::thread holder([&] {
    u = sleeper(false);
    char c;
    (void)!write(started[1], "x", 1);
    (void)!read(done[0], &c, 1);  // until the main thread says
  });
  char c;
  ASSERT_EQ(read(started[0], &c, 1), 1);
  cleanup.pids.push_back(u);
  expectBothWays(getpid(), e, sorted({a, b, d, t, u}));
  (void)!write(done[1], "x", 1);
  holder.join();
  expectBothWays(getpid(), e, sorted({a, b, d, t, u}));

  ASSERT_EQ(waitpid(z, nullptr, 0), z);
  prctl(PR_SET_CHILD_SUBREAPER, 0);
}

TEST(Processes, AProcessWithNoChildrenHasNoDescendants) {
  pid_t s = sleeper();
  expectBothWays(s, 0, {});
  kill(s, SIGKILL);
  waitpid(s, nullptr, 0);
  // A process that is gone has none either, and no error.
  expectBothWays(s, 0, {});
}

}  // namespace
}  // namespace muster::launcher
