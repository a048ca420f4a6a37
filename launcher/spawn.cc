// spawnProcess: clone(CLONE_VM | CLONE_VFORK) with every signal blocked, as posix_spawn: the
// child runs on a stack of its own in launch's memory until execve, so no page table is copied
// (a fork of launch, with gRPC's threads and mappings, cost about 0.6 ms a worker); launch's
// calling thread waits until the child has exec'd or exited. The child makes the kernel's calls
// through syscall(2), not libc's wrappers: a sanitizer intercepts some of those (ThreadSanitizer:
// dup2, prctl, sigprocmask, _exit) and would keep its books, which are launch's in this shared
// memory, for the child. Of launch's memory it writes its own stack, the exec error it
// reports, the calling thread's errno (it runs on that thread's TLS), and on a first call the
// lazy binding of the functions it calls: the same values launch would write, while the only
// thread that could read them waits.
#include "launcher/spawn.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <signal.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include <fmt/format.h>

namespace muster::launcher {

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

// The child's code runs on its own small stack in launch's memory, with launch's thread's
// thread-local state, until it execs: a sanitizer's bookkeeping there would be the parent
// thread's (ASan's stack bounds and fake frames: "ASan is ignoring requested
// __asan_handle_no_return" under tests/sanitize.sh), so none of it is instrumented.
#define MUSTER_CHILD_CODE __attribute__((no_sanitize("address", "undefined", "thread"), noinline))

// In the child: makes `from` the descriptor `to`, kept across exec.
MUSTER_CHILD_CODE bool moveTo(int from, int to) {
  if (from == to) return syscall(SYS_fcntl, to, F_SETFD, 0) == 0;
  return syscall(SYS_dup3, from, to, 0) == to;
}

// What the child gets, and where it says why exec did not happen.
struct ChildArgs {
  const char* path;      // plain values: the child calls none of the request's (instrumented)
  const rlimit* files;   // member functions
  char* const* argv;
  char* const* envp;
  int in, out, err;
  pid_t parent;
  volatile int execErr;  // written by the child (in launch's memory) before it exits
};

[[noreturn]] MUSTER_CHILD_CODE void exitChild() {
  syscall(SYS_exit_group, 127);
  __builtin_unreachable();
}

// Says why exec did not happen, and ends the child.
[[noreturn]] MUSTER_CHILD_CODE void failChild(ChildArgs& a, int e) {
  a.execErr = e;
  exitChild();
}

[[noreturn]] MUSTER_CHILD_CODE void child(ChildArgs& a) {
  int in = a.in, out = a.out, err = a.err;
  pid_t parent = a.parent;
  char* const* argv = a.argv;
  char* const* envp = a.envp;
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
  if (syscall(SYS_setpgid, 0, 0) != 0) failChild(a, errno);
  syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  if (syscall(SYS_getppid) != parent) exitChild();  // launch died before the death signal was armed
  if (a.files) syscall(SYS_prlimit64, 0, RLIMIT_NOFILE, a.files, nullptr);
  // The three targets may be among the sources: move them above 2 first.
  int fds[3] = {in, out, err};
  for (int& fd : fds) {
    if (fd <= 2) {
      long copy = syscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, 3);
      if (copy < 0) failChild(a, errno);
      fd = static_cast<int>(copy);
    }
  }
  for (int target = 0; target < 3; ++target) {
    if (!moveTo(fds[target], target)) failChild(a, errno);
  }
  // Nothing else crosses exec (as Python's subprocess, torchrun's, with close_fds).
  syscall(SYS_close_range, 3, ~0U, CLOSE_RANGE_CLOEXEC);
  uint64_t none = 0;
  syscall(SYS_rt_sigprocmask, SIG_SETMASK, &none, nullptr, sizeof(none));
  syscall(SYS_execve, a.path, argv, envp);
  failChild(a, errno);
}

MUSTER_CHILD_CODE int childMain(void* args) { child(*static_cast<ChildArgs*>(args)); }

// The child's stack: what child() and execve's wrapper need (with a first call's lazy binding,
// about 12 KiB), with room to spare; below it a page that faults rather than let an overflow
// write into another mapping.
constexpr size_t kChildStack = 64 * 1024;
constexpr size_t kGuard = 4096;

// Every signal blocked, glibc's own two (32, 33) too, which pthread_sigmask leaves open.
void blockEverySignal(sigset_t* old) {
  uint64_t all = ~uint64_t{0};
  syscall(SYS_rt_sigprocmask, SIG_SETMASK, &all, old, sizeof(all));
}

// glibc's clone. ThreadSanitizer (GCC 12's) intercepts clone() and takes it for a fork: in a
// CLONE_VM child its bookkeeping of the fork is launch's own, which then counts as a process
// forked while it had threads (every thread it starts after that ends it, "starting new threads
// after multi-threaded fork"). The child runs nothing instrumented, so TSan need not see it.
using CloneFn = int (*)(int (*)(void*), void*, int, void*, ...);
CloneFn libcClone() {
#if defined(__SANITIZE_THREAD__)
  static const CloneFn fn =
      reinterpret_cast<CloneFn>(dlsym(dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD), "clone"));
  return fn;
#else
  return &clone;
#endif
}

}  // namespace

absl::StatusOr<pid_t> spawnProcess(const SpawnRequest& r) {
  auto error = [&](const char* what, int err) {
    return absl::InternalError(fmt::format("{}: {}", what, errnoText(err)));
  };
  // Everything the child needs is made before the clone: it may not allocate.
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
  void* stack = mmap(nullptr, kGuard + kChildStack, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK | MAP_NORESERVE, -1, 0);
  if (stack == MAP_FAILED) {
    int e = errno;
    if (devNull >= 0) close(devNull);
    return error("mmap", e);
  }
  mprotect(stack, kGuard, PROT_NONE);
  ChildArgs args{r.path.c_str(), r.files ? &*r.files : nullptr, argv.data(), envp.data(), pick(r.stdinFd), pick(r.stdoutFd), pick(r.stderrFd),
                 getpid(), 0};
  sigset_t old;
  blockEverySignal(&old);
  // Returns once the child has exec'd or exited (CLONE_VFORK).
  pid_t pid = libcClone()(childMain, static_cast<char*>(stack) + kGuard + kChildStack,
                    CLONE_VM | CLONE_VFORK | SIGCHLD, &args);
  int cloneErr = errno;
  syscall(SYS_rt_sigprocmask, SIG_SETMASK, &old, nullptr, sizeof(uint64_t));
  munmap(stack, kGuard + kChildStack);
  if (devNull >= 0) close(devNull);
  if (pid < 0) return error("fork", cloneErr);
  if (int execErr = args.execErr; execErr != 0) {
    waitpid(pid, nullptr, 0);  // it has exited
    return absl::InternalError(errnoText(execErr));
  }
  return pid;
}

}  // namespace muster::launcher
