// etcd as the rendezvous, measured against torchrun's own etcd backends and muster's own
// rendezvous in the same run, on one 3-member etcd cluster (Debian's etcd-server, v2 API on for
// torch) that the bench starts on loopback:
//   rounds:   N agents (processes of this bench, several agents each) join one round; the time
//             from the first join to every agent knowing its rank. muster on etcd
//             (EtcdRendezvous, what launch --rdzv_backend=etcd runs), muster's own service
//             (RendezvousServer, what node 0's launch or rendezvousd runs), torchrun 1.13's
//             "etcd" and "etcd-v2" handlers (python3-etcd, threads in a few processes).
//   failover: two real nodes (launch, or Debian's torchrun) with sleeping ranks; a node killed
//             (its whole process group, as a host that dies): the time until the survivor stops;
//             etcd's leader (made the member every agent talks to first) killed, a member frozen
//             (SIGSTOP: it accepts connections and answers nothing, as behind a partition) and
//             the whole cluster gone, mid-run: whether the job still finishes, and when.
//
//   etcd_bench [--sizes 2 64 1024] [--torch-max N] [--procs P] [--skip-failover] [--skip-rounds]
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "common/log.h"
#include "etcd/client.h"
#include "launcher/etcd_rendezvous.h"
#include "rendezvous/client/rendezvous_client.h"
#include "rendezvous/server/rendezvous_server.h"
#include "tests/bench/bench_process.h"
#include "tests/support/child.h"
#include "tests/support/etcd_cluster.h"

namespace fs = std::filesystem;
namespace pb = muster::v1;
using muster::bench::nowNs;
using muster::testing::Child;
using muster::testing::EtcdCluster;
using std::chrono::milliseconds;

namespace {

std::string self() { return fs::read_symlink("/proc/self/exe").string(); }
std::string sourceDir() { return muster::testing::sourceDir(); }
std::string buildDir() { return muster::testing::buildDir(); }

// ---- rounds -------------------------------------------------------------------------------

// A child process: `count` agents (agent-FIRST ...) join run `run` of `nodes` through `kind`
// ("etcd": ENDPOINTS; "muster": HOST:PORT of a service); prints "<start> <done>" per agent.
int child(const std::string& kind, const std::string& target, const std::string& run, int nodes, int first,
          int count, const std::string& ready) {
  std::vector<std::unique_ptr<muster::rendezvous::RoundClient>> clients;
  for (int i = 0; i < count; ++i) {
    if (kind == "etcd") {
      muster::etcd::Options o;
      o.endpoints = *muster::etcd::parseEndpoints(target);
      clients.push_back(std::make_unique<muster::launcher::EtcdRendezvous>(o, run));
    } else {
      clients.push_back(std::make_unique<muster::rendezvous::RendezvousClient>(target, ""));
    }
  }
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<long long, long long>> times(count);
  int left = count, failed = 0;
  muster::bench::waitForStart(ready);
  for (int i = 0; i < count; ++i) {
    pb::JoinRequest req;
    req.set_run_id(run);
    req.set_min_nodes(nodes);
    req.set_max_nodes(nodes);
    req.set_join_timeout_ms(300000);
    req.set_last_call_ms(1000);
    req.set_keep_alive_ms(600000);
    auto* n = req.mutable_node();
    n->set_node_id(fmt::format("agent-{}", first + i));
    n->set_host("10.0.0.1");
    n->set_local_world_size(8);
    n->set_wanted_rank(-1);
    n->set_master_port(29500);
    times[i].first = nowNs();
    clients[i]->join(req, muster::deadlineAfter(muster::Millis(310000)), [&, i](absl::StatusOr<pb::Assignment> a) {
      std::lock_guard lock(mu);
      times[i].second = nowNs();
      if (!a.ok()) {
        ++failed;
        std::fprintf(stderr, "agent-%d: %s\n", first + i, std::string(a.status().message()).c_str());
      }
      if (--left == 0) cv.notify_all();
    });
  }
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return left == 0; });
  }
  for (const auto& [start, done] : times) std::printf("%lld %lld\n", start, done);
  std::fflush(stdout);
  _exit(failed == 0 ? 0 : 1);  // leases and channels go with the process, as a node's would
}

struct Round {
  bool ok = false;
  bool timedOut = false;  // not every agent had its answer within the limit
  double seconds = 0;     // the first join to the last agent's answer
};

constexpr int kRoundLimitS = 300;

// Reads "<start> <done>" lines from every file: the round's span.
Round span(const std::vector<std::string>& files, int expected) {
  long long first = 0, last = 0;
  int lines = 0;
  for (const auto& f : files) {
    std::ifstream in(f);
    long long s = 0, d = 0;
    while (in >> s >> d) {
      first = lines == 0 ? s : std::min(first, s);
      last = lines == 0 ? d : std::max(last, d);
      ++lines;
    }
  }
  return {.ok = lines == expected, .seconds = (last - first) / 1e9};
}

// Waits for every process; false when one failed or was still running after `timeoutS` (then
// killed, and `timedOut` set).
bool waitAll(const std::vector<pid_t>& pids, int timeoutS, bool* timedOut = nullptr) {
  bool ok = true;
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(timeoutS);
  for (pid_t p : pids) {
    int status = 0;
    while (waitpid(p, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > end) {
        kill(p, SIGKILL);
        waitpid(p, &status, 0);
        ok = false;
        if (timedOut) *timedOut = true;
        break;
      }
      std::this_thread::sleep_for(milliseconds(20));
    }
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return ok;
}

// muster's agents (on etcd or on muster's own service) in `procs` processes of this bench.
Round musterRound(const std::string& kind, const std::string& target, int n, int procs, const fs::path& dir) {
  static int runs = 0;
  std::string run = fmt::format("bench-{}-{}-{}", kind, n, ++runs);
  procs = std::min(procs, n);
  std::vector<pid_t> pids;
  std::vector<std::string> outs, ready;
  for (int p = 0, first = 0; p < procs; ++p) {
    int count = n / procs + (p < n % procs ? 1 : 0);
    outs.push_back((dir / fmt::format("{}-{}.out", run, p)).string());
    ready.push_back((dir / fmt::format("{}-{}.ready", run, p)).string());
    pids.push_back(muster::bench::spawn({self(), "--child", kind, target, run, std::to_string(n), std::to_string(first),
                                         std::to_string(count), ready.back()},
                                        outs.back(), /*gated=*/true));
    first += count;
  }
  if (!muster::bench::startWhenReady(pids, ready)) {
    waitAll(pids, 0);
    return {};
  }
  bool timedOut = false;
  bool ok = waitAll(pids, kRoundLimitS, &timedOut);
  Round r = span(outs, n);
  r.ok = r.ok && ok;
  r.timedOut = timedOut;
  return r;
}

// torchrun's "etcd" or "etcd-v2" handlers, `n` agents in `procs` Python processes.
Round torchRound(const std::string& backend, const std::string& endpoint, int n, int procs, const fs::path& dir) {
  static int runs = 0;
  std::string run = fmt::format("bench-torch-{}-{}", n, ++runs);
  procs = std::min(procs, n);
  std::string go = (dir / (run + ".go")).string();
  std::vector<pid_t> pids;
  std::vector<std::string> outs, marks;
  for (int p = 0; p < procs; ++p) {
    int count = n / procs + (p < n % procs ? 1 : 0);
    outs.push_back((dir / fmt::format("{}-{}.out", run, p)).string());
    marks.push_back((dir / fmt::format("{}-{}.mark", run, p)).string());
    pids.push_back(muster::bench::spawn({"/usr/bin/python3", sourceDir() + "/tests/bench/torch_etcd_rdzv.py", backend,
                                         endpoint, run, std::to_string(n), std::to_string(count), marks.back(), go},
                                        outs.back()));
  }
  for (const auto& m : marks) {
    for (int i = 0; i < 6000 && !fs::exists(m); ++i) std::this_thread::sleep_for(milliseconds(10));
  }
  std::ofstream(go) << "";
  bool timedOut = false;
  bool ok = waitAll(pids, kRoundLimitS, &timedOut);
  Round r = span(outs, n);
  r.ok = r.ok && ok;
  r.timedOut = timedOut;
  return r;
}

std::string seconds(const Round& r) {
  if (r.timedOut) return fmt::format("> {} s", kRoundLimitS);
  return r.ok ? fmt::format("{:.3f} s", r.seconds) : "failed";
}
std::string ratio(const Round& anchor, const Round& ours) {
  return anchor.ok && ours.ok && ours.seconds > 0 ? fmt::format("{:.1f}x", anchor.seconds / ours.seconds) : "-";
}

void rounds(EtcdCluster& cluster, const std::vector<int>& sizes, int procs, int torchMax, const fs::path& dir) {
  muster::rendezvous::ServerOptions server;
  server.host = "127.0.0.1";
  server.port = 0;
  auto service = muster::rendezvous::RendezvousServer::start(server);
  if (!service.ok()) {
    std::fprintf(stderr, "etcd_bench: %s\n", std::string(service.status().message()).c_str());
    return;
  }
  std::string own = fmt::format("127.0.0.1:{}", (*service)->port());
  std::printf("\none round of N agents (first join to the last agent's rank), %d processes:\n", procs);
  std::printf("%6s  %12s  %12s  %12s  %12s  %s\n", "N", "muster etcd", "muster own", "torch etcd", "torch etcd-v2",
              "torch etcd / muster etcd, etcd-v2 / muster etcd");
  for (int n : sizes) {
    Round onEtcd = musterRound("etcd", cluster.endpoints(), n, procs, dir);
    Round onOwn = musterRound("muster", own, n, procs, dir);
    Round v1, v2;
    if (n <= torchMax) {
      v1 = torchRound("etcd", cluster.endpoint(0), n, procs, dir);
      v2 = torchRound("etcd-v2", cluster.endpoint(0), n, procs, dir);
    }
    std::printf("%6d  %12s  %12s  %12s  %12s  %s, %s\n", n, seconds(onEtcd).c_str(), seconds(onOwn).c_str(),
                n <= torchMax ? seconds(v1).c_str() : "not run", n <= torchMax ? seconds(v2).c_str() : "not run",
                ratio(v1, onEtcd).c_str(), ratio(v2, onEtcd).c_str());
    std::fflush(stdout);
  }
}

// ---- failover -----------------------------------------------------------------------------

enum class Backend { kMusterEtcd, kMusterOwn, kTorchEtcd, kTorchEtcdV2 };
const char* name(Backend b) {
  switch (b) {
    case Backend::kMusterEtcd: return "launch, etcd";
    case Backend::kMusterOwn: return "launch, c10d (its own)";
    case Backend::kTorchEtcd: return "torchrun 1.13, etcd";
    case Backend::kTorchEtcdV2: return "torchrun 1.13, etcd-v2";
  }
  return "?";
}

// A node of a two-node job: launch or torchrun in a session of its own (so that killing it is
// killing the host's whole job), with ranks that wait for `go`.
class Job {
 public:
  Job(Backend b, EtcdCluster& cluster, const fs::path& dir, int id) : dir_(dir / fmt::format("job{}", id)) {
    fs::create_directories(dir_);
    std::string worker = (dir_ / "w.sh").string();
    std::ofstream(worker) << "#!/bin/sh\ntouch " << (dir_ / "up_").string() << "$RANK\nwhile [ ! -e "
                          << (dir_ / "go").string() << " ]; do sleep 0.05; done\n";
    fs::permissions(worker, fs::perms::owner_all);
    std::string run = fmt::format("failover-{}-{}", id, getpid());
    int port = muster::testing::freePort();
    for (int n = 0; n < 2; ++n) {
      std::vector<std::string> argv{"/usr/bin/setsid"};
      if (b == Backend::kMusterEtcd || b == Backend::kMusterOwn) {
        argv.insert(argv.end(), {buildDir() + "/launcher/launch", "--nnodes=2", "--nproc_per_node=1", "--rdzv_id=" + run,
                                 "--log_dir=" + (dir_ / fmt::format("logs{}", n)).string()});
        if (b == Backend::kMusterEtcd) {
          argv.insert(argv.end(), {"--rdzv_backend=etcd", "--rdzv_endpoint=" + cluster.endpoints()});
        } else {
          argv.insert(argv.end(), {"--rdzv_backend=c10d", fmt::format("--rdzv_endpoint=127.0.0.1:{}", port),
                                   fmt::format("--rdzv_conf=is_host={}", n == 0 ? 1 : 0)});
        }
        argv.insert(argv.end(), {"--no_python", worker});
      } else {
        argv.insert(argv.end(), {"/usr/bin/python3", sourceDir() + "/tests/compat/torchrun_py311.py", "--nnodes=2",
                                 "--nproc_per_node=1", "--rdzv_id=" + run,
                                 b == Backend::kTorchEtcd ? "--rdzv_backend=etcd" : "--rdzv_backend=etcd-v2",
                                 "--rdzv_endpoint=" + cluster.endpoint(0), "--no_python", worker});
      }
      nodes_.push_back(std::make_unique<Child>(argv));
      // The service's node first, for muster's own.
      if (n == 0 && b == Backend::kMusterOwn) std::this_thread::sleep_for(milliseconds(200));
    }
  }
  ~Job() {
    for (auto& n : nodes_) kill(-n->pid(), SIGKILL);
    nodes_.clear();
    fs::remove_all(dir_);
  }
  bool up(milliseconds timeout = milliseconds(120000)) {
    return muster::testing::awaitPath(dir_ / "up_0", timeout) && muster::testing::awaitPath(dir_ / "up_1", timeout);
  }
  void go() { std::ofstream(dir_ / "go") << ""; }
  void killNode(int n) { kill(-nodes_[n]->pid(), SIGKILL); }
  // Seconds until node `n` ends (its exit code in `code`), or -1 past `limit`.
  double waitNode(int n, milliseconds limit, int* code = nullptr) {
    auto start = std::chrono::steady_clock::now();
    auto e = nodes_[n]->wait(limit);
    if (!e) return -1;
    if (code) *code = e->code;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  std::string stderrOf(int n) { return nodes_[n]->stderrText(); }

 private:
  fs::path dir_;
  std::vector<std::unique_ptr<Child>> nodes_;
};

std::string outcome(double s, int code, int limitS) {
  if (s < 0) return fmt::format("still running after {} s", limitS);
  return fmt::format("{} in {:.2f} s", code == 0 ? "finished" : fmt::format("failed (exit {})", code), s);
}

void failover(const fs::path& dir, const std::vector<Backend>& backends) {
  constexpr int kLimit = 60;
  int jobs = 0;
  std::printf("\nfailover: two nodes, one rank each, the ranks waiting; torchrun takes one endpoint (member 0), launch "
              "all three; default keep-alive (5 s x 3) everywhere\n");
  std::printf("%-26s  %-36s  %s\n", "", "scenario", "outcome");
  auto row = [](Backend b, const char* scenario, const std::string& what) {
    std::printf("%-26s  %-36s  %s\n", name(b), scenario, what.c_str());
    std::fflush(stdout);
  };
  for (Backend b : backends) {
    // A node killed mid-run: when does the survivor stop?
    {
      EtcdCluster cluster;
      if (!cluster.start()) return;
      Job job(b, cluster, dir, ++jobs);
      if (!job.up()) {
        row(b, "a node killed", "the job did not start: " + job.stderrOf(0));
        continue;
      }
      job.killNode(1);
      int code = -1;
      double s = job.waitNode(0, milliseconds(kLimit * 1000), &code);
      row(b, "a node killed: the survivor stops", s < 0 ? fmt::format("not within {} s", kLimit) : fmt::format("in {:.2f} s (exit {})", s, code));
    }
    if (b == Backend::kMusterOwn) continue;  // no etcd under it
    struct Scenario {
      const char* what;
      std::function<void(EtcdCluster&)> strike, heal;
    };
    std::vector<Scenario> scenarios{
        {"leader (member 0) killed mid-run", [](EtcdCluster& c) { c.kill(0); }, nullptr},
        {"member 0 frozen (SIGSTOP) mid-run", [](EtcdCluster& c) { c.kill(0, SIGSTOP); },
         [](EtcdCluster& c) { c.kill(0, SIGCONT); }},
        {"the whole cluster killed mid-run",
         [](EtcdCluster& c) {
           for (int i = 0; i < c.size(); ++i) c.kill(i);
         },
         nullptr},
    };
    for (const auto& sc : scenarios) {
      EtcdCluster cluster;
      if (!cluster.start() || !cluster.makeLeader(0)) {
        row(b, sc.what, "the cluster did not start");
        continue;
      }
      Job job(b, cluster, dir, ++jobs);
      if (!job.up()) {
        row(b, sc.what, "the job did not start");
        continue;
      }
      sc.strike(cluster);
      // Past every keep-alive bound (15 s): what is lost is lost by now.
      int code0 = -1, code1 = -1;
      double early = job.waitNode(0, milliseconds(20000), &code0);
      if (early >= 0) {
        job.waitNode(1, milliseconds(kLimit * 1000), &code1);
        row(b, sc.what, outcome(early, code0, kLimit) + " (before the ranks were done)");
      } else {
        auto released = std::chrono::steady_clock::now();
        job.go();
        double a = job.waitNode(0, milliseconds(kLimit * 1000), &code0);
        double c = job.waitNode(1, milliseconds(kLimit * 1000), &code1);
        double all = std::chrono::duration<double>(std::chrono::steady_clock::now() - released).count();
        bool both = a >= 0 && c >= 0;
        row(b, sc.what,
            both ? fmt::format("ran on; after the ranks were done: {} in {:.2f} s", code0 == 0 && code1 == 0 ? "finished" : fmt::format("failed (exit {}, {})", code0, code1), all)
                 : fmt::format("ran on; still running {} s after the ranks were done", kLimit));
      }
      if (sc.heal) sc.heal(cluster);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--child") {
    if (argc != 9) return 2;
    muster::log::setLevel("error");
    return child(argv[2], argv[3], argv[4], std::stoi(argv[5]), std::stoi(argv[6]), std::stoi(argv[7]), argv[8]);
  }
  std::vector<int> sizes{2, 64, 1024};
  int procs = 8, torchMax = 1024;
  bool skipFailover = false, skipRounds = false;
  CLI::App app{"etcd as the rendezvous: muster against torchrun's etcd backends and muster's own service"};
  app.add_option("--sizes", sizes, "agents per round")->capture_default_str();
  app.add_option("--procs", procs, "client processes per round")->capture_default_str();
  app.add_option("--torch-max", torchMax, "the largest round torchrun's handlers are run for")->capture_default_str();
  app.add_flag("--skip-failover", skipFailover, "only the rounds");
  app.add_flag("--skip-rounds", skipRounds, "only the failover");
  CLI11_PARSE(app, argc, argv);
  muster::log::setLevel("error");
  struct rlimit files{65536, 65536};
  setrlimit(RLIMIT_NOFILE, &files);
  if (!fs::exists("/usr/bin/etcd")) {
    std::fprintf(stderr, "etcd_bench: etcd-server is not installed (deploy/setup.sh installs it)\n");
    return 1;
  }
  fs::path dir = muster::testing::freshTestDir("muster-etcd-bench");
  std::printf("etcd_bench: etcd 3.4, 3 members on loopback; %u CPUs\n", std::thread::hardware_concurrency());
  if (!skipRounds) {
    EtcdCluster cluster;
    if (!cluster.start()) {
      std::fprintf(stderr, "etcd_bench: %s\n", cluster.why().c_str());
      return 1;
    }
    rounds(cluster, sizes, procs, torchMax, dir);
  }
  if (!skipFailover) {
    failover(dir, {Backend::kMusterEtcd, Backend::kMusterOwn, Backend::kTorchEtcd, Backend::kTorchEtcdV2});
  }
  fs::remove_all(dir);
  return 0;
}
