// spawnProcess with real programs: what the child gets (descriptors, signals, process group,
// limit), exec's failures reported back, and spawning while another thread allocates (the
// child shares launch's memory until exec).
#include "launcher/spawn.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace muster::launcher {
namespace {

extern "C" char** environ;

std::vector<std::string> environment() {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  return env;
}

// Runs `argv` with its stdout on a pipe; returns what it wrote and its exit code.
std::pair<std::string, int> output(const std::vector<std::string>& argv, SpawnRequest r = {}) {
  int out[2];
  EXPECT_EQ(pipe2(out, O_CLOEXEC), 0);
  r.path = argv[0];
  r.argv = argv;
  r.env = environment();
  r.stdoutFd = out[1];
  auto pid = spawnProcess(r);
  close(out[1]);
  std::string text;
  if (pid.ok()) {
    char buffer[4096];
    ssize_t got;
    while ((got = read(out[0], buffer, sizeof(buffer))) > 0) text.append(buffer, got);
  }
  close(out[0]);
  int status = 0;
  if (!pid.ok()) {
    ADD_FAILURE() << pid.status();
    return {text, -1};
  }
  EXPECT_EQ(waitpid(*pid, &status, 0), *pid);
  return {text, WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)};
}

std::string statusLine(const std::string& status, const std::string& name) {
  auto at = status.find(name + ":");
  if (at == std::string::npos) return "";
  auto end = status.find('\n', at);
  std::string line = status.substr(at + name.size() + 1, end - at - name.size() - 1);
  return line.substr(line.find_first_not_of(" \t"));
}

TEST(Spawn, TheChildHasDescriptors0To2OnlyDefaultSignalsAndAGroupOfItsOwn) {
  // A descriptor of ours without close-on-exec, an ignored and a blocked signal: none reaches
  // the child.
  int leaked = open("/dev/null", O_RDONLY);
  ASSERT_GE(leaked, 3);
  struct sigaction ignore{};
  ignore.sa_handler = SIG_IGN;
  struct sigaction was{};
  sigaction(SIGUSR1, &ignore, &was);
  sigset_t usr2, mask;
  sigemptyset(&usr2);
  sigaddset(&usr2, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &usr2, &mask);

  auto [fds, code] = output({"/bin/ls", "-1", "/proc/self/fd"});
  EXPECT_EQ(code, 0);
  EXPECT_EQ(fds, "0\n1\n2\n3\n") << "3 is ls's own listing of the folder";
  auto [status, code2] = output({"/bin/cat", "/proc/self/status"});
  EXPECT_EQ(code2, 0);
  EXPECT_EQ(statusLine(status, "SigIgn"), "0000000000000000");
  EXPECT_EQ(statusLine(status, "SigBlk"), "0000000000000000");

  pthread_sigmask(SIG_SETMASK, &mask, nullptr);
  sigaction(SIGUSR1, &was, nullptr);
  close(leaked);

  SpawnRequest r;
  r.path = "/bin/sleep";
  r.argv = {"sleep", "30"};
  auto pid = spawnProcess(r);
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(getpgid(*pid), *pid);
  kill(*pid, SIGKILL);
  waitpid(*pid, nullptr, 0);
}

TEST(Spawn, TheDescriptorLimitAndTheOutputsAreWhatWasAsked) {
  SpawnRequest r;
  r.files = rlimit{77, 77};
  auto [limit, code] = output({"/bin/sh", "-c", "ulimit -n; echo to-stderr >&2"}, r);
  EXPECT_EQ(code, 0);
  EXPECT_EQ(limit, "77\n");  // stderr went to /dev/null, not the pipe

  // stdout and stderr both on one pipe, given as the same descriptor.
  int pipeFds[2];
  ASSERT_EQ(pipe2(pipeFds, O_CLOEXEC), 0);
  SpawnRequest both;
  both.path = "/bin/sh";
  both.argv = {"sh", "-c", "echo out; echo err >&2"};
  both.stdoutFd = pipeFds[1];
  both.stderrFd = pipeFds[1];
  auto pid = spawnProcess(both);
  close(pipeFds[1]);
  ASSERT_TRUE(pid.ok()) << pid.status();
  std::string text;
  char buffer[256];
  ssize_t got;
  while ((got = read(pipeFds[0], buffer, sizeof(buffer))) > 0) text.append(buffer, got);
  close(pipeFds[0]);
  waitpid(*pid, nullptr, 0);
  EXPECT_EQ(text, "out\nerr\n");
}

TEST(Spawn, ExecFailuresComeBackAsTheReason) {
  SpawnRequest r;
  r.path = "/nonexistent/program";
  r.argv = {"program"};
  auto missing = spawnProcess(r);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("No such file or directory"), std::string::npos)
      << missing.status();

  // An executable file that is no program: ENOEXEC from execve, in the child.
  char path[] = "/tmp/spawn_test_XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "\x7f\x45\x4c\x46garbage", 11), 11);
  close(fd);
  chmod(path, 0755);
  r.path = path;
  auto garbage = spawnProcess(r);
  unlink(path);
  ASSERT_FALSE(garbage.ok());
  EXPECT_NE(garbage.status().message().find("Exec format error"), std::string::npos)
      << garbage.status();
  // The failed child was reaped: nothing is left to wait for.
  EXPECT_EQ(waitpid(-1, nullptr, WNOHANG), -1);
}

TEST(Spawn, ManyWhileAnotherThreadAllocates) {
  // The child runs in this process's memory until exec: another thread's malloc and free
  // meanwhile must not disturb it, nor it them.
  std::atomic<bool> stop{false};
  std::thread churn([&] {
    std::vector<std::unique_ptr<char[]>> blocks(64);
    for (size_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
      blocks[i % blocks.size()] = std::make_unique<char[]>(64 + i % 4096);
    }
  });
  int failed = 0;
  for (int i = 0; i < 200; ++i) {
    SpawnRequest r;
    r.path = "/bin/true";
    r.argv = {"true"};
    auto pid = spawnProcess(r);
    if (!pid.ok()) {
      ++failed;
      continue;
    }
    int status = 0;
    waitpid(*pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  stop = true;
  churn.join();
  EXPECT_EQ(failed, 0);
}

}  // namespace
}  // namespace muster::launcher
