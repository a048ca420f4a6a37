// Process-group benchmark: time from process start to the first collective done, for world
// sizes 2..16, with muster's store and with c10d::TCPStore (the same Gloo code on each); and
// Gloo all-reduce bandwidth for 1 MiB..256 MiB on each store. The parent hosts both stores.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/log.h"
#include "common/net.h"
#include "rendezvous/client/store_client.h"
#include "rendezvous/server/rendezvous_server.h"
#include "tests/bench/bench_process.h"
#include "worker/c10d_store.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using Ms = std::chrono::milliseconds;

using muster::bench::nowNs;

c10::intrusive_ptr<c10d::Store> openStore(const std::string& kind, const std::string& addr,
                                          const std::string& ns) {
  if (kind == "muster") {
    auto client = muster::rendezvous::StoreClient::connect({.target = addr, .ns = ns},
                                                           muster::deadlineAfter(Ms(60000)));
    if (!client.ok()) throw std::runtime_error(std::string(client.status().message()));
    std::shared_ptr<muster::rendezvous::Store> shared(std::move(*client));
    return c10::make_intrusive<muster::worker::C10dStore>(shared, Ms(120000));
  }
  auto split = muster::net::splitHostPort(addr);
  if (!split || !split->port) throw std::runtime_error("not HOST:PORT: " + addr);
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(*split->port);
  opts.waitWorkers = false;
  opts.timeout = Ms(120000);
  auto tcp = c10::make_intrusive<c10d::TCPStore>(split->host, opts);
  return c10::make_intrusive<c10d::PrefixStore>(ns, tcp);
}

int child(const std::string& kind, const std::string& addr, const std::string& ns, int rank,
          int world, long long spawnedNs, const std::vector<int64_t>& sizesMiB, int iters,
          const std::string& out) {
  auto store = openStore(kind, addr, ns);
  auto opts = c10d::ProcessGroupGloo::Options::create(Ms(120000));
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(
      c10::make_intrusive<c10d::PrefixStore>("pg", store), rank, world, opts);
  std::vector<at::Tensor> one{torch::ones({1})};
  pg->allreduce(one)->wait();
  long long ready = nowNs();
  std::ofstream file(out);
  file << (ready - spawnedNs) << "\n";
  for (int64_t mib : sizesMiB) {
    std::vector<at::Tensor> t{torch::ones({mib * (1 << 20) / 4})};
    pg->allreduce(t)->wait();  // warm-up
    pg->barrier()->wait();
    long long t0 = nowNs();
    for (int i = 0; i < iters; ++i) pg->allreduce(t)->wait();
    file << (nowNs() - t0) / iters << "\n";
  }
  return 0;
}

struct Run {
  double initMs = 0;                // slowest rank: spawn -> first collective done
  std::vector<double> allreduceMs;  // per size, rank 0's average
};

Run runGroup(const std::string& self, const std::string& kind, const std::string& addr,
             int world, const std::vector<int64_t>& sizes, int iters, const fs::path& dir,
             int round) {
  std::vector<pid_t> pids;
  std::string ns = fmt::format("{}-{}-{}", kind, world, round);
  std::string sizeList;
  for (auto s : sizes) sizeList += (sizeList.empty() ? "" : ",") + std::to_string(s);
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> args{self, "--child", kind, "--addr", addr, "--ns", ns, "--rank",
                                  std::to_string(r), "--world", std::to_string(world),
                                  "--spawned", std::to_string(nowNs()), "--iters",
                                  std::to_string(iters), "--out",
                                  (dir / fmt::format("{}_{}", ns, r)).string()};
    if (!sizeList.empty()) args.insert(args.end(), {"--sizes", sizeList});
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid;
    std::vector<std::string> envs{"OMP_NUM_THREADS=1"};
    std::vector<char*> envp;
    for (char** e = environ; *e; ++e) envp.push_back(*e);
    envp.push_back(envs[0].data());
    envp.push_back(nullptr);
    if (posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), envp.data()) != 0) {
      throw std::runtime_error("spawn failed");
    }
    pids.push_back(pid);
  }
  for (pid_t p : pids) {
    int status = 0;
    waitpid(p, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) throw std::runtime_error("a rank failed");
  }
  Run run;
  for (int r = 0; r < world; ++r) {
    std::ifstream in(dir / fmt::format("{}_{}", ns, r));
    long long init;
    in >> init;
    run.initMs = std::max(run.initMs, init / 1e6);
    if (r == 0) {
      for (long long v; in >> v;) run.allreduceMs.push_back(v / 1e6);
    }
  }
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pg_bench: Gloo groups on muster's store vs TCPStore"};
  std::string childKind, addr, ns, out;
  int rank = 0, world = 2, iters = 5, reps = 3;
  long long spawned = 0;
  std::vector<int64_t> sizes;
  std::vector<int> worlds{2, 4, 8, 16};
  std::vector<int64_t> bwSizes{1, 4, 16, 64, 256};
  app.add_option("--child", childKind)->group("");
  app.add_option("--addr", addr)->group("");
  app.add_option("--ns", ns)->group("");
  app.add_option("--rank", rank)->group("");
  app.add_option("--world", world)->group("");
  app.add_option("--spawned", spawned)->group("");
  app.add_option("--out", out)->group("");
  app.add_option("--sizes", sizes)->delimiter(',')->group("");
  app.add_option("--iters", iters, "all-reduces per size")->capture_default_str();
  app.add_option("--reps", reps, "init runs per world size (median)")->capture_default_str();
  app.add_option("--worlds", worlds, "world sizes for the init figures")->delimiter(',');
  app.add_option("--bandwidth-sizes", bwSizes, "MiB per all-reduce")->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  muster::log::setLevel("warn");
  if (!childKind.empty()) {
    return child(childKind, addr, ns, rank, world, spawned, sizes, iters, out);
  }
  std::string self = fs::read_symlink("/proc/self/exe").string();
  fs::path dir = fs::temp_directory_path() / fmt::format("muster-pg-bench-{}", getpid());
  fs::create_directories(dir);
  muster::rendezvous::ServerOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  auto ours = muster::rendezvous::RendezvousServer::start(so);
  c10d::TCPStoreOptions to;
  to.port = 0;
  to.isServer = true;
  to.waitWorkers = false;
  c10d::TCPStore tcp("127.0.0.1", to);
  std::string musterAddr = (*ours)->address();
  std::string tcpAddr = fmt::format("127.0.0.1:{}", tcp.getPort());

  std::printf("process group benchmark: Gloo on loopback, %u cores; init = process start to the "
              "first all-reduce done (slowest rank, median of %d)\n",
              std::thread::hardware_concurrency(), reps);
  std::printf("%6s %14s %14s %8s\n", "world", "tcpstore ms", "muster ms", "ratio");
  int round = 0;
  for (int w : worlds) {
    std::vector<double> t, m;
    for (int i = 0; i < reps; ++i) {
      t.push_back(runGroup(self, "tcpstore", tcpAddr, w, {}, iters, dir, round++).initMs);
      m.push_back(runGroup(self, "muster", musterAddr, w, {}, iters, dir, round++).initMs);
    }
    std::sort(t.begin(), t.end());
    std::sort(m.begin(), m.end());
    double tm = t[t.size() / 2], mm = m[m.size() / 2];
    std::printf("%6d %14.1f %14.1f %7.2fx\n", w, tm, mm, mm / tm);
    std::fflush(stdout);
  }
  std::printf("\nall-reduce, world 2, %d iterations per size (rank 0's average):\n", iters);
  std::printf("%8s %16s %16s %8s\n", "MiB", "tcpstore GB/s", "muster GB/s", "ratio");
  Run tr = runGroup(self, "tcpstore", tcpAddr, 2, bwSizes, iters, dir, round++);
  Run mr = runGroup(self, "muster", musterAddr, 2, bwSizes, iters, dir, round++);
  for (size_t i = 0; i < bwSizes.size(); ++i) {
    double bytes = static_cast<double>(bwSizes[i]) * (1 << 20);
    double tg = bytes / (tr.allreduceMs[i] / 1e3) / 1e9, mg = bytes / (mr.allreduceMs[i] / 1e3) / 1e9;
    std::printf("%8lld %16.2f %16.2f %7.2fx\n", static_cast<long long>(bwSizes[i]), tg, mg, mg / tg);
  }
  std::printf("(the store is not on the data path: equal figures are expected)\n");
  fs::remove_all(dir);
  return 0;
}
