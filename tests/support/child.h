// Test support: a real child process with its stdout and stderr captured line by line, waited
// for with deadlines. Header-only so that every test binary can use it.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace muster::testing {

// The build tree: $MUSTER_BUILD_DIR (ctest sets it), else the nearest folder above this test
// binary that holds CMakeCache.txt.
inline std::string buildDir() {
  if (const char* dir = std::getenv("MUSTER_BUILD_DIR")) return dir;
  std::error_code ec;
  auto path = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path();
  for (; !path.empty() && path != path.root_path(); path = path.parent_path()) {
    if (std::filesystem::exists(path / "CMakeCache.txt")) return path.string();
  }
  return ".";
}

// The source tree: $MUSTER_SOURCE_DIR (ctest sets it), else the one this test was built from.
inline std::string sourceDir() {
  if (const char* dir = std::getenv("MUSTER_SOURCE_DIR")) return dir;
#ifdef MUSTER_SOURCE_DIR_DEFAULT
  return MUSTER_SOURCE_DIR_DEFAULT;
#else
  return ".";
#endif
}

// What a test puts before a program whose memory it measures (memoryBytes): nothing, or under
// ASan (tests/sanitize.sh) the quarantine turned off, where ASan keeps freed memory to catch a
// use after free: memory the program no longer holds. ASan's shadow (an eighth of what the
// program touches) still counts.
inline std::vector<std::string> measuredMemoryPrefix() {
#if defined(__SANITIZE_ADDRESS__)
  return {"/usr/bin/env", "ASAN_OPTIONS=quarantine_size_mb=0:thread_local_quarantine_size_kb=0"};
#else
  return {};
#endif
}

// A memory figure of process `pid` from /proc/PID/status ("VmRSS": resident now, "VmHWM": the
// peak), in bytes; 0 if it cannot be read.
inline size_t memoryBytes(pid_t pid, const std::string& field) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1)) * 1024;
  }
  return 0;
}

// An empty directory of this test's own: $TMPDIR/<prefix>-<pid>-<test name>, made anew (outside
// a test, as in a bench: <prefix>-<pid>-<a count>).
inline std::filesystem::path freshTestDir(const std::string& prefix) {
  static std::atomic<int> made{0};
  const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
  auto dir = std::filesystem::temp_directory_path() /
             (prefix + "-" + std::to_string(getpid()) + "-" + (test ? test->name() : std::to_string(++made)));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// A file of NAME=value lines (what a test's worker wrote with `env > file`), as a map.
inline std::map<std::string, std::string> readEnvFile(const std::filesystem::path& path) {
  std::map<std::string, std::string> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    auto eq = line.find('=');
    if (eq != std::string::npos) out[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return out;
}

// A bash script at `path` (executable) running `body`: a test's worker.
inline std::string writeScript(const std::filesystem::path& path, const std::string& body) {
  std::ofstream(path) << "#!/bin/bash\n" << body;
  std::filesystem::permissions(path, std::filesystem::perms::owner_all, std::filesystem::perm_options::add);
  return path.string();
}

// Waits up to `timeout` for `path` to exist (a worker's marker file).
inline bool awaitPath(const std::filesystem::path& path, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (std::filesystem::exists(path)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

// A port for a program that binds it later (torchrun's --master_port, etcd's, a restarted
// rendezvousd's), that no other test gets while this process lives: from a band outside the
// kernel's ephemeral range (which bind(0) and connect() never hand out), held by an flock on a
// file all tests share, as tests/support/ports.py does for the Python tests. Nothing listens on
// it on any address when it is handed out. A port from bind(0) would be free only at the moment
// of asking: the next bind(0) or connect() of a test beside this one could take it.
inline bool bindableEverywhere(int port) {
  for (int family : {AF_INET, AF_INET6}) {
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;  // no IPv6 here
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    int rc;
    if (family == AF_INET) {
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(static_cast<uint16_t>(port));
      rc = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    } else {
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
      sockaddr_in6 addr{};
      addr.sin6_family = AF_INET6;
      addr.sin6_port = htons(static_cast<uint16_t>(port));
      rc = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    }
    close(fd);
    if (rc != 0) return false;
  }
  return true;
}

// [first, end) outside the kernel's ephemeral range: below it from 20000 (Debian's starts at
// 32768), else above it; tests/support/ports.py's band() reads the same.
inline std::pair<int, int> portBand() {
  int low = 32768, high = 60999;
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  range >> low >> high;
  if (std::min(low, 32000) - 20000 >= 1000) return {20000, std::min(low, 32000)};
  if (65535 - high >= 1000) return {high + 1, 65536};
  return {20000, 32000};
}

inline int freePort() {
  auto [kFirst, kEnd] = portBand();
  const char* locks = "/tmp/muster-test-ports";
  if (mkdir(locks, 01777) == 0) chmod(locks, 01777);  // any user's tests share it
  std::random_device seed;
  std::mt19937 rng(seed());
  for (int attempt = 0; attempt < 1000; ++attempt) {
    int port = kFirst + static_cast<int>(rng() % (kEnd - kFirst));
    std::string path = std::string(locks) + "/" + std::to_string(port) + ".lock";
    int fd = open(path.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) continue;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      close(fd);
      continue;
    }
    if (bindableEverywhere(port)) return port;  // fd stays open: the lock lasts as this process
    close(fd);
  }
  std::abort();  // 1,000 ports of the band taken: something is badly wrong on this machine
}

// A child's exit: code >= 0 when it exited, signal > 0 when a signal ended it.
struct ExitStatus {
  int code = -1;
  int signal = 0;
};

class Child {
 public:
  // Starts argv[0] (a path) with argv; env entries "K=V" are added to (or override) ours.
  explicit Child(const std::vector<std::string>& argv, const std::vector<std::string>& env = {}) {
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) std::abort();
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_adddup2(&actions, err[1], 2);
    std::vector<std::string> envStrings;
    for (char** e = environ; *e; ++e) {
      std::string entry = *e;
      bool overridden = false;
      for (const auto& add : env) {
        if (entry.substr(0, entry.find('=') + 1) == add.substr(0, add.find('=') + 1)) overridden = true;
      }
      if (!overridden) envStrings.push_back(entry);
    }
    for (const auto& add : env) envStrings.push_back(add);
    std::vector<char*> args, envp;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    for (const auto& e : envStrings) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    if (posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), envp.data()) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
    close(out[1]);
    close(err[1]);
    outFd_ = out[0];
    errFd_ = err[0];
  }

  ~Child() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    close(outFd_);
    close(errFd_);
  }

  pid_t pid() const { return pid_; }
  void kill(int sig) { ::kill(pid_, sig); }

  // Reads output until a line of stderr (or stdout) matches `pattern`; returns the line and its
  // groups (index 0 is the whole match).
  std::optional<std::vector<std::string>> waitForLine(const std::string& pattern,
                                         std::chrono::milliseconds timeout, bool fromStderr = true) {
    std::regex re(pattern);
    auto deadline = std::chrono::steady_clock::now() + timeout;
    auto& lines = fromStderr ? errLines_ : outLines_;
    size_t scanned = 0;
    while (true) {
      for (; scanned < lines.size(); ++scanned) {
        std::smatch m;
        if (std::regex_search(lines[scanned], m, re)) {
          std::vector<std::string> groups;
          for (const auto& g : m) groups.push_back(g.str());
          return groups;
        }
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || !pump(static_cast<int>(left.count()))) return std::nullopt;
    }
  }

  // Waits for the child to end, reading its output meanwhile; nullopt on timeout.
  std::optional<ExitStatus> wait(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!exited_) {
      int status = 0;
      pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        exited_ = true;
        if (WIFEXITED(status)) exit_.code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) exit_.signal = WTERMSIG(status);
        break;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      // Output is read while waiting so that a chatty child never blocks on a full pipe; at
      // end of output, waitpid is asked again after a short pause.
      if (!pump(static_cast<int>(std::min<int64_t>(left.count(), 20)))) usleep(2000);
    }
    while (pump(0)) {
    }
    return exit_;
  }

  std::string stdoutText() const { return join(outLines_) + outPartial_; }
  std::string stderrText() const { return join(errLines_) + errPartial_; }
  const std::vector<std::string>& stderrLines() const { return errLines_; }
  // Reads what the child has written so far, without waiting. A long-lived child (a daemon
  // that logs a line per event) blocks on a full pipe unless its output is read now and then.
  void drain() {
    while (pump(0)) {
    }
  }

 private:
  static std::string join(const std::vector<std::string>& lines) {
    std::string s;
    for (const auto& l : lines) s += l + "\n";
    return s;
  }

  // Reads what is available within timeoutMs; false when nothing more will come now.
  bool pump(int timeoutMs) {
    pollfd fds[2] = {{outFd_, POLLIN, 0}, {errFd_, POLLIN, 0}};
    int n = poll(fds, 2, timeoutMs);
    if (n <= 0) return n == 0 && timeoutMs > 0 ? true : false;
    bool any = false;
    for (int i = 0; i < 2; ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP))) continue;
      char buf[4096];
      ssize_t got = read(fds[i].fd, buf, sizeof(buf));
      if (got <= 0) {
        fds[i].fd = -1;
        continue;
      }
      any = true;
      auto& partial = i == 0 ? outPartial_ : errPartial_;
      auto& lines = i == 0 ? outLines_ : errLines_;
      partial.append(buf, static_cast<size_t>(got));
      size_t pos;
      while ((pos = partial.find('\n')) != std::string::npos) {
        lines.push_back(partial.substr(0, pos));
        partial.erase(0, pos + 1);
      }
    }
    return any;
  }

  pid_t pid_ = -1;
  int outFd_ = -1, errFd_ = -1;
  bool exited_ = false;
  ExitStatus exit_;
  std::vector<std::string> outLines_, errLines_;
  std::string outPartial_, errPartial_;
};

// Waits until `nodes` together have printed `ranks` "rank R pid P ready" lines on stdout (what
// a rank of the roll-call tests prints once its stack handler is in); false after `timeout`.
inline bool awaitReadyLines(const std::vector<Child*>& nodes, long ranks, std::chrono::milliseconds timeout) {
  static const std::regex re("rank \\d+ pid \\d+ ready");
  auto count = [&] {
    long n = 0;
    for (auto* c : nodes) {
      std::string text = c->stdoutText();
      n += std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator());
    }
    return n;
  };
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (count() < ranks) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    for (auto* c : nodes) c->waitForLine("never", std::chrono::milliseconds(50), false);
  }
  return true;
}

}  // namespace muster::testing
