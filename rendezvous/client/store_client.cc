// StoreClient: the connection (one gRPC channel per store and process, the session on it,
// reopened when it breaks, with unconfirmed sets sent again) and the Session that carries the
// operations, many in flight, over a SessionStream (session_stream.h): gRPC or the direct path.
#include "rendezvous/client/store_client.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include <climits>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "common/backoff.h"
#include "common/log.h"
#include "muster/v1/store.grpc.pb.h"
#include "rendezvous/client/session_stream.h"
#include "rendezvous/client/store_session.h"
#include "rendezvous/rpc/grpc_channel.h"
#include "rendezvous/rpc/grpc_status.h"
#include "rendezvous/store/memory_store.h"

namespace muster::rendezvous {
namespace {

using store_session::logger;
using store_session::Session;

constexpr Millis kFirstBackoff{50};
constexpr Millis kMaxBackoff{2000};
// How long a client tries the direct path before it stays on gRPC.
constexpr Millis kDirectConnectWait{2000};
// The most one stream message carries when the server batches requests (or the server's
// largest request, when that is less).
constexpr size_t kMaxBatchBytes = size_t{256} << 10;

}  // namespace

// The channel and the current Session; reopens the session when it breaks.
class ClientConnection {
 public:
  explicit ClientConnection(const ClientOptions& options) : options_(options) {
    // One TCP connection per process and store: each client its own stream on it.
    channel_ = sharedChannel({.target = options.target,
                            .tlsCaPem = options.tlsCaPem,
                            .tlsServerName = options.tlsServerName,
                            .minBackoff = kFirstBackoff,
                            .maxBackoff = kMaxBackoff,
                            .keepAlive = Millis(10000)});
    limits_.maxKeyBytes = limits_.maxValueBytes = limits_.maxKeysPerCall = SIZE_MAX;
    stub_ = pb::Store::NewStub(channel_);
  }

  // Sets not yet confirmed are confirmed before the connection goes (a round trip, at most a
  // moment): a connection that broke under them is replaced and they are sent again, so a
  // client that sets and exits at once loses none.
  ~ClientConnection() {
    static constexpr Millis kLastConfirm{2000};
    bool owed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      owed = !replay_.empty() || (session_ && session_->unacked() > 0);
    }
    if (!owed) return;
    if (auto confirmed = confirm(deadlineAfter(kLastConfirm)); !confirmed.ok()) {
      logger()->error("store {}: sets this client posted last were not confirmed before it "
                      "closed; they may be lost: {}",
                      options_.target, std::string(confirmed.message()));
    }
  }

  const std::string& target() const { return options_.target; }

  absl::Status waitConnected(Deadline deadline) {
    if (channel_->WaitForConnected(toSystem(deadline))) return absl::OkStatus();
    return absl::DeadlineExceededError(
        fmt::format("no store answered at {} before the deadline", options_.target));
  }

  // The live session, opening one (waiting for the channel) when there is none: on the direct
  // path when the store offers it and it answers, on gRPC otherwise.
  absl::StatusOr<std::shared_ptr<Session>> session(Deadline deadline) {
    std::lock_guard<std::mutex> lock(mu_);
    if (session_ && !session_->broken()) return session_;
    if (session_) {
      auto lost = session_->takeUnacked();
      for (auto& r : lost) replay_.push_back(std::move(r));
    }
    session_.reset();
    // The store answers on gRPC first (it may be restarting): a direct port that cannot be
    // reached then is unreachable from here, not merely not up yet.
    auto status = waitConnected(deadline);
    if (!status.ok()) return status;
    if (openDirectLocked(deadline)) return session_;
    session_ = std::make_shared<Session>(openGrpcStream(*stub_, options_.token),
                                         options_.target);
    session_->replay(std::exchange(replay_, {}));
    if (batchBytes_ > 0) {
      // The store may have come back as another build: batch only if it says it batches (one
      // that does not would drop batched requests unseen).
      pb::StoreRequest info;
      info.mutable_info();
      bool transport = false;
      // Bounded: other callers wait on this connection meanwhile.
      auto answer = session_->call(info, std::min(deadline, deadlineAfter(Millis(10000))),
                                   &transport);
      if (answer.ok() && answer->code() == 0 && answer->info().batching()) {
        session_->batchUpTo(batchBytes_);
      } else if (answer.ok() && answer->code() == 0) {
        batchBytes_ = 0;
      }
      if (answer.ok() && answer->code() == 0) adoptInfoLocked(answer->info(), deadline);
    }
    return session_;
  }

  // Whether the live session is on the store's direct path.
  bool onDirect() {
    std::lock_guard<std::mutex> lock(mu_);
    return session_ && !session_->broken() && session_->direct();
  }

  void setLimits(const pb::ServerInfo& info) {
    std::lock_guard<std::mutex> lock(mu_);
    limits_.maxKeyBytes = info.max_key_bytes();
    limits_.maxValueBytes = info.max_value_bytes();
    limits_.maxKeysPerCall = info.max_keys_per_call();
    limits_.maxTotalBytes = info.max_total_bytes();
    if (info.batching()) {
      batchBytes_ = std::min(kMaxBatchBytes, largestRequest(limits_));
      if (session_) session_->batchUpTo(batchBytes_);
    }
    adoptInfoLocked(info, kNoDeadline);
  }

  // Sends a quiet request; a broken stream is reopened and the request sent again (only
  // set and multi_set are posted, and both are safe to repeat). What the server's limits
  // refuse is refused here, at once, with the server's words.
  absl::Status post(pb::StoreRequest& request, Deadline deadline) {
    StoreLimits limits;
    {
      std::lock_guard<std::mutex> lock(mu_);
      limits = limits_;
    }
    if (auto valid = validateRequest(request, limits); !valid.ok()) return valid;
    Backoff backoff(kFirstBackoff, kMaxBackoff);
    while (true) {
      auto session = this->session(deadline);
      if (!session.ok()) return session.status();
      bool transport = false;
      absl::Status status = (*session)->post(request, &transport);
      if (!transport) {
        // Sets kept for replay are confirmed by any answer; a client that only sets asks for
        // one now and then, so that they stay few.
        if (status.ok() && (*session)->unackedFull()) {
          if (auto confirmed = confirm(deadline); !confirmed.ok()) return confirmed;
        }
        return status;
      }
      Millis pause = backoff.next();
      if (deadline != kNoDeadline && Clock::now() + pause >= deadline) return status;
      std::this_thread::sleep_for(pause);
    }
  }

  // A round trip (info, safe to repeat): every set posted before it is applied (or refused)
  // once it is answered, on a new session too if the old one broke (the sets are replayed).
  absl::Status confirm(Deadline deadline) {
    pb::StoreRequest sync;
    sync.mutable_info();
    return execute(sync, deadline, true).status();
  }

  // confirm(), then the first set refused.
  absl::Status flush(Deadline deadline) {
    if (auto confirmed = confirm(deadline); !confirmed.ok()) return confirmed;
    auto session = this->session(deadline);
    if (!session.ok()) return session.status();
    return (*session)->takeDeferred();
  }

  absl::StatusOr<pb::StoreResponse> execute(pb::StoreRequest& request, Deadline deadline,
                                            bool retryable) {
    bool blocking = request.timeout_ms() != 0;
    Backoff backoff(kFirstBackoff, kMaxBackoff);
    while (true) {
      if (blocking && deadline != kNoDeadline) {
        request.set_timeout_ms(std::max<int64_t>(1, millisLeft(deadline)));
      }
      auto session = this->session(deadline);
      if (!session.ok()) return session.status();
      bool transport = false;
      auto result = (*session)->call(request, deadline, &transport);
      if (result.ok()) {
        absl::Status status = responseStatus(*result);
        if (!status.ok()) return status;
        return result;
      }
      if (!transport) return result.status();
      if (!retryable) {
        return absl::UnavailableError(fmt::format(
            "{}; not retried because the operation may have been applied",
            std::string(result.status().message())));
      }
      Millis pause = backoff.next();
      if (deadline != kNoDeadline && Clock::now() + pause >= deadline) return result.status();
      logger()->debug("store {} unavailable ({}); retrying in {} ms", options_.target,
                      std::string(result.status().message()), pause.count());
      std::this_thread::sleep_for(pause);
    }
  }

 private:
  // With mu_ held: what the store's info says of its direct path. A store that offers it and
  // has not been found unusable takes the session there now, when it is on gRPC: at connect
  // (which asks for info before any request of the caller's) and on a new session after a
  // break, so that nothing but replayed sets is in flight on the old one.
  void adoptInfoLocked(const pb::ServerInfo& info, Deadline deadline) {
    directPort_ = info.direct_port();
    instance_ = info.instance();
    if (!session_ || session_->direct() || directPort_ == 0) return;
    auto old = std::move(session_);
    if (!openDirectLocked(deadline)) {
      session_ = std::move(old);
      return;
    }
    // The new session is live. Nothing is unconfirmed on the old one here (the info's answer
    // confirmed all before it), but should anything be, it goes again on the new one.
    auto lost = old->takeUnacked();
    old.reset();
    session_->replay(std::move(lost));
  }

  // With mu_ held and no session: opens one on the direct path if the store offers it. False:
  // use gRPC. A port that could not be reached is not tried again by this connection (a
  // firewall would cost each new session the wait), one line says so; a store that comes back
  // with another port is tried there.
  bool openDirectLocked(Deadline deadline) {
    if (directPort_ == 0 || !options_.direct || !options_.tlsCaPem.empty() ||
        (directPort_ == unreachable_.first && instance_ == unreachable_.second)) {
      return false;
    }
    auto host = targetHost(options_.target);
    if (!host) return false;
    Deadline until = deadlineAfter(kDirectConnectWait);
    bool shortened = deadline < until;
    pb::ServerInfo welcome;
    bool timedOut = false, busy = false;
    auto stream = openDirectStream(*host, static_cast<int>(directPort_), options_.token,
                                     std::min(deadline, until), &welcome, &timedOut, &busy);
    if (stream.ok() && welcome.instance() != instance_) {
      // Another run of the store has the port (it restarted; or another store took the port):
      // the store's next info says which, and the session moves there if it is this one's.
      logger()->debug("store {}: port {} answers for another run of the store", options_.target,
                      directPort_);
      return false;
    }
    absl::Status failed = stream.status();
    if (!failed.ok()) {
      // A caller's deadline cut the try short, or the store was busy (it said so, or closed
      // before its welcome): that says nothing of the port.
      if ((timedOut && shortened) || busy) return false;
      unreachable_ = {directPort_, instance_};
      logger()->warn("store {}: its direct path (port {}) cannot be used ({}); staying on gRPC",
                     options_.target, directPort_, std::string(failed.message()));
      return false;
    }
    session_ = std::make_shared<Session>(std::move(*stream), options_.target);
    session_->replay(std::exchange(replay_, {}));
    if (batchBytes_ > 0) session_->batchUpTo(batchBytes_);
    return true;
  }

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::Store::Stub> stub_;
  std::mutex mu_;
  std::shared_ptr<Session> session_;
  // Sets a broken session had not confirmed, until a new session takes them.
  std::deque<pb::StoreRequest> replay_;
  StoreLimits limits_;  // the server's, once connect has asked; unlimited until then
  size_t batchBytes_ = 0;  // the server batches: what one message may carry
  uint32_t directPort_ = 0;  // the store's direct path, as its last info said
  std::string instance_;     // the run of the store its last info came from
  // A direct port (and the store's run) that could not be used: gRPC instead.
  std::pair<uint32_t, std::string> unreachable_;
};

StoreClient::StoreClient(std::shared_ptr<ClientConnection> connection, std::string ns)
    : connection_(std::move(connection)), ns_(std::move(ns)) {}

StoreClient::~StoreClient() = default;

const std::string& StoreClient::target() const { return connection_->target(); }

absl::StatusOr<std::unique_ptr<StoreClient>> StoreClient::connect(const ClientOptions& options,
                                                                  Deadline deadline) {
  if (options.target.empty() || options.target.find(':') == std::string::npos) {
    return absl::InvalidArgumentError(
        fmt::format("store address '{}' is invalid; expected HOST:PORT", options.target));
  }
  auto connection = std::make_shared<ClientConnection>(options);
  auto connected = connection->waitConnected(deadline);
  if (!connected.ok()) return connected;
  std::unique_ptr<StoreClient> client(new StoreClient(connection, options.ns));
  // One real round trip proves the store answers and accepts our token, and brings its limits.
  auto info = client->info();
  if (!info.ok()) {
    return absl::Status(info.status().code(),
                        fmt::format("cannot use the store at {}: {}", options.target,
                                    std::string(info.status().message())));
  }
  connection->setLimits(*info);
  return client;
}

std::unique_ptr<StoreClient> StoreClient::withNamespace(std::string ns) const {
  return std::unique_ptr<StoreClient>(new StoreClient(connection_, std::move(ns)));
}

absl::Status StoreClient::post(pb::StoreRequest& request) {
  request.set_ns(ns_);
  return connection_->post(request, quickDeadline());
}

absl::Status StoreClient::flush(Deadline deadline) { return connection_->flush(deadline); }

bool StoreClient::direct() const { return connection_->onDirect(); }

absl::StatusOr<pb::StoreResponse> StoreClient::execute(pb::StoreRequest& request,
                                                       Deadline deadline) {
  request.set_ns(ns_);
  return connection_->execute(request, deadline, idempotent(request));
}

}  // namespace muster::rendezvous
