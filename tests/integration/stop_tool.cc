// A C++ rank for tests/python/test_stop.py: the loop of stop_worker.py's "fast" and "slow"
// modes through the worker library's stopRequested(). usage: stop_tool OUT [SECONDS_PER_STEP]
// Writes OUT/<RANK>.step now and then while it runs, and OUT/<RANK>.stop ("<step> <the steps it
// was told false, counted>") when told true, then exits 0.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>

#include "common/stop_board.h"
#include "worker/stop_request.h"

namespace {

void write(const std::string& path, const std::string& text) {
  {
    std::ofstream f(path + ".tmp");
    f << text;
  }
  std::filesystem::rename(path + ".tmp", path);
}

}  // namespace

// stop_tool --bench CALLS: nanoseconds per stopRequested() call in a loop under launch's board,
// and per locked look at the board (tests/bench/stop_bench.py). Makes its own board.
int bench(int64_t calls) {
  char dir[] = "/tmp/muster-stoptool-XXXXXX";
  if (mkdtemp(dir) == nullptr) return 1;
  std::string board = std::string(dir) + "/board";
  if (!muster::stopboard::create(board, 1).ok()) return 1;
  setenv("MUSTER_STOP_FILE", board.c_str(), 1);
  setenv("MUSTER_STOP_SLOT", "0", 1);
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  int64_t stopped = 0;
  for (int64_t step = 0; step < calls; ++step) stopped += muster::worker::stopRequested(step) ? 1 : 0;
  double perCall = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / calls;
  int fd = open(board.c_str(), O_RDWR);
  int64_t n = std::max<int64_t>(calls / 100, 1000);
  t0 = Clock::now();
  for (int64_t i = 0; i < n; ++i) {
    if (!muster::stopboard::ask(fd, 0, calls + i, 1).ok()) return 1;
  }
  double lock = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / n;
  close(fd);
  std::filesystem::remove_all(dir);
  std::printf("stopRequested %.1f\nlock %.1f\n", perCall, lock);
  return stopped == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: stop_tool OUT [SECONDS_PER_STEP] | stop_tool --bench CALLS\n");
    return 2;
  }
  if (std::string(argv[1]) == "--bench") return bench(argc > 2 ? std::atoll(argv[2]) : 10000000);
  std::string out = argv[1];
  double perStep = argc > 2 ? std::atof(argv[2]) : 0.0;
  const char* rankVar = std::getenv("RANK");
  std::string rank = rankVar ? rankVar : "0";
  auto lastWritten = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  int64_t toldFalse = 0;
  for (int64_t step = 0;; ++step) {
    if (muster::worker::stopRequested(step)) {
      write(out + "/" + rank + ".stop", std::to_string(step) + " " + std::to_string(toldFalse));
      return 0;
    }
    ++toldFalse;
    if (perStep > 0) std::this_thread::sleep_for(std::chrono::duration<double>(perStep));
    auto now = std::chrono::steady_clock::now();
    if (now - lastWritten > std::chrono::milliseconds(50)) {
      write(out + "/" + rank + ".step", std::to_string(step));
      lastWritten = now;
    }
  }
}
