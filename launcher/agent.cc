// Agent: the event loop of launch.
#include "launcher/agent.h"

#include <fcntl.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/contract.h"
#include "common/files.h"
#include "common/log.h"
#include "common/net.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "launcher/console.h"
#include "launcher/events.h"
#include "launcher/numa.h"
#include "launcher/processes.h"
#include "rendezvous/local_store.h"
#include "rendezvous/store_client.h"

namespace muster::launcher {
namespace asio = boost::asio;
namespace fs = std::filesystem;

namespace {

auto logger() {
  static auto l = log::get("launch");
  return l;
}

// How long launch, once done, waits for a report to the rendezvous that is still on its way.
constexpr Millis kLastReportWait{2000};

std::string randomHex(size_t bytes) {
  std::random_device rd;
  std::string out;
  for (size_t i = 0; i < bytes; ++i) out += fmt::format("{:02x}", rd() & 0xff);
  return out;
}

std::string makeTempDir(const std::string& parent, const std::string& prefix) {
  std::string pattern = (fs::path(parent) / (prefix + "XXXXXX")).string();
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) return "";
  return buf.data();
}

std::string tempRoot(const std::map<std::string, std::string>& env) {
  auto it = env.find("TMPDIR");
  return it != env.end() && !it->second.empty() ? it->second : "/tmp";
}

std::string hostName() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

// The fully qualified name, as torchrun's _get_fq_hostname (socket.getfqdn). Resolved once:
// every event line and rendezvous check asks for it, and a resolver lookup is not free.
const std::string& fqdn() {
  static const std::string name = [] {
    std::string host = hostName();
    addrinfo hints{};
    hints.ai_flags = AI_CANONNAME;
    addrinfo* res = nullptr;
    if (getaddrinfo(host.c_str(), nullptr, &hints, &res) == 0 && res != nullptr) {
      std::string canon = res->ai_canonname ? res->ai_canonname : host;
      freeaddrinfo(res);
      return canon;
    }
    return host;
  }();
  return name;
}

int freePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) close(fd);
  return port;
}

std::string describeExit(const WorkerExit& e) {
  if (e.signal != 0) return fmt::format("was killed by {}", signalName(e.signal));
  return fmt::format("exited with code {}", e.code);
}

// torchrun's error file: {"message": "..."} or {"message": {"message": ..., "extraInfo":
// {"py_callstack": ..., "timestamp": ...}}}. Returns what best explains the failure.
std::string readErrorFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  try {
    auto json = nlohmann::json::parse(in);
    const auto& message = json.at("message");
    if (message.is_string()) return message.get<std::string>();
    if (message.contains("extraInfo") && message["extraInfo"].contains("py_callstack")) {
      return message["extraInfo"]["py_callstack"].get<std::string>();
    }
    if (message.contains("message")) return message["message"].dump();
    return message.dump();
  } catch (const std::exception& e) {
    return fmt::format("(error file is not torchrun's JSON: {})", e.what());
  }
}

}  // namespace

Agent::Agent(LaunchOptions options, std::map<std::string, std::string> env,
             std::vector<std::string> command)
    : options_(std::move(options)),
      env_(std::move(env)),
      command_(std::move(command)),
      signals_(io_),
      graceTimer_(io_),
      killTimer_(io_),
      joinRetryTimer_(io_),
      reportTimer_(io_) {}

Agent::~Agent() { stopProbe(); }

absl::Status Agent::prepare() {
  multiNode_ = options_.maxNodes > 1 || (options_.rdzvBackend != "static" && !options_.standalone);
  groupRank_ = 0;
  groupWorldSize_ = 1;
  worldSize_ = options_.localWorldSize * groupWorldSize_;
  if (multiNode_) {
    runId_ = options_.rdzvId;
  } else if (options_.standalone || options_.rdzvBackend != "static") {
    // As torchrun's c10d rendezvous: a run id of its own (standalone), the host's name and a
    // free port for the workers' store.
    if (options_.standalone || options_.rdzvId == "none") {
      runId_ = randomHex(4) + "-" + randomHex(2) + "-" + randomHex(2) + "-" + randomHex(2) +
               "-" + randomHex(6);
    } else {
      runId_ = options_.rdzvId;
    }
    masterAddr_ = fqdn();
    masterPort_ = 0;
  } else {
    runId_ = options_.rdzvId;
    masterAddr_ = options_.masterAddr;
    // 0: a free port, so that jobs side by side on one host do not collide on 29500.
    masterPort_ = options_.masterPort;
  }
  if (!multiNode_) {
    if (options_.agentStore) {
      // One node: the workers reach the store at MASTER_ADDR, so bind what it names (loopback
      // for the default 127.0.0.1), and hold the port from now on.
      if (auto s = holdWorkerPort(masterAddr_, masterPort_); !s.ok()) return s;
      masterPort_ = workerPort_;
    } else if (masterPort_ == 0) {
      masterPort_ = freePort();  // rank 0's worker binds it
    }
  }

  // Logs: <base>/<run id>_XXXX/attempt_N/<local rank>/{stdout,stderr}.log and error.json, as
  // torchrun lays them out.
  if (options_.logDir.empty()) {
    baseLogDir_ = makeTempDir(tempRoot(env_), "muster_");
    ownBaseLogDir_ = true;
  } else {
    baseLogDir_ = options_.logDir;
    std::error_code ec;
    fs::create_directories(baseLogDir_, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          fmt::format("--log_dir={}: cannot create it: {}", baseLogDir_, ec.message()));
    }
  }
  runDir_ = baseLogDir_.empty() ? "" : makeTempDir(baseLogDir_, runId_ + "_");
  // The channel's directory must be the same on every node: the run id across nodes.
  jobId_ = multiNode_ ? runId_ : fs::path(runDir_).filename().string();
  if (runDir_.empty()) {
    return absl::InternalError(fmt::format("cannot create a log directory under '{}'",
                                           baseLogDir_.empty() ? tempRoot(env_) : baseLogDir_));
  }

  if (options_.sharedDir.empty() && options_.maxNodes > 1) {
    // Across nodes a per-job temporary directory would be local to each node: the workers get
    // none, and the channel's create() says to give --shared_dir (a DDP script never asks).
  } else if (options_.sharedDir.empty()) {
    sharedDir_ = makeTempDir(tempRoot(env_), "muster-shared-");
    ownSharedDir_ = true;
    if (sharedDir_.empty()) return absl::InternalError("cannot create a shared directory");
  } else {
    sharedDir_ = options_.sharedDir;
    if (!fs::is_directory(sharedDir_)) {
      return absl::InvalidArgumentError(
          fmt::format("--shared_dir={} is not a directory", sharedDir_));
    }
  }

  // The store, in-process, on loopback, guarded by a token only this job's workers can read.
  // Across nodes the token must be shared: MUSTER_STORE_TOKEN_FILE names it (or none).
  tokenFile_ = (fs::path(runDir_) / "store.token").string();
  std::string token = randomHex(16);
  if (multiNode_) {
    token.clear();
    if (auto it = env_.find(contract::kStoreTokenFile); it != env_.end() && !it->second.empty()) {
      auto shared = readToken(it->second);
      if (!shared.ok()) return shared.status();
      token = *shared;
    }
  }
  {
    int fd = open(tokenFile_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, token.data(), token.size()) != static_cast<ssize_t>(token.size())) {
      if (fd >= 0) close(fd);
      return absl::InternalError(fmt::format("cannot write '{}'", tokenFile_));
    }
    close(fd);
  }
  storeToken_ = token;
  if (multiNode_) {
    if (auto s = prepareMultiNode(); !s.ok()) return s;
  } else {
    rendezvous::ServerOptions server;
    server.host = "127.0.0.1";
    server.port = 0;
    server.token = token;
    server.announce = false;
    auto started = rendezvous::StoreServer::start(server);
    if (!started.ok()) return started.status();
    store_ = std::move(*started);
    endpoint_ = store_->address();
    if (options_.agentStore) {
      if (auto s = serveWorkerStore(); !s.ok()) return s;
    }
  }

  if (multiNode_ && options_.agentStore) {
    // Every node holds a port for the workers' store; the round's group rank 0 serves it. A
    // one-node job binds only the address its workers use.
    if (auto s = holdWorkerPort(options_.maxNodes == 1 ? nodeHost_ : "", 0); !s.ok()) return s;
  }

  if (!env_.count("OMP_NUM_THREADS") && options_.localWorldSize > 1) {
    logger()->warn(
        "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to "
        "avoid your system being overloaded, please further tune the variable for optimal "
        "performance in your application as needed.");
    env_["OMP_NUM_THREADS"] = "1";
  }
  return absl::OkStatus();
}

namespace {

bool isLocalHost(const std::string& host) {
  return host == "localhost" || host == "127.0.0.1" || host == "::1" || host == hostName() || host == fqdn();
}

}  // namespace

absl::Status Agent::prepareMultiNode() {
  std::string host;
  int port = 0;
  if (options_.rdzvBackend == "static") {
    host = options_.masterAddr;
    port = options_.masterPort;
    hostsStore_ = options_.nodeRank == 0;
  } else {
    if (options_.rdzvEndpoint.empty()) {
      return absl::InvalidArgumentError(fmt::format(
          "--rdzv_backend={} needs --rdzv_endpoint=HOST:PORT (node 0's address, or a rendezvousd)",
          options_.rdzvBackend));
    }
    host = options_.rdzvHost;
    port = options_.rdzvPort;
    hostsStore_ = options_.rdzvConf.isHost.value_or(port == 0 || isLocalHost(host));
  }
  endpoint_ = rendezvous::joinHostPort(host, port);
  if (hostsStore_) {
    // Port 0: this node hosts the rendezvous on a free port (a one-node job). A one-node job
    // binds only the endpoint's own address; others every address.
    rendezvous::ServerOptions server;
    server.host = options_.maxNodes == 1 && options_.rdzvBackend != "static" ? host : "0.0.0.0";
    server.port = port;
    server.token = storeToken_;
    auto started = rendezvous::StoreServer::start(server);
    if (!started.ok()) {
      if (options_.rdzvBackend == "static") return started.status();
      // A c10d endpoint that is taken may be a standalone rendezvousd: use it.
      logger()->info("{}; joining the rendezvous already there", std::string(started.status().message()));
      hostsStore_ = false;
    } else {
      store_ = std::move(*started);
      if (port == 0) {
        port = store_->port();
        endpoint_ = rendezvous::joinHostPort(host, port);
      }
    }
  }
  nodeId_ = fmt::format("{}-{}-{}", hostName(), getpid(), randomHex(2));
  nodeHost_ = !options_.localAddr.empty() ? options_.localAddr : net::routeAddress(host, port);
  if (nodeHost_.empty()) nodeHost_ = fqdn();
  rdzv_ = std::make_unique<rendezvous::RendezvousClient>(endpoint_, storeToken_);
  logger()->info("node {} ({}) joins run '{}' at {}{}", nodeId_, nodeHost_, runId_, endpoint_,
                 hostsStore_ ? " (hosted here)" : "");
  return absl::OkStatus();
}

void Agent::startJoin() {
  muster::v1::JoinRequest req;
  req.set_run_id(runId_);
  auto* node = req.mutable_node();
  node->set_node_id(nodeId_);
  node->set_host(nodeHost_);
  node->set_local_world_size(options_.localWorldSize);
  node->set_wanted_rank(options_.rdzvBackend == "static" ? options_.nodeRank : -1);
  node->set_master_port(options_.agentStore ? workerPort_ : freePort());
  req.set_min_nodes(options_.minNodes);
  req.set_max_nodes(options_.maxNodes);
  req.set_last_call_ms(static_cast<uint64_t>(options_.rdzvConf.lastCall.count()));
  req.set_join_timeout_ms(static_cast<uint64_t>(options_.rdzvConf.joinTimeout.count()));
  req.set_keep_alive_ms(static_cast<uint64_t>(options_.rdzvConf.keepAliveInterval.count() * options_.rdzvConf.keepAliveMaxAttempt));
  joinStarted_ = std::chrono::steady_clock::now();
  joinRequest_ = req;
  joinDeadline_ = deadlineAfter(options_.rdzvConf.joinTimeout + Millis(5000));
  joinBackoff_ = Millis(50);
  sendJoin();
}

void Agent::sendJoin() {
  rdzv_->join(joinRequest_, joinDeadline_, [this](absl::StatusOr<muster::v1::Assignment> result) {
    asio::post(io_, [this, result = std::move(result)] { onJoined(result); });
  });
}

void Agent::onJoined(absl::StatusOr<muster::v1::Assignment> result) {
  if (stopping_ == Stopping::kDone || stopping_ == Stopping::kSignal) return;
  if (!result.ok() && result.status().code() == absl::StatusCode::kUnavailable &&
      Clock::now() + joinBackoff_ < joinDeadline_) {
    // The connection broke under the call (a rendezvousd that was just restarted, the old
    // connection not yet seen closed): the service never had it; ask again, backing off.
    logger()->debug("join: {}; asking again in {} ms", std::string(result.status().message()), joinBackoff_.count());
    joinRetryTimer_.expires_after(joinBackoff_);
    joinBackoff_ = std::min(joinBackoff_ * 2, Millis(1000));
    joinRetryTimer_.async_wait([this](const boost::system::error_code& ec) {
      if (!ec && stopping_ != Stopping::kDone) sendJoin();
    });
    return;
  }
  if (!result.ok()) {
    std::fprintf(stderr, "launch: rendezvous at %s failed: %s\n", endpoint_.c_str(),
                 std::string(result.status().message()).c_str());
    finish(1);
    return;
  }
  const auto& a = *result;
  round_ = a.round();
  groupRank_ = a.group_rank();
  groupWorldSize_ = a.group_world_size();
  worldSize_ = a.world_size();
  rankOffset_ = a.rank_offset();
  masterAddr_ = a.master_addr();
  masterPort_ = a.master_port();
  standaloneService_ = a.standalone_service();
  localDone_ = false;
  remote_ = Remote::kNone;
  {
    ElasticEvent e;
    e.state = "RENDEZVOUS";
    e.durationMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - joinStarted_).count();
    emit(e);
  }
  if (groupRank_ == 0 && options_.agentStore) {
    if (auto s = serveWorkerStore(); !s.ok()) {
      std::fprintf(stderr, "launch: %s\n", std::string(s.message()).c_str());
      report(false, std::string(s.message()));
      finish(1);
      return;
    }
  }
  logger()->info("round {}: node rank {} of {}, ranks {}-{} of world size {}; workers' store at {}", round_,
                 groupRank_, groupWorldSize_, rankOffset_, rankOffset_ + options_.localWorldSize - 1, worldSize_,
                 rendezvous::joinHostPort(masterAddr_, masterPort_));
  // Watch before the workers start, so that losing this node is seen through its watch at once.
  rdzv_->watch(runId_, nodeId_, round_, options_.rdzvConf.keepAliveInterval, options_.rdzvConf.keepAliveInterval * options_.rdzvConf.keepAliveMaxAttempt,
               [this](const muster::v1::RoundEvent& e) { asio::post(io_, [this, e] { onRemoteEvent(e); }); },
               [this](const std::string& why) { asio::post(io_, [this, why] { onRemoteError(why); }); });
  if (options_.sharedDir.empty()) {
    onProbed(absl::OkStatus());  // only a given --shared_dir is probed
    return;
  }
  SharedDirProbe probe{.endpoint = endpoint_,
                       .token = storeToken_,
                       .storeNamespace = fmt::format("{}/{}/probe", runId_, round_),
                       .file = (fs::path(sharedDir_) / jobId_ / fmt::format(".node-probe-{}", round_)).string(),
                       .sharedDir = sharedDir_,
                       .nodeHost = nodeHost_,
                       .groupRank = groupRank_,
                       .groupWorldSize = groupWorldSize_,
                       .timeout = options_.rdzvConf.joinTimeout};
  stopProbe();
  probeCancelled_ = false;
  probeThread_ = std::thread([this, probe] {
    auto status = probeSharedDir(probe, probeCancelled_);
    asio::post(io_, [this, status] { onProbed(status); });
  });
}

void Agent::onProbed(const absl::Status& shared) {
  if (stopping_ == Stopping::kDone || stopping_ == Stopping::kSignal) return;
  if (!shared.ok()) {
    std::fprintf(stderr, "launch: %s\n", std::string(shared.message()).c_str());
    report(false, std::string(shared.message()));
    finish(1);
    return;
  }
  auto status = startRound();
  if (!status.ok()) {
    std::fprintf(stderr, "launch: %s\n", std::string(status.message()).c_str());
    report(false, std::string(status.message()));
    finish(1);
    return;
  }
}

void Agent::stopProbe() {
  probeCancelled_ = true;
  if (probeThread_.joinable()) probeThread_.join();
}

absl::Status Agent::holdWorkerPort(const std::string& host, int port) {
  std::string why;
  workerPortFd_ = net::listenTcp(host, port, why);
  if (workerPortFd_ < 0) {
    return absl::UnavailableError(fmt::format(
        "cannot hold the workers' store port (MASTER_PORT): {}; choose another --master_port "
        "(0 picks a free one), or --worker_store=rank0 if your script starts its own TCPStore "
        "there",
        why));
  }
  workerPort_ = net::boundPort(workerPortFd_);
  return absl::OkStatus();
}

absl::Status Agent::serveWorkerStore() {
  if (!front_) {
    if (workerPortFd_ < 0) return absl::InternalError("no port is held for the workers' store");
    frontMemory_ = store_ ? store_->memory() : std::make_shared<rendezvous::MemoryStore>();
    auto front = rendezvous::TcpStoreFront::start(frontMemory_, workerPortFd_,
                                                  {.runId = runId_, .round = round_});
    workerPortFd_ = -1;  // the front owns it now
    if (!front.ok()) return front.status();
    front_ = std::move(*front);
    logger()->debug("workers' store (TCPStore protocol) on port {}", front_->port());
  }
  front_->setRound(round_);
  return absl::OkStatus();
}

void Agent::report(bool succeeded, const std::string& message, std::function<void()> then) {
  if (!rdzv_) {
    if (then) then();
    return;
  }
  muster::v1::ReportRequest req;
  req.set_run_id(runId_);
  req.set_node_id(nodeId_);
  req.set_round(round_);
  req.set_outcome(succeeded ? muster::v1::ReportRequest::SUCCEEDED : muster::v1::ReportRequest::FAILED);
  req.set_exit_code(succeeded ? 0 : 1);
  req.set_message(message);
  ++pendingReports_;
  // The loop must not run out of work (and return) while the report is on its way.
  auto work = std::make_shared<asio::executor_work_guard<asio::io_context::executor_type>>(io_.get_executor());
  rdzv_->report(req, deadlineAfter(Millis(10000)), [this, work, then = std::move(then)](absl::Status s) {
    asio::post(io_, [this, work, s, then] {
      if (!s.ok()) logger()->warn("could not report to the rendezvous: {}", std::string(s.message()));
      --pendingReports_;
      if (then) then();
      // finish() leaves the loop running until the last report is out.
      if (stopping_ == Stopping::kDone && pendingReports_ == 0) io_.stop();
    });
  });
}

void Agent::onRemoteEvent(const muster::v1::RoundEvent& e) {
  if (stopping_ == Stopping::kDone || e.round() != round_) return;
  using K = muster::v1::RoundEvent;
  if (e.kind() == K::JOB_SUCCEEDED) {
    rdzv_->stopWatch();
    logger()->info("every node succeeded");
    finish(0);
    return;
  }
  remote_ = e.kind() == K::NODE_WAITING ? Remote::kWaiting : e.kind() == K::NODE_FAILED ? Remote::kFailed : Remote::kLost;
  remoteWhy_ = e.message().empty() ? fmt::format("node {} ended the round", e.host()) : e.message();
  if (e.kind() == K::NODE_FAILED) remoteWhy_ = fmt::format("node {} (group rank {}) failed: {}", e.host(), e.group_rank(), e.message());
  if (stopping_ == Stopping::kFailure) return;  // our own failure is being handled
  if (e.kind() != K::NODE_WAITING && restartCount_ >= options_.maxRestarts && !failureAnnounced_) {
    // Say it now, not once the workers are down: under srun --kill-on-bad-exit the failed
    // node's exit gets this launch killed soon after.
    std::fprintf(stderr, "launch: the job failed: %s; stopping this node's workers\n", remoteWhy_.c_str());
    std::fflush(stderr);
    failureAnnounced_ = true;
  }
  stopForRemote();
}

void Agent::stopForRemote() {
  if (localDone_ || (group_ && group_->settled())) {
    stopping_ = Stopping::kRemote;
    onRoundSettled();
    return;
  }
  if (stopping_ == Stopping::kNo) {
    stopping_ = Stopping::kRemote;
    stopStarted_ = std::chrono::steady_clock::now();
    stopGroup(SIGTERM, remoteWhy_);
  }
}

void Agent::onRemoteError(const std::string& why) {
  if (stopping_ == Stopping::kDone) return;
  remote_ = Remote::kGone;
  remoteWhy_ = why;
  stopForRemote();
}

std::vector<WorkerSpec> Agent::roundSpecs() {
  std::vector<WorkerSpec> specs;
  numaError_.clear();
  fs::path attemptDir = fs::path(runDir_) / fmt::format("attempt_{}", round_);
  std::string ns = contract::roundNamespace(runId_, round_);
  for (int local = 0; local < options_.localWorldSize; ++local) {
    WorkerSpec spec;
    spec.localRank = local;
    spec.globalRank = rankOffset_ + local;
    fs::path rankDir = attemptDir / std::to_string(local);
    std::error_code ec;
    fs::create_directories(rankDir, ec);
    spec.env = env_;
    auto& e = spec.env;
    e["LOCAL_RANK"] = std::to_string(local);
    if (options_.virtualLocalRank) {
      // Each worker sees its own device as device 0 (torchrun's --virtual-local-rank).
      e["LOCAL_RANK"] = "0";
      std::string device = std::to_string(local);
      if (auto it = env_.find("CUDA_VISIBLE_DEVICES"); it != env_.end()) {
        std::vector<std::string> devices = absl::StrSplit(it->second, ',');
        device = std::string(absl::StripAsciiWhitespace(devices.at(static_cast<size_t>(local))));
      }
      e["CUDA_VISIBLE_DEVICES"] = device;
    }
    e["RANK"] = std::to_string(spec.globalRank);
    e["GROUP_RANK"] = std::to_string(groupRank_);
    e["ROLE_RANK"] = std::to_string(spec.globalRank);
    e["ROLE_NAME"] = options_.role;
    e["LOCAL_WORLD_SIZE"] = std::to_string(options_.localWorldSize);
    e["WORLD_SIZE"] = std::to_string(worldSize_);
    e["GROUP_WORLD_SIZE"] = std::to_string(groupWorldSize_);
    e["ROLE_WORLD_SIZE"] = std::to_string(worldSize_);
    e["MASTER_ADDR"] = masterAddr_;
    e["MASTER_PORT"] = std::to_string(masterPort_);
    e["TORCHELASTIC_RESTART_COUNT"] = std::to_string(restartCount_);
    e["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(options_.maxRestarts);
    e["TORCHELASTIC_RUN_ID"] = runId_;
    // The workers' c10d store: this job's agent store at MASTER_ADDR:MASTER_PORT (as
    // torchrun's static rendezvous and torchrun >= 2.5's c10d), or with --worker_store=rank0
    // rank 0's own TCPStore there.
    e["TORCHELASTIC_USE_AGENT_STORE"] = options_.agentStore ? "True" : "False";
    if (!env_.count("NCCL_ASYNC_ERROR_HANDLING")) e["NCCL_ASYNC_ERROR_HANDLING"] = "1";
    if (!env_.count("TORCH_NCCL_ASYNC_ERROR_HANDLING")) e["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1";
    spec.errorFile = (rankDir / "error.json").string();
    e["TORCHELASTIC_ERROR_FILE"] = spec.errorFile;
    e[contract::kStoreAddr] = endpoint_;
    e[contract::kStoreNamespace] = ns;
    e[contract::kRound] = std::to_string(round_);
    if (!storeToken_.empty()) e[contract::kStoreTokenFile] = tokenFile_;
    if (!sharedDir_.empty()) e[contract::kSharedDir] = sharedDir_;
    e[contract::kRunDir] = runDir_;
    e[contract::kJobId] = jobId_;

    StdSpec redirect = options_.redirectFor(local), tee = options_.teeFor(local);
    bool shown = options_.consoleShows(local);
    spec.stdoutToConsole = shown && (!redirect.out || tee.out);
    spec.stderrToConsole = shown && (!redirect.err || tee.err);
    if (redirect.out || tee.out) spec.stdoutFile = (rankDir / "stdout.log").string();
    if (redirect.err || tee.err) spec.stderrFile = (rankDir / "stderr.log").string();
    if (options_.prefixOutput || tee.out || tee.err) {
      spec.prefix = linePrefix(local, spec.globalRank);
    }
    if (shown && !options_.duplicateStdoutFilters.empty() && tee.out) {
      spec.filteredStdoutFile = (attemptDir / "filtered_stdout.log").string();
      spec.stdoutFilters = options_.duplicateStdoutFilters;
    }
    if (shown && !options_.duplicateStderrFilters.empty() && tee.err) {
      spec.filteredStderrFile = (attemptDir / "filtered_stderr.log").string();
      spec.stderrFilters = options_.duplicateStderrFilters;
    }
    spec.argv = command_;
    if (!options_.numaBinding.empty()) {
      // As torchrun: the worker runs under numactl, on the CPUs near GPU <local rank>.
      auto cpus = numaCpusForGpu({.mode = options_.numaBinding, .gpu = local}, env_);
      if (!cpus.ok()) {
        numaError_ = std::string(cpus.status().message());
      } else {
        std::string numactl = findExecutable("numactl", env_.count("PATH") ? env_.at("PATH") : "/usr/bin:/bin");
        spec.argv.insert(spec.argv.begin(), {numactl, "--physcpubind=" + *cpus});
      }
    }
    for (auto& arg : spec.argv) {
      for (size_t pos; (pos = arg.find("${local_rank}")) != std::string::npos;) {
        arg.replace(pos, 13, std::to_string(local));
      }
    }
    specs.push_back(std::move(spec));
  }
  return specs;
}

std::string Agent::linePrefix(int localRank, int globalRank) const {
  if (options_.logLinePrefixTemplate.empty()) return fmt::format("[{}{}]:", options_.role, localRank);
  // Python's Template.safe_substitute: ${name} and $name; unknown names stay as written.
  std::map<std::string, std::string> values{{"role_name", options_.role},
                                            {"local_rank", std::to_string(localRank)},
                                            {"rank", std::to_string(globalRank)},
                                            {"hostname", hostName()}};
  const std::string& t = options_.logLinePrefixTemplate;
  std::string out;
  for (size_t i = 0; i < t.size();) {
    if (t[i] == '$' && i + 1 < t.size() && t[i + 1] == '$') {
      out += '$';
      i += 2;
      continue;
    }
    if (t[i] == '$') {
      bool braced = i + 1 < t.size() && t[i + 1] == '{';
      size_t start = i + (braced ? 2 : 1), end = start;
      while (end < t.size() && (std::isalnum(static_cast<unsigned char>(t[end])) || t[end] == '_')) ++end;
      std::string name = t.substr(start, end - start);
      bool closed = !braced || (end < t.size() && t[end] == '}');
      auto it = values.find(name);
      if (!name.empty() && closed && it != values.end()) {
        out += it->second;
        i = end + (braced ? 1 : 0);
        continue;
      }
    }
    out += t[i++];
  }
  return out;
}

absl::Status Agent::startRound() {
  stopping_ = Stopping::kNo;
  killArmed_ = false;
  group_ = std::make_unique<WorkerGroup>(io_, reaper_,
                                         [this](const WorkerState& w) { onWorkerExit(w); },
                                         WorkerGroup::Consoles{stdout_.get(), stderr_.get()});
  group_->onSettled([this] { onRoundSettled(); });
  roundStarted_ = std::chrono::steady_clock::now();
  auto specs = roundSpecs();
  if (!numaError_.empty()) return absl::FailedPreconditionError(numaError_);
  auto status = group_->start(std::move(specs));
  if (!status.ok()) return status;
  std::string pids;
  for (const auto& w : group_->workers()) pids += (pids.empty() ? "" : ",") + std::to_string(w->pid);
  emitWorkerEvents();
  logger()->info("round {}: started {} workers of world size {} (pids {}); run {}, logs in {}",
                 round_, group_->workers().size(), worldSize_, pids, runId_, runDir_);
  return absl::OkStatus();
}

Agent::Failure Agent::describe(const WorkerState& w) const {
  Failure f;
  f.globalRank = w.spec.globalRank;
  f.localRank = w.spec.localRank;
  f.pid = w.pid;
  f.exit = *w.exit;
  f.when = std::chrono::system_clock::now();
  if (fs::exists(w.spec.errorFile)) {
    f.errorFile = w.spec.errorFile;
    f.errorMessage = readErrorFile(w.spec.errorFile);
  }
  f.lastLines.assign(w.lastErrLines.begin(), w.lastErrLines.end());
  return f;
}

void Agent::onWorkerExit(const WorkerState& w) {
  const WorkerExit& e = *w.exit;
  bool failed = e.code != 0 || e.signal != 0;
  double secs = std::chrono::duration<double>(e.at - w.started).count();
  if (!failed) {
    logger()->debug("rank {} (local_rank {}, pid {}) finished in {:.3f} s", w.spec.globalRank,
                    w.spec.localRank, w.pid, secs);
  } else if (stopping_ == Stopping::kNo) {
    logger()->error("rank {} (local_rank {}, pid {}) {} after {:.3f} s", w.spec.globalRank,
                    w.spec.localRank, w.pid, describeExit(e), secs);
  } else {
    logger()->debug("rank {} (local_rank {}, pid {}) {} while the group stops", w.spec.globalRank,
                    w.spec.localRank, w.pid, describeExit(e));
  }
  if (failed && stopping_ == Stopping::kNo) {
    stopping_ = Stopping::kFailure;
    stopStarted_ = e.at;
    rootLocalRank_ = w.spec.localRank;
    // The report waits for the group to settle, so that stderr's last lines are complete;
    // only which worker failed first is noted now.
    stopGroup(SIGTERM, fmt::format("rank {} failed", w.spec.globalRank));
  }
  if (group_->allExited()) {
    // Whatever the workers left behind in their process groups goes too: no orphans.
    killGroup();
    killLeftovers();
  }
}

void Agent::stopGroup(int sig, const std::string& why) {
  if (!group_) return;
  size_t running = 0;
  for (const auto& w : group_->workers()) running += w->exit ? 0 : 1;
  if (running > 0) {
    logger()->info("{}: sending {} to {} worker(s); SIGKILL after {} s", why, signalName(sig),
                   running, options_.gracePeriodS);
  }
  group_->signalAll(sig);
  graceTimer_.expires_after(std::chrono::milliseconds(static_cast<int64_t>(options_.gracePeriodS * 1000)));
  graceTimer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || !group_ || group_->allExited()) return;
    size_t left = 0;
    for (const auto& w : group_->workers()) left += w->exit ? 0 : 1;
    logger()->warn("{} worker(s) still running {} s after the stop began; sending SIGKILL", left,
                   options_.gracePeriodS);
    killGroup();
  });
}

void Agent::killGroup() {
  group_->signalAll(SIGKILL);
  if (killArmed_) return;
  killArmed_ = true;
  killTimer_.expires_after(Millis(static_cast<int64_t>(options_.killTimeoutS * 1000)));
  killTimer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || !group_ || group_->settled()) return;
    // SIGKILL cannot end a process the kernel holds (state D: a hung file system or device).
    // Waiting on would wedge launch for good: say what is stuck, and go on without it.
    for (const auto& line : group_->abandon()) logger()->error("{}", line);
    logger()->error("launch goes on without what is still there {} s after SIGKILL (--kill_timeout); no "
                    "restart while it may hold the job's resources", options_.killTimeoutS);
    stuck_ = true;
  });
}

void Agent::onRoundSettled() {
  graceTimer_.cancel();
  killTimer_.cancel();
  emitWorkerEvents();
  if (group_) {
    for (const auto& [file, loss] : group_->logLosses()) lostLogs_[file] = loss;
  }
  double roundSecs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - roundStarted_).count();
  if (stopping_ == Stopping::kNo) {
    logger()->info("all {} workers finished successfully in {:.3f} s", group_->workers().size(),
                   roundSecs);
    if (!multiNode_) {
      finish(0);
      return;
    }
    // The job succeeds when every node has: wait for the service to say so (or for a failure).
    localDone_ = true;
    report(true, "");
    if (stopping_ == Stopping::kNo) logger()->info("waiting for the other nodes to finish");
    return;
  }
  if (stopping_ == Stopping::kSignal) {
    if (multiNode_) report(false, fmt::format("launch got {}", signalName(stopSignal_)));
    finish(128 + stopSignal_);
    return;
  }
  if (stopping_ == Stopping::kRemote) {
    if (rdzv_) rdzv_->stopWatch();
    dropRound();
    if (stuck_) {
      std::fprintf(stderr, "launch: %s; no restart: a worker could not be killed\n", remoteWhy_.c_str());
      finish(1);
      return;
    }
    if (remote_ == Remote::kGone && standaloneService_ && restartCount_ < options_.maxRestarts) {
      // rendezvousd restarted (systemd, a rescheduled pod): it comes back empty, so every
      // agent re-joins as a new round; the join waits for it, with back-off, up to the join
      // timeout.
      ++restartCount_;
      logger()->warn("{}; re-joining it as a new round ({} of {} restarts; waiting up to {} s)",
                     remoteWhy_, restartCount_, options_.maxRestarts, options_.rdzvConf.joinTimeout.count() / 1000);
      stopping_ = Stopping::kNo;
      startJoin();
      return;
    }
    if (remote_ == Remote::kGone) {
      std::fprintf(stderr, "launch: %s; %s\n", remoteWhy_.c_str(),
                   hostsStore_           ? "this node hosted it"
                   : standaloneService_ ? "no restart is left to re-join it (--max_restarts)"
                                        : "it was hosted by node 0's launch, which is gone (run a "
                                          "standalone rendezvousd to make the store outlive any node)");
      finish(1);
      return;
    }
    if (remote_ == Remote::kWaiting) {
      logger()->info("{}: restarting the group to take it in (not counted as a restart)", remoteWhy_);
      stopping_ = Stopping::kNo;
      startJoin();
      return;
    }
    if (restartCount_ < options_.maxRestarts) {
      ++restartCount_;
      logger()->warn("{}; restarting the group ({} of {} restarts)", remoteWhy_, restartCount_, options_.maxRestarts);
      stopping_ = Stopping::kNo;
      startJoin();
      return;
    }
    if (!failureAnnounced_) std::fprintf(stderr, "launch: the job failed: %s\n", remoteWhy_.c_str());
    finish(1);
    return;
  }
  // A failure: the first worker that failed is the root cause. Others that failed in a way
  // our SIGTERM/SIGKILL does not explain are failures too.
  rootCause_.reset();
  failures_.clear();
  for (const auto& w : group_->workers()) {
    if (w->spec.localRank == rootLocalRank_) {
      rootCause_ = describe(*w);
      continue;
    }
    const WorkerExit& e = *w->exit;
    bool ours = e.signal == SIGTERM || e.signal == SIGKILL || e.code == 128 + SIGTERM;
    if ((e.code != 0 || e.signal != 0) && !ours) failures_.push_back(describe(*w));
  }
  auto stopMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                          stopStarted_)
                    .count();
  logger()->info("group stopped {:.1f} ms after rank {} failed", stopMs,
                 rootCause_ ? rootCause_->globalRank : -1);
  if (multiNode_) {
    // Close the watch once the report is in: a watch that closes first looks like a lost node.
    report(false,
           rootCause_ ? fmt::format("rank {} {}", rootCause_->globalRank, describeExit(rootCause_->exit))
                      : std::string("a worker failed"),
           [this] {
             if (rdzv_) rdzv_->stopWatch();
             if (stopping_ != Stopping::kDone) restartOrEnd();
           });
    return;
  }
  restartOrEnd();
}

void Agent::restartOrEnd() {
  if (restartCount_ < options_.maxRestarts && !stuck_) {
    if (rootCause_) {
      logger()->warn("restarting the group ({} of {} restarts) after rank {} {}",
                     restartCount_ + 1, options_.maxRestarts, rootCause_->globalRank,
                     describeExit(rootCause_->exit));
    }
    ++restartCount_;
    dropRound();
    if (multiNode_) {
      stopping_ = Stopping::kNo;
      startJoin();
      return;
    }
    round_ = restartCount_;
    if (front_) front_->setRound(round_);
    auto status = startRound();
    if (!status.ok()) {
      logger()->error("{}", std::string(status.message()));
      finish(1);
    }
    return;
  }
  printFailureReport();
  finish(1);
}

void Agent::reapOrphans() {
  // launch is a child subreaper: a worker's descendants whose parent died come to it. Reap
  // them as they exit (peeking first, so that a worker's exit stays the group's to reap).
  while (true) {
    siginfo_t info{};
    if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) return;
    pid_t pid = info.si_pid;
    if (group_ && group_->owns(pid)) {
      group_->reap();
      if (group_ && group_->owns(pid)) return;  // not reapable yet
      continue;
    }
    waitpid(pid, nullptr, WNOHANG);
  }
}

void Agent::killLeftovers() {
  // Every process below launch, but the orphan guard, once the round's workers have all
  // exited: daemons that left their worker's process group (setsid, double fork) came to
  // launch as their subreaper, and go with the round.
  std::map<pid_t, pid_t> parent;
  std::set<pid_t> zombies;  // kept for the walk (a dead shell between launch and a daemon)
  for (const auto& p : listProcesses()) {
    parent[p.pid] = p.ppid;
    if (p.state == 'Z') zombies.insert(p.pid);
  }
  pid_t self = getpid(), guard = reaper_.pid();
  std::vector<pid_t> leftovers;
  for (const auto& [pid, ppid] : parent) {
    // Walk up: is it below launch, and not below the guard?
    bool below = false;
    for (pid_t p = ppid, hops = 0; p > 1 && hops < 4096; p = parent.count(p) ? parent[p] : 0, ++hops) {
      if (p == guard) break;
      if (p == self) {
        below = pid != guard;
        break;
      }
    }
    if (below && !zombies.count(pid)) leftovers.push_back(pid);
  }
  if (leftovers.empty()) return;
  std::string pids;
  for (pid_t p : leftovers) {
    kill(p, SIGKILL);
    pids += (pids.empty() ? "" : ",") + std::to_string(p);
  }
  logger()->warn("killed {} process(es) the workers left behind outside their process groups "
                 "(pids {}): a daemon (setsid, double fork) does not outlive the job", leftovers.size(), pids);
}

void Agent::dropRound() {
  // The next round gets a fresh namespace and channel directory (a restarted rendezvousd may
  // hand out the same round number again).
  std::error_code ec;
  if (!sharedDir_.empty()) fs::remove_all(contract::roundDirectory(sharedDir_, jobId_, round_), ec);
  std::string ns = contract::roundNamespace(runId_, round_);
  if (store_) rendezvous::LocalStore(store_->memory(), ns).clear().IgnoreError();
  if (frontMemory_ && (!store_ || frontMemory_ != store_->memory())) {
    rendezvous::LocalStore(frontMemory_, ns).clear().IgnoreError();
  }
}

void Agent::printFailureReport() const {
  std::string program = options_.program;
  std::string out;
  if (rootCause_) {
    const Failure& f = *rootCause_;
    out += fmt::format("launch: root cause: rank {} (local_rank {}, pid {}) {}\n", f.globalRank,
                       f.localRank, f.pid, describeExit(f.exit));
    if (!f.errorFile.empty()) {
      out += fmt::format("  error file {}:\n", f.errorFile);
      for (absl::string_view l : absl::StrSplit(f.errorMessage, '\n')) {
        if (!l.empty()) out += fmt::format("    {}\n", std::string(l));
      }
    }
    if (!f.lastLines.empty()) {
      out += fmt::format("  last {} line(s) of its stderr:\n", f.lastLines.size());
      for (const auto& l : f.lastLines) out += fmt::format("    {}\n", l);
    }
  }
  std::string rule(60, '=');
  std::string thin(60, '-');
  auto entry = [&](size_t idx, const Failure& f) {
    std::string exitText = f.exit.signal != 0 ? fmt::format("-{} ({})", f.exit.signal,
                                                            signalName(f.exit.signal))
                                              : std::to_string(f.exit.code);
    std::string traceback =
        !f.errorMessage.empty()
            ? f.errorMessage
            : f.exit.signal != 0
                  ? fmt::format("Signal {} ({}) received by PID {}", f.exit.signal,
                                signalName(f.exit.signal), f.pid)
                  : (f.lastLines.empty() ? std::string("(no error file, no stderr)")
                                         : f.lastLines.back());
    return fmt::format(
        "[{}]:\n  time      : {:%Y-%m-%d_%H:%M:%S}\n  host      : {}\n  rank      : {} "
        "(local_rank: {})\n  exitcode  : {} (pid: {})\n  error_file: {}\n  traceback : {}\n",
        idx, fmt::localtime(std::chrono::system_clock::to_time_t(f.when)), hostName(),
        f.globalRank, f.localRank, exitText, f.pid,
        f.errorFile.empty() ? "<N/A>" : f.errorFile, traceback);
  };
  out += rule + "\n" + program + " FAILED\n" + thin + "\nFailures:\n";
  if (failures_.empty()) {
    out += "  <NO_OTHER_FAILURES>\n";
  } else {
    for (size_t i = 0; i < failures_.size(); ++i) out += entry(i + 1, failures_[i]);
  }
  out += thin + "\nRoot Cause (first observed failure):\n";
  if (rootCause_) out += entry(0, *rootCause_);
  out += rule + "\n";
  std::fwrite(out.data(), 1, out.size(), stderr);
  std::fflush(stderr);
}

void Agent::emit(ElasticEvent e) const {
  if (options_.eventLogHandler != "console") return;
  e.runId = runId_;
  e.role = options_.role;
  e.hostname = fqdn();
  e.rdzvBackend = options_.rdzvBackend;
  e.agentRestarts = restartCount_;
  e.entryPoint = fs::path(command_.empty() ? "" : command_[0]).filename().string();
  if (!e.groupRank) e.groupRank = groupRank_;
  if (!e.groupWorldSize) e.groupWorldSize = groupWorldSize_;
  e.totalRunTimeS = std::chrono::duration<double>(std::chrono::steady_clock::now() - launched_).count();
  std::string line = eventLine(e) + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

void Agent::emitWorkerEvents() const {
  if (options_.eventLogHandler != "console" || !group_) return;
  for (const auto& w : group_->workers()) {
    ElasticEvent e;
    e.fromWorker = true;
    e.globalRank = w->spec.globalRank;
    e.localRank = w->spec.localRank;
    e.roleWorldSize = worldSize_;
    e.workerPid = w->pid;
    if (w->exit) {
      const WorkerExit& x = *w->exit;
      e.exitCode = x.signal != 0 ? -x.signal : x.code;
      bool ours = stopping_ != Stopping::kNo && w->spec.localRank != rootLocalRank_ &&
                  (x.signal == SIGTERM || x.signal == SIGKILL || x.code == 128 + SIGTERM);
      e.state = x.code == 0 && x.signal == 0 ? "SUCCEEDED" : ours ? "TERMINATED" : "FAILED";
      if (e.state == "FAILED") {
        if (auto text = readFile(w->spec.errorFile, "error file"); text.ok()) e.rawError = *text;
      }
    } else {
      e.state = "START";
    }
    emit(e);
  }
}

void Agent::finish(int code) {
  if (stopping_ != Stopping::kDone) {
    ElasticEvent e;
    e.state = code == 0 ? "SUCCEEDED" : "FAILED";
    if (code != 0) e.rawError = fmt::format("launch exits with code {}", code);
    emit(e);
  }
  exitCode_ = code;
  stopping_ = Stopping::kDone;
  signals_.cancel();
  graceTimer_.cancel();
  killTimer_.cancel();
  joinRetryTimer_.cancel();
  if (pendingReports_ == 0) {
    io_.stop();
    return;
  }
  // A report still on its way stops the loop when it is in; the service may be gone, so it
  // gets a moment, not its whole deadline.
  reportTimer_.expires_after(kLastReportWait);
  reportTimer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec && rdzv_) rdzv_->cancel();
  });
}

void Agent::armSignals() {
  signals_.async_wait([this](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    if (sig == SIGCHLD) {
      if (group_) group_->reap();
      reapOrphans();
    } else if ((sig == SIGUSR1 || sig == SIGUSR2) &&
               std::find(options_.stopSignals.begin(), options_.stopSignals.end(), sig) ==
                   options_.stopSignals.end()) {
      // Notices, not stops (Slurm's --signal=USR1@SECONDS before preemption or the time
      // limit): pass them on and keep going; the workers decide (checkpoint, exit).
      if (group_ && !group_->allExited()) {
        logger()->warn("launch got {}; forwarding it to the workers", signalName(sig));
        group_->signalAll(sig);
      } else {
        logger()->warn("launch got {} with no worker running; ignoring it", signalName(sig));
      }
    } else if (stopping_ != Stopping::kDone) {
      if (stopping_ == Stopping::kSignal && sig == stopSignal_) {
        // A second Ctrl-C: do not wait out the grace period.
        logger()->warn("{} again: killing the workers now", signalName(sig));
        if (group_) killGroup();
      } else {
        logger()->warn("launch got {}; forwarding it to the workers", signalName(sig));
        if (!group_ || group_->allExited()) {
          // Nothing running (still joining, or waiting for the other nodes): stop now.
          if (multiNode_) report(false, fmt::format("launch got {}", signalName(sig)));
          finish(128 + sig);
          return;
        }
        stopping_ = Stopping::kSignal;
        stopSignal_ = sig;
        stopStarted_ = std::chrono::steady_clock::now();
        stopGroup(sig, fmt::format("launch got {}", signalName(sig)));
      }
    }
    if (stopping_ != Stopping::kDone) armSignals();
  });
}

int Agent::run() {
  launched_ = std::chrono::steady_clock::now();
  raiseFileLimit();
  // Orphaned descendants of the workers (double-forked daemons) come to launch, not to init,
  // so that they end with the job.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  // The guard first: it must be forked before any thread starts (the store's are next).
  if (auto s = reaper_.start(); !s.ok()) {
    logger()->error("cannot start the orphan guard: {}", std::string(s.message()));
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);
  // After the guard's fork: these start threads.
  stdout_ = std::make_unique<ConsoleStream>(STDOUT_FILENO);
  stderr_ = std::make_unique<ConsoleStream>(STDERR_FILENO);
  // --signals_to_handle stop the job; SIGUSR1/2 are notices unless listed there.
  std::set<int> caught(options_.stopSignals.begin(), options_.stopSignals.end());
  caught.insert({SIGUSR1, SIGUSR2, SIGCHLD});
  for (int sig : caught) signals_.add(sig);
  armSignals();
  auto prepared = prepare();
  if (!prepared.ok()) {
    std::fprintf(stderr, "launch: %s\n", std::string(prepared.message()).c_str());
    return prepared.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  if (multiNode_) {
    startJoin();
  } else {
    ElasticEvent e;
    e.state = "RENDEZVOUS";
    e.durationMs = 0.0;
    emit(e);
    auto started = startRound();
    if (!started.ok()) {
      std::fprintf(stderr, "launch: %s\n", std::string(started.message()).c_str());
      group_.reset();
      return 1;
    }
  }
  io_.run();
  group_.reset();
  // The workers' last lines reach the console before launch's own last words, if the reader
  // takes them within a moment; a reader that never reads does not hold launch.
  stdout_->drain(Millis(2000));
  stderr_->drain(Millis(2000));
  for (const auto& [file, loss] : lostLogs_) {
    std::fprintf(stderr, "launch: %zu byte(s) of output were lost: %s could not be written (%s)\n",
                 loss.bytes, file.c_str(), loss.error.c_str());
  }
  if (size_t dropped = stdout_->droppedBytes() + stderr_->droppedBytes(); dropped > 0) {
    std::fprintf(stderr, "launch: %zu byte(s) of worker output were not shown: the console did not "
                 "take them (a stalled or closed reader)\n", dropped);
  }
  stopProbe();
  // Cancels a join still waiting and closes the watch; waits only for their callbacks.
  rdzv_.reset();
  if (front_) front_->shutdown();
  if (workerPortFd_ >= 0) close(workerPortFd_);
  if (store_) store_->shutdown(Millis(200));
  std::error_code ec;
  if (ownSharedDir_) {
    fs::remove_all(sharedDir_, ec);
  } else if (exitCode_ == 0 && !jobId_.empty() && !sharedDir_.empty()) {
    fs::remove_all(fs::path(sharedDir_) / jobId_, ec);  // nothing left after a successful job
  }
  if (exitCode_ == 0 && ownBaseLogDir_) fs::remove_all(baseLogDir_, ec);
  return exitCode_;
}

}  // namespace muster::launcher
