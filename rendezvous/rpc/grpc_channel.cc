// makeChannel: credentials and channel arguments for every muster client.
#include "rendezvous/rpc/grpc_channel.h"

#include <climits>
#include <map>
#include <mutex>
#include <utility>

#include <unistd.h>

#include "common/log.h"

namespace muster::rendezvous {

std::shared_ptr<grpc::Channel> makeChannel(const ChannelOptions& options) {
  log::routeGrpcLogs();
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  grpc::ChannelArguments args;
  if (!options.tlsCaPem.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tlsCaPem;
    credentials = grpc::SslCredentials(ssl);
    if (!options.tlsServerName.empty()) args.SetSslTargetNameOverride(options.tlsServerName);
  }
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, static_cast<int>(options.minBackoff.count()));
  // Despite its name, gRPC takes this as the least time a connection attempt is given.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, static_cast<int>(options.connectTimeout.count()));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, static_cast<int>(options.maxBackoff.count()));
  if (options.keepAlive.count() > 0) {
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(options.keepAlive.count()));
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, static_cast<int>(options.keepAlive.count() / 2));
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  }
  args.SetMaxReceiveMessageSize(INT_MAX);
  args.SetMaxSendMessageSize(INT_MAX);
  if (options.ownConnection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(options.target, credentials, args);
}

std::shared_ptr<grpc::Channel> sharedChannel(const ChannelOptions& options) {
  ChannelOptions own = options;
  own.ownConnection = true;
  // Every option, and the process id: a forked child cannot use its parent's channel.
  using Key = std::pair<pid_t, ChannelOptions>;
  static std::mutex mu;
  static auto* open = new std::map<Key, std::weak_ptr<grpc::Channel>>();  // outlives exit
  Key key{getpid(), own};
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = open->find(key); it != open->end()) {
    if (auto channel = it->second.lock()) return channel;
  }
  for (auto it = open->begin(); it != open->end();) {
    it = it->second.expired() ? open->erase(it) : std::next(it);
  }
  auto channel = makeChannel(own);
  (*open)[key] = channel;
  return channel;
}

}  // namespace muster::rendezvous
