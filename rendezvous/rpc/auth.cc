// hasToken / TokenGate: the token check of every muster service.
#include "rendezvous/rpc/auth.h"

#include <openssl/crypto.h>

#include "common/log.h"

namespace muster::rendezvous {

bool tokenMatches(std::string_view given, const std::string& token) {
  if (token.empty()) return true;
  return given.size() == token.size() &&
         CRYPTO_memcmp(token.data(), given.data(), token.size()) == 0;
}

bool hasToken(const grpc::ServerContextBase* context, const std::string& token) {
  if (token.empty()) return true;
  const auto& metadata = context->client_metadata();
  auto it = metadata.find(kTokenMetadataKey);
  return it != metadata.end() &&
         tokenMatches(std::string_view(it->second.data(), it->second.size()), token);
}

grpc::Status unauthenticated() {
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or wrong token (x-muster-token)");
}

bool TokenGate::admits(const grpc::ServerContextBase* context) {
  if (hasToken(context, token_)) return true;
  refused(context->peer());
  return false;
}

bool TokenGate::admitsToken(std::string_view token, const std::string& peer) {
  if (tokenMatches(token, token_)) return true;
  refused(peer);
  return false;
}

void TokenGate::refused(const std::string& peer) {
  uint64_t count = ++rejected_;
  if (logLimit_.pass()) {
    static auto logger = log::get("store");
    logger->warn("rejected a request from {} without a valid token ({} rejected so far)", peer,
                 count);
  }
}

}  // namespace muster::rendezvous
