// The two streams a StoreClient session travels on: gRPC's Session stream, and the direct
// path's blocking socket with its frames.
#include "rendezvous/client/session_stream.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "common/net.h"
#include "rendezvous/rpc/auth.h"
#include "rendezvous/store/store.h"
#include "rendezvous/transport/direct_wire.h"

namespace muster::rendezvous {
namespace {

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

// The direct path (store_direct.h): one blocking TCP socket, frames both ways.
class DirectStream final : public SessionStream {
 public:
  // openDirectStream (session_stream.h).
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

}  // namespace

std::unique_ptr<SessionStream> openGrpcStream(pb::Store::Stub& stub, const std::string& token) {
  return std::make_unique<GrpcStream>(stub, token);
}

absl::StatusOr<std::unique_ptr<SessionStream>> openDirectStream(const std::string& host, int port,
                                                                const std::string& token,
                                                                Deadline deadline,
                                                                pb::ServerInfo* welcome,
                                                                bool* timedOut, bool* busy) {
  auto stream = DirectStream::open(host, port, token, deadline, welcome, timedOut, busy);
  if (!stream.ok()) return stream.status();
  return std::unique_ptr<SessionStream>(std::move(*stream));
}

std::optional<std::string> targetHost(const std::string& target) {
  if (target.find("://") != std::string::npos || target.rfind("unix:", 0) == 0) return std::nullopt;
  auto split = net::splitHostPort(target);
  if (!split || !split->port) return std::nullopt;
  return split->host;
}

}  // namespace muster::rendezvous
