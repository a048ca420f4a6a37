// StoreClient: a bidirectional Session stream with a reader thread that matches responses to
// waiting callers by request id.
#include "rendezvous/store_client.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fcntl.h>

#include <cerrno>
#include <climits>
#include <cstring>

#include <deque>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "common/backoff.h"
#include "common/log.h"
#include "common/net.h"
#include "rendezvous/auth.h"
#include "rendezvous/direct_wire.h"
#include "rendezvous/grpc_channel.h"
#include "rendezvous/grpc_status.h"
#include "muster/v1/store.grpc.pb.h"
#include "rendezvous/memory_store.h"

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
// How long a client tries the direct path before it stays on gRPC.
constexpr Millis kDirectConnectWait{2000};
constexpr Millis kMaxBackoff{2000};
// Sets (count, bytes) a session keeps for replay before it asks the server to confirm them.
constexpr size_t kMaxUnacked = 4096;
constexpr size_t kMaxUnackedBytes = size_t{64} << 20;

// Ids of quiet requests (answered only on failure) carry this bit, so that their failure
// answers are told apart from late answers to callers that gave up.
constexpr uint64_t kQuietBit = uint64_t{1} << 63;

// The most one stream message carries when the server batches requests (or the server's
// largest request, when that is less).
constexpr size_t kMaxBatchBytes = size_t{256} << 10;
// What an entry of StoreRequest.batch costs beyond its own bytes, at most: a tag and a length.
constexpr size_t kEntryFraming = 6;

// Whether a failure is the connection's (worth a new session), not the server's answer.
bool isTransport(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable;
}

// What a Session's messages travel on: gRPC's Session stream, or the direct path's socket.
// One write and one read may run at once, on different threads; cancel() from any thread.
class SessionStream {
 public:
  virtual ~SessionStream() = default;
  // False: the stream has ended (read() then says why).
  virtual bool write(const pb::StoreRequest& request) = 0;
  // False: the stream has ended; finish() says why.
  virtual bool read(pb::StoreResponse* response) = 0;
  // No more requests (the server answers what it has, then ends the stream).
  virtual void writesDone() = 0;
  // Why the stream ended, once read() said it has.
  virtual grpc::Status finish() = 0;
  // Ends the stream now: a read or write under way returns.
  virtual void cancel() = 0;
  // The store's direct path (not gRPC).
  virtual bool direct() const = 0;
};

class GrpcStream final : public SessionStream {
 public:
  GrpcStream(pb::Store::Stub& stub, const std::string& token) {
    if (!token.empty()) context_.AddMetadata(kTokenMetadataKey, token);
    // Answers may come several to a message (a server that predates this ignores it).
    context_.AddMetadata(kBatchMetadataKey, "1");
    stream_ = stub.Session(&context_);
  }
  bool write(const pb::StoreRequest& request) override { return stream_->Write(request); }
  bool read(pb::StoreResponse* response) override { return stream_->Read(response); }
  void writesDone() override { stream_->WritesDone(); }
  grpc::Status finish() override { return stream_->Finish(); }
  void cancel() override { context_.TryCancel(); }
  bool direct() const override { return false; }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<pb::StoreRequest, pb::StoreResponse>> stream_;
};

// The host of a HOST:PORT target ("[v6]:port" too); nullopt for anything else (a gRPC scheme,
// a Unix socket), which has no direct path.
std::optional<std::string> targetHost(const std::string& target) {
  if (target.find("://") != std::string::npos || target.rfind("unix:", 0) == 0) return std::nullopt;
  auto split = net::splitHostPort(target);
  if (!split || !split->port) return std::nullopt;
  return split->host;
}

// The direct path (store_direct.h): one blocking TCP socket, frames both ways.
class DirectStream final : public SessionStream {
 public:
  // Connects to host:port within `deadline`, says hello (magic and token) and waits for the
  // welcome, whose ServerInfo goes to `*welcome`. Errors: UNAVAILABLE with the reason (no
  // answer in time, refused, closed), or the store's own (UNAUTHENTICATED). `*timedOut`: the
  // deadline ran out, which says nothing of the port when the deadline was short; `*busy`: the
  // store refused for now (UNAVAILABLE, or closed before its welcome).
  static absl::StatusOr<std::unique_ptr<DirectStream>> open(const std::string& host, int port,
                                                            const std::string& token,
                                                            Deadline deadline,
                                                            pb::ServerInfo* welcome,
                                                            bool* timedOut, bool* busy) {
    *timedOut = false;
    *busy = false;
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    std::string service = std::to_string(port);
    if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
      return absl::UnavailableError(fmt::format("{}: {}", host, gai_strerror(rc)));
    }
    std::string why = "no address";
    int fd = -1;
    for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
      fd = connectOne(a, deadline, why, timedOut);
    }
    freeaddrinfo(found);
    if (fd < 0) return absl::UnavailableError(fmt::format("{}:{}: {}", host, port, why));
    auto stream = std::unique_ptr<DirectStream>(new DirectStream(fd));
    pb::DirectHello hello;
    hello.set_token(token);
    std::string opening(direct::kMagic);
    direct::appendFrame(opening, direct::Kind::kHello, hello);
    if (!stream->sendAll(opening)) {
      return absl::UnavailableError(fmt::format("{}:{}: {}", host, port, std::strerror(errno)));
    }
    auto kind = stream->nextFrame(std::max<int64_t>(1, millisLeft(deadline)));
    if (kind == direct::Kind::kWelcome && welcome->ParseFromArray(stream->body_, stream->bodyBytes_)) {
      return stream;
    }
    if (kind == direct::Kind::kEnd) {
      pb::StoreResponse end;
      end.ParseFromArray(stream->body_, stream->bodyBytes_);
      *busy = end.code() == static_cast<int>(absl::StatusCode::kUnavailable);
      return absl::Status(static_cast<absl::StatusCode>(end.code()),
                          fmt::format("{}:{}: {}", host, port, end.message()));
    }
    *timedOut = stream->ended_.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    // Closed before a word: a busy store's refusal whose end frame was lost.
    *busy = !kind && !*timedOut;
    return absl::UnavailableError(fmt::format(
        "{}:{}: {}", host, port,
        kind ? "no welcome from the store" : stream->ended_.error_message()));
  }

  ~DirectStream() override { ::close(fd_); }

  bool write(const pb::StoreRequest& request) override {
    out_.clear();
    direct::appendFrame(out_, direct::Kind::kRequest, request);
    return sendAll(out_);
  }

  bool read(pb::StoreResponse* response) override {
    while (true) {
      // The store pings a quiet connection: silence this long means it is gone.
      auto kind = nextFrame(direct::kSilence.count());
      if (!kind) {
        if (ended_.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
          ended_ = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                fmt::format("the store sent nothing for {} s",
                                            direct::kSilence.count() / 1000));
        }
        return false;
      }
      if (*kind == direct::Kind::kPing) continue;
      if (*kind == direct::Kind::kAnswer && response->ParseFromArray(body_, bodyBytes_)) return true;
      pb::StoreResponse end;
      if (*kind == direct::Kind::kEnd && end.ParseFromArray(body_, bodyBytes_)) {
        return fail(static_cast<grpc::StatusCode>(end.code()), end.message());
      }
      return fail(grpc::StatusCode::UNAVAILABLE,
                  fmt::format("the store sent a frame of kind {} that does not parse",
                              static_cast<int>(*kind)));
    }
  }

  void writesDone() override { ::shutdown(fd_, SHUT_WR); }
  grpc::Status finish() override { return ended_; }
  void cancel() override { ::shutdown(fd_, SHUT_RDWR); }
  bool direct() const override { return true; }

 private:
  static constexpr size_t kReadChunk = 64 * 1024;

  explicit DirectStream(int fd) : fd_(fd), chunk_(new char[kReadChunk]) {}

  // A connected socket to `a` (blocking, watched: direct::watchPeer), or -1 with `why`.
  static int connectOne(const addrinfo* a, Deadline deadline, std::string& why, bool* timedOut) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      return -1;
    }
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      why = std::strerror(errno);
      ::close(fd);
      return -1;
    }
    int err = waitFor(fd, POLLOUT, deadline);
    if (err == 0) {
      socklen_t len = sizeof err;
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    }
    if (err != 0) {
      *timedOut = err == ETIMEDOUT;
      why = std::strerror(err);
      ::close(fd);
      return -1;
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    direct::watchPeer(fd);
    return fd;
  }

  // Waits until `fd` is ready for `events` or `deadline` passes: 0, ETIMEDOUT or an errno.
  static int waitFor(int fd, short events, Deadline deadline) {
    while (true) {
      int waitMs = deadline == kNoDeadline
                       ? -1
                       : static_cast<int>(std::clamp<int64_t>(millisLeft(deadline), 0, INT_MAX));
      pollfd p{fd, events, 0};
      int ready = ::poll(&p, 1, waitMs);
      if (ready > 0) return 0;
      if (ready == 0) return ETIMEDOUT;
      if (errno != EINTR) return errno;
    }
  }

  // The next whole frame's kind, its message at body_ (valid until the next call); nullopt
  // when the stream ended or nothing came for `silenceMs` (ended_ says which). The socket's
  // receive timeout bounds each wait: one blocking recv, no poll before it.
  std::optional<direct::Kind> nextFrame(int64_t silenceMs) {
    if (silenceMs != receiveTimeoutMs_) {
      timeval bound{static_cast<time_t>(silenceMs / 1000),
                    static_cast<suseconds_t>((silenceMs % 1000) * 1000)};
      setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof bound);
      receiveTimeoutMs_ = silenceMs;
    }
    while (true) {
      if (in_.size() - head_ >= direct::kHeaderBytes) {
        uint32_t length = direct::frameLength(in_.data() + head_);
        if (length == 0 || length > static_cast<uint32_t>(INT_MAX)) {
          fail(grpc::StatusCode::UNAVAILABLE,
               fmt::format("the store sent a frame of {} bytes", length));
          return std::nullopt;
        }
        if (in_.size() - head_ >= 4 + size_t{length}) {
          auto kind = static_cast<direct::Kind>(in_[head_ + 4]);
          body_ = in_.data() + head_ + direct::kHeaderBytes;
          bodyBytes_ = static_cast<int>(length - 1);
          head_ += 4 + size_t{length};
          return kind;
        }
      }
      compact();
      ssize_t n = ::recv(fd_, chunk_.get(), kReadChunk, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        bool silent = errno == EAGAIN || errno == EWOULDBLOCK;
        fail(silent ? grpc::StatusCode::DEADLINE_EXCEEDED : grpc::StatusCode::UNAVAILABLE,
             silent ? "no answer in time" : std::strerror(errno));
        return std::nullopt;
      }
      if (n == 0) {
        fail(grpc::StatusCode::UNAVAILABLE, "the store closed the connection");
        return std::nullopt;
      }
      in_.append(chunk_.get(), static_cast<size_t>(n));
    }
  }

  bool sendAll(const std::string& bytes) {
    for (size_t done = 0; done < bytes.size();) {
      ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }

  bool fail(grpc::StatusCode code, const std::string& why) {
    ended_ = grpc::Status(code, why);
    return false;
  }

  // Drops what was read (the last frame's body stays valid until the next read).
  void compact() {
    if (head_ == in_.size()) {
      in_.clear();
      head_ = 0;
      if (in_.capacity() > (size_t{8} << 20)) std::string().swap(in_);
    } else if (head_ > (size_t{1} << 20)) {
      in_.erase(0, head_);
      head_ = 0;
    }
  }

  int fd_;
  std::unique_ptr<char[]> chunk_;  // what one recv takes
  std::string out_;  // the frame being written (writes are one at a time)
  std::string in_;
  size_t head_ = 0;
  const char* body_ = nullptr;
  int bodyBytes_ = 0;
  int64_t receiveTimeoutMs_ = 0;  // SO_RCVTIMEO as set (0: none)
  grpc::Status ended_;
};

// One Session stream. There is no reader thread: a caller waiting for its answer reads the
// stream itself when nobody else is reading, and hands every answer it reads to its owner
// (leader/followers). A lone caller so gets its answer without a thread hand-off.
// Writes go through an outbox: the first caller to find no writer writes whatever is queued,
// several requests per message when the server batches (group commit), the others return at
// once. Broken for good once a read sees the end; the connection then opens a new one.
class Session {
 public:
  Session(std::unique_ptr<SessionStream> stream, std::string peer)
      : stream_(std::move(stream)), peer_(std::move(peer)) {}

  bool direct() const { return stream_->direct(); }

  // Half-closes, then reads what is left (answers to quiet requests) so that the server has
  // applied every request before the stream ends; gives up after kCloseWait.
  ~Session() {
    static constexpr Millis kCloseWait{2000};
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !readerActive_; });
    if (broken_) return;
    lock.unlock();
    // The outbox is empty: its writer empties it before letting go, and every caller has.
    {
      std::lock_guard<std::mutex> w(writeMu_);
      stream_->writesDone();
    }
    std::mutex watchMu;
    std::condition_variable watchCv;
    bool drained = false;
    std::thread watchdog([&] {
      std::unique_lock<std::mutex> l(watchMu);
      if (!watchCv.wait_for(l, kCloseWait, [&] { return drained; })) stream_->cancel();
    });
    pb::StoreResponse response;
    while (stream_->read(&response)) {
      std::lock_guard<std::mutex> l(mu_);
      dispatchLocked(std::move(response));
    }
    grpc::Status ended = stream_->finish();
    if (!ended.ok() && !unacked_.empty()) {
      logger()->error("store {}: the connection ended ({}) before {} set(s) were confirmed; they "
                      "may be lost", peer_, ended.error_message(), unacked_.size());
    }
    {
      std::lock_guard<std::mutex> l(watchMu);
      drained = true;
    }
    watchCv.notify_all();
    watchdog.join();
  }

  // The server batches (its info said so): one message may carry up to `bytes` of requests.
  void batchUpTo(size_t bytes) {
    std::lock_guard<std::mutex> lock(outMu_);
    batchBytes_ = bytes;
  }

  bool broken() const {
    std::lock_guard<std::mutex> lock(mu_);
    return broken_;
  }

  // Sends the request without waiting for an answer. Errors: a transport failure (`*transport`
  // set), or the failure of an earlier quiet request.
  absl::Status post(pb::StoreRequest& request, bool* transport) {
    *transport = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (broken_) {
        *transport = isTransport(brokenStatus_);
        return brokenStatus_;
      }
      if (!deferred_.ok()) return std::exchange(deferred_, absl::OkStatus());
    }
    uint64_t seq = 0;
    if (!send(request, true, &seq)) {
      // The stream has ended; without a reader to learn why, say so and let the connection
      // open a new one. The caller sends this request again there: it is not replayed too.
      std::lock_guard<std::mutex> lock(mu_);
      forgetUnackedLocked(seq);
      if (!broken_) breakLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the stream ended"));
      *transport = isTransport(brokenStatus_);
      return brokenStatus_;
    }
    return absl::OkStatus();
  }

  // Quiet requests written but not known to be applied: the server applies a session's
  // requests in order, so any answer proves everything sent before it.
  size_t unacked() const {
    std::lock_guard<std::mutex> lock(mu_);
    return unacked_.size();
  }
  // The first refusal of a quiet request not yet returned to anyone.
  absl::Status takeDeferred() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(deferred_, absl::OkStatus());
  }
  // Whether enough is kept that the server should confirm it now.
  bool unackedFull() const {
    std::lock_guard<std::mutex> lock(mu_);
    return unacked_.size() >= kMaxUnacked || unackedBytes_ >= kMaxUnackedBytes;
  }
  std::deque<pb::StoreRequest> takeUnacked() {
    std::lock_guard<std::mutex> lock(mu_);
    std::deque<pb::StoreRequest> out;
    for (auto& kept : unacked_) out.push_back(std::move(kept.request));
    unacked_.clear();
    unackedBytes_ = 0;
    return out;
  }

  // Sends `requests` (quiet, from a broken session) first on this new one, before anyone else
  // uses it. Those a write does not take stay unacknowledged here, for the session after.
  void replay(std::deque<pb::StoreRequest> requests) {
    if (requests.empty()) return;
    logger()->info("store {}: sending again {} set(s) the lost connection may not have delivered",
                   peer_, requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      uint64_t seq = 0;
      if (send(requests[i], true, &seq)) continue;
      // Kept for the session after: this one (unless send kept it) and those not sent yet.
      std::lock_guard<std::mutex> out(outMu_);
      std::lock_guard<std::mutex> lock(mu_);
      bool kept = !unacked_.empty() && unacked_.back().seq == seq;
      for (size_t j = kept ? i + 1 : i; j < requests.size(); ++j) {
        size_t bytes = requests[j].ByteSizeLong();
        unackedBytes_ += bytes;
        unacked_.push_back({nextId_++, std::move(requests[j]), bytes});
      }
      if (!broken_) breakLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the stream ended"));
      return;
    }
  }

  // Sends the request and waits for its answer. A transport failure comes back as UNAVAILABLE
  // with `*transport` set.
  absl::StatusOr<pb::StoreResponse> call(pb::StoreRequest& request, Deadline deadline,
                                         bool* transport) {
    *transport = false;
    std::unique_lock<std::mutex> lock(mu_);
    if (broken_) {
      *transport = isTransport(brokenStatus_);
      return brokenStatus_;
    }
    if (!deferred_.ok()) return std::exchange(deferred_, absl::OkStatus());
    lock.unlock();
    // A failed write means the stream is ending; reading below says why.
    uint64_t id = 0;
    send(request, false, &id);
    lock.lock();
    // Made by send; references to unordered_map elements survive rehashing.
    auto& slot = pending_[id];
    Deadline giveUp = deadline == kNoDeadline ? kNoDeadline : deadline + kAnswerGrace;
    while (true) {
      if (slot.has_value()) {
        auto result = std::move(*slot);
        pending_.erase(id);
        *transport = !result.ok() && isTransport(result.status());
        return result;
      }
      if (broken_) {
        pending_.erase(id);
        *transport = isTransport(brokenStatus_);
        return brokenStatus_;
      }
      if (!readerActive_) {
        readerActive_ = true;
        lock.unlock();
        pb::StoreResponse response;
        bool ok = stream_->read(&response);
        grpc::Status ended;
        if (!ok) {
          std::lock_guard<std::mutex> w(writeMu_);
          ended = stream_->finish();
        }
        lock.lock();
        readerActive_ = false;
        if (ok) {
          dispatchLocked(std::move(response));
        } else {
          breakLocked(ended);
        }
        cv_.notify_all();
        continue;
      }
      if (giveUp == kNoDeadline) {
        cv_.wait(lock);
      } else if (cv_.wait_until(lock, giveUp) == std::cv_status::timeout && !slot.has_value()) {
        pending_.erase(id);
        return absl::DeadlineExceededError("the store did not answer before the deadline");
      }
    }
  }

 private:
  // Queues a copy of `request` for the stream, numbered (`*id`) in queue order, the order the
  // server sees, so that an answer proves everything numbered before it applied. Before it can
  // be written, a quiet request is kept in unacked_ (for replay) and a call's answer slot is
  // made. Then, unless a writer is at work, writes the queue. False when the stream has ended,
  // or, for a quiet request, the session is broken (it is then not kept, unless its own write
  // failed).
  bool send(const pb::StoreRequest& request, bool quiet, uint64_t* id) {
    std::unique_lock<std::mutex> out(outMu_);
    uint64_t seq = nextId_++;
    *id = seq;
    pb::StoreRequest queued = request;
    queued.set_quiet(quiet);
    queued.set_id(quiet ? seq | kQuietBit : seq);
    size_t bytes = queued.ByteSizeLong();
    {
      std::lock_guard<std::mutex> lock(mu_);  // the one order: outMu_, then mu_
      if (!quiet) {
        pending_[seq];
      } else if (broken_ || outEnded_) {
        // Not kept, so not sent: a set queued now could be dropped with the outbox and never
        // replayed. The caller sends it on a new session.
        return false;
      } else {
        unacked_.push_back({seq, queued, bytes});
        unackedBytes_ += bytes;
      }
    }
    if (outEnded_) return false;
    outbox_.emplace_back(std::move(queued), bytes);
    if (writing_) return true;  // the writer at work takes it along
    writing_ = true;
    return drainLocked(out);
  }

  // Drops the quiet request `seq` from unacked_ (its caller sends it again).
  void forgetUnackedLocked(uint64_t seq) {
    for (auto it = unacked_.rbegin(); it != unacked_.rend(); ++it) {
      if (it->seq == seq) {
        unackedBytes_ -= std::min(unackedBytes_, it->bytes);
        unacked_.erase(std::next(it).base());
        return;
      }
    }
  }

  // As the writer (writing_ set, outMu_ held): writes the outbox until it is empty, as many
  // requests to a message as the server takes. False, and the outbox dropped, when a write
  // fails (the stream has ended; quiet requests are replayed from unacked_, callers waiting
  // for answers learn of it from their read).
  bool drainLocked(std::unique_lock<std::mutex>& out) {
    bool ok = true;
    while (!outbox_.empty()) {
      pb::StoreRequest message = std::move(outbox_.front().first);
      size_t bytes = outbox_.front().second;
      size_t taken = 1;
      // A batch entry costs its bytes, a tag and a length of up to 5 bytes.
      while (batchBytes_ > 0 && taken < outbox_.size() &&
             bytes + outbox_[taken].second + kEntryFraming <= batchBytes_) {
        bytes += outbox_[taken].second + kEntryFraming;
        *message.add_batch() = std::move(outbox_[taken].first);
        ++taken;
      }
      outbox_.erase(outbox_.begin(), outbox_.begin() + static_cast<std::ptrdiff_t>(taken));
      out.unlock();
      bool written;
      {
        std::lock_guard<std::mutex> w(writeMu_);
        written = stream_->write(message);
      }
      out.lock();
      if (!written) {
        ok = false;
        outEnded_ = true;
        outbox_.clear();
        break;
      }
    }
    writing_ = false;
    return ok;
  }

  // A quiet request is answered only when it failed: log it, and keep the first such failure
  // for the next operation to return.
  void noteQuietFailureLocked(const pb::StoreResponse& response) {
    if (response.code() == 0) return;
    absl::Status status = responseStatus(response);
    logger()->error("the store refused a set: {}", std::string(status.message()));
    if (deferred_.ok()) {
      deferred_ = absl::Status(
          status.code(), fmt::format("an earlier set failed: {}", std::string(status.message())));
    }
  }

  void dispatchLocked(pb::StoreResponse&& response) {
    // Answers batched with this one come after it, in the server's order.
    auto more = std::move(*response.mutable_batch());
    response.clear_batch();
    dispatchOneLocked(std::move(response));
    for (auto& r : more) dispatchOneLocked(std::move(r));
  }

  void dispatchOneLocked(pb::StoreResponse&& response) {
    uint64_t seq = response.id() & ~kQuietBit;
    // Answered (a call), or refused (a quiet failure): the server has dealt with everything
    // this session sent before it.
    while (!unacked_.empty() && unacked_.front().seq <= seq) {
      unackedBytes_ -= std::min(unackedBytes_, unacked_.front().bytes);
      unacked_.pop_front();
    }
    if (response.id() & kQuietBit) {
      noteQuietFailureLocked(response);
      return;
    }
    auto it = pending_.find(response.id());
    if (it == pending_.end()) return;  // its caller gave up
    it->second = std::move(response);
  }

  void breakLocked(const grpc::Status& status) {
    broken_ = true;
    if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      brokenStatus_ = absl::UnauthenticatedError(status.error_message());
    } else {
      brokenStatus_ = absl::UnavailableError(fmt::format(
          "connection to the store lost: {} (code {})", status.error_message(),
          static_cast<int>(status.error_code())));
    }
    for (auto& [id, slot] : pending_) {
      if (!slot.has_value()) slot = brokenStatus_;
    }
  }

  std::unique_ptr<SessionStream> stream_;
  std::mutex writeMu_;  // one stream write (or writesDone, finish) at a time
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<uint64_t, std::optional<absl::StatusOr<pb::StoreResponse>>> pending_;
  bool readerActive_ = false;
  bool broken_ = false;
  absl::Status brokenStatus_;
  absl::Status deferred_;
  uint64_t nextId_ = 1;  // under outMu_ (replay: alone on the session)
  // A quiet request kept until an answer proves it applied, with its size (counted once).
  struct Kept {
    uint64_t seq;
    pb::StoreRequest request;
    size_t bytes;
  };
  std::deque<Kept> unacked_;
  size_t unackedBytes_ = 0;
  std::string peer_;
  // The outbox. Lock order: outMu_, then mu_ (send); never mu_, then outMu_.
  std::mutex outMu_;
  std::deque<std::pair<pb::StoreRequest, size_t>> outbox_;  // request, its size
  size_t batchBytes_ = 0;  // 0: one request per message (a server that does not batch)
  bool writing_ = false;   // a caller is writing the outbox
  bool outEnded_ = false;  // a write failed: the stream takes no more
};

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
    session_ = std::make_shared<Session>(std::make_unique<GrpcStream>(*stub_, options_.token),
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
    auto stream = DirectStream::open(*host, static_cast<int>(directPort_), options_.token,
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
