// Shared-dir channel benchmark: 1 GiB send -> recv through the channel (write, rename,
// announce, map, verify), `cp` of the same bytes on the same filesystem, and Python
// torch.save + torch.load of the same tensor (Debian's PyTorch), measured in one run.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "rendezvous/store/local_store.h"
#include "tests/bench/bench_process.h"
#include "worker/c10d_store.h"
#include "worker/shared_dir_channel.h"

namespace fs = std::filesystem;

namespace {

using muster::bench::nowNs;

// Seconds since `startNs` (nowNs).
double seconds(int64_t startNs) { return static_cast<double>(nowNs() - startNs) / 1e9; }

double runShell(const std::string& cmd) {
  int64_t t = nowNs();
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("failed: " + cmd);
  return seconds(t);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"channel_bench: 1 GiB through the shared-dir channel vs cp vs torch.save/load"};
  int mib = 1024, reps = 3;
  std::string dir = fs::temp_directory_path().string();
  std::string python = "/usr/bin/python3";
  app.add_option("--mib", mib)->capture_default_str();
  app.add_option("--reps", reps)->capture_default_str();
  app.add_option("--dir", dir, "filesystem to measure on")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  fs::path work = fs::path(dir) / fmt::format("muster-chan-bench-{}", getpid());
  fs::create_directories(work);
  double gib = mib / 1024.0;
  int64_t elements = static_cast<int64_t>(mib) * (1 << 20) / 4;
  auto tensor = torch::randn({elements});

  // The channel: a world of one sending to itself, so that both halves are timed.
  muster::worker::WorkerEnv env;
  env.runId = env.jobId = "bench";
  env.sharedDir = work.string();
  auto memory = std::make_shared<muster::rendezvous::MemoryStore>();
  std::shared_ptr<muster::rendezvous::Store> local =
      std::make_shared<muster::rendezvous::LocalStore>(memory, "bench/0");
  auto channel = muster::worker::SharedDirChannel::create(
      env, c10::make_intrusive<muster::worker::C10dStore>(local), {});
  if (!channel.ok()) {
    std::fprintf(stderr, "channel_bench: %s\n", std::string(channel.status().message()).c_str());
    return 1;
  }
  std::vector<double> ours, cp, torchIo;
  for (int i = 0; i < reps; ++i) {
    int64_t t = nowNs();
    auto sent = (*channel)->send(tensor, 0);
    auto got = (*channel)->recv(0);  // reads every byte: the checksum is verified
    ours.push_back(seconds(t));
    double sum = got.ok() ? got->sum().item<double>() : 0;
    if (!sent.ok() || !got.ok() || sum != tensor.sum().item<double>()) {
      std::fprintf(stderr, "channel_bench: the transfer failed\n");
      return 1;
    }
  }
  // cp of the same bytes: first put them in a file, then copy it.
  fs::path src = work / "src.bin", dst = work / "dst.bin";
  {
    std::ofstream out(src, std::ios::binary);
    out.write(static_cast<const char*>(tensor.data_ptr()), elements * 4);
  }
  for (int i = 0; i < reps; ++i) {
    fs::remove(dst);
    cp.push_back(runShell(fmt::format("cp {} {}", src.string(), dst.string())));
  }
  // torch.save + torch.load in Debian's PyTorch, timed inside Python (start-up excluded).
  fs::path script = work / "save_load.py";
  std::ofstream(script) << fmt::format(
      "import time, torch\n"
      "t = torch.randn({})\n"
      "best = []\n"
      "for _ in range({}):\n"
      "    a = time.perf_counter()\n"
      "    torch.save(t, '{}')\n"
      "    u = torch.load('{}')\n"
      "    u.sum().item()\n"
      "    best.append(time.perf_counter() - a)\n"
      "best.sort()\n"
      "print(best[len(best)//2])\n",
      elements, reps, (work / "t.pt").string(), (work / "t.pt").string());
  FILE* p = popen((python + " " + script.string()).c_str(), "r");
  double torchSecs = 0;
  if (p == nullptr || std::fscanf(p, "%lf", &torchSecs) != 1) {
    std::fprintf(stderr, "channel_bench: torch.save/load did not run\n");
  }
  if (p) pclose(p);
  fs::remove_all(work);

  double o = median(ours), c = median(cp);
  std::printf("shared-dir channel benchmark: %d MiB on %s, median of %d\n", mib, dir.c_str(), reps);
  std::printf("%-44s %8s %10s\n", "", "s", "GiB/s");
  std::printf("%-44s %8.3f %10.2f\n", "channel send -> recv (checked, mapped)", o, gib / o);
  std::printf("%-44s %8.3f %10.2f\n", "cp of the same bytes", c, gib / c);
  if (torchSecs > 0) {
    std::printf("%-44s %8.3f %10.2f\n", "torch.save + torch.load (PyTorch 1.13)", torchSecs,
                gib / torchSecs);
  }
  std::printf("channel vs cp: %.2fx of cp's throughput (goal >= 0.8x)\n", c / o);
  if (torchSecs > 0) {
    std::printf("channel vs torch.save/load: %.1fx faster (goal >= 3x)\n", torchSecs / o);
  }
  return 0;
}
