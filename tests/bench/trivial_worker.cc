// The benchmark's worker. "run DIR": records its own run time (monotonic entry and exit) in
// DIR/run_<RANK>. "failover DIR": rank 0 waits for the others to be ready, records the instant
// it fails and exits 1; the others record when SIGTERM reaches them, then exit.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>

#include "tests/bench/bench_process.h"

namespace {

using muster::bench::nowNs;

std::string gDir, gRank;

void writeFile(const std::string& name, const std::string& text) {
  std::string path = gDir + "/" + name;
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    (void)!write(fd, text.data(), text.size());
    close(fd);
  }
}

void onTerm(int) {
  // Async-signal-safe enough for a benchmark: format by hand, one write.
  char buf[32];
  long long t = nowNs();
  int n = 0;
  char tmp[32];
  do {
    tmp[n++] = static_cast<char>('0' + t % 10);
    t /= 10;
  } while (t > 0);
  for (int i = 0; i < n; ++i) buf[i] = tmp[n - 1 - i];
  std::string path = gDir + "/term_" + gRank;
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    (void)!write(fd, buf, static_cast<size_t>(n));
    close(fd);
  }
  _exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  long long entry = nowNs();
  if (argc < 3) return 2;
  std::string mode = argv[1];
  gDir = argv[2];
  const char* rank = std::getenv("RANK");
  const char* world = std::getenv("WORLD_SIZE");
  gRank = rank ? rank : "0";
  if (mode == "run") {
    writeFile("run_" + gRank, std::to_string(entry) + " " + std::to_string(nowNs()));
    return 0;
  }
  if (mode == "failover") {
    signal(SIGTERM, onTerm);
    writeFile("ready_" + gRank, "1");
    if (gRank != "0") {
      while (true) pause();
    }
    int n = world ? std::atoi(world) : 1;
    for (bool all = false; !all;) {
      all = true;
      for (int r = 1; r < n; ++r) {
        all = all && access((gDir + "/ready_" + std::to_string(r)).c_str(), F_OK) == 0;
      }
      if (!all) usleep(1000);
    }
    writeFile("fail", std::to_string(nowNs()));
    _exit(1);
  }
  return 2;
}
