// spawnProcess: _Fork (no atfork handlers: gRPC's are not for this) with all signals blocked;
// the child calls only async-signal-safe functions before execve.
#include "launcher/spawn.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace muster::launcher {
namespace {

}  // namespace

std::string errnoText(int err) {
  if (err == EMFILE || err == ENFILE) {
    rlimit files{};
    getrlimit(RLIMIT_NOFILE, &files);
    return fmt::format("{} (launch holds a few descriptors per worker; the limit is {}: raise it with "
                       "`ulimit -n`, or start fewer workers per node)",
                       std::strerror(err), static_cast<unsigned long long>(files.rlim_cur));
  }
  return std::strerror(err);
}

namespace {

// In the child: makes `from` the descriptor `to`, kept across exec.
bool moveTo(int from, int to) {
  if (from == to) return fcntl(to, F_SETFD, 0) == 0;
  return dup2(from, to) == to;
}

// Tells the parent why exec did not happen, and ends the child.
[[noreturn]] void failChild(int report, int e) {
  (void)!write(report, &e, sizeof(e));
  _exit(127);
}

[[noreturn]] void child(const SpawnRequest& r, char* const* argv, char* const* envp, int in, int out,
                        int err, int report, pid_t parent) {
  auto fail = [report](int e) { failChild(report, e); };
  // Every disposition to the default, through the kernel's call: glibc's sigaction refuses
  // its own signals (32, 33), and an ignored one is inherited across exec.
  struct {
    void* handler;
    unsigned long flags;
    void* restorer;
    unsigned long mask;
  } dfl{};  // the kernel's struct sigaction (x86-64, arm64), SIG_DFL
  for (int s = 1; s < NSIG; ++s) {
    if (s != SIGKILL && s != SIGSTOP) syscall(SYS_rt_sigaction, s, &dfl, nullptr, sizeof(dfl.mask));
  }
  if (setpgid(0, 0) != 0) fail(errno);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);  // launch died before the death signal was armed
  if (r.files) setrlimit(RLIMIT_NOFILE, &*r.files);
  // The three targets may be among the sources: move them above 2 first.
  int fds[3] = {in, out, err};
  for (int& fd : fds) {
    if (fd <= 2) {
      int copy = fcntl(fd, F_DUPFD_CLOEXEC, 3);
      if (copy < 0) fail(errno);
      fd = copy;
    }
  }
  for (int target = 0; target < 3; ++target) {
    if (!moveTo(fds[target], target)) fail(errno);
  }
  // Nothing else crosses exec (as Python's subprocess, torchrun's, with close_fds).
  close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  execve(r.path.c_str(), argv, envp);
  failChild(report, errno);
}

}  // namespace

absl::StatusOr<pid_t> spawnProcess(const SpawnRequest& r) {
  auto error = [&](const char* what, int err) {
    return absl::InternalError(fmt::format("{}: {}", what, errnoText(err)));
  };
  // Everything the child needs is made before the fork: it may not allocate.
  std::vector<char*> argv, envp;
  for (const auto& a : r.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : r.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  int devNull = -1;
  if (r.stdinFd < 0 || r.stdoutFd < 0 || r.stderrFd < 0) {
    devNull = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (devNull < 0) return error("/dev/null", errno);
  }
  auto pick = [&](int fd) { return fd < 0 ? devNull : fd; };
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) {
    int e = errno;
    if (devNull >= 0) close(devNull);
    return error("pipe", e);
  }
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pid_t parent = getpid();
  pid_t pid = _Fork();
  if (pid == 0) child(r, argv.data(), envp.data(), pick(r.stdinFd), pick(r.stdoutFd), pick(r.stderrFd), report[1], parent);
  int forkErr = errno;
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  close(report[1]);
  if (devNull >= 0) close(devNull);
  if (pid < 0) {
    close(report[0]);
    return error("fork", forkErr);
  }
  int execErr = 0;
  ssize_t got;
  do {
    got = read(report[0], &execErr, sizeof(execErr));
  } while (got < 0 && errno == EINTR);
  close(report[0]);
  if (got == sizeof(execErr)) {
    waitpid(pid, nullptr, 0);  // it exits at once
    return absl::InternalError(errnoText(execErr));
  }
  return pid;
}

}  // namespace muster::launcher
