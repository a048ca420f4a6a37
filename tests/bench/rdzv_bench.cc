// Rendezvous benchmark: N simulated agents (concurrent Join calls from a few client
// processes, gRPC's async API) join one round on one service: the time from the first join to
// every agent knowing its rank, for N = 64 .. 4096; failure-detection latency (an agent killed,
// an agent silenced); and, in the same run, torch's own c10d rendezvous
// (DynamicRendezvousHandler over TCPStore, Python) with as many agents as this machine holds.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/log.h"
#include "muster/v1/rendezvous.grpc.pb.h"
#include "rendezvous/client/rendezvous_client.h"
#include "rendezvous/server/rendezvous_server.h"
#include "tests/bench/bench_process.h"

namespace pb = muster::v1;
namespace fs = std::filesystem;

namespace {

using muster::bench::cpuSeconds;
using muster::bench::nowNs;
using muster::bench::spawn;
using muster::bench::spawnTogether;
using muster::bench::waitForStart;

// A stub of the service at `target`, its channel connected (or 30 s spent trying).
std::unique_ptr<pb::Rendezvous::Stub> connectStub(const std::string& target) {
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(30));
  return pb::Rendezvous::NewStub(channel);
}

// A client process: `count` agents, each one async Join; prints "<start> <done>" per agent.
int child(const std::string& target, const std::string& run, int nodes, int first, int count,
          const std::string& ready) {
  auto stub = connectStub(target);
  struct Call {
    grpc::ClientContext context;
    pb::JoinRequest request;
    pb::Assignment response;
    long long start = 0, done = 0;
    bool ok = false;
  };
  std::vector<std::unique_ptr<Call>> calls;
  std::mutex mu;
  std::condition_variable cv;
  int left = count;
  for (int i = 0; i < count; ++i) {
    auto c = std::make_unique<Call>();
    c->request.set_run_id(run);
    c->request.set_min_nodes(nodes);
    c->request.set_max_nodes(nodes);
    c->request.set_join_timeout_ms(120000);
    c->request.set_keep_alive_ms(600000);
    auto* n = c->request.mutable_node();
    n->set_node_id(fmt::format("agent-{}", first + i));
    n->set_host("10.0.0.1");
    n->set_local_world_size(8);
    n->set_wanted_rank(-1);
    n->set_master_port(29500);
    c->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    calls.push_back(std::move(c));
  }
  waitForStart(ready);
  for (auto& c : calls) {
    Call* p = c.get();
    p->start = nowNs();
    stub->async()->Join(&p->context, &p->request, &p->response, [p, &mu, &cv, &left](grpc::Status s) {
      p->done = nowNs();
      p->ok = s.ok();
      std::lock_guard<std::mutex> lock(mu);
      if (--left == 0) cv.notify_all();
    });
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return left == 0; });
  for (auto& c : calls) {
    if (!c->ok) return 1;
    std::printf("%lld %lld\n", c->start, c->done);
  }
  return 0;
}

// A client process: `rounds` heartbeats for each of `count` agents of a running round, as
// many in flight as agents (gRPC's async API); prints "<start> <done>" (the whole process's).
int heartbeats(const std::string& target, const std::string& run, int first, int count,
               int rounds, const std::string& ready) {
  auto stub = connectStub(target);
  waitForStart(ready);
  struct Call {
    grpc::ClientContext context;
    pb::HeartbeatRequest request;
    pb::HeartbeatResponse response;
  };
  std::mutex mu;
  std::condition_variable cv;
  int left = 0, failed = 0;
  long long start = nowNs();
  for (int r = 0; r < rounds; ++r) {
    std::vector<std::unique_ptr<Call>> calls;
    left = count;
    for (int i = 0; i < count; ++i) {
      auto c = std::make_unique<Call>();
      c->request.set_run_id(run);
      c->request.set_node_id(fmt::format("agent-{}", first + i));
      c->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      Call* p = c.get();
      calls.push_back(std::move(c));
      stub->async()->Heartbeat(&p->context, &p->request, &p->response,
                               [&](grpc::Status s) {
                                 std::lock_guard<std::mutex> lock(mu);
                                 if (!s.ok()) ++failed;
                                 if (--left == 0) cv.notify_all();
                               });
    }
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return left == 0; });
  }
  if (failed > 0) return 1;
  long long done = nowNs();
  std::printf("%lld %lld\n", start, done);
  return 0;
}

// Spawns `procs` client processes of this program for agents 0..n-1, split evenly: each gets
// `args` then --first, --count and --ready, and writes to `<dir>/<prefix>-<p>`. They start
// their agents together, once every one is loaded and connected (a process that ends first
// leaves them waiting: they are killed, and collect() reports the failure).
void spawnAgents(const std::string& self, const std::vector<std::string>& args, int n, int procs,
                 const fs::path& dir, const std::string& prefix, std::vector<pid_t>& pids,
                 std::vector<std::string>& outs) {
  std::vector<std::vector<std::string>> argvs;
  std::vector<std::string> readies;
  for (int p = 0; p < procs; ++p) {
    int lo = n * p / procs, hi = n * (p + 1) / procs;
    outs.push_back((dir / fmt::format("{}-{}", prefix, p)).string());
    readies.push_back(outs.back() + ".ready");
    argvs.push_back({self});
    argvs.back().insert(argvs.back().end(), args.begin(), args.end());
    argvs.back().insert(argvs.back().end(), {"--first", std::to_string(lo), "--count",
                                             std::to_string(hi - lo), "--ready", readies.back()});
  }
  pids = spawnTogether(argvs, readies, outs);
}

// Spawns the client processes and returns max(done) - min(start) in ms, or -1.
double collect(const std::vector<pid_t>& pids, const std::vector<std::string>& outs) {
  long long first = LLONG_MAX, last = 0;
  size_t agents = 0;
  for (size_t i = 0; i < pids.size(); ++i) {
    int status = 0;
    waitpid(pids[i], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return -1;
    std::ifstream in(outs[i]);
    for (long long s, d; in >> s >> d;) {
      first = std::min(first, s);
      last = std::max(last, d);
      ++agents;
    }
  }
  return agents == 0 ? -1 : (last - first) / 1e6;
}

pb::JoinRequest pairJoin(const std::string& run, const std::string& node) {
  pb::JoinRequest req;
  req.set_run_id(run);
  req.set_min_nodes(2);
  req.set_max_nodes(2);
  req.set_join_timeout_ms(30000);
  req.set_keep_alive_ms(2000);  // keep_alive_interval 0.5 s x 4 attempts
  req.mutable_node()->set_node_id(node);
  req.mutable_node()->set_host("127.0.0.1");
  req.mutable_node()->set_local_world_size(1);
  req.mutable_node()->set_wanted_rank(-1);
  return req;
}

// A victim agent (a process of its own, exec'd, not forked): joins, watches, heartbeats, and
// says "ready" once its watch is open; then waits to be killed or stopped.
int victim(const std::string& target, const std::string& run) {
  muster::rendezvous::RendezvousClient me(target, "");
  auto a = me.join(pairJoin(run, "victim"), muster::deadlineAfter(muster::Millis(30000)));
  if (!a.ok()) return 1;
  me.watch(run, "victim", a->round(), muster::Millis(500), muster::Millis(60000), [](const pb::RoundEvent&) {},
           [](const std::string&) {});
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the watch call reaches the service
  std::printf("ready\n");
  std::fflush(stdout);
  pause();
  return 0;
}

// Milliseconds from striking the victim (SIGKILL or SIGSTOP) to the other agent learning the
// round's end through its watch.
double detection(const std::string& self, const std::string& target, int signal, const fs::path& dir) {
  std::string run = fmt::format("detect-{}", signal);
  std::string out = (dir / run).string();
  pid_t pid = spawn({self, "--victim", target, "--run", run}, out);
  muster::rendezvous::RendezvousClient watcher(target, "");
  auto a = watcher.join(pairJoin(run, "watcher"), muster::deadlineAfter(muster::Millis(30000)));
  if (!a.ok()) return -1;
  std::mutex mu;
  std::condition_variable cv;
  long long seen = 0;
  watcher.watch(run, "watcher", a->round(), muster::Millis(500), muster::Millis(60000),
                [&](const pb::RoundEvent&) {
                  std::lock_guard<std::mutex> l(mu);
                  seen = nowNs();
                  cv.notify_all();
                },
                [](const std::string&) {});
  for (int i = 0; i < 3000; ++i) {  // wait for the victim's "ready" (bounded)
    std::ifstream in(out);
    std::string word;
    if (in >> word && word == "ready") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  long long struck = nowNs();
  kill(pid, signal);
  std::unique_lock<std::mutex> l(mu);
  cv.wait_for(l, std::chrono::seconds(10), [&] { return seen != 0; });
  long long at = seen;
  l.unlock();
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  watcher.stopWatch();
  return at ? (at - struck) / 1e6 : -1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"rdzv_bench: agents joining one round, muster vs torch's c10d rendezvous"};
  std::string childTarget, run;
  int nodes = 0, first = 0, count = 0, procs = 4, torchAgents = 32, torchProcs = 4;
  std::vector<int> sizes{64, 512, 2048, 4096};
  app.add_option("--child", childTarget)->group("");
  std::string victimTarget;
  app.add_option("--victim", victimTarget)->group("");
  app.add_option("--run", run)->group("");
  app.add_option("--nodes", nodes)->group("");
  app.add_option("--first", first)->group("");
  app.add_option("--count", count)->group("");
  std::string ready;
  app.add_option("--ready", ready)->group("");
  int heartbeatRounds = 0;
  app.add_option("--heartbeats", heartbeatRounds)->group("");
  app.add_option("--sizes", sizes, "agent counts")->delimiter(',');
  app.add_option("--procs", procs, "client processes")->capture_default_str();
  int heartbeatLoad = 5;
  app.add_option("--heartbeat-rounds", heartbeatLoad,
                 "heartbeats per agent of the largest round, for the heartbeat load (0: none)")
      ->capture_default_str();
  app.add_option("--torch-agents", torchAgents, "agents for torch's rendezvous")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  muster::log::setLevel("warn");
  if (!childTarget.empty() && heartbeatRounds > 0) {
    return heartbeats(childTarget, run, first, count, heartbeatRounds, ready);
  }
  if (!childTarget.empty()) return child(childTarget, run, nodes, first, count, ready);
  if (!victimTarget.empty()) return victim(victimTarget, run);

  std::string self = fs::read_symlink("/proc/self/exe").string();
  fs::path dir = fs::temp_directory_path() / fmt::format("muster-rdzv-bench-{}", getpid());
  fs::create_directories(dir);
  muster::rendezvous::ServerOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  so.announce = false;
  auto server = muster::rendezvous::RendezvousServer::start(so);
  std::string target = (*server)->address();
  std::printf("rendezvous benchmark: agents joining one round, %u cores, %d client processes\n",
              std::thread::hardware_concurrency(), procs);
  std::printf("%8s %12s %18s\n", "agents", "muster ms", "server CPU us/agent");
  std::fflush(stdout);
  std::vector<std::string> csv;
  std::string heartbeatCsv;
  for (int n : sizes) {
    std::vector<pid_t> pids;
    std::vector<std::string> outs;
    std::string runId = fmt::format("bench-{}", n);
    double cpu0 = cpuSeconds();
    spawnAgents(self, {"--child", target, "--run", runId, "--nodes", std::to_string(n)}, n, procs,
                dir, runId, pids, outs);
    double ms = collect(pids, outs);
    // The server's CPU: this process runs nothing else meanwhile.
    double cpuUs = (cpuSeconds() - cpu0) * 1e6 / n;
    std::printf("%8d %12.1f %18.1f\n", n, ms, cpuUs);
    csv.push_back(fmt::format("{},{:.1f},{:.1f}", n, ms, cpuUs));
    std::fflush(stdout);
  }
  // Heartbeats of the largest round's agents: what a service spends on each (the load of a
  // big job's agents heartbeating every few seconds).
  if (!sizes.empty() && sizes.back() > 0 && heartbeatLoad > 0) {
    int n = sizes.back(), rounds = heartbeatLoad;
    std::string runId = fmt::format("bench-{}", n);
    std::vector<pid_t> pids;
    std::vector<std::string> outs;
    double cpu0 = cpuSeconds();
    spawnAgents(self, {"--child", target, "--run", runId, "--heartbeats", std::to_string(rounds)},
                n, procs, dir, "hb", pids, outs);
    double ms = collect(pids, outs);
    double cpuUs = (cpuSeconds() - cpu0) * 1e6 / (static_cast<double>(n) * rounds);
    std::printf("heartbeats: %d x %d agents in %.1f ms (%.0f/s), server CPU %.1f us each\n", rounds, n, ms,
                ms > 0 ? n * rounds / (ms / 1e3) : 0.0, cpuUs);
    heartbeatCsv = fmt::format("{},{},{:.1f},{:.1f}", rounds, n,
                               ms / (static_cast<double>(n) * rounds) * 1e3, cpuUs);
  }
  std::printf("csv: agents,join_ms,server_cpu_us_per_agent\n");
  for (const auto& line : csv) std::printf("csv: %s\n", line.c_str());
  if (!heartbeatCsv.empty()) {
    std::printf("csv-heartbeat: rounds,agents,wall_us_each,server_cpu_us_each\ncsv-heartbeat: %s\n",
                heartbeatCsv.c_str());
  }
  std::fflush(stdout);

  double killed = detection(self, target, SIGKILL, dir);
  double silenced = detection(self, target, SIGSTOP, dir);
  std::printf("failure detection: agent killed %.1f ms (its connection closes); agent silenced "
              "(SIGSTOP) %.1f ms (keep-alive timeout 2000 ms, counted from its last heartbeat)\n",
              killed, silenced);
  std::fflush(stdout);

  // torch's own c10d rendezvous, Python, over a TCPStore: as many agents as this machine holds.
  c10d::TCPStoreOptions to;
  to.port = 0;
  to.isServer = true;
  to.waitWorkers = false;
  c10d::TCPStore tcp("127.0.0.1", to);
  std::vector<pid_t> pids;
  std::vector<std::string> outs;
  std::string script = std::string(MUSTER_SOURCE_DIR_DEFAULT) + "/tests/bench/torch_rdzv.py";
  for (int p = 0; p < torchProcs; ++p) {
    outs.push_back((dir / fmt::format("torch-{}", p)).string());
    pids.push_back(spawn({"/usr/bin/python3", script, "127.0.0.1", std::to_string(tcp.getPort()), "torchbench",
                          std::to_string(torchAgents), std::to_string(torchAgents / torchProcs)},
                         outs.back()));
  }
  double torchMs = collect(pids, outs);
  std::printf("torch DynamicRendezvousHandler (c10d backend, TCPStore), %d agents in %d processes: %.1f ms "
              "(includes its 1 s last call, set as low as it goes here)\n",
              torchAgents, torchProcs, torchMs);
  std::printf("csv-torch: agents,join_ms\ncsv-torch: %d,%.1f\n", torchAgents, torchMs);
  fs::remove_all(dir);
  return 0;
}
