// hasToken / TokenGate: the token check of every muster service.
#include "rendezvous/auth.h"

#include <openssl/crypto.h>

#include "common/log.h"

namespace muster::rendezvous {

bool hasToken(const grpc::ServerContextBase* context, const std::string& token) {
  if (token.empty()) return true;
  const auto& metadata = context->client_metadata();
  auto it = metadata.find(kTokenMetadataKey);
  return it != metadata.end() && it->second.size() == token.size() &&
         CRYPTO_memcmp(token.data(), it->second.data(), token.size()) == 0;
}

grpc::Status unauthenticated() {
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or wrong token (x-muster-token)");
}

bool TokenGate::admits(const grpc::ServerContextBase* context) {
  if (hasToken(context, token_)) return true;
  uint64_t count = ++rejected_;
  if (logLimit_.pass()) {
    static auto logger = log::get("store");
    logger->warn("rejected a request from {} without a valid token ({} rejected so far)",
                 context->peer(), count);
  }
  return false;
}

}  // namespace muster::rendezvous
