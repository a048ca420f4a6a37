// etcd::Client: channels to every member, one in use; a call that the member cannot answer
// moves on to the next.
#include "etcd/client.h"

#include <thread>

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_split.h"
#include "common/backoff.h"

namespace muster::etcd {

namespace {

bool contains(const std::string& text, const char* what) { return text.find(what) != std::string::npos; }

// The member could not answer, another may: down, restarting, cut off from its leader, or an
// election under way.
bool memberFailure(const grpc::Status& s) {
  auto code = s.error_code();
  const auto& m = s.error_message();
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED ||
         code == grpc::StatusCode::UNKNOWN || contains(m, "no leader") || contains(m, "leader changed") ||
         contains(m, "request timed out") || contains(m, "not capable");
}

bool tokenExpired(const grpc::Status& s) {
  return contains(s.error_message(), "invalid auth token") ||
         (s.error_code() == grpc::StatusCode::UNAUTHENTICATED && !contains(s.error_message(), "password"));
}

}  // namespace

absl::StatusOr<std::vector<std::string>> parseEndpoints(const std::string& list, bool* https) {
  std::vector<std::string> out;
  int secure = 0;
  for (auto part : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    std::string e(part);
    e.erase(0, e.find_first_not_of(' '));
    e.erase(e.find_last_not_of(' ') + 1);
    if (e.rfind("https://", 0) == 0) {
      e = e.substr(8);
      ++secure;
    } else if (e.rfind("http://", 0) == 0) {
      e = e.substr(7);
    }
    if (!e.empty() && e.back() == '/') e.pop_back();
    auto colon = e.rfind(':');
    bool portOk = colon != std::string::npos && colon + 1 < e.size() &&
                  e.find_first_not_of("0123456789", colon + 1) == std::string::npos && colon + 1 + 5 >= e.size();
    if (e.empty() || e.find('/') != std::string::npos || (colon != std::string::npos && !portOk)) {
      return absl::InvalidArgumentError(
          fmt::format("'{}' is not an etcd endpoint (expected HOST:PORT, comma-separated for several)", e));
    }
    if (colon == std::string::npos) e += ":2379";  // etcd's client port, as torchrun's etcd backends default
    out.push_back(e);
  }
  if (out.empty()) return absl::InvalidArgumentError("no etcd endpoint given (expected HOST:PORT[,HOST:PORT...])");
  if (https) *https = secure > 0;
  return out;
}

Client::Client(Options options) : options_(std::move(options)) {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (options_.tls) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options_.caPem;
    ssl.pem_cert_chain = options_.certPem;
    ssl.pem_private_key = options_.keyPem;
    credentials = grpc::SslCredentials(ssl);
  }
  for (const auto& endpoint : options_.endpoints) {
    grpc::ChannelArguments args;
    // A member that went away is tried again soon; calls on it fail at once meanwhile, and go
    // to the next member. Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC takes it as the time a
    // connection has to reach HTTP/2's SETTINGS, and at 100 ms hundreds of nodes connecting to
    // a busy member at once gave up and came again in a loop (384 nodes: 211 s for a round,
    // 4.6 s with its default of 20 s; a dead member is left for the next by the call's own
    // attemptTimeout anyway).
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    // A member whose host went silent (no reset) is noticed by pings; etcd refuses pings more
    // often than every 5 s (--grpc-keepalive-min-time).
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    Member m;
    m.endpoint = endpoint;
    m.channel = grpc::CreateCustomChannel(endpoint, credentials, args);
    m.kv = pb::KV::NewStub(m.channel);
    m.lease = pb::Lease::NewStub(m.channel);
    m.watch = pb::Watch::NewStub(m.channel);
    m.auth = pb::Auth::NewStub(m.channel);
    members_.push_back(std::move(m));
  }
}

Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::connect(Options options, Deadline deadline) {
  if (options.endpoints.empty()) return absl::InvalidArgumentError("no etcd endpoint given");
  std::unique_ptr<Client> client(new Client(std::move(options)));
  if (!client->options_.user.empty()) {
    if (auto s = client->authenticate(deadline); !s.ok()) return s;
    return client;
  }
  // Reach one member before the caller counts on the cluster: an endpoint list that names
  // nothing alive is the answer now, not at the first join.
  pb::RangeRequest probe;
  probe.set_key("muster/");
  probe.set_count_only(true);
  probe.set_serializable(true);
  auto reached = client->range(probe, deadline);
  if (!reached.ok()) return reached.status();
  return client;
}

std::string Client::endpointList() const {
  std::string out;
  for (const auto& m : members_) out += (out.empty() ? "" : ",") + m.endpoint;
  return out;
}

absl::Status Client::authenticate(Deadline deadline) {
  Backoff backoff(Millis(50), Millis(500));
  grpc::Status last;
  for (size_t tried = 0;; ++tried) {
    size_t member;
    {
      std::lock_guard lock(mu_);
      member = current_;
    }
    grpc::ClientContext context;
    context.set_deadline(toSystem(std::min(deadline, deadlineAfter(options_.attemptTimeout))));
    pb::AuthenticateRequest request;
    request.set_name(options_.user);
    request.set_password(options_.password);
    pb::AuthenticateResponse response;
    last = members_[member].auth->Authenticate(&context, request, &response);
    if (last.ok()) {
      std::lock_guard lock(mu_);
      token_ = response.token();
      return absl::OkStatus();
    }
    if (!memberFailure(last)) {
      return absl::PermissionDeniedError(fmt::format("etcd at {} refused user '{}': {}", endpointList(),
                                                     options_.user, last.error_message()));
    }
    leave(member);
    if (Clock::now() >= deadline) break;
    if ((tried + 1) % members_.size() == 0) {
      std::this_thread::sleep_for(std::min<Millis>(backoff.next(), Millis(millisLeft(deadline))));
    }
  }
  return absl::UnavailableError(fmt::format("etcd at {}: no member answered: {}", endpointList(), last.error_message()));
}

Client::Call Client::call(Deadline deadline, bool stream) {
  Call c;
  c.context = std::make_unique<grpc::ClientContext>();
  if (deadline != kNoDeadline) c.context->set_deadline(toSystem(deadline));
  std::string token;
  {
    std::lock_guard lock(mu_);
    c.member = current_;
    token = token_;
  }
  if (!token.empty()) c.context->AddMetadata("token", token);
  // etcd's require-leader (clientv3.WithRequireLeader): a member without a leader ends the
  // stream rather than keep it open and silent.
  if (stream) c.context->AddMetadata("hasleader", "true");
  return c;
}

bool Client::failed(size_t member, const grpc::Status& status) {
  if (status.error_code() == grpc::StatusCode::CANCELLED) return false;
  if (!options_.user.empty() && tokenExpired(status)) {
    return authenticate(deadlineAfter(options_.attemptTimeout * 2)).ok();
  }
  if (!memberFailure(status)) return false;
  leave(member);
  return true;
}

void Client::leave(size_t member) {
  std::lock_guard lock(mu_);
  // Only once for a member that several calls found failing at once.
  if (current_ == member) current_ = (member + 1) % members_.size();
}

template <typename Response, typename Fn>
absl::StatusOr<Response> Client::unary(const char* what, Deadline deadline, Fn fn) {
  Backoff backoff(Millis(20), Millis(500));
  grpc::Status last;
  for (size_t tried = 1;; ++tried) {
    auto c = call(std::min(deadline, deadlineAfter(options_.attemptTimeout)));
    Response response;
    last = fn(c.member, c.context.get(), &response);
    if (last.ok()) return response;
    if (!failed(c.member, last) || Clock::now() >= deadline) break;
    // Every member tried once: a pause before the next lap (an election takes a moment).
    if (tried % members_.size() == 0) {
      std::this_thread::sleep_for(std::min<Millis>(backoff.next(), Millis(millisLeft(deadline))));
    }
  }
  auto code = static_cast<absl::StatusCode>(last.error_code());
  if (memberFailure(last)) {
    return absl::UnavailableError(
        fmt::format("etcd at {}: no member answered the {} in time (last: {})", endpointList(), what,
                    last.error_message()));
  }
  return absl::Status(code, fmt::format("etcd at {}: {}: {}", endpointList(), what, last.error_message()));
}

absl::StatusOr<pb::RangeResponse> Client::range(const pb::RangeRequest& request, Deadline deadline) {
  return unary<pb::RangeResponse>("read", deadline, [&](size_t m, grpc::ClientContext* c, pb::RangeResponse* r) {
    return members_[m].kv->Range(c, request, r);
  });
}

absl::StatusOr<pb::PutResponse> Client::put(const pb::PutRequest& request, Deadline deadline) {
  return unary<pb::PutResponse>("write", deadline, [&](size_t m, grpc::ClientContext* c, pb::PutResponse* r) {
    return members_[m].kv->Put(c, request, r);
  });
}

absl::StatusOr<pb::DeleteRangeResponse> Client::deleteRange(const pb::DeleteRangeRequest& request,
                                                             Deadline deadline) {
  return unary<pb::DeleteRangeResponse>(
      "delete", deadline,
      [&](size_t m, grpc::ClientContext* c, pb::DeleteRangeResponse* r) { return members_[m].kv->DeleteRange(c, request, r); });
}

absl::StatusOr<pb::TxnResponse> Client::txn(const pb::TxnRequest& request, Deadline deadline) {
  return unary<pb::TxnResponse>("transaction", deadline, [&](size_t m, grpc::ClientContext* c, pb::TxnResponse* r) {
    return members_[m].kv->Txn(c, request, r);
  });
}

absl::StatusOr<int64_t> Client::grantLease(int64_t ttlSeconds, Deadline deadline) {
  pb::LeaseGrantRequest request;
  request.set_ttl(ttlSeconds);
  auto granted = unary<pb::LeaseGrantResponse>(
      "lease grant", deadline,
      [&](size_t m, grpc::ClientContext* c, pb::LeaseGrantResponse* r) { return members_[m].lease->LeaseGrant(c, request, r); });
  if (!granted.ok()) return granted.status();
  if (!granted->error().empty()) {
    return absl::FailedPreconditionError(fmt::format("etcd at {}: lease grant: {}", endpointList(), granted->error()));
  }
  return granted->id();
}

absl::Status Client::revokeLease(int64_t lease, Deadline deadline) {
  pb::LeaseRevokeRequest request;
  request.set_id(lease);
  auto revoked = unary<pb::LeaseRevokeResponse>(
      "lease revoke", deadline,
      [&](size_t m, grpc::ClientContext* c, pb::LeaseRevokeResponse* r) { return members_[m].lease->LeaseRevoke(c, request, r); });
  return revoked.status();
}

absl::StatusOr<int64_t> Client::leaseTimeToLive(int64_t lease, Deadline deadline) {
  pb::LeaseTimeToLiveRequest request;
  request.set_id(lease);
  auto answer = unary<pb::LeaseTimeToLiveResponse>(
      "lease time-to-live", deadline, [&](size_t m, grpc::ClientContext* c, pb::LeaseTimeToLiveResponse* r) {
        return members_[m].lease->LeaseTimeToLive(c, request, r);
      });
  if (!answer.ok()) return answer.status();
  return answer->ttl();
}

}  // namespace muster::etcd
