// A client of an etcd cluster's v3 API (gRPC): key-value reads, writes and transactions,
// leases and their keep-alive, watches, user/password auth and TLS, over every endpoint the
// cluster was given with. A member that is down, cut off from the others (no leader) or slow
// to answer is left for the next one; a watch or a keep-alive moves with it.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/deadline.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"

namespace muster::etcd {

namespace pb = ::etcdserverpb;

struct Options {
  std::vector<std::string> endpoints;  // host:port (an http:// or https:// prefix is dropped)
  bool tls = false;
  std::string caPem;                   // TLS: the members' certificates are signed by this CA
  std::string certPem, keyPem;         // TLS: this client's certificate, when members ask for one
  std::string user, password;          // etcd's auth, when the cluster has it on
  // One attempt at one member: a member cut off from its cluster holds a write this long
  // before it gives up, so the next member is asked after it.
  Millis attemptTimeout{2000};
  // Where muster's runs live in the cluster (--rdzv_conf etcd_prefix=, as torchrun's etcd
  // backend names its own): each run's keys under <runsPrefix>/<run id>/, so that etcd's
  // roles can grant a team one prefix.
  std::string runsPrefix = "/muster/runs";
};

// "h1:2379,https://h2:2379" -> Options' endpoints (and tls when every one says https); a
// message for an empty or malformed list.
absl::StatusOr<std::vector<std::string>> parseEndpoints(const std::string& list, bool* https = nullptr);

// Thread-safety: every method from any thread. Lifetime: a Watch or KeepAlive (watch.h,
// keep_alive.h) on it must be destroyed before it.
class Client {
 public:
  // Opens channels to every endpoint and, with a user, authenticates with one that answers
  // within `deadline`: a wrong password or a cluster that cannot be reached is the answer.
  static absl::StatusOr<std::unique_ptr<Client>> connect(Options options, Deadline deadline);
  ~Client();

  // Each call asks the member in use; one that cannot answer (down, no leader, timed out) is
  // left for the next until `deadline`. A write that timed out may have been applied: callers
  // of put and txn read again before they write again.
  absl::StatusOr<pb::RangeResponse> range(const pb::RangeRequest& request, Deadline deadline);
  absl::StatusOr<pb::PutResponse> put(const pb::PutRequest& request, Deadline deadline);
  absl::StatusOr<pb::DeleteRangeResponse> deleteRange(const pb::DeleteRangeRequest& request, Deadline deadline);
  absl::StatusOr<pb::TxnResponse> txn(const pb::TxnRequest& request, Deadline deadline);
  absl::StatusOr<int64_t> grantLease(int64_t ttlSeconds, Deadline deadline);
  absl::Status revokeLease(int64_t lease, Deadline deadline);
  // Seconds the lease has left (-1: it is gone).
  absl::StatusOr<int64_t> leaseTimeToLive(int64_t lease, Deadline deadline);

  // "h1:2379,h2:2379,h3:2379": what messages name.
  std::string endpointList() const;
  const Options& options() const { return options_; }

  // A context for one call to the member in use: its deadline, auth token and (for streams)
  // etcd's require-leader, so a member cut off from the cluster ends the stream instead of
  // holding it silent. Returns the member's index too.
  struct Call {
    size_t member = 0;
    std::unique_ptr<grpc::ClientContext> context;
  };
  Call call(Deadline deadline, bool stream = false);
  // The call on `member` failed with `status`: moves on to the next member when the failure
  // is the member's (down, no leader, timed out), re-authenticates when the token expired.
  // Returns whether asking again may help.
  bool failed(size_t member, const grpc::Status& status);
  pb::KV::Stub& kv(size_t member) { return *members_[member].kv; }
  pb::Lease::Stub& lease(size_t member) { return *members_[member].lease; }
  pb::Watch::Stub& watchStub(size_t member) { return *members_[member].watch; }

 private:
  struct Member {
    std::string endpoint;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<pb::KV::Stub> kv;
    std::unique_ptr<pb::Lease::Stub> lease;
    std::unique_ptr<pb::Watch::Stub> watch;
    std::unique_ptr<pb::Auth::Stub> auth;
  };
  explicit Client(Options options);
  absl::Status authenticate(Deadline deadline);
  // The member in use is `member`: the next one is, from now.
  void leave(size_t member);
  template <typename Response, typename Fn>
  absl::StatusOr<Response> unary(const char* what, Deadline deadline, Fn fn);

  Options options_;
  std::vector<Member> members_;
  mutable std::mutex mu_;
  size_t current_ = 0;
  std::string token_;
};

}  // namespace muster::etcd
