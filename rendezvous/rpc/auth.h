// The shared token: the metadata key clients send it under, and the one check every muster
// service makes before it does anything for a call.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

#include <grpcpp/grpcpp.h>

#include "common/log.h"

namespace muster::rendezvous {

// Metadata key that carries the shared token.
inline constexpr char kTokenMetadataKey[] = "x-muster-token";

// Whether the call carries `token` (constant-time compare). An empty `token` admits every call.
bool hasToken(const grpc::ServerContextBase* context, const std::string& token);
bool tokenMatches(std::string_view given, const std::string& token);

// What a call without the token gets.
grpc::Status unauthenticated();

// A service's gate: the check, a count of the calls it refused, and one warning a second at
// most naming the caller (a stray client must not flood the log). Thread-safe.
class TokenGate {
 public:
  explicit TokenGate(std::string token) : token_(std::move(token)) {}
  bool admits(const grpc::ServerContextBase* context);
  // The same for a token that came another way (the direct path's hello), from `peer`.
  bool admitsToken(std::string_view token, const std::string& peer);
  // Whether the call carries the token, neither counted nor logged (a method open to all that
  // serves members more).
  bool carries(const grpc::ServerContextBase* context) const { return hasToken(context, token_); }
  uint64_t rejected() const { return rejected_.load(); }

 private:
  void refused(const std::string& peer);
  std::string token_;
  std::atomic<uint64_t> rejected_{0};
  log::OncePerSecond logLimit_;
};

}  // namespace muster::rendezvous
