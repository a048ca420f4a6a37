// Agent: this node's side of a rendezvous with other nodes: joining a round of the service (or
// node 0's), probing that the shared directory is shared, reporting the round's end, and the
// service's news of other nodes (a node lost, a late joiner, a finished run).
#include "launcher/agent.h"

#include <signal.h>

#include <filesystem>

#include <fmt/format.h>

#include "common/files.h"
#include "common/net.h"
#include "etcd/options.h"
#include "launcher/etcd_rendezvous.h"

namespace muster::launcher {
namespace asio = boost::asio;
namespace fs = std::filesystem;

absl::Status Agent::prepareMultiNode() {
  std::string host;
  int port = 0;
  if (options_.etcd()) return prepareEtcd();
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
    // A TLS endpoint is a rendezvousd: launch's own rendezvous speaks plaintext.
    hostsStore_ = options_.rdzvTlsCa.empty() &&
                  options_.rdzvConf.isHost.value_or(port == 0 || net::isLocalHost(host));
  }
  if (!options_.rdzvTlsCa.empty()) {
    auto ca = readFile(options_.rdzvTlsCa, "TLS CA");
    if (!ca.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("--rdzv_tls_ca: {}", std::string(ca.status().message())));
    }
    tlsCaPem_ = *ca;
  }
  endpoint_ = net::joinHostPort(host, port);
  if (hostsStore_) {
    // Port 0: this node hosts the rendezvous on a free port (a one-node job). A one-node job
    // binds only the endpoint's own address; others every address.
    rendezvous::ServerOptions server;
    server.host = options_.maxNodes == 1 && options_.rdzvBackend != "static" ? host : "0.0.0.0";
    server.port = port;
    server.token = layout_.token;
    // On a free port of the same address; a client that cannot reach it stays on gRPC.
    server.directPort = 0;
    auto started = rendezvous::RendezvousServer::start(server);
    if (!started.ok()) {
      if (options_.rdzvBackend == "static") return started.status();
      // A c10d endpoint that is taken may be a standalone rendezvousd: use it.
      logger()->info("{}; joining the rendezvous already there",
                     std::string(started.status().message()));
      hostsStore_ = false;
    } else {
      store_ = std::move(*started);
      if (port == 0) {
        port = store_->port();
        endpoint_ = net::joinHostPort(host, port);
      }
    }
  }
  rdzv_ = std::make_unique<NodeRendezvous>(io_, endpoint_, layout_.token, thisNode(host, port), options_.rdzvConf,
                                           tlsCaPem_, options_.rdzvTlsServerName);
  logger()->info("node {} ({}) joins run '{}' at {}{}", rdzv_->node().nodeId, rdzv_->node().host, layout_.runId,
                 endpoint_, hostsStore_ ? " (hosted here)" : "");
  return holdPortAndSettle();
}

absl::Status Agent::prepareEtcd() {
  // The rendezvous is etcd's; the store of the workers and of the shared-directory probe is
  // group rank 0's, served by its launch: every node serves one, on a free port, in case.
  rendezvous::ServerOptions server;
  server.host = "0.0.0.0";
  server.port = 0;
  server.token = layout_.token;
  server.directPort = 0;
  auto started = rendezvous::RendezvousServer::start(server);
  if (!started.ok()) return started.status();
  store_ = std::move(*started);
  auto etcdOptions = etcd::clientOptions(options_.rdzvEndpoint, options_.rdzvConf.given, "--rdzv_conf");
  if (!etcdOptions.ok()) return etcdOptions.status();
  endpoint_ = options_.rdzvEndpoint;
  auto node = thisNode(options_.rdzvHost, options_.rdzvPort);
  auto client = std::make_unique<EtcdRendezvous>(std::move(*etcdOptions), layout_.runId, store_->port());
  rdzv_ = std::make_unique<NodeRendezvous>(io_, std::move(client), node, options_.rdzvConf);
  logger()->info("node {} ({}) joins run '{}' at etcd {}", node.nodeId, node.host, layout_.runId, endpoint_);
  return holdPortAndSettle();
}

NodeRendezvous::Node Agent::thisNode(const std::string& host, int port) const {
  NodeRendezvous::Node node;
  node.runId = layout_.runId;
  node.nodeId = fmt::format("{}-{}-{}", net::hostName(), getpid(), randomHex(2));
  // The address the others (and the workers) reach this node at: --local_addr; for one node,
  // torchrun's socket.getfqdn() when it resolves; else the local end of the route to the
  // rendezvous (a name may not resolve, or resolve to 127.0.1.1, on another host).
  node.host = options_.localAddr;
  if (node.host.empty() && options_.maxNodes == 1 && !net::routeAddress(net::canonicalHostName(), 9).empty()) {
    node.host = net::canonicalHostName();
  }
  if (node.host.empty()) node.host = net::routeAddress(host, port);
  if (node.host.empty()) node.host = net::canonicalHostName();
  node.localWorldSize = options_.localWorldSize;
  node.wantedRank = options_.rdzvBackend == "static" ? options_.nodeRank : -1;
  node.role = options_.role;
  node.minNodes = options_.minNodes;
  node.maxNodes = options_.maxNodes;
  return node;
}

absl::Status Agent::holdPortAndSettle() {
  if (options_.agentStore) {
    // Every node holds a port for the workers' store; the round's group rank 0 serves it. A
    // one-node job binds only the address its workers use.
    if (auto s = holdWorkerPort(options_.maxNodes == 1 ? rdzv_->node().host : "", 0); !s.ok()) return s;
  }
  settleThreads();
  return absl::OkStatus();
}

void Agent::startJoin() {
  joinStarted_ = std::chrono::steady_clock::now();
  rdzv_->join(options_.agentStore ? workerPort_ : net::freeTcpPort(), standaloneService_,
              [this](absl::StatusOr<muster::v1::Assignment> result) { onJoined(std::move(result)); });
}

void Agent::onJoined(absl::StatusOr<muster::v1::Assignment> result) {
  if (stopping_ == Stopping::kDone || stopping_ == Stopping::kSignal) return;
  if (!result.ok()) {
    std::fprintf(stderr, "launch: rendezvous at %s failed: %s\n", endpoint_.c_str(),
                 std::string(result.status().message()).c_str());
    finish(1);
    return;
  }
  const auto& a = *result;
  at_.round = a.round();
  at_.groupRank = a.group_rank();
  at_.groupWorldSize = a.group_world_size();
  at_.worldSize = a.world_size();
  at_.rankOffset = a.rank_offset();
  at_.roleRankOffset = a.role_rank_offset();
  at_.roleWorldSize = a.role_world_size();
  at_.masterAddr = a.master_addr();
  at_.masterPort = a.master_port();
  standaloneService_ = a.standalone_service();
  if (!a.store_endpoint().empty()) endpoint_ = a.store_endpoint();
  localDone_ = false;
  heldEnd_.reset();
  endTaken_ = false;
  remote_ = Remote::kNone;
  emitRendezvousEvents(
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - joinStarted_).count());
  if (at_.groupRank == 0 && options_.agentStore) {
    if (auto s = serveWorkerStore(); !s.ok()) {
      std::fprintf(stderr, "launch: %s\n", std::string(s.message()).c_str());
      report(false, std::string(s.message()));
      finish(1);
      return;
    }
  }
  logger()->info("round {}: node rank {} of {}, ranks {}-{} of world size {}; workers' store at {}", at_.round,
                 at_.groupRank, at_.groupWorldSize, at_.rankOffset, at_.rankOffset + options_.localWorldSize - 1, at_.worldSize,
                 net::joinHostPort(at_.masterAddr, at_.masterPort));
  // Watch before the workers start, so that losing this node is seen through its watch at once.
  rdzv_->watch(at_.round, [this](const muster::v1::RoundEvent& e) { onRemoteEvent(e); },
               [this](const std::string& why) { onRemoteError(why); },
               [this](uint64_t request) { onStacksAsked(request); });
  if (options_.sharedDir.empty()) {
    onProbed(absl::OkStatus());  // only a given --shared_dir is probed
    return;
  }
  SharedDirProbe probe{.endpoint = endpoint_,
                       .token = layout_.token,
                       .tlsCaPem = tlsCaPem_,
                       .tlsServerName = options_.rdzvTlsServerName,
                       .storeNamespace = fmt::format("{}/{}/probe", layout_.runId, at_.round),
                       .file = (fs::path(layout_.sharedDir) / layout_.jobId / fmt::format(".node-probe-{}", at_.round)).string(),
                       .sharedDir = layout_.sharedDir,
                       .nodeHost = rdzv_->node().host,
                       .groupRank = at_.groupRank,
                       .groupWorldSize = at_.groupWorldSize,
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

void Agent::report(bool succeeded, const std::string& message, NodeRendezvous::Reported then) {
  if (!rdzv_) {
    if (then) then(std::nullopt);
    return;
  }
  rdzv_->report(at_.round, succeeded, message, [this, then = std::move(then)](const auto& ended) {
    if (then) then(ended);
    // finish() leaves the loop running until the last report is out.
    if (stopping_ == Stopping::kDone && rdzv_->pendingReports() == 0) io_.stop();
  });
}

void Agent::onReported(const std::optional<muster::v1::RoundEvent>& ended) {
  // The service's answer to this node's success: how the round ended, when it has. It decides
  // over an end the watch could not say (heldEnd_); a job that succeeded is a success whatever
  // a later call meets.
  std::optional<muster::v1::RoundEvent> held = std::exchange(heldEnd_, std::nullopt);
  if (ended && ended->round() == at_.round && ended->kind() != muster::v1::RoundEvent::UNKNOWN) {
    onRemoteEvent(*ended);  // the watch's own report of this end, if it comes too, is not taken again
  } else if (held) {
    onRemoteEvent(*held);
  }
}

void Agent::onRemoteEvent(const muster::v1::RoundEvent& e) {
  if (stopping_ == Stopping::kDone || e.round() != at_.round || endTaken_) return;
  using K = muster::v1::RoundEvent;
  if (e.kind() == K::UNKNOWN && localDone_ && rdzv_->pendingReports() > 0) {
    // The round ended before the service took this node's watch, and it no longer says how;
    // this node's own success report is on its way, and its answer says (onReported).
    heldEnd_ = e;
    return;
  }
  // One end a round: the watch and the answer to this node's report can both say it.
  endTaken_ = true;
  if (e.kind() == K::JOB_SUCCEEDED) {
    rdzv_->stopWatch();
    if (stop_ && ranksStopped()) {
      logger()->info("every node's ranks stopped");
      finish(kStoppedExit);
    } else {
      logger()->info("every node succeeded");
      finish(0);
    }
    return;
  }
  remote_ = e.kind() == K::NODE_WAITING ? Remote::kWaiting : e.kind() == K::NODE_FAILED ? Remote::kFailed : Remote::kLost;
  remoteWhy_ = e.message().empty() ? fmt::format("node {} ended the round", e.host()) : e.message();
  if (e.kind() == K::NODE_FAILED) remoteWhy_ = fmt::format("node {} (group rank {}) failed: {}", e.host(), e.group_rank(), e.message());
  if (stopping_ == Stopping::kFailure) return;  // our own failure is being handled
  if (e.kind() != K::NODE_WAITING && at_.restartCount >= options_.maxRestarts && !failureAnnounced_) {
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
  if (stopping_ != Stopping::kNo) return;
  stopping_ = Stopping::kRemote;
  stopStarted_ = std::chrono::steady_clock::now();
  // The job failed elsewhere (a rank, a hang, a node lost): where this node's ranks stand is
  // part of the answer (the hung rank may be here, while another node saw the hang first), so
  // their stacks are taken before they are stopped. Not for a scale-up.
  auto targets = rollCallTargets();
  if (remote_ == Remote::kWaiting || stacksSignal_ == 0 || targets.empty()) {
    stopGroup(SIGTERM, remoteWhy_);
    return;
  }
  WorkerGroup* round = group_.get();
  takeStacks(fmt::format("{}; this node's ranks before they are stopped", remoteWhy_), std::move(targets),
             [this, round](const auto&, const std::string&) {
               if (group_.get() == round && stopping_ == Stopping::kRemote) stopGroup(SIGTERM, remoteWhy_);
             });
}

void Agent::onRemoteError(const std::string& why) {
  if (stopping_ == Stopping::kDone || endTaken_) return;
  endTaken_ = true;
  remote_ = Remote::kGone;
  remoteWhy_ = why;
  stopForRemote();
}

}  // namespace muster::launcher
