// How a worker reaches its job's muster store: MUSTER_STORE_ADDR and the namespace, with the
// token and TLS files launch names. One place for every program of the worker library.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/files.h"
#include "rendezvous/client/store_client.h"
#include "worker/worker_env.h"

namespace muster::worker {

// Errors: a token or CA file that cannot be read (INVALID_ARGUMENT naming it).
inline absl::StatusOr<rendezvous::ClientOptions> storeClientOptions(const WorkerEnv& env) {
  rendezvous::ClientOptions options;
  options.target = env.storeAddr;
  options.ns = env.storeNamespace;
  if (!env.tokenFile.empty()) {
    auto token = readToken(env.tokenFile);
    if (!token.ok()) return token.status();
    options.token = *token;
  }
  if (!env.tlsCaFile.empty()) {
    auto ca = readFile(env.tlsCaFile, "TLS CA (MUSTER_STORE_TLS_CA)");
    if (!ca.ok()) return ca.status();
    options.tlsCaPem = *ca;
    options.tlsServerName = env.tlsServerName;
  }
  return options;
}

}  // namespace muster::worker
