// WorkerGroup: Boost.Process spawns; SIGCHLD reaps; asio pumps the pipes.
#include "launcher/worker_group.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/process.hpp>
#include <boost/process/extend.hpp>
#include <boost/process/posix.hpp>
#include <algorithm>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

#include "common/log.h"
#include "launcher/console.h"

namespace muster::launcher {
namespace bp = boost::process;
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

// Runs in the child between fork and exec: its own process group, so that one signal reaches
// the worker and everything it starts; and death with launch (the reaper covers the rest).
struct ChildSetup : bp::extend::handler {
  pid_t parent;
  explicit ChildSetup(pid_t p) : parent(p) {}
  template <typename Executor>
  void on_exec_setup(Executor&) const {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // launch died before prctl took effect
    // Workers start with default dispositions and an empty mask, whatever launch blocked.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGCHLD, SIGUSR1, SIGUSR2}) {
      signal(s, SIG_DFL);
    }
    if (gRestoreFiles) setrlimit(RLIMIT_NOFILE, &gWorkerFiles);
  }
};

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
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) != 0 || files.rlim_cur >= files.rlim_max) return;
  gWorkerFiles = files;
  files.rlim_cur = files.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &files) == 0) gRestoreFiles = true;
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
    if (w->pid > 0) {
      kill(-w->pid, SIGKILL);
      if (!w->exit) waitpid(w->pid, nullptr, 0);
      reaper_.forget(w->pid);
    }
  }
}

absl::Status WorkerGroup::start(std::vector<WorkerSpec> specs) {
  for (auto& spec : specs) {
    auto state = std::make_unique<WorkerState>();
    state->spec = std::move(spec);
    WorkerState& w = *state;
    workers_.push_back(std::move(state));

    // stdout goes straight to launch's stdout when nothing needs to see it; stderr always
    // passes through launch so that its last lines can explain a failure.
    bool outDirect = w.spec.stdoutToConsole && w.spec.prefix.empty() && w.spec.stdoutFile.empty();
    bool outDiscard = !w.spec.stdoutToConsole && w.spec.stdoutFile.empty();
    int outPipe[2] = {-1, -1}, errPipe[2] = {-1, -1};
    if (!outDirect && !outDiscard && pipe2(outPipe, O_CLOEXEC) != 0) {
      return absl::InternalError(fmt::format("pipe: {}", strerror(errno)));
    }
    if (pipe2(errPipe, O_CLOEXEC) != 0) {
      return absl::InternalError(fmt::format("pipe: {}", strerror(errno)));
    }
    int outTarget = outDirect ? STDOUT_FILENO : outDiscard ? open("/dev/null", O_WRONLY | O_CLOEXEC)
                                                           : outPipe[1];
    bp::environment env;
    for (const auto& [k, v] : w.spec.env) env[k] = v;
    std::vector<std::string> args(w.spec.argv.begin() + 1, w.spec.argv.end());
    // vfork: the child borrows launch's memory until exec, so spawning costs the same however
    // large launch is (a fork copies the page tables: about 1 ms each here).
    bp::child child;
    std::string spawnError;
    try {
      child = bp::child(bp::exe = w.spec.argv[0], bp::args = args, env, bp::std_in < bp::null,
                        bp::posix::fd.bind(STDOUT_FILENO, outTarget),
                        bp::posix::fd.bind(STDERR_FILENO, errPipe[1]), ChildSetup(getpid()),
                        bp::posix::use_vfork);
    } catch (const bp::process_error& e) {
      spawnError = e.code().message();
    }
    if (!outDirect) close(outTarget);
    close(errPipe[1]);
    if (!spawnError.empty()) {
      if (outPipe[0] >= 0) close(outPipe[0]);
      close(errPipe[0]);
      return absl::InternalError(fmt::format("cannot start local rank {} ({}): {}",
                                             w.spec.localRank, w.spec.argv[0], spawnError));
    }
    w.pid = child.id();
    w.started = std::chrono::steady_clock::now();
    child.detach();  // reaped by reap() on SIGCHLD
    reaper_.watch(w.pid);

    auto addPump = [&](int fd, bool isErr) {
      auto p = std::make_shared<Pump>(io_, fd);
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
      if (!filtered.empty()) {
        auto& fd = filtered_[filtered];
        if (!fd) {
          fd = std::shared_ptr<int>(new int(openLog(filtered)), [](int* f) {
            if (*f >= 0) close(*f);
            delete f;
          });
        }
        p->filteredFd = fd;
        p->filters = isErr ? &w.spec.stderrFilters : &w.spec.stdoutFilters;
      }
      ++w.openStreams;
      pump(p);
    };
    if (outPipe[0] >= 0) addPump(outPipe[0], false);
    addPump(errPipe[0], true);
  }
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

void WorkerGroup::signalAll(int sig) {
  for (auto& w : workers_) {
    if (w->pid <= 0) continue;
    // The group may outlive its leader (a worker's own children).
    if (kill(-w->pid, sig) != 0 && !w->exit) kill(w->pid, sig);
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
  if (settledCallback_ && settled()) {
    auto cb = settledCallback_;
    cb();
  }
}

}  // namespace muster::launcher
