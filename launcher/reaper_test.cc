// The orphan guard with real processes: a process group it was told about dies with launch
// (here: a forked stand-in for launch that exits), however many groups it holds.
#include "launcher/reaper.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

namespace muster::launcher {
namespace {

bool alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  auto close = text.rfind(')');
  return close != std::string::npos && text.size() > close + 2 && text[close + 2] != 'Z';
}

bool goneWithin(pid_t pid, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!alive(pid)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

// A sleeping process in a group of its own (not this test's child: the stand-in's).
pid_t sleeperGroup() {
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    execl("/bin/sleep", "sleep", "60", nullptr);
    _exit(127);
  }
  setpgid(pid, pid);
  return pid;
}

// The guard once kept 4096 groups and dropped the rest: with 5000 records of which 4999 are
// withdrawn, the one left was never killed.
TEST(Reaper, KillsAGroupRecordedAfterMoreThan4096Others) {
  int pipeFds[2];
  ASSERT_EQ(pipe(pipeFds), 0);
  pid_t standIn = fork();
  if (standIn == 0) {
    close(pipeFds[0]);
    Reaper reaper;
    if (!reaper.start().ok()) _exit(2);
    pid_t group = sleeperGroup();
    for (int i = 0; i < 5000; ++i) reaper.watch(group);
    for (int i = 0; i < 4999; ++i) reaper.forget(group);
    (void)!write(pipeFds[1], &group, sizeof(group));
    pause();  // until the test kills this stand-in for launch
    _exit(0);
  }
  close(pipeFds[1]);
  pid_t group = 0;
  ASSERT_EQ(read(pipeFds[0], &group, sizeof(group)), static_cast<ssize_t>(sizeof(group)));
  close(pipeFds[0]);
  ASSERT_TRUE(alive(group));
  kill(standIn, SIGKILL);  // kill -9 of launch
  waitpid(standIn, nullptr, 0);
  EXPECT_TRUE(goneWithin(group, std::chrono::milliseconds(20000))) << "the guard did not kill group " << group;
  kill(-group, SIGKILL);
}

}  // namespace
}  // namespace muster::launcher
