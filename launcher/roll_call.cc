// rollCall: one poll timer for every rank; a native dump ends with contract::kStacksEnd,
// faulthandler's is complete once the file has rested.
#include "launcher/roll_call.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <memory>

#include <fmt/format.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "common/contract.h"
#include "launcher/processes.h"

namespace muster::launcher {
namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {

constexpr Millis kPoll{5};
// faulthandler writes its dump in one go from the signal handler; a file that has not grown
// for this long holds all of it.
constexpr Millis kRest{100};

struct Pending {
  RollCallTarget target;
  stacks::RankStacks result;
  pid_t handler = -1;  // the process whose handler is asked
  bool native = false;
  off_t from = 0;      // the file's size when the signal went
  off_t lastSize = 0;
  Clock::time_point lastGrowth;
  bool done = true;
};

struct Call {
  explicit Call(asio::io_context& io) : timer(io) {}
  asio::steady_timer timer;
  std::vector<Pending> ranks;
  int signal = 0;
  Clock::time_point deadline;
  std::function<void(std::vector<stacks::RankStacks>)> done;
};

off_t fileSize(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

std::string readFrom(const std::string& path, off_t from) {
  std::ifstream in(path, std::ios::binary);
  in.seekg(from);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// True when `pid`'s process catches `signal` now (SigCgt of /proc/PID/status): the ready line
// may be older than an exec that dropped the handler, and to a process without one the
// signal is fatal.
bool catches(pid_t pid, int signal) {
  std::ifstream in(fmt::format("/proc/{}/status", pid));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("SigCgt:", 0) != 0) continue;
    uint64_t mask = 0;
    if (!absl::SimpleHexAtoi(absl::StripAsciiWhitespace(line.substr(7)), &mask)) return false;
    return signal >= 1 && signal <= 64 && (mask >> (signal - 1)) & 1u;
  }
  return false;
}

// The handler's ready lines: "muster-stacks pid=N python|native" (one per process that
// installed one); the last whose process is alive, in the rank's group, and catches the signal.
bool readyHandler(const std::string& path, pid_t rank, int signal, pid_t& pid, bool& native) {
  std::ifstream in(path);
  bool found = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(contract::kStacksReady, 0) != 0) continue;
    std::string rest = line.substr(contract::kStacksReady.size());
    size_t space = rest.find(' ');
    pid_t p = 0;
    if (!absl::SimpleAtoi(rest.substr(0, space), &p) || p <= 0) continue;
    auto process = readProcess(p);
    if (!process || process->state == 'Z' || (p != rank && process->pgid != rank) || !catches(p, signal)) continue;
    pid = p;
    native = space != std::string::npos && rest.substr(space + 1) == "native";
    found = true;
  }
  return found;
}

void finishOne(Pending& p, bool answered) {
  p.done = true;
  std::string text = readFrom(p.target.stacksFile, p.from);
  p.result.threads = stacks::parseDump(text);
  if (answered) {
    p.result.answer = stacks::Answer::kAnswered;
    return;
  }
  p.result.answer = stacks::Answer::kNoAnswer;
  p.result.state = processState(p.handler);
  if (!p.result.threads.empty()) p.result.state += " (what it wrote is below)";
}

void poll(std::shared_ptr<Call> call) {
  auto now = Clock::now();
  bool left = false;
  for (auto& p : call->ranks) {
    if (p.done) continue;
    off_t size = fileSize(p.target.stacksFile);
    if (size != p.lastSize) {
      p.lastSize = size;
      p.lastGrowth = now;
    }
    if (size > p.from) {
      if (p.native) {
        std::string text = readFrom(p.target.stacksFile, p.from);
        if (text.find(contract::kStacksEnd) != std::string::npos) {
          finishOne(p, true);
          continue;
        }
      } else if (now - p.lastGrowth >= kRest) {
        finishOne(p, true);
        continue;
      }
    }
    if (now >= call->deadline) {
      finishOne(p, false);
      continue;
    }
    left = true;
  }
  if (!left) {
    std::vector<stacks::RankStacks> out;
    for (auto& p : call->ranks) out.push_back(std::move(p.result));
    call->done(std::move(out));
    return;
  }
  call->timer.expires_after(kPoll);
  call->timer.async_wait([call](const boost::system::error_code&) { poll(call); });
}

}  // namespace

void rollCall(asio::io_context& io, std::vector<RollCallTarget> targets, int signal, Millis deadline,
              const std::string& host, std::function<void(std::vector<stacks::RankStacks>)> done) {
  auto call = std::make_shared<Call>(io);
  call->signal = signal;
  call->deadline = Clock::now() + deadline;
  call->done = std::move(done);
  for (auto& t : targets) {
    Pending p;
    p.target = t;
    p.result.rank = t.rank;
    p.result.localRank = t.localRank;
    p.result.pid = t.pid;
    p.result.host = host;
    if (auto process = readProcess(t.pid); !process || process->state == 'Z') {
      p.result.answer = stacks::Answer::kGone;
    } else if (!readyHandler(t.stacksFile, t.pid, signal, p.handler, p.native)) {
      // Only a process of the rank's own group that has a handler is signalled: to anything
      // else the signal would be fatal.
      p.result.answer = stacks::Answer::kNoHandler;
      p.result.state = processState(t.pid);
    } else {
      p.result.kind = p.native ? "native" : "python";
      if (p.handler != t.pid) p.result.pid = p.handler;
      p.from = p.lastSize = fileSize(t.stacksFile);
      p.lastGrowth = Clock::now();
      // The main thread takes it: its stack is the one ranks are grouped by.
      if (syscall(SYS_tgkill, p.handler, p.handler, signal) == 0) {
        p.done = false;
      } else {
        p.result.answer = stacks::Answer::kGone;
      }
    }
    call->ranks.push_back(std::move(p));
  }
  asio::post(io, [call] { poll(call); });
}

}  // namespace muster::launcher
