// RendezvousServer: builds and runs the gRPC server around a MemoryStore and a RendezvousState.
#include "rendezvous/server/rendezvous_server.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <unistd.h>

#include <climits>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "common/net.h"
#include "rendezvous/door/connection_gate.h"
#include "rendezvous/door/front_door.h"
#include "rendezvous/door/health_service.h"
#include "rendezvous/membership/rendezvous_service.h"
#include "rendezvous/transport/store_direct.h"
#include "rendezvous/transport/store_service.h"

namespace muster::rendezvous {
namespace {

auto logger() {
  static auto l = log::get("store");
  return l;
}

// gRPC says only that the server did not start when its certificate or key is wrong (and
// binding then looks fine): check the pair first, to say which and why.
absl::Status checkTlsPair(const std::string& certPem, const std::string& keyPem) {
  auto opensslError = [] {
    const char* reason = ERR_reason_error_string(ERR_get_error());
    ERR_clear_error();
    return std::string(reason != nullptr ? reason : "unreadable");
  };
  std::unique_ptr<BIO, decltype(&BIO_free)> certBio(BIO_new_mem_buf(certPem.data(), static_cast<int>(certPem.size())), BIO_free);
  std::unique_ptr<X509, decltype(&X509_free)> cert(PEM_read_bio_X509(certBio.get(), nullptr, nullptr, nullptr), X509_free);
  if (!cert) {
    return absl::InvalidArgumentError(fmt::format("the TLS certificate is not a PEM certificate ({})", opensslError()));
  }
  std::unique_ptr<BIO, decltype(&BIO_free)> keyBio(BIO_new_mem_buf(keyPem.data(), static_cast<int>(keyPem.size())), BIO_free);
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
      PEM_read_bio_PrivateKey(keyBio.get(), nullptr, nullptr, nullptr), EVP_PKEY_free);
  if (!key) {
    return absl::InvalidArgumentError(fmt::format(
        "the TLS key is not an unencrypted PEM private key ({})", opensslError()));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError("the TLS key does not match the certificate (it is another "
                                      "certificate's key)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<RendezvousServer>> RendezvousServer::start(ServerOptions options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        fmt::format("port {} is out of range; expected 0 to 65535", options.port));
  }
  if (options.tlsCertPem.empty() != options.tlsKeyPem.empty()) {
    return absl::InvalidArgumentError("TLS needs both a certificate and its key");
  }
  if (options.directPort < -1 || options.directPort > 65535) {
    return absl::InvalidArgumentError(fmt::format(
        "direct port {} is out of range; expected 0 to 65535, or -1 for none", options.directPort));
  }
  if (options.directPort >= 0 && !options.tlsCertPem.empty()) {
    return absl::InvalidArgumentError(
        "the store's direct path is plaintext; it cannot be offered beside TLS");
  }
  if (!options.tlsCertPem.empty()) {
    if (auto s = checkTlsPair(options.tlsCertPem, options.tlsKeyPem); !s.ok()) return s;
  }

  size_t largest = largestRequest(options.limits);
  if (largest > INT_MAX) {
    return absl::InvalidArgumentError(fmt::format(
        "the largest request ({} bytes, from max_key_bytes, max_value_bytes and "
        "max_keys_per_call) exceeds gRPC's 2 GiB message limit", largest));
  }
  // Past the quota gRPC cancels streams, a member's too: the default leaves room for bursts of
  // write-behind sets (a client confirms every 64 MiB) from many clients, not just two requests.
  size_t inflight = options.maxInflightBytes != 0 ? options.maxInflightBytes
                                                  : std::max(2 * largest, size_t{1} << 30);
  if (inflight < largest) {
    return absl::InvalidArgumentError(fmt::format(
        "max_inflight_bytes={} cannot hold the largest request ({} bytes, from max_key_bytes, "
        "max_value_bytes and max_keys_per_call)", inflight, largest));
  }
  log::routeGrpcLogs();
  std::unique_ptr<RendezvousServer> server(new RendezvousServer());
  server->memory_ = std::make_shared<MemoryStore>(options.limits);
  server->gate_ = std::make_unique<TokenGate>(options.token);
  server->door_ = std::make_unique<FrontDoor>(*server->gate_);
  server->health_ = std::make_unique<HealthService>(
      std::vector<std::string>{"muster.v1.Store", "muster.v1.Rendezvous"});
  server->sessions_ = std::make_unique<StoreSessions>(server->memory_);
  server->rendezvous_ = std::make_unique<RendezvousService>(options.standalone, options.retention);
  if (options.standalone) {
    // A run the service forgets has no node left: what it left in the store goes with it.
    std::weak_ptr<MemoryStore> memory = server->memory_;
    server->rendezvous_->state().onForget([memory](const std::string& runId) {
      auto store = memory.lock();
      if (!store) return;
      if (size_t n = store->dropJob(runId); n > 0) {
        logger()->debug("dropped {} namespace(s) of forgotten run '{}'", n, runId);
      }
    });
  }
  server->health_->serve(*server->door_);
  serveStore(*server->sessions_, *server->door_);
  server->rendezvous_->serve(*server->door_);

  if (options.directPort >= 0) {
    auto direct = StoreDirect::start(*server->sessions_, *server->gate_,
                                     {.host = options.host,
                                      .port = options.directPort,
                                      .maxMessageBytes = largest,
                                      // Room for the largest request, and a read.
                                      .maxBufferedBytes = std::max(inflight, largest + (size_t{1} << 20)),
                                      .loops = options.threads});
    if (!direct.ok()) return direct.status();
    server->direct_ = std::move(*direct);
    server->sessions_->advertiseDirectPort(static_cast<uint32_t>(server->direct_->port()));
  }

  std::shared_ptr<grpc::ServerCredentials> credentials;
  if (!options.tlsCertPem.empty()) {
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({options.tlsKeyPem, options.tlsCertPem});
    credentials = grpc::SslServerCredentials(ssl);
  } else {
    credentials = grpc::InsecureServerCredentials();
  }

  // gRPC's absl::Mutexes check lock order for deadlocks on every lock when absl is built
  // without NDEBUG, as Debian's is: a graph of every live mutex (gRPC makes some per call),
  // which at 65,536 concurrent joins cost a fifth of the round (rdzv_bench). A debugging aid,
  // off in a release build of absl; off here for the whole process.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  grpc::ServerBuilder builder;
  // gRPC turns SO_REUSEPORT on by default: a second store on the same port would then start
  // and share it silently. An address in use must be an error.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Clients ping idle sessions to notice a dead store; let them.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // No timer for each call's deadline here: the client keeps its own, and cancels the call when
  // it passes, which reaches the server as the client leaving (FrontDoor's Answer, a Session's
  // cancel). Debian's libgrpc files every timer in a debugging hash table of 1,009 chains,
  // walked on each add and cancel: 65,536 parked joins with deadlines cost 16% of the round in
  // those walks (rdzv_bench). A client that sends no deadline was never bounded by one anyway.
  builder.AddChannelArgument(GRPC_ARG_ENABLE_DEADLINE_CHECKS, 0);
  // Nothing is read for a call before its method and token are checked (FrontDoor, Sessions
  // too), no message is larger than the largest request, and what gRPC holds for calls in
  // flight is bounded: past the quota it cancels streams with RESOURCE_EXHAUSTED rather than
  // grow.
  builder.SetMaxReceiveMessageSize(static_cast<int>(largest));
  builder.SetMaxSendMessageSize(INT_MAX);
  grpc::ResourceQuota quota("muster-store");
  quota.Resize(inflight);
  builder.SetResourceQuota(quota);
  // A connection that never finishes its HTTP/2 (and TLS) handshake holds a descriptor for at
  // most this long (gRPC's default: 120 s); members send theirs at once.
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 10000);
  // The port is ours: ConnectionGate accepts, caps and hands connections to gRPC.
  std::string why;
  int listenFd = net::listenTcp(options.host, options.port, why);
  if (listenFd < 0) {
    return absl::UnavailableError(
        why.rfind("cannot resolve", 0) == 0
            ? fmt::format("cannot listen on {}: {}", net::joinHostPort(options.host, options.port), why)
            : fmt::format("cannot listen on {}", why));
  }
  int selected = net::boundPort(listenFd);
  auto acceptor = builder.experimental().AddExternalConnectionAcceptor(
      grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD, credentials);
  server->door_->attach(builder, options.threads);
  server->server_ = builder.BuildAndStart();
  if (!server->server_) {
    ::close(listenFd);
    return absl::UnavailableError(fmt::format("the store's gRPC server on {} did not start",
                                              net::joinHostPort(options.host, selected)));
  }
  auto gate = ConnectionGate::start(listenFd, std::move(acceptor), options.connections);
  if (!gate.ok()) return gate.status();
  server->connections_ = std::move(*gate);
  server->door_->onMember([gate = server->connections_.get()](std::string_view peer) {
    gate->authenticated(peer);
  });
  server->door_->start();
  server->health_->setServing(true);
  server->port_ = selected;
  server->address_ = net::joinHostPort(options.host, selected);
  server->announce_ = options.announce;
  logger()->log(options.announce ? spdlog::level::info : spdlog::level::debug,
                "store listening on {} (direct port {}, tls {}, token {}, max_value_bytes={}, "
                "max_total_bytes={}, max_inflight_bytes={})",
                server->address_, server->directPort(), options.tlsCertPem.empty() ? "off" : "on",
                options.token.empty() ? "off" : "on", options.limits.maxValueBytes,
                options.limits.maxTotalBytes, inflight);
  return server;
}

RendezvousServer::~RendezvousServer() { shutdown(); }

uint64_t RendezvousServer::rejectedCalls() const { return gate_->rejected(); }

int64_t RendezvousServer::callsInFlight() const { return door_->inFlight(); }

int RendezvousServer::directPort() const { return direct_ ? direct_->port() : 0; }

ConnectionCounts RendezvousServer::connections() const {
  return connections_ ? connections_->counts() : ConnectionCounts{};
}

size_t RendezvousServer::directConnections() const {
  return direct_ ? direct_->connections() : 0;
}

void RendezvousServer::shutdown(Millis grace) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (down_ || !server_) return;
    down_ = true;
  }
  health_->setServing(false);
  // No connection handed to gRPC once it shuts down (it would hold it unserved).
  if (connections_) connections_->stop();
  door_->close();
  size_t pending = memory_->pendingWaiters();
  memory_->shutdown();
  rendezvous_->shutdown();
  sessions_->closeAll();
  // Both transports' sessions end side by side, each within the grace.
  std::thread direct([this, grace] {
    if (direct_) direct_->shutdown(grace);
  });
  server_->Shutdown(std::chrono::system_clock::now() + grace);
  direct.join();
  door_->stop();
  logger()->log(announce_ ? spdlog::level::info : spdlog::level::debug,
                "store on {} shut down ({} pending waits ended)", address_, pending);
}

void RendezvousServer::wait() {
  if (server_) server_->Wait();
}

}  // namespace muster::rendezvous
