// StoreClient: a bidirectional Session stream with a reader thread that matches responses to
// waiting callers by request id.
#include "rendezvous/store_client.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>

#include "common/log.h"
#include "muster/v1/store.grpc.pb.h"
#include "rendezvous/store_service.h"

namespace muster::rendezvous {
namespace {

auto logger() {
  static auto l = log::get("store-client");
  return l;
}

// How long past an operation's deadline the client still waits for the server's own answer
// (which names the missing keys) before it gives up by itself.
constexpr Millis kAnswerGrace{2000};
constexpr Millis kFirstBackoff{50};
constexpr Millis kMaxBackoff{2000};

std::chrono::system_clock::time_point toSystem(Deadline deadline) {
  if (deadline == kNoDeadline) return std::chrono::system_clock::time_point::max();
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(deadline - Clock::now());
}

Millis jittered(Millis base) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_real_distribution<double> factor(0.5, 1.5);
  return Millis(static_cast<int64_t>(base.count() * factor(rng)));
}

// One Session stream. Broken for good once its reader sees the end; the connection then opens
// a new one.
class Session {
 public:
  Session(pb::Store::Stub& stub, const std::string& token) {
    if (!token.empty()) context_.AddMetadata(kTokenMetadataKey, token);
    stream_ = stub.Session(&context_);
    reader_ = std::thread([this] { readLoop(); });
  }

  ~Session() {
    context_.TryCancel();
    reader_.join();
  }

  bool broken() const { return broken_.load(); }

  // Sends the request and waits for its answer. A transport failure comes back as UNAVAILABLE
  // with `*transport` set.
  absl::StatusOr<pb::StoreResponse> call(pb::StoreRequest& request, Deadline deadline,
                                         bool* transport) {
    *transport = false;
    auto slot = std::make_shared<std::promise<absl::StatusOr<pb::StoreResponse>>>();
    auto answer = slot->get_future();
    uint64_t id = nextId_.fetch_add(1);
    request.set_id(id);
    {
      std::lock_guard<std::mutex> lock(pendingMu_);
      if (broken_) {
        *transport = true;
        return brokenStatus_;
      }
      pending_.emplace(id, slot);
    }
    bool written;
    {
      std::lock_guard<std::mutex> lock(writeMu_);
      written = stream_->Write(request);
    }
    if (!written) {
      // The reader will fail every pending call, this one included, with the stream's status.
      *transport = true;
    }
    std::future_status ready = std::future_status::ready;
    if (deadline == kNoDeadline) {
      answer.wait();
    } else {
      auto limit = deadline + kAnswerGrace;
      ready = answer.wait_until(limit);
    }
    if (ready != std::future_status::ready) {
      std::lock_guard<std::mutex> lock(pendingMu_);
      pending_.erase(id);
      return absl::DeadlineExceededError("the store did not answer before the deadline");
    }
    // The reader answers with a StoreResponse whenever the server did; an error status means
    // the stream ended under this call.
    auto result = answer.get();
    *transport = !result.ok() && result.status().code() == absl::StatusCode::kUnavailable;
    return result;
  }

 private:
  void readLoop() {
    pb::StoreResponse response;
    while (stream_->Read(&response)) {
      std::shared_ptr<std::promise<absl::StatusOr<pb::StoreResponse>>> slot;
      {
        std::lock_guard<std::mutex> lock(pendingMu_);
        auto it = pending_.find(response.id());
        if (it == pending_.end()) continue;  // its caller gave up
        slot = std::move(it->second);
        pending_.erase(it);
      }
      slot->set_value(std::move(response));
      response = pb::StoreResponse();
    }
    grpc::Status status;
    {
      std::lock_guard<std::mutex> lock(writeMu_);
      stream_->WritesDone();
      status = stream_->Finish();
    }
    absl::Status why;
    if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      why = absl::UnauthenticatedError(status.error_message());
    } else {
      why = absl::UnavailableError(fmt::format("connection to the store lost: {} ({})",
                                               status.error_message(),
                                               static_cast<int>(status.error_code())));
    }
    std::unordered_map<uint64_t, std::shared_ptr<std::promise<absl::StatusOr<pb::StoreResponse>>>>
        orphans;
    {
      std::lock_guard<std::mutex> lock(pendingMu_);
      broken_ = true;
      brokenStatus_ = why;
      orphans.swap(pending_);
    }
    for (auto& [id, slot] : orphans) slot->set_value(why);
  }

  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<pb::StoreRequest, pb::StoreResponse>> stream_;
  std::mutex writeMu_;
  std::mutex pendingMu_;
  std::unordered_map<uint64_t, std::shared_ptr<std::promise<absl::StatusOr<pb::StoreResponse>>>>
      pending_;
  std::atomic<bool> broken_{false};
  absl::Status brokenStatus_;
  std::atomic<uint64_t> nextId_{1};
  std::thread reader_;
};

}  // namespace

// The channel and the current Session; reopens the session when it breaks.
class ClientConnection {
 public:
  explicit ClientConnection(const ClientOptions& options) : options_(options) {
    log::routeGrpcLogs();
    std::shared_ptr<grpc::ChannelCredentials> credentials;
    if (!options.tlsCaPem.empty()) {
      grpc::SslCredentialsOptions ssl;
      ssl.pem_root_certs = options.tlsCaPem;
      credentials = grpc::SslCredentials(ssl);
    } else {
      credentials = grpc::InsecureChannelCredentials();
    }
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, static_cast<int>(kMaxBackoff.count()));
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetMaxReceiveMessageSize(INT_MAX);
    args.SetMaxSendMessageSize(INT_MAX);
    // Each client its own TCP connection: views share one, separate clients do not.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    if (!options.tlsServerName.empty()) {
      args.SetSslTargetNameOverride(options.tlsServerName);
    }
    channel_ = grpc::CreateCustomChannel(options.target, credentials, args);
    stub_ = pb::Store::NewStub(channel_);
  }

  const std::string& target() const { return options_.target; }

  absl::Status waitConnected(Deadline deadline) {
    if (channel_->WaitForConnected(toSystem(deadline))) return absl::OkStatus();
    return absl::DeadlineExceededError(
        fmt::format("no store answered at {} before the deadline", options_.target));
  }

  // The live session, opening one (waiting for the channel) when there is none.
  absl::StatusOr<std::shared_ptr<Session>> session(Deadline deadline) {
    std::lock_guard<std::mutex> lock(mu_);
    if (session_ && !session_->broken()) return session_;
    session_.reset();
    auto status = waitConnected(deadline);
    if (!status.ok()) return status;
    session_ = std::make_shared<Session>(*stub_, options_.token);
    return session_;
  }

  absl::StatusOr<pb::StoreResponse> execute(pb::StoreRequest& request, Deadline deadline,
                                            bool retryable) {
    bool blocking = request.timeout_ms() != 0;
    Millis backoff = kFirstBackoff;
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
      Millis pause = jittered(backoff);
      if (deadline != kNoDeadline && Clock::now() + pause >= deadline) return result.status();
      logger()->debug("store {} unavailable ({}); retrying in {} ms", options_.target,
                      std::string(result.status().message()), pause.count());
      std::this_thread::sleep_for(pause);
      backoff = std::min(kMaxBackoff, backoff * 2);
    }
  }

 private:
  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::Store::Stub> stub_;
  std::mutex mu_;
  std::shared_ptr<Session> session_;
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
  // One real round trip proves the store answers and accepts our token.
  auto probe = client->numKeys();
  if (!probe.ok()) {
    return absl::Status(probe.status().code(),
                        fmt::format("cannot use the store at {}: {}", options.target,
                                    std::string(probe.status().message())));
  }
  return client;
}

std::unique_ptr<StoreClient> StoreClient::withNamespace(std::string ns) const {
  return std::unique_ptr<StoreClient>(new StoreClient(connection_, std::move(ns)));
}

absl::StatusOr<pb::StoreResponse> StoreClient::execute(pb::StoreRequest& request,
                                                       Deadline deadline) {
  request.set_ns(ns_);
  return connection_->execute(request, deadline, idempotent(request));
}

}  // namespace muster::rendezvous
