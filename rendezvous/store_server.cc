// StoreServer: builds and runs the gRPC server around a MemoryStore.
#include "rendezvous/store_server.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <climits>
#include <cstring>

#include "common/log.h"
#include "rendezvous/rendezvous_service.h"
#include "rendezvous/store_service.h"

namespace muster::rendezvous {
namespace {

auto logger() {
  static auto l = log::get("store");
  return l;
}

// gRPC says only that binding failed; bind a plain socket to learn why.
std::string whyCannotBind(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* result = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &result);
  if (rc != 0) return fmt::format("cannot resolve '{}': {}", host, gai_strerror(rc));
  std::string why = "the address is not available";
  for (addrinfo* ai = result; ai != nullptr; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      why = std::strerror(errno);
      close(fd);
      break;
    }
    close(fd);
  }
  freeaddrinfo(result);
  return why;
}

}  // namespace

std::string joinHostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos && host.front() != '[') {
    return fmt::format("[{}]:{}", host, port);
  }
  return fmt::format("{}:{}", host, port);
}

absl::StatusOr<std::unique_ptr<StoreServer>> StoreServer::start(ServerOptions options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        fmt::format("port {} is out of range; expected 0 to 65535", options.port));
  }
  if (options.tlsCertPem.empty() != options.tlsKeyPem.empty()) {
    return absl::InvalidArgumentError("TLS needs both a certificate and its key");
  }
  log::routeGrpcLogs();
  std::unique_ptr<StoreServer> server(new StoreServer());
  server->memory_ = std::make_shared<MemoryStore>(options.limits);
  server->service_ = std::make_unique<StoreService>(server->memory_, options.token);
  server->rendezvous_ = std::make_unique<RendezvousService>(options.token, options.standalone,
                                                            options.retention);

  std::shared_ptr<grpc::ServerCredentials> credentials;
  if (!options.tlsCertPem.empty()) {
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({options.tlsKeyPem, options.tlsCertPem});
    credentials = grpc::SslServerCredentials(ssl);
  } else {
    credentials = grpc::InsecureServerCredentials();
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  // gRPC turns SO_REUSEPORT on by default: a second store on the same port would then start
  // and share it silently. An address in use must be an error.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Clients ping idle sessions to notice a dead store; let them.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  size_t maxMessage = std::min<size_t>(INT_MAX, options.limits.maxTotalBytes + (1u << 20));
  builder.SetMaxReceiveMessageSize(static_cast<int>(maxMessage));
  builder.SetMaxSendMessageSize(INT_MAX);
  std::string requested = joinHostPort(options.host, options.port);
  int selected = 0;
  builder.AddListeningPort(requested, credentials, &selected);
  builder.RegisterService(server->service_.get());
  builder.RegisterService(server->rendezvous_.get());
  server->server_ = builder.BuildAndStart();
  if (!server->server_ || selected == 0) {
    return absl::UnavailableError(fmt::format("cannot listen on {}: {}", requested,
                                              whyCannotBind(options.host, options.port)));
  }
  if (auto* health = server->server_->GetHealthCheckService()) health->SetServingStatus(true);
  server->port_ = selected;
  server->address_ = joinHostPort(options.host, selected);
  server->announce_ = options.announce;
  logger()->log(options.announce ? spdlog::level::info : spdlog::level::debug,
                "store listening on {} (tls {}, token {}, max_value_bytes={}, max_total_bytes={})",
                 server->address_, options.tlsCertPem.empty() ? "off" : "on",
                 options.token.empty() ? "off" : "on", options.limits.maxValueBytes,
                 options.limits.maxTotalBytes);
  return server;
}

StoreServer::~StoreServer() { shutdown(); }

void StoreServer::shutdown(Millis grace) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (down_ || !server_) return;
    down_ = true;
  }
  if (auto* health = server_->GetHealthCheckService()) health->SetServingStatus(false);
  size_t pending = memory_->pendingWaiters();
  memory_->shutdown();
  rendezvous_->shutdown();
  service_->closeAll();
  server_->Shutdown(std::chrono::system_clock::now() + grace);
  logger()->log(announce_ ? spdlog::level::info : spdlog::level::debug,
                "store on {} shut down ({} pending waits ended)", address_, pending);
}

void StoreServer::wait() {
  if (server_) server_->Wait();
}

}  // namespace muster::rendezvous
