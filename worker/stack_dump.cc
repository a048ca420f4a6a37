// installStackDump: the handler is written for a signal context: only async-signal-safe
// calls (open, read, write, getdents64, tgkill, nanosleep, backtrace after a first call
// outside the handler, backtrace_symbols_fd), no allocation, no lock.
#include "worker/stack_dump.h"

#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "common/contract.h"

namespace muster::worker {
namespace {

int gFd = -1;
int gSignal = 0;
std::atomic<pid_t> gAsked{0};     // the thread the coordinator asked to dump itself
std::atomic<pid_t> gAnswered{0};  // the last thread that has
std::atomic<bool> gBusy{false};   // a roll-call is being answered

constexpr int kMaxFrames = 128;
constexpr int kThreadWaitMs = 100;  // per thread: one that does not answer is named and skipped
constexpr int kTotalWaitMs = 1500;  // in all, below launch's default deadline (3 s)

pid_t threadId() { return static_cast<pid_t>(syscall(SYS_gettid)); }

void put(const char* s, size_t n) {
  while (n > 0) {
    ssize_t w = write(gFd, s, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}
void put(const char* s) { put(s, strlen(s)); }
void putNumber(long v) {
  char buf[24];
  size_t i = sizeof buf;
  unsigned long u = v < 0 ? 0UL - static_cast<unsigned long>(v) : static_cast<unsigned long>(v);
  do {
    buf[--i] = static_cast<char>('0' + u % 10);
    u /= 10;
  } while (u != 0);
  if (v < 0) buf[--i] = '-';
  put(buf + i, sizeof buf - i);
}

// "/proc/self/task/<tid>/comm" into `path`.
void taskPath(char* path, size_t cap, pid_t tid, const char* leaf) {
  char digits[16];
  size_t n = 0;
  for (unsigned v = static_cast<unsigned>(tid); n == 0 || v != 0; v /= 10) digits[n++] = static_cast<char>('0' + v % 10);
  size_t at = 0;
  for (const char* p = "/proc/self/task/"; *p && at + 1 < cap; ++p) path[at++] = *p;
  while (n > 0 && at + 1 < cap) path[at++] = digits[--n];
  for (const char* p = leaf; *p && at + 1 < cap; ++p) path[at++] = *p;
  path[at] = '\0';
}

void threadName(pid_t tid, char* out, size_t cap) {
  char path[64];
  taskPath(path, sizeof path, tid, "/comm");
  out[0] = '\0';
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ssize_t n = read(fd, out, cap - 1);
  close(fd);
  if (n <= 0) return;
  out[n] = '\0';
  if (out[n - 1] == '\n') out[n - 1] = '\0';
}

// Where the signal interrupted the thread: the frames above it are the handler's own.
void* interruptedAt(void* context) {
  auto* uc = static_cast<ucontext_t*>(context);
#if defined(__x86_64__)
  return reinterpret_cast<void*>(uc->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
  return reinterpret_cast<void*>(uc->uc_mcontext.pc);
#else
  (void)uc;
  return nullptr;
#endif
}

void dumpThisThread(bool current, void* context) {
  void* frames[kMaxFrames];
  int n = backtrace(frames, kMaxFrames);
  int skip = 0;
  void* at = interruptedAt(context);
  for (int i = 0; i < n; ++i) {
    if (frames[i] == at) {
      skip = i;
      break;
    }
  }
  pid_t tid = threadId();
  char name[32];
  threadName(tid, name, sizeof name);
  put("Thread ");
  putNumber(tid);
  put(" (");
  put(name);
  put(current ? ") current:\n" : "):\n");
  backtrace_symbols_fd(frames + skip, n - skip, gFd);
  put("\n");
}

void sleepMs(long ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

struct Dirent64 {
  uint64_t ino;
  int64_t off;
  unsigned short reclen;
  unsigned char type;
  char name[1];
};

// Asks every other thread to dump itself, one at a time.
void dumpOtherThreads(pid_t self) {
  int dir = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return;
  alignas(8) char buf[4096];
  pid_t pid = getpid();
  int totalWaited = 0;
  for (;;) {
    long n = syscall(SYS_getdents64, dir, buf, sizeof buf);
    if (n <= 0) break;
    for (long off = 0; off < n;) {
      const auto* d = reinterpret_cast<const Dirent64*>(buf + off);
      off += d->reclen;
      pid_t tid = 0;
      const char* p = d->name;
      if (*p < '0' || *p > '9') continue;
      for (; *p >= '0' && *p <= '9'; ++p) tid = tid * 10 + (*p - '0');
      if (tid == self) continue;
      if (totalWaited >= kTotalWaitMs) {
        put("Thread ");
        putNumber(tid);
        put(" did not answer\n\n");  // not asked: the others took the time there was
        continue;
      }
      gAnswered.store(0);
      gAsked.store(tid);
      if (syscall(SYS_tgkill, pid, tid, gSignal) != 0) continue;  // it has exited
      int waited = 0;
      while (gAnswered.load() != tid && waited < kThreadWaitMs) {
        sleepMs(1);
        ++waited;
      }
      totalWaited += waited;
      if (gAnswered.load() != tid) {
        gAsked.store(0);  // if it answers later, it says nothing
        put("Thread ");
        putNumber(tid);
        put(" did not answer\n\n");
      }
    }
  }
  gAsked.store(0);
  close(dir);
}

void onSignal(int, siginfo_t* info, void* context) {
  int savedErrno = errno;
  pid_t self = threadId();
  if (info->si_code == SI_TKILL && info->si_pid == getpid()) {
    // The coordinator (another thread of ours) asks this thread for its stack.
    if (gAsked.load() == self) {
      dumpThisThread(false, context);
      gAnswered.store(self);
    }
    errno = savedErrno;
    return;
  }
  bool idle = false;
  if (gBusy.compare_exchange_strong(idle, true)) {
    dumpThisThread(true, context);
    dumpOtherThreads(self);
    put(contract::kStacksEnd.data(), contract::kStacksEnd.size());
    gBusy.store(false);
  }
  errno = savedErrno;
}

bool install() {
  const char* file = std::getenv(contract::kStacksFile);
  const char* signalText = std::getenv(contract::kStacksSignal);
  if (file == nullptr || signalText == nullptr || *file == '\0') return false;
  char* end = nullptr;
  long sig = std::strtol(signalText, &end, 10);
  if (end == signalText || *end != '\0' || sig < SIGRTMIN || sig > SIGRTMAX) return false;
  struct sigaction old {};
  if (sigaction(static_cast<int>(sig), nullptr, &old) != 0) return false;
  bool taken = (old.sa_flags & SA_SIGINFO) ? old.sa_sigaction != nullptr
                                           : (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN);
  if (taken) return false;  // faulthandler (a Python process) or the program's own
  int fd = open(file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  // backtrace() loads the unwinder on its first call: do that here, not in the handler.
  void* warm[4];
  backtrace(warm, 4);
  gFd = fd;
  gSignal = static_cast<int>(sig);
  struct sigaction action {};
  action.sa_sigaction = onSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_SIGINFO | SA_RESTART;
  if (sigaction(gSignal, &action, nullptr) != 0) {
    close(fd);
    gFd = -1;
    return false;
  }
  std::string ready = std::string(contract::kStacksReady) + std::to_string(getpid()) + " native\n";
  put(ready.data(), ready.size());
  return true;
}

// Installed as the program starts: nothing needs to call it.
[[maybe_unused]] const bool gInstalledAtStart = installStackDump();

}  // namespace

bool installStackDump() {
  static std::once_flag once;
  static bool installed = false;
  std::call_once(once, [] { installed = install(); });
  return installed;
}

void heartbeat() {
  static std::atomic<int64_t> last{0};
  static const char* fifo = std::getenv(contract::kProgressFifo);
  if (fifo == nullptr || *fifo == '\0') return;
  int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                    std::chrono::steady_clock::now().time_since_epoch()).count();
  int64_t before = last.load();
  if (now - before < 1000 || !last.compare_exchange_strong(before, now)) return;
  // A FileTimerClient release request of a scope no one holds: torchrun's server ignores it.
  std::string line = "{\"version\": 1, \"pid\": " + std::to_string(getpid()) + ", \"scope_id\": \"" +
                     std::string(contract::kHeartbeatScope) + "\", \"expiration_time\": -1, \"signal\": 0}\n";
  int fd = open(fifo, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return;  // launch is not reading (gone): nothing to tell
  ssize_t ignored = write(fd, line.data(), line.size());
  (void)ignored;
  close(fd);
}

}  // namespace muster::worker
