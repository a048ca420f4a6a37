// Reaper: the guard reads +pgid/-pgid records from a pipe; at EOF it SIGKILLs what is left.
#include "launcher/reaper.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace muster::launcher {
namespace {

// Runs in the forked guard: only async-signal-safe calls, no allocation but mmap's (the list
// of groups grows with mremap, as far as memory allows).
[[noreturn]] void guardMain(int fd) {
  // Keep running through the signals that stop launch: the guard's job starts then.
  signal(SIGINT, SIG_IGN);
  signal(SIGTERM, SIG_IGN);
  signal(SIGHUP, SIG_IGN);
  signal(SIGQUIT, SIG_IGN);
  signal(SIGPIPE, SIG_IGN);
  signal(SIGUSR1, SIG_IGN);  // notices (Slurm's --signal) that launch forwards to the workers
  signal(SIGUSR2, SIG_IGN);
  // Leave launch's process group, so that a signal sent to that group (a terminal's Ctrl-C)
  // does not reach the guard while launch is still there to handle it.
  setpgid(0, 0);
  // Every descriptor but the pipe, however high the limit.
  if (fd > 3) close_range(3, static_cast<unsigned>(fd) - 1, 0);
  close_range(static_cast<unsigned>(fd) + 1, ~0U, 0);
  size_t capacity = 4096, count = 0;
  auto* groups = static_cast<int32_t*>(
      mmap(nullptr, capacity * sizeof(int32_t), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (groups == MAP_FAILED) _exit(1);
  int32_t record;
  while (true) {
    ssize_t got = read(fd, &record, sizeof(record));
    if (got == sizeof(record)) {
      if (record > 0 && count == capacity) {
        void* bigger = mremap(groups, capacity * sizeof(int32_t), 2 * capacity * sizeof(int32_t), MREMAP_MAYMOVE);
        if (bigger != MAP_FAILED) {
          groups = static_cast<int32_t*>(bigger);
          capacity *= 2;
        }
      }
      if (record > 0 && count < capacity) {
        groups[count++] = record;
      } else if (record < 0) {
        for (size_t i = 0; i < count; ++i) {
          if (groups[i] == -record) {
            groups[i] = groups[--count];
            break;
          }
        }
      }
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    break;  // EOF: launch is gone
  }
  for (size_t i = 0; i < count; ++i) kill(-groups[i], SIGKILL);
  _exit(0);
}

}  // namespace

absl::Status Reaper::start() {
  int fds[2];
  if (pipe(fds) != 0) return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) {
    close(fds[1]);
    guardMain(fds[0]);
  }
  close(fds[0]);
  fcntl(fds[1], F_SETFD, FD_CLOEXEC);
  fd_ = fds[1];
  pid_ = pid;
  return absl::OkStatus();
}

void Reaper::watch(pid_t pgid) {
  int32_t record = static_cast<int32_t>(pgid);
  if (fd_ >= 0) (void)!write(fd_, &record, sizeof(record));
}

void Reaper::forget(pid_t pgid) {
  int32_t record = -static_cast<int32_t>(pgid);
  if (fd_ >= 0) (void)!write(fd_, &record, sizeof(record));
}

}  // namespace muster::launcher
