// WorkerGroup: spawnProcess starts; SIGCHLD reaps; asio pumps the pipes.
#include "launcher/worker_group.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <utility>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

#include "common/limits.h"
#include "common/log.h"
#include "launcher/console.h"
#include "launcher/processes.h"
#include "launcher/spawn.h"

namespace muster::launcher {
namespace asio = boost::asio;

namespace {

auto logger() {
  static auto l = log::get("launch");
  return l;
}

// The descriptor limit launch started with: launch raises its own soft limit (it serves a
// connection per rank), workers get back the one they would have had.
rlimit gWorkerFiles{RLIM_INFINITY, RLIM_INFINITY};
bool gRestoreFiles = false;

int openLog(const std::string& path) {
  return open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
}

// 0, or the errno that stopped the write (with *lost the bytes not written).
int writeAll(int fd, const char* data, size_t size, size_t* lost = nullptr) {
  while (size > 0) {
    ssize_t n = write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (lost) *lost = size;
      return n < 0 ? errno : EIO;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return 0;
}

}  // namespace

void raiseFileLimit() {
  if (auto before = raiseDescriptorLimit()) {
    gWorkerFiles = *before;
    gRestoreFiles = true;
  }
}

std::string signalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", sig);
}

// One pipe from a worker: lines go to the console (prefixed) and/or a file; stderr's last
// lines are kept for the failure report.
struct WorkerGroup::Pump {
  Pump(asio::io_context& io, int fd) : stream(io, fd) {}
  asio::posix::stream_descriptor stream;
  WorkerGroup* group = nullptr;
  WorkerState* worker = nullptr;
  bool isErr = false;
  ConsoleStream* console = nullptr;  // launch's stdout or stderr, or none
  bool consoleGone = false;          // its reader went away
  int fileFd = -1;
  std::string filePath;
  std::string prefix;
  std::string partial;
  std::shared_ptr<int> filteredFd;  // --duplicate_*_filters' file, or null
  const std::vector<std::string>* filters = nullptr;
  std::array<char, 65536> buffer;

  ~Pump() {
    if (fileFd >= 0) close(fileFd);
  }

  // True when nothing but the console wanted this stream and the console's reader is gone:
  // the worker should then see a closed pipe itself, as if it wrote to the console directly.
  bool unwanted() const { return consoleGone && fileFd < 0 && !filteredFd && !isErr; }

  void line(const char* data, size_t size, bool newline) {
    if (console != nullptr && !consoleGone) {
      std::string out = prefix;
      out.append(data, size);
      if (newline) out += '\n';
      if (!console->write(std::move(out))) consoleGone = true;
    }
    if (filteredFd && *filteredFd >= 0 && filters != nullptr) {
      std::string_view text(data, size);
      bool match = std::any_of(filters->begin(), filters->end(), [&](const std::string& needle) {
        return text.find(needle) != std::string_view::npos;
      });
      if (match) {
        std::string out = prefix;
        out.append(data, size);
        out += '\n';
        size_t lost = 0;
        if (int err = writeAll(*filteredFd, out.data(), out.size(), &lost); err != 0) {
          group->logLost(isErr ? "filtered_stderr.log" : "filtered_stdout.log", err, lost);
        }
      }
    }
    if (isErr && worker != nullptr) {
      constexpr size_t kMaxLine = 4096;
      worker->lastErrLines.emplace_back(data, std::min(size, kMaxLine));
      if (worker->lastErrLines.size() > kTailLines) worker->lastErrLines.pop_front();
    }
  }

  void consume(size_t n) {
    if (worker != nullptr) worker->lastOutput = std::chrono::steady_clock::now();
    if (group->outputCallback_) group->outputCallback_();
    if (fileFd >= 0) {
      size_t lost = 0;
      if (int err = writeAll(fileFd, buffer.data(), n, &lost); err != 0) group->logLost(filePath, err, lost);
    }
    partial.append(buffer.data(), n);
    size_t start = 0, nl;
    while ((nl = partial.find('\n', start)) != std::string::npos) {
      line(partial.data() + start, nl - start, true);
      start = nl + 1;
    }
    partial.erase(0, start);
    // A very long line without a newline is passed on in pieces.
    if (partial.size() > 65536) {
      line(partial.data(), partial.size(), false);
      partial.clear();
    }
  }

  void finish() {
    if (!partial.empty()) line(partial.data(), partial.size(), true);
    partial.clear();
  }
};

WorkerGroup::WorkerGroup(asio::io_context& io, Reaper& reaper, ExitHandler onExit, Consoles consoles)
    : io_(io), reaper_(reaper), onExit_(std::move(onExit)), consoles_(consoles) {}

void WorkerGroup::logLost(const std::string& file, int err, size_t bytes) {
  auto& loss = logLosses_[file];
  if (loss.bytes == 0 && loss.error.empty()) {
    // Once per file, at once: the rest is counted for the end-of-job summary.
    logger()->warn("cannot write the log {}: {}; its output is being lost", file, std::strerror(err));
    loss.error = std::strerror(err);
  }
  loss.bytes += bytes;
}

WorkerGroup::~WorkerGroup() {
  for (auto& w : workers_) {
    if (w->pid > 0 && !w->groupDone) {
      kill(-w->pid, SIGKILL);
      // Never wait here: a worker stuck in the kernel (state D) would hold launch. One that
      // exits later is reaped as an orphan (Agent::reapOrphans), or by init after launch.
      if (!w->exit) waitpid(w->pid, nullptr, WNOHANG);
      reaper_.forget(w->pid);
    }
  }
}

namespace {

// A descriptor closed when it goes out of scope, unless released.
struct OwnedFd {
  int fd = -1;
  OwnedFd() = default;
  explicit OwnedFd(int f) : fd(f) {}
  OwnedFd(const OwnedFd&) = delete;
  OwnedFd& operator=(const OwnedFd&) = delete;
  ~OwnedFd() {
    if (fd >= 0) close(fd);
  }
  int release() { return std::exchange(fd, -1); }
};

// A pipe whose ends close themselves.
absl::Status makePipe(OwnedFd& read, OwnedFd& write) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    int err = errno;
    return absl::Status(absl::ErrnoToStatusCode(err), "pipe: " + errnoText(err));
  }
  read.fd = fds[0];
  write.fd = fds[1];
  return absl::OkStatus();
}

}  // namespace

absl::Status WorkerGroup::start(std::vector<WorkerSpec> specs) {
  for (auto& spec : specs) {
    if (auto status = startOne(std::move(spec)); !status.ok()) {
      // A round starts whole or not at all: the workers already started go at once.
      signalAll(SIGKILL);
      return status;
    }
  }
  return absl::OkStatus();
}

absl::Status WorkerGroup::startOne(WorkerSpec spec) {
  auto state = std::make_unique<WorkerState>();
  state->spec = std::move(spec);
  WorkerState& w = *state;
  auto failed = [&](const absl::Status& why) {
    return absl::Status(why.code(), fmt::format("cannot start local rank {} ({}): {}", w.spec.localRank,
                                                w.spec.argv[0], std::string(why.message())));
  };
  // stdout goes straight to launch's stdout when nothing needs to see it; stderr always
  // passes through launch so that its last lines can explain a failure.
  bool outDirect = w.spec.stdoutToConsole && w.spec.prefix.empty() && w.spec.stdoutFile.empty() &&
                   !w.spec.watchOutput;
  bool outDiscard = !w.spec.stdoutToConsole && w.spec.stdoutFile.empty() && !w.spec.watchOutput;
  OwnedFd outRead, outWrite, errRead, errWrite;
  if (!outDirect && !outDiscard) {
    if (auto s = makePipe(outRead, outWrite); !s.ok()) return failed(s);
  }
  if (auto s = makePipe(errRead, errWrite); !s.ok()) return failed(s);
  SpawnRequest request;
  request.path = w.spec.argv[0];
  request.argv = w.spec.argv;
  for (const auto& [k, v] : w.spec.env) request.env.push_back(k + "=" + v);
  request.stdoutFd = outDirect ? STDOUT_FILENO : outDiscard ? -1 : outWrite.fd;
  request.stderrFd = errWrite.fd;
  if (gRestoreFiles) request.files = gWorkerFiles;
  auto pid = spawnProcess(request);
  if (!pid.ok()) return failed(pid.status());
  w.pid = *pid;
  w.started = std::chrono::steady_clock::now();
  reaper_.watch(w.pid);
  workers_.push_back(std::move(state));

  auto addPump = [&](OwnedFd& fd, bool isErr) {
    auto p = std::make_shared<Pump>(io_, fd.release());
    p->worker = &w;
    p->isErr = isErr;
    bool console = isErr ? w.spec.stderrToConsole : w.spec.stdoutToConsole;
    p->group = this;
    p->console = console ? (isErr ? consoles_.err : consoles_.out) : nullptr;
    const std::string& file = isErr ? w.spec.stderrFile : w.spec.stdoutFile;
    if (!file.empty()) {
      p->filePath = file;
      p->fileFd = openLog(file);
      if (p->fileFd < 0) logLost(file, errno, 0);
    }
    p->prefix = w.spec.prefix;
    const std::string& filtered = isErr ? w.spec.filteredStderrFile : w.spec.filteredStdoutFile;
    const auto& filters = isErr ? w.spec.stderrFilters : w.spec.stdoutFilters;
    // A rank with no filters for this stream (not shown, not tee'd) has nothing to write there
    // (makeRankDirectories made the file), and must not count as its reader (unwanted()).
    if (!filtered.empty() && !filters.empty()) {
      auto& shared = filtered_[filtered];
      if (!shared) {
        shared = std::shared_ptr<int>(new int(openLog(filtered)), [](int* f) {
          if (*f >= 0) close(*f);
          delete f;
        });
        if (*shared < 0) logLost(filtered, errno, 0);
      }
      p->filteredFd = shared;
      p->filters = &filters;
    }
    ++w.openStreams;
    pumps_.push_back(p);
    pump(p);
  };
  if (outRead.fd >= 0) addPump(outRead, false);
  addPump(errRead, true);
  return absl::OkStatus();
}

void WorkerGroup::pump(std::shared_ptr<Pump> p) {
  p->stream.async_read_some(asio::buffer(p->buffer), [this, p](const boost::system::error_code& ec,
                                                               size_t n) {
    if (!ec) {
      p->consume(n);
      if (p->unwanted()) {
        // The reader of launch's stdout is gone (| head): close the worker's pipe, so that
        // its next write fails with EPIPE/SIGPIPE as it would under torchrun.
        boost::system::error_code ignored;
        p->stream.close(ignored);
      } else {
        pump(p);
        return;
      }
    }
    p->finish();
    if (p->worker != nullptr) --p->worker->openStreams;
    maybeSettled();
  });
}

void WorkerGroup::reap() {
  for (auto& w : workers_) {
    if (w->exit || w->pid <= 0) continue;
    int status = 0;
    pid_t r = waitpid(w->pid, &status, WNOHANG);
    if (r != w->pid) continue;
    WorkerExit e;
    e.at = std::chrono::steady_clock::now();
    if (WIFEXITED(status)) e.code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) e.signal = WTERMSIG(status);
    w->exit = e;
    onExit_(*w);
  }
  maybeSettled();
}

std::vector<std::string> WorkerGroup::abandon() {
  std::vector<std::string> lines;
  for (auto& w : workers_) {
    if (w->pid <= 0) continue;
    for (const auto& p : listProcesses()) {
      if (p.pgid != w->pid || p.state == 'Z') continue;
      lines.push_back(fmt::format("rank {} (local_rank {}): {} {} ({}) is still there after SIGKILL: {}",
                                  w->spec.globalRank, w->spec.localRank,
                                  p.pid == w->pid ? "its process" : "a process of its group, pid", p.pid, p.command,
                                  processState(p.pid)));
    }
    if (!w->exit) {
      w->exit = WorkerExit{.code = -1, .signal = SIGKILL, .at = std::chrono::steady_clock::now()};
      w->abandoned = true;
    }
  }
  for (const auto& weak : pumps_) {
    if (auto p = weak.lock()) {
      boost::system::error_code ignored;
      p->stream.close(ignored);  // its read completes (aborted): the stream counts as ended
    }
  }
  maybeSettled();
  return lines;
}

void WorkerGroup::signalAll(int sig) {
  for (auto& w : workers_) {
    if (w->pid <= 0 || w->groupDone) continue;
    // The group may outlive its leader (a worker's own children).
    if (kill(-w->pid, sig) != 0 && !w->exit) kill(w->pid, sig);
    if (sig == SIGKILL && w->exit && !w->abandoned) {
      w->groupDone = true;
      reaper_.forget(w->pid);
    }
  }
}

bool WorkerGroup::owns(pid_t pid) const {
  for (const auto& w : workers_) {
    if (w->pid == pid && !w->exit) return true;
  }
  return false;
}

bool WorkerGroup::allExited() const {
  for (const auto& w : workers_) {
    if (!w->exit) return false;
  }
  return true;
}

bool WorkerGroup::settled() const {
  if (!allExited()) return false;
  for (const auto& w : workers_) {
    if (w->openStreams > 0) return false;
  }
  return true;
}

void WorkerGroup::maybeSettled() {
  // Once: a group stays settled, and the SIGCHLDs of its leftovers (reaped by launch as child
  // subreaper) still come through reap() after the agent has moved on to the next round.
  if (settledFired_ || !settledCallback_ || !settled()) return;
  settledFired_ = true;
  auto cb = settledCallback_;
  cb();
}

}  // namespace muster::launcher
