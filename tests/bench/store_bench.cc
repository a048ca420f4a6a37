// Store benchmark: N client processes doing set+get of small values against c10d::TCPStore
// (LibTorch's server and client), against launch's TCPStore front with the same LibTorch
// client, and against muster's store on gRPC and on its direct path, in the same run; prints
// ops/s, p50, p99 and the ratios to TCPStore. --startup: a job's start-up through each store.
// Over 700 lines on purpose: every store is measured by the same loop in the same run, so that
// the ratios compare like with like; the child processes are this program too.
#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>
#include <fmt/format.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spawn.h>
#include <sys/socket.h>
#include <unistd.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <thread>

#include "common/log.h"
#include "muster/v1/store.grpc.pb.h"
#include "rendezvous/client/store_client.h"
#include "common/net.h"
#include "rendezvous/server/rendezvous_server.h"
#include "rendezvous/transport/tcpstore_front.h"
#include "rendezvous/transport/tcpstore_wire.h"
#include "tests/bench/bench_process.h"

namespace {

using muster::Clock;
using muster::bench::cpuSeconds;
using muster::bench::nowNs;
using muster::bench::spawn;
using muster::bench::spawnTogether;
using muster::bench::waitForStart;
using muster::deadlineAfter;
using muster::Millis;
namespace fs = std::filesystem;

// What one client does, whatever the store: connect, meet the others, then set+get.
struct Ops {
  virtual ~Ops() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  virtual std::string get(const std::string& key) = 0;
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  virtual void waitFor(const std::string& key) = 0;
};

struct MusterOps : Ops {
  explicit MusterOps(const std::string& addr) {
    auto c = muster::rendezvous::StoreClient::connect({.target = addr, .ns = "bench"},
                                                      deadlineAfter(Millis(60000)));
    if (!c.ok()) throw std::runtime_error(std::string(c.status().message()));
    client = std::move(*c);
  }
  void set(const std::string& k, const std::string& v) override {
    auto s = client->set(k, v);
    if (!s.ok()) throw std::runtime_error(std::string(s.message()));
  }
  std::string get(const std::string& k) override {
    return client->get(k, deadlineAfter(Millis(60000))).value();
  }
  int64_t add(const std::string& k, int64_t d) override { return client->add(k, d).value(); }
  void waitFor(const std::string& k) override {
    auto s = client->wait({k}, deadlineAfter(Millis(120000)));
    if (!s.ok()) throw std::runtime_error(std::string(s.message()));
  }
  std::unique_ptr<muster::rendezvous::StoreClient> client;
};

struct TcpStoreOps : Ops {
  TcpStoreOps(const std::string& host, int port) {
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<uint16_t>(port);
    opts.isServer = false;
    opts.waitWorkers = false;
    opts.timeout = std::chrono::seconds(120);
    store = std::make_unique<c10d::TCPStore>(host, opts);
  }
  void set(const std::string& k, const std::string& v) override {
    store->set(k, std::vector<uint8_t>(v.begin(), v.end()));
  }
  std::string get(const std::string& k) override {
    auto v = store->get(k);
    return std::string(v.begin(), v.end());
  }
  int64_t add(const std::string& k, int64_t d) override { return store->add(k, d); }
  void waitFor(const std::string& k) override { store->wait({k}); }
  std::unique_ptr<c10d::TCPStore> store;
};

// A TCPStore client speaking the wire format itself, blocking, on one connection: what torch
// 2.x's client opens (1.13's opens a second, for watch callbacks that start-up never uses,
// so that 16,384 ranks would need 32,768 sockets at the server, past this machine's limit),
// with the messages 1.13's client sends (get is WAIT, then GET).
struct WireOps : Ops {
  using Op = muster::rendezvous::tcpstore::Op;
  WireOps(const std::string& host, int port) {
    auto deadline = Clock::now() + Millis(120000);
    while (true) {
      fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(static_cast<uint16_t>(port));
      inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) break;
      int err = errno;
      close(fd);
      if (Clock::now() > deadline) {
        throw std::runtime_error(fmt::format("connect: {}", std::strerror(err)));
      }
      std::this_thread::sleep_for(Millis(10));  // TCPStore's client retries too
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  ~WireOps() override { close(fd); }
  void send(Op op, std::vector<std::string> keys, std::vector<std::string> values = {},
            int64_t number = 0) {
    muster::rendezvous::tcpstore::Request r;
    r.op = op;
    r.keys = std::move(keys);
    r.values = std::move(values);
    r.number = number;
    std::string bytes = muster::rendezvous::tcpstore::encode(r, muster::rendezvous::tcpstore::Generation::kV1);
    for (size_t done = 0; done < bytes.size();) {
      ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (n <= 0) throw std::runtime_error(fmt::format("send: {}", std::strerror(errno)));
      done += static_cast<size_t>(n);
    }
  }
  void read(void* into, size_t size) {
    for (size_t done = 0; done < size;) {
      ssize_t n = ::read(fd, static_cast<char*>(into) + done, size - done);
      if (n < 0) throw std::runtime_error(fmt::format("read: {}", std::strerror(errno)));
      if (n == 0) throw std::runtime_error("the store closed the connection");
      done += static_cast<size_t>(n);
    }
  }
  void set(const std::string& k, const std::string& v) override { send(Op::kSet, {k}, {v}); }
  std::string get(const std::string& k) override {
    waitFor(k);
    send(Op::kGet, {k});
    uint64_t size = 0;
    read(&size, sizeof size);
    std::string value(size, '\0');
    read(value.data(), size);
    return value;
  }
  int64_t add(const std::string& k, int64_t d) override {
    send(Op::kAdd, {k}, {}, d);
    int64_t value = 0;
    read(&value, sizeof value);
    return value;
  }
  void waitFor(const std::string& k) override {
    send(Op::kWait, {k});
    uint8_t reply = 0;
    read(&reply, 1);
    if (reply != muster::rendezvous::tcpstore::kStopWaiting) throw std::runtime_error("wait failed");
  }
  int fd = -1;
};

// A client of `backend` ("muster": the gRPC store; "wire": WireOps; else LibTorch's TCPStore
// client).
std::unique_ptr<Ops> connectOps(const std::string& backend, const std::string& addr) {
  if (backend == "muster") return std::make_unique<MusterOps>(addr);
  auto split = muster::net::splitHostPort(addr);
  if (!split || !split->port) throw std::runtime_error("not HOST:PORT: " + addr);
  if (backend == "wire") return std::make_unique<WireOps>(split->host, *split->port);
  return std::make_unique<TcpStoreOps>(split->host, *split->port);
}

// launch's front over a MemoryStore on a free loopback port, or null (said on stderr).
std::unique_ptr<muster::rendezvous::TcpStoreFront> startFront(size_t maxConnections) {
  std::string why;
  int fd = muster::net::listenTcp("127.0.0.1", 0, why);
  auto memory = std::make_shared<muster::rendezvous::MemoryStore>();
  auto server = muster::rendezvous::TcpStoreFront::start(
      memory, fd, {.runId = "bench", .maxConnections = maxConnections});
  if (!server.ok()) {
    std::fprintf(stderr, "store_bench: %s %s\n", why.c_str(),
                 std::string(server.status().message()).c_str());
    return nullptr;
  }
  return std::move(*server);
}

// muster's gRPC store on a free loopback port, or null (said on stderr). `direct`: with its
// direct path on (muster's client then moves its session there).
std::unique_ptr<muster::rendezvous::RendezvousServer> startGrpc(bool direct = false) {
  muster::rendezvous::ServerOptions opts;
  opts.host = "127.0.0.1";
  opts.port = 0;
  opts.directPort = direct ? 0 : -1;
  auto server = muster::rendezvous::RendezvousServer::start(opts);
  if (!server.ok()) {
    std::fprintf(stderr, "store_bench: %s\n", std::string(server.status().message()).c_str());
    return nullptr;
  }
  return std::move(*server);
}


// Writes each rank's start and end, a line each; 0, or 4 when the file cannot be written.
int writeTimes(const std::string& out, const std::vector<std::pair<int64_t, int64_t>>& times) {
  std::ofstream file(out);
  for (const auto& [start, end] : times) file << start << ' ' << end << '\n';
  return file ? 0 : 4;
}

// c10d's own TCPStore server on a free loopback port.
std::unique_ptr<c10d::TCPStore> tcpStoreServer(std::chrono::seconds timeout) {
  c10d::TCPStoreOptions opts;
  opts.port = 0;
  opts.isServer = true;
  opts.waitWorkers = false;
  opts.timeout = timeout;
  return std::make_unique<c10d::TCPStore>("127.0.0.1", opts);
}


int runChild(const std::string& backend, const std::string& addr, int id, int clients,
             double seconds, int valueBytes, const std::string& out) {
  std::unique_ptr<Ops> ops = connectOps(backend, addr);
  if (ops->add("ready", 1) == clients) ops->set("go", "1");
  ops->waitFor("go");
  std::string key = "key" + std::to_string(id);
  std::string value(static_cast<size_t>(valueBytes), 'v');
  std::vector<int64_t> nanos;
  nanos.reserve(1 << 20);
  double cpu0 = cpuSeconds(RUSAGE_SELF);
  auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                std::chrono::duration<double>(seconds));
  while (true) {
    auto t0 = Clock::now();
    if (t0 >= end) break;
    ops->set(key, value);
    auto t1 = Clock::now();
    if (ops->get(key).size() != value.size()) return 3;
    auto t2 = Clock::now();
    nanos.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
    nanos.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(t2 - t1).count());
  }
  // The first number is this client's CPU time during the measurement, in nanoseconds.
  nanos.insert(nanos.begin(), static_cast<int64_t>((cpuSeconds(RUSAGE_SELF) - cpu0) * 1e9));
  std::ofstream file(out, std::ios::binary);
  file.write(reinterpret_cast<const char*>(nanos.data()),
             static_cast<std::streamsize>(nanos.size() * sizeof(int64_t)));
  // Say "done" only after the measurement so slow teardown never counts.
  ops->add("done", 1);
  return file ? 0 : 4;
}

struct Result {
  double opsPerSec = 0, p50Ms = 0, p99Ms = 0;
  double serverCpuUsPerOp = 0, clientCpuUsPerOp = 0;
};


Result runOnce(const std::string& self, const std::string& backend, const std::string& addr,
               int clients, double seconds, int valueBytes, const fs::path& dir) {
  double serverCpu0 = cpuSeconds(RUSAGE_SELF);
  std::vector<pid_t> pids;
  for (int i = 0; i < clients; ++i) {
    pid_t pid = spawn({self, "--child", "--backend", backend, "--addr", addr, "--id",
                           std::to_string(i), "--clients", std::to_string(clients), "--seconds",
                           std::to_string(seconds), "--value-bytes", std::to_string(valueBytes),
                           "--out", (dir / (backend + std::to_string(i))).string()});
    if (pid < 0) throw std::runtime_error("cannot spawn a client");
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      throw std::runtime_error(fmt::format("a {} client failed (status {})", backend, status));
    }
  }
  double serverCpu = cpuSeconds(RUSAGE_SELF) - serverCpu0;
  double clientCpu = 0;
  std::vector<int64_t> all;
  for (int i = 0; i < clients; ++i) {
    fs::path file = dir / (backend + std::to_string(i));
    std::ifstream in(file, std::ios::binary);
    std::vector<int64_t> nanos(fs::file_size(file) / sizeof(int64_t));
    in.read(reinterpret_cast<char*>(nanos.data()),
            static_cast<std::streamsize>(nanos.size() * sizeof(int64_t)));
    if (nanos.empty()) throw std::runtime_error("a client wrote no results");
    clientCpu += static_cast<double>(nanos[0]) / 1e9;
    all.insert(all.end(), nanos.begin() + 1, nanos.end());
  }
  std::sort(all.begin(), all.end());
  Result r;
  r.opsPerSec = static_cast<double>(all.size()) / seconds;
  if (!all.empty()) {
    r.p50Ms = static_cast<double>(all[all.size() / 2]) / 1e6;
    r.p99Ms = static_cast<double>(all[std::min(all.size() - 1, all.size() * 99 / 100)]) / 1e6;
  }
  // CPU per measured operation: the clients' during their loops; the server's over the whole
  // run (connections and teardown included, a small share).
  if (!all.empty()) {
    r.serverCpuUsPerOp = serverCpu * 1e6 / static_cast<double>(all.size());
    r.clientCpuUsPerOp = clientCpu * 1e6 / static_cast<double>(all.size());
  }
  return r;
}

// Job start-up as init_process_group does it, for `count` simulated ranks from `first` of a
// world of `world`, each a thread with its own client: connect, set its address, read rank
// 0's, then the store-based barrier (an add; the last one sets the key every rank waits for).
// Writes each rank's start and end (ns since the epoch).
int runStartupChild(const std::string& backend, const std::string& addr, int first, int count,
                    int world, const std::string& out) {
  std::vector<std::pair<int64_t, int64_t>> times(static_cast<size_t>(count));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(count));
  // The ranks' threads exist before the start line; they go together once it is crossed.
  std::mutex mu;
  std::condition_variable cv;
  bool go = false;
  for (int i = 0; i < count; ++i) {
    threads.emplace_back([&, i] {
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return go; });
      }
      int rank = first + i;
      times[static_cast<size_t>(i)].first = nowNs();
      try {
        std::unique_ptr<Ops> ops = connectOps(backend, addr);
        ops->set("addr/" + std::to_string(rank), "10.0.0.1:29500");
        if (ops->get("addr/0").empty()) throw std::runtime_error("rank 0's address is empty");
        if (ops->add("arrived", 1) == world) ops->set("go", "1");
        ops->waitFor("go");
        times[static_cast<size_t>(i)].second = nowNs();
      } catch (const std::exception& e) {
        // The others would wait for this rank at the barrier: end the process.
        std::fprintf(stderr, "store_bench rank %d: %s\n", rank, e.what());
        std::_Exit(1);
      }
    });
  }
  waitForStart(out + ".ready");
  {
    std::lock_guard<std::mutex> lock(mu);
    go = true;
  }
  cv.notify_all();
  for (auto& t : threads) t.join();
  return writeTimes(out, times);
}

// The same start-up for `count` ranks of the gRPC store without a thread each: every rank is
// one Session stream driven by gRPC's callback API, all on one connection, each operation
// answered before the next but the sets, which are quiet (write-behind) as StoreClient's.
// Writes each rank's start and end.
int runAsyncStartupChild(const std::string& addr, int first, int count, int world,
                         const std::string& out) {
  namespace pb = muster::v1;
  auto stub = pb::Store::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  std::mutex mu;
  std::condition_variable cv;
  int left = count, failed = 0;
  std::string why;
  class Rank : public grpc::ClientBidiReactor<pb::StoreRequest, pb::StoreResponse> {
   public:
    Rank(int rank, int world, std::function<void(bool, const std::string&)> done,
         std::function<void()> gone)
        : gone_{std::move(gone)}, rank_(rank), world_(world), done_(std::move(done)) {}
    void start(pb::Store::Stub& stub) {
      stub.async()->Session(&context_, this);
      next();
      StartCall();
    }
    void OnWriteDone(bool ok) override {
      if (!ok) {
        fail("write failed");
      } else if (request_.quiet()) {
        next();  // answered only if it fails, as muster's StoreClient sends its sets
      } else {
        StartRead(&response_);
      }
    }
    void OnReadDone(bool ok) override {
      if (!ok || response_.code() != 0) return fail(ok ? response_.message() : "read failed");
      if (step_ == 3 && response_.number() == world_) go_ = true;
      next();
    }
    void OnDone(const grpc::Status& status) override {
      done_(ok_ && status.ok(), why_.empty() ? status.error_message() : why_);
      delete this;
    }
   private:
    // Runs last, once the call's context is gone too: the process may end after the last one.
    struct Gone {
      std::function<void()> fn;
      ~Gone() { fn(); }
    } gone_;
    // The next operation: set its address, get rank 0's, add to the barrier (the last sets
    // go), wait for go; then half-close. Sets are quiet (write-behind), as StoreClient's: the
    // get or wait after one shows it has been applied.
    void next() {
      request_.Clear();
      request_.set_ns("bench");
      request_.set_id(++step_);
      switch (step_) {
        case 1:
          request_.mutable_set()->set_key("addr/" + std::to_string(rank_));
          request_.mutable_set()->set_value("10.0.0.1:29500");
          request_.set_quiet(true);
          break;
        case 2:
          request_.mutable_get()->set_key("addr/0");
          request_.set_timeout_ms(120000);
          break;
        case 3:
          request_.mutable_add()->set_key("arrived");
          request_.mutable_add()->set_delta(1);
          break;
        case 4:
          if (go_) {
            request_.mutable_set()->set_key("go");
            request_.mutable_set()->set_value("1");
            request_.set_quiet(true);
            break;
          }
          ++step_;
          [[fallthrough]];
        case 5:
          request_.mutable_wait()->add_keys("go");
          request_.set_timeout_ms(120000);
          break;
        default:
          ok_ = true;
          StartWritesDone();
          return;
      }
      StartWrite(&request_);
    }
    void fail(const std::string& why) {
      why_ = why;
      context_.TryCancel();
    }
    grpc::ClientContext context_;
    pb::StoreRequest request_;
    pb::StoreResponse response_;
    int rank_, world_, step_ = 0;
    bool go_ = false, ok_ = false;
    std::string why_;
    std::function<void(bool, const std::string&)> done_;
  };
  std::vector<std::pair<int64_t, int64_t>> times(static_cast<size_t>(count));
  waitForStart(out + ".ready");
  for (int i = 0; i < count; ++i) {
    times[static_cast<size_t>(i)].first = nowNs();
    auto* rank = new Rank(
        first + i, world,
        [&, i](bool ok, const std::string& error) {
          std::lock_guard<std::mutex> lock(mu);
          times[static_cast<size_t>(i)].second = nowNs();
          if (!ok && failed++ == 0) why = fmt::format("rank {}: {}", first + i, error);
        },
        [&] {
          std::lock_guard<std::mutex> lock(mu);
          if (--left == 0) cv.notify_all();
        });
    rank->start(*stub);
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return left == 0; });
  if (failed > 0) {
    std::fprintf(stderr, "store_bench %s\n", why.c_str());
    return 1;
  }
  return writeTimes(out, times);
}

// Raises this process's descriptor limit to the most root may have: a 1.13 TCPStore client
// holds two connections, so 16,384 ranks are 32,768 sockets at the server.
void raiseDescriptorLimit() {
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  rlimit want{1 << 17, 1 << 17};
  if (setrlimit(RLIMIT_NOFILE, &want) != 0) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
}

// Seconds from the first rank's start to the last rank past the barrier, or -1.
double runStartup(const std::string& self, const std::string& backend, const std::string& addr,
                  int world, int procs, const fs::path& dir) {
  std::vector<std::vector<std::string>> argvs;
  std::vector<fs::path> outs;
  std::vector<std::string> readies;  // each child makes its --out with ".ready" added
  for (int p = 0; p < procs; ++p) {
    int first = world * p / procs, count = world * (p + 1) / procs - first;
    outs.push_back(dir / fmt::format("startup-{}-{}", backend, p));
    readies.push_back(outs.back().string() + ".ready");
    argvs.push_back({self, "--startup-child", "--backend", backend, "--addr", addr, "--id",
                     std::to_string(first), "--clients", std::to_string(count), "--world",
                     std::to_string(world), "--out", outs.back().string()});
  }
  // The ranks start once every process is loaded and ready.
  std::vector<pid_t> pids = spawnTogether(argvs, readies);
  bool ok = pids.size() == argvs.size();
  // A rank that fails ends the run: the others would wait for it at the barrier for good.
  for (size_t left = pids.size(); left > 0; --left) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) break;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      if (ok) {
        for (pid_t other : pids) kill(other, SIGKILL);
      }
      ok = false;
    }
  }
  if (!ok) return -1;
  int64_t first = INT64_MAX, last = 0;
  for (const auto& out : outs) {
    std::ifstream in(out);
    for (int64_t a, b; in >> a >> b;) {
      first = std::min(first, a);
      last = std::max(last, b);
    }
  }
  return last > first ? static_cast<double>(last - first) / 1e9 : -1;
}

// `client`: "torch": LibTorch's TCPStore client and muster's StoreClient, a thread a rank;
// "wire": WireOps, and runAsyncStartupChild for the gRPC store.
int startupBench(const std::string& self, const std::vector<int>& worlds, int procs,
                 const std::string& client, const std::function<bool(const char*)>& wanted,
                 const fs::path& dir) {
  raiseDescriptorLimit();
  std::string tcpBackend = client == "torch" ? "tcpstore" : "wire";
  std::printf("job start-up through the store: N simulated ranks in %d processes, each with its "
              "own client: connect, set, get rank 0's, add, wait. Clients: %s\n",
              procs,
              client == "torch"
                  ? "LibTorch 1.13's TCPStore client and muster's StoreClient, a thread a rank"
                  : "TCPStore's wire format on one connection a rank (a thread each), one gRPC "
                    "stream a rank on gRPC's callback API (no thread each), and muster's "
                    "StoreClient, a thread a rank, for the direct path");
  std::printf("csv: ranks,tcpstore_s,front_s,grpc_s,front_vs_tcpstore,grpc_vs_tcpstore,"
              "tcpstore_cpu_us_per_rank,front_cpu_us_per_rank,grpc_cpu_us_per_rank,"
              "direct_s,direct_vs_tcpstore,direct_cpu_us_per_rank\n");
  for (int world : worlds) {
    double tcp = -1, front = -1, grpc = -1, direct = -1;
    // Server CPU per rank (us): the servers run in this process, which does nothing else
    // meanwhile; -1 where the run failed.
    double tcpCpu = -1, frontCpu = -1, grpcCpu = -1, directCpu = -1;
    auto timed = [&](double& cpu, auto&& run) {
      double cpu0 = cpuSeconds(RUSAGE_SELF);
      double seconds = run();
      if (seconds > 0) cpu = (cpuSeconds(RUSAGE_SELF) - cpu0) * 1e6 / world;
      return seconds;
    };
    if (wanted("tcpstore")) {
      auto server = tcpStoreServer(std::chrono::seconds(600));
      tcp = timed(tcpCpu, [&] {
        return runStartup(self, tcpBackend, fmt::format("127.0.0.1:{}", server->getPort()), world,
                          procs, dir);
      });
    }
    if (wanted("front")) {
      auto server = startFront(size_t{1} << 17);
      if (!server) return 1;
      front = timed(frontCpu, [&] {
        return runStartup(self, tcpBackend, fmt::format("127.0.0.1:{}", server->port()), world,
                          procs, dir);
      });
    }
    if (wanted("grpc")) {
      auto server = startGrpc();
      if (!server) return 1;
      grpc = timed(grpcCpu, [&] {
        return runStartup(self, client == "wire" ? "muster-async" : "muster", server->address(),
                          world, procs, dir);
      });
    }
    if (wanted("direct")) {
      // muster's StoreClient (a thread a rank, with either --startup-client): it opens its
      // session on gRPC and moves it to the direct path after the first round trip.
      auto server = startGrpc(true);
      if (!server) return 1;
      direct = timed(directCpu, [&] {
        return runStartup(self, "muster", server->address(), world, procs, dir);
      });
    }
    // Stores that failed or did not run show as nan (gnuplot leaves them out).
    auto num = [](double x) { return x > 0 ? fmt::format("{:.3f}", x) : std::string("nan"); };
    auto ratio = [&](double x) { return x > 0 && tcp > 0 ? tcp / x : -1; };
    auto times = [&](double x) {
      if (x <= 0) return std::string(" (failed or not run)");
      return ratio(x) > 0 ? fmt::format(" s ({:.1f}x)", ratio(x)) : std::string(" s");
    };
    std::printf("csv: %d,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s\n", world, num(tcp).c_str(),
                num(front).c_str(), num(grpc).c_str(), num(ratio(front)).c_str(),
                num(ratio(grpc)).c_str(), num(tcpCpu).c_str(), num(frontCpu).c_str(),
                num(grpcCpu).c_str(), num(direct).c_str(), num(ratio(direct)).c_str(),
                num(directCpu).c_str());
    std::printf("%8d ranks: TCPStore %s%s, launch's front %s%s, gRPC store %s%s, direct path "
                "%s%s\n",
                world, num(tcp).c_str(), tcp > 0 ? " s" : " (failed or not run)",
                num(front).c_str(), times(front).c_str(), num(grpc).c_str(), times(grpc).c_str(),
                num(direct).c_str(), times(direct).c_str());
    std::printf("%8s  server CPU per rank: TCPStore %s us, front %s us, gRPC store %s us, "
                "direct path %s us\n",
                "", num(tcpCpu).c_str(), num(frontCpu).c_str(), num(grpcCpu).c_str(),
                num(directCpu).c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"store_bench: muster's store vs c10d::TCPStore, set+get from N processes"};
  bool child = false;
  std::string backend, addr, out;
  int id = 0, clients = 1, valueBytes = 64;
  double seconds = 3;
  std::vector<int> clientCounts{1, 8, 64};
  app.add_flag("--child", child)->group("");
  app.add_option("--backend", backend)->group("");
  app.add_option("--addr", addr)->group("");
  app.add_option("--id", id)->group("");
  app.add_option("--clients", clients)->group("");
  app.add_option("--out", out)->group("");
  app.add_option("--seconds", seconds, "measured seconds per run")->capture_default_str();
  app.add_option("--value-bytes", valueBytes, "value size")->capture_default_str();
  app.add_option("--client-counts", clientCounts, "client process counts")->delimiter(',');
  std::vector<std::string> stores{"tcpstore", "front", "grpc", "direct"};
  int repeat = 3;
  app.add_option("--repeat", repeat, "runs per store, taking turns; the median is shown")
      ->capture_default_str();
  app.add_option("--stores", stores, "which stores to run (for profiling one alone)")
      ->delimiter(',')
      ->check(CLI::IsMember({"tcpstore", "front", "grpc", "direct"}))
      ->capture_default_str();
  std::vector<int> startupRanks;
  int startupProcs = 4, world = 0;
  bool startupChild = false;
  app.add_option("--startup", startupRanks,
                 "job start-up instead: simulated rank counts (e.g. 1024,4096,16384)")
      ->delimiter(',');
  app.add_option("--startup-procs", startupProcs, "client processes for --startup")
      ->capture_default_str();
  std::string startupClient = "torch";
  app.add_option("--startup-client", startupClient,
                 "clients for --startup: torch (LibTorch's TCPStore client, two connections a "
                 "rank, and muster's StoreClient, a thread each) or wire (TCPStore's wire format "
                 "on one connection a rank, as torch 2.x, for 16,384 ranks under a 20,000 "
                 "descriptor limit; gRPC streams on the callback API, no thread a rank)")
      ->check(CLI::IsMember({"torch", "wire"}))
      ->capture_default_str();
  app.add_flag("--startup-child", startupChild)->group("");
  app.add_option("--world", world)->group("");
  CLI11_PARSE(app, argc, argv);
  muster::log::setLevel("warn");
  auto wanted = [&](const char* store) {
    return std::find(stores.begin(), stores.end(), store) != stores.end();
  };
  if (child) return runChild(backend, addr, id, clients, seconds, valueBytes, out);
  if (startupChild && backend == "muster-async") {
    return runAsyncStartupChild(addr, id, clients, world, out);
  }
  if (startupChild) return runStartupChild(backend, addr, id, clients, world, out);

  std::string self = fs::read_symlink("/proc/self/exe").string();
  fs::path dir = fs::temp_directory_path() / fmt::format("muster-bench-{}", getpid());
  fs::create_directories(dir);
  if (!startupRanks.empty()) {
    int rc = startupBench(self, startupRanks, startupProcs, startupClient, wanted, dir);
    fs::remove_all(dir);
    return rc;
  }
  std::printf("store benchmark: %d-byte set+get per client process, %.1f s per run, median of "
              "%d turns, %u cores\n",
              valueBytes, seconds, repeat, std::thread::hardware_concurrency());
  std::printf("%8s  %-9s %12s %9s %9s %14s %14s\n", "clients", "store", "ops/s", "p50 ms",
              "p99 ms", "server us/op", "client us/op");
  // The machine's speed drifts (a shared 2-core VM): the stores take turns, `repeat` times,
  // and each row is the run with the median ops/s.
  auto median = [](std::vector<Result> runs) {
    if (runs.empty()) return Result{};
    std::sort(runs.begin(), runs.end(),
              [](const Result& a, const Result& b) { return a.opsPerSec < b.opsPerSec; });
    return runs[runs.size() / 2];
  };
  std::vector<std::string> csv;
  for (int n : clientCounts) {
    std::vector<Result> tcps, fronts, grpcs, directs;
    for (int round = 0; round < repeat; ++round) {
      if (wanted("tcpstore")) {
        auto server = tcpStoreServer(std::chrono::seconds(120));
        tcps.push_back(runOnce(self, "tcpstore", fmt::format("127.0.0.1:{}", server->getPort()), n,
                               seconds, valueBytes, dir));
      }
      if (wanted("front")) {
        // launch's front: torch's own client (the "tcpstore" backend) against a MemoryStore.
        auto server = startFront(muster::rendezvous::FrontOptions{}.maxConnections);
        if (!server) return 1;
        fronts.push_back(runOnce(self, "tcpstore", fmt::format("127.0.0.1:{}", server->port()), n,
                                 seconds, valueBytes, dir));
      }
      if (wanted("grpc")) {
        auto server = startGrpc();
        if (!server) return 1;
        grpcs.push_back(runOnce(self, "muster", server->address(), n, seconds, valueBytes, dir));
      }
      if (wanted("direct")) {
        // The same store and client, the session on the store's direct path.
        auto server = startGrpc(true);
        if (!server) return 1;
        directs.push_back(runOnce(self, "muster", server->address(), n, seconds, valueBytes, dir));
      }
    }
    Result tcp = median(tcps), front = median(fronts), ours = median(grpcs),
           direct = median(directs);
    std::vector<std::pair<const char*, Result>> rows;
    if (wanted("tcpstore")) rows.emplace_back("tcpstore", tcp);
    if (wanted("front")) rows.emplace_back("front", front);
    if (wanted("grpc")) rows.emplace_back("grpc", ours);
    if (wanted("direct")) rows.emplace_back("direct", direct);
    for (const auto& [name, r] : rows) {
      std::printf("%8d  %-9s %12.0f %9.3f %9.3f %14.1f %14.1f\n", n, name, r.opsPerSec, r.p50Ms,
                  r.p99Ms, r.serverCpuUsPerOp, r.clientCpuUsPerOp);
    }
    for (const auto& [name, r] : rows) {
      if (!wanted("tcpstore") || std::string(name) == "tcpstore") continue;
      std::printf("%8d  %-9s %11.2fx %8.2fx %8.2fx   (%s / tcpstore: ops/s, p50, p99; p99 < 1 is "
                  "better)\n",
                  n, "ratio", r.opsPerSec / tcp.opsPerSec, r.p50Ms / tcp.p50Ms, r.p99Ms / tcp.p99Ms,
                  name);
    }
    // Stores that did not run, and ratios without TCPStore, show as nan (gnuplot skips them).
    auto ops = [](const Result& r) {
      return r.opsPerSec > 0 ? fmt::format("{:.0f}", r.opsPerSec) : std::string("nan");
    };
    auto toTcp = [&](const Result& r) {
      return r.opsPerSec > 0 && tcp.opsPerSec > 0 ? fmt::format("{:.2f}", r.opsPerSec / tcp.opsPerSec)
                                                  : std::string("nan");
    };
    csv.push_back(fmt::format("{},{},{},{},{},{},{},{}", n, ops(tcp), ops(front), ops(ours),
                              toTcp(front), toTcp(ours), ops(direct), toTcp(direct)));
    std::fflush(stdout);
  }
  // For plots: one line per client count.
  std::printf("csv: clients,tcpstore_ops,front_ops,grpc_ops,front_vs_tcpstore,grpc_vs_tcpstore,"
              "direct_ops,direct_vs_tcpstore\n");
  for (const auto& line : csv) std::printf("csv: %s\n", line.c_str());
  fs::remove_all(dir);
  return 0;
}
