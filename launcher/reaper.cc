// Reaper: the guard reads +pgid/-pgid records from a pipe; at EOF it SIGKILLs what is left and
// removes launch's runtime folder.
#include "launcher/reaper.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <ctime>

#include "absl/strings/str_cat.h"

namespace muster::launcher {
namespace {

// Removes everything under the folder open at `dirFd` (which it closes), depth first, with
// system calls only (getdents64, unlinkat): async-signal-safe, no allocation. Reads the folder to
// its end, then again from its start while a pass removed something (at most 64 passes: a
// writer that keeps making files does not hold the guard). Returns false when something could
// not be removed (a file a dying worker made meanwhile: the caller tries again). Folders deeper
// than `depth` are left.
bool removeContents(int dirFd, int depth) {
  bool all = true;
  alignas(8) char buf[4096];
  bool removed = false;
  for (int pass = 0; pass < 64;) {
    long got = syscall(SYS_getdents64, dirFd, buf, sizeof(buf));
    if (got <= 0) {
      // The end of this pass: again from the start only if it removed something.
      if (got < 0 || !removed) break;
      removed = false;
      all = true;
      ++pass;
      lseek(dirFd, 0, SEEK_SET);
      continue;
    }
    for (long off = 0; off < got;) {
      auto* entry = reinterpret_cast<struct dirent64*>(buf + off);
      off += entry->d_reclen;
      const char* name = entry->d_name;
      if (name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0'))) continue;
      if (unlinkat(dirFd, name, 0) == 0 || errno == ENOENT) {
        removed = true;
        continue;
      }
      if (errno != EISDIR && errno != EPERM) {
        all = false;
        continue;
      }
      int sub = depth > 0 ? openat(dirFd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
      if (sub < 0 || !removeContents(sub, depth - 1) || unlinkat(dirFd, name, AT_REMOVEDIR) != 0) {
        all = false;
      } else {
        removed = true;
      }
    }
  }
  close(dirFd);
  return all;
}

void removeTree(const char* path) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return;  // gone already (launch removed it)
    if (removeContents(fd, 16) && rmdir(path) == 0) return;
    struct timespec pause = {0, 100 * 1000 * 1000};  // a killed worker may still be on its way out
    nanosleep(&pause, nullptr);
  }
}

// Runs in the forked guard: only async-signal-safe calls, no allocation but mmap's (the list
// of groups grows with mremap, as far as memory allows).
[[noreturn]] void guardMain(int fd, const char* removeAtEnd) {
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
  if (removeAtEnd[0] != '\0') removeTree(removeAtEnd);
  _exit(0);
}

}  // namespace

absl::Status Reaper::start(const std::string& removeAtEnd) {
  int fds[2];
  if (pipe(fds) != 0) return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) {
    close(fds[1]);
    guardMain(fds[0], removeAtEnd.c_str());
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
