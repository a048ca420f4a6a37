// StoreDirect: an acceptor on the first of a few asio loops; each connection lives on one loop,
// reads the magic and the hello, then hands each request frame to its StoreService session
// and writes the session's answers back as frames.
#include "rendezvous/store_direct.h"

#include <fmt/format.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <boost/asio.hpp>
#include <condition_variable>
#include <cstring>
#include <future>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/log.h"
#include "common/net.h"
#include "rendezvous/direct_wire.h"

namespace muster::rendezvous {
namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

auto logger() {
  static auto l = log::get("store");
  return l;
}

constexpr size_t kReadChunk = 64 * 1024;
// A hello is a token: anything longer is not one.
constexpr size_t kMaxHelloBytes = 64 * 1024;

class DirectConnection;

}  // namespace

class StoreDirect::Impl {
 public:
  Impl(StoreService& service, TokenGate& gate, DirectOptions options)
      : service_(service), gate_(gate), options_(std::move(options)) {
    int loops = options_.loops;
    if (loops <= 0) loops = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
    for (int i = 0; i < loops; ++i) {
      loops_.push_back(std::make_unique<asio::io_context>(1));
      work_.emplace_back(asio::make_work_guard(*loops_.back()));
    }
    acceptor_ = std::make_unique<tcp::acceptor>(*loops_[0]);
    retry_ = std::make_unique<asio::steady_timer>(*loops_[0]);
  }
  ~Impl() { shutdown(Millis(0)); }

  absl::Status adopt(int fd) {
    boost::system::error_code ec;
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    acceptor_->assign(addr.ss_family == AF_INET6 ? tcp::v6() : tcp::v4(), fd, ec);
    if (!ec) acceptor_->non_blocking(true, ec);
    if (ec) {
      ::close(fd);
      return absl::InternalError(fmt::format("store direct path: cannot use socket {}: {}", fd,
                                             ec.message()));
    }
    return absl::OkStatus();
  }

  void run() {
    accept();
    for (auto& loop : loops_) {
      threads_.emplace_back([io = loop.get()] { io->run(); });
    }
  }

  void accept();
  void shutdown(Millis grace);

  void forget(DirectConnection* c) {
    std::lock_guard<std::mutex> lock(mu_);
    live_.erase(c);
    if (live_.empty()) cv_.notify_all();
  }
  size_t connections() const {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.size();
  }
  // One line a second at most for clients that are not muster's.
  void warnForeign(const std::string& line) {
    if (foreignLog_.pass()) logger()->warn("{}", line);
  }

  StoreService& service_;
  TokenGate& gate_;
  DirectOptions options_;
  // Declared before the loops: a connection that goes with its loop's handlers still finds them.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<DirectConnection*, std::weak_ptr<DirectConnection>> live_;
  log::OncePerSecond foreignLog_;
  bool down_ = false;
  std::vector<std::unique_ptr<asio::io_context>> loops_;
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::unique_ptr<tcp::acceptor> acceptor_;
  std::unique_ptr<asio::steady_timer> retry_;
  std::vector<std::thread> threads_;
  size_t next_ = 0;
  bool acceptErrorLogged_ = false;
};

namespace {

// One client: the hello, then its session. Everything but the sink's calls runs on the
// connection's loop; the sink posts there. Holds itself (self_) from start() until closed.
class DirectConnection final : public SessionSink,
                               public std::enable_shared_from_this<DirectConnection> {
 public:
  DirectConnection(StoreDirect::Impl* impl, asio::io_context& io, tcp::socket socket)
      : impl_(impl), io_(io), socket_(std::move(socket)), helloTimer_(io) {
    boost::system::error_code ec;
    auto remote = socket_.remote_endpoint(ec);
    peer_ = ec ? std::string("?") : fmt::format("{}:{}", remote.address().to_string(), remote.port());
    socket_.set_option(tcp::no_delay(true), ec);
  }

  ~DirectConnection() override {
    release();
    if (!closed_) impl_->forget(this);
  }

  void start() {
    self_ = shared_from_this();
    helloTimer_.expires_after(impl_->options_.helloTimeout);
    helloTimer_.async_wait([weak = weak_from_this()](boost::system::error_code ec) {
      auto self = weak.lock();
      if (ec || !self || self->state_ || self->closed_) return;
      self->impl_->warnForeign(fmt::format(
          "store direct path: {} sent no hello within {} ms; closed", self->peer_,
          self->impl_->options_.helloTimeout.count()));
      self->closeNow();
    });
    read();
  }

  asio::io_context& executor() { return io_; }

  // The service is gone or going: no more session, no more socket.
  void forceClose() {
    release();
    closeNow();
  }

  void startWrite(const pb::StoreResponse& response) override {
    auto frame = std::make_shared<std::string>();
    direct::appendFrame(*frame, direct::Kind::kAnswer, response);
    send(std::move(frame), false);
  }

  void finish(const grpc::Status& status) override {
    pb::StoreResponse end;
    end.set_code(static_cast<int>(status.error_code()));
    end.set_message(status.error_message());
    auto frame = std::make_shared<std::string>();
    direct::appendFrame(*frame, direct::Kind::kEnd, end);
    send(std::move(frame), true);
  }

 private:
  // From any thread (the session's lock held): writes on the loop. `last`: the end frame.
  void send(std::shared_ptr<std::string> frame, bool last) {
    auto self = weak_from_this().lock();
    if (!self) return;  // being destroyed: release() detaches it
    asio::post(io_, [self = std::move(self), frame = std::move(frame), last] {
      if (self->closed_) {
        if (last) {
          self->release();
        } else if (self->state_) {
          self->state_->writeDone(false);
        }
        return;
      }
      asio::async_write(self->socket_, asio::buffer(*frame),
                        [self, frame, last](boost::system::error_code ec, size_t) {
                          if (last) {
                            self->release();
                            self->closeNow();
                          } else if (self->state_) {
                            self->state_->writeDone(!ec);
                          }
                        });
    });
  }

  void read() {
    if (closed_ || stopReading_) return;
    socket_.async_read_some(asio::buffer(chunk_), [self = shared_from_this()](
                                                      boost::system::error_code ec, size_t n) {
      if (self->closed_) return;
      if (ec) {
        // The end of its requests (half-closed): answer what is due, then end. Reset: gone.
        if (!self->state_) {
          self->closeNow();
        } else {
          self->state_->close(ec == asio::error::eof ? grpc::Status::OK : grpc::Status::CANCELLED);
        }
        return;
      }
      self->in_.append(self->chunk_.data(), n);
      self->parse();
      self->read();
    });
  }

  // Takes every whole frame in `in_`.
  void parse() {
    size_t at = 0;
    if (!magicSeen_) {
      size_t have = std::min(in_.size(), direct::kMagic.size());
      if (std::string_view(in_).substr(0, have) != direct::kMagic.substr(0, have)) {
        impl_->warnForeign(fmt::format(
            "store direct path: {} does not speak muster's direct protocol; closed", peer_));
        closeNow();
        return;
      }
      if (have < direct::kMagic.size()) return;
      magicSeen_ = true;
      at = direct::kMagic.size();
    }
    while (!closed_ && !stopReading_ && in_.size() - at >= direct::kHeaderBytes) {
      uint32_t length = direct::frameLength(in_.data() + at);
      size_t most = state_ ? impl_->options_.maxMessageBytes + 1 : kMaxHelloBytes;
      if (length == 0 || length > most) {
        refuse(grpc::StatusCode::INVALID_ARGUMENT,
               fmt::format("a frame of {} bytes; the most this store takes is {}", length, most));
        return;
      }
      if (in_.size() - at < 4 + size_t{length}) break;
      auto kind = static_cast<direct::Kind>(in_[at + 4]);
      const char* body = in_.data() + at + direct::kHeaderBytes;
      int bodyBytes = static_cast<int>(length - 1);
      at += 4 + size_t{length};
      if (!state_) {
        hello(kind, body, bodyBytes);
      } else if (kind != direct::Kind::kRequest) {
        refuse(grpc::StatusCode::INVALID_ARGUMENT,
               fmt::format("a frame of kind {} where a request belongs", static_cast<int>(kind)));
      } else if (!request_.ParseFromArray(body, bodyBytes)) {
        refuse(grpc::StatusCode::INVALID_ARGUMENT, "a request on the session does not parse");
      } else if (!state_->apply(request_)) {
        stopReading_ = true;
      }
    }
    in_.erase(0, at);
    if (in_.capacity() > (size_t{8} << 20) && in_.size() < kReadChunk) in_.shrink_to_fit();
  }

  void hello(direct::Kind kind, const char* body, int bytes) {
    pb::DirectHello hello;
    if (kind != direct::Kind::kHello || !hello.ParseFromArray(body, bytes)) {
      impl_->warnForeign(fmt::format("store direct path: {} sent no hello; closed", peer_));
      closeNow();
      return;
    }
    helloTimer_.cancel();
    bool admitted = impl_->gate_.admitsToken(hello.token(), peer_);
    state_ = impl_->service_.openSession(true);
    if (!admitted) {
      stopReading_ = true;
      state_->close(grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                                 "missing or wrong token (x-muster-token)"));
    }
    state_->attach(this);
  }

  // A session that breaks the protocol ends with `code`; a connection without one closes.
  void refuse(grpc::StatusCode code, const std::string& why) {
    stopReading_ = true;
    if (!state_) {
      impl_->warnForeign(fmt::format("store direct path: {}: {}; closed", peer_, why));
      closeNow();
      return;
    }
    logger()->warn("store direct path: session of {} ended: {}", peer_, why);
    state_->close(grpc::Status(code, why));
  }

  // No more calls from the session.
  void release() {
    if (!state_) return;
    auto state = std::move(state_);
    state->detach();
    impl_->service_.forget(state);
  }

  void closeNow() {
    if (closed_) return;
    closed_ = true;
    boost::system::error_code ec;
    helloTimer_.cancel();
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    impl_->forget(this);
    in_.clear();
    in_.shrink_to_fit();
    self_.reset();  // the handlers under way hold it until they end
  }

  StoreDirect::Impl* impl_;
  asio::io_context& io_;
  tcp::socket socket_;
  asio::steady_timer helloTimer_;
  std::string peer_;
  std::shared_ptr<DirectConnection> self_;
  std::shared_ptr<StoreService::SessionState> state_;
  std::string in_;
  std::array<char, kReadChunk> chunk_;
  pb::StoreRequest request_;
  bool magicSeen_ = false;
  bool stopReading_ = false;
  bool closed_ = false;
};

}  // namespace

void StoreDirect::Impl::accept() {
  acceptor_->async_wait(tcp::acceptor::wait_read, [this](boost::system::error_code ec) {
    if (ec == asio::error::operation_aborted || !acceptor_->is_open()) return;
    // accept4 with SOCK_CLOEXEC: never leak into a worker launch spawns at the same moment.
    int fd = ec ? -1
                : ::accept4(acceptor_->native_handle(), nullptr, nullptr,
                            SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      int err = ec ? ec.value() : errno;
      if (!ec && (err == EAGAIN || err == EWOULDBLOCK || err == EINTR || err == ECONNABORTED)) {
        accept();
        return;
      }
      if (!acceptErrorLogged_) {
        logger()->error("store direct path: cannot accept: {}; retrying every 100 ms",
                        std::strerror(err));
        acceptErrorLogged_ = true;
      }
      retry_->expires_after(std::chrono::milliseconds(100));
      retry_->async_wait([this](boost::system::error_code e) {
        if (!e) accept();
      });
      return;
    }
    acceptErrorLogged_ = false;
    bool full;
    {
      std::lock_guard<std::mutex> lock(mu_);
      full = live_.size() >= options_.maxConnections;
    }
    if (full) {
      warnForeign(fmt::format("store direct path: {} connections already; closing a new one",
                              options_.maxConnections));
      ::close(fd);
    } else {
      asio::io_context& io = *loops_[next_++ % loops_.size()];
      boost::system::error_code assignError;
      tcp::socket socket(io);
      socket.assign(acceptor_->local_endpoint(assignError).protocol(), fd, assignError);
      if (assignError) {
        ::close(fd);
      } else {
        auto c = std::make_shared<DirectConnection>(this, io, std::move(socket));
        {
          std::lock_guard<std::mutex> lock(mu_);
          live_.emplace(c.get(), c);
        }
        asio::post(io, [c] { c->start(); });
      }
    }
    accept();
  });
}

void StoreDirect::Impl::shutdown(Millis grace) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (down_) return;
    down_ = true;
  }
  if (threads_.empty()) return;
  // No new connections, then time for the sessions closing to say so.
  std::promise<void> closed;
  asio::post(*loops_[0], [this, &closed] {
    boost::system::error_code ec;
    acceptor_->close(ec);
    retry_->cancel();
    closed.set_value();
  });
  closed.get_future().wait();
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, grace, [&] { return live_.empty(); });
  }
  // The rest (a client that reads nothing, a half-open socket) are closed now, each on its loop.
  std::vector<std::shared_ptr<DirectConnection>> open;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [raw, weak] : live_) {
      if (auto c = weak.lock()) open.push_back(std::move(c));
    }
  }
  for (auto& c : open) {
    asio::post(c->executor(), [c] { c->forceClose(); });
  }
  open.clear();
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, Millis(2000), [&] { return live_.empty(); });
  }
  work_.clear();
  for (auto& loop : loops_) loop->stop();
  for (auto& t : threads_) t.join();
}

absl::StatusOr<std::unique_ptr<StoreDirect>> StoreDirect::start(StoreService& service,
                                                                TokenGate& gate,
                                                                DirectOptions options) {
  std::string why;
  int fd = net::listenTcp(options.host, options.port, why);
  if (fd < 0) return absl::UnavailableError(fmt::format("store direct path: cannot listen: {}", why));
  int port = net::boundPort(fd);
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY) {
    size_t room = files.rlim_cur > 512 ? files.rlim_cur - 256 : files.rlim_cur / 2;
    options.maxConnections = std::min(options.maxConnections, room);
  }
  auto impl = std::make_shared<Impl>(service, gate, std::move(options));
  if (auto s = impl->adopt(fd); !s.ok()) return s;
  impl->run();
  return std::unique_ptr<StoreDirect>(new StoreDirect(std::move(impl), port));
}

StoreDirect::~StoreDirect() { shutdown(Millis(0)); }

size_t StoreDirect::connections() const { return impl_->connections(); }

void StoreDirect::shutdown(Millis grace) { impl_->shutdown(grace); }

}  // namespace muster::rendezvous
