// StoreDirect: an acceptor on the first of a few asio loops; each connection lives on one loop,
// reads the magic and the hello, then hands each request frame to its StoreSessions session
// and writes the session's answers back as frames.
#include "rendezvous/transport/store_direct.h"

#include <fmt/format.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/limits.h"
#include "common/log.h"
#include "common/net.h"
#include "rendezvous/door/accept_loop.h"
#include "rendezvous/transport/direct_wire.h"

namespace muster::rendezvous {
namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

auto logger() {
  static auto l = log::get("store");
  return l;
}

// What one read takes off a socket, into its loop's buffer.
constexpr size_t kReadChunk = 64 * 1024;
// A hello is a token and little else.
constexpr size_t kMaxHelloBytes = 4096;
// A connection's input buffer keeps no more than this once it is empty.
constexpr size_t kKeptInputCapacity = 256 * 1024;
// After its end frame, how long a connection waits for its client to close (reading what it
// still sends) before it closes itself.
constexpr Millis kLinger{2000};

class DirectConnection;

}  // namespace

class StoreDirect::Impl {
 public:
  Impl(StoreSessions& sessions, TokenGate& gate, DirectOptions options)
      : sessions_(sessions), gate_(gate), options_(std::move(options)) {
    int loops = options_.loops;
    if (loops <= 0) loops = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
    for (int i = 0; i < loops; ++i) {
      loops_.push_back(std::make_unique<asio::io_context>(1));
      scratch_.emplace_back(kReadChunk);
      work_.emplace_back(asio::make_work_guard(*loops_.back()));
    }
    accept_ = std::make_unique<AcceptLoop>(*loops_[0], "store direct path", logger());
  }
  ~Impl() { shutdown(Millis(0)); }

  absl::Status adopt(int fd) { return accept_->adopt(fd); }

  void run() {
    accept();
    for (auto& loop : loops_) {
      threads_.emplace_back([io = loop.get()] { io->run(); });
    }
  }

  void accept();
  void shutdown(Millis grace);

  // `ended`: the connection had written its end frame (counted in lingering_).
  void forget(DirectConnection* c, bool ended) {
    std::lock_guard<std::mutex> lock(mu_);
    if (live_.erase(c) > 0 && ended) --lingering_;
    if (live_.size() == lingering_) cv_.notify_all();
  }
  // The connection's session is over (its end frame written): shutdown does not wait for it.
  void ended() {
    std::lock_guard<std::mutex> lock(mu_);
    ++lingering_;
    if (live_.size() == lingering_) cv_.notify_all();
  }
  size_t connections() const {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.size();
  }
  // One line a second at most for clients that are not muster's or misbehave before hello.
  void warnForeign(const std::string& line) {
    if (foreignLog_.pass()) logger()->warn("{}", line);
  }
  // Input buffered across connections: false (and nothing taken) when `more` would pass the
  // budget.
  bool reserveInput(size_t more) {
    size_t now = buffered_.load();
    do {
      if (now + more > options_.maxBufferedBytes) return false;
    } while (!buffered_.compare_exchange_weak(now, now + more));
    return true;
  }
  void releaseInput(size_t less) { buffered_.fetch_sub(less); }
  size_t bufferedInput() const { return buffered_.load(); }

  StoreSessions& sessions_;
  TokenGate& gate_;
  DirectOptions options_;
  std::atomic<size_t> buffered_{0};
  std::atomic<size_t> greeting_{0};  // connections that have not said hello yet
  // Declared before the loops: a connection that goes with its loop's handlers still finds them.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<DirectConnection*, std::weak_ptr<DirectConnection>> live_;
  size_t lingering_ = 0;  // of live_, those past their end frame
  log::OncePerSecond foreignLog_;
  std::mutex shutdownMu_;  // held for a whole shutdown
  bool down_ = false;
  std::vector<std::unique_ptr<asio::io_context>> loops_;
  // Each loop's read buffer: a read's bytes are taken off it before the handler returns.
  std::vector<std::vector<char>> scratch_;
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::unique_ptr<AcceptLoop> accept_;
  std::vector<std::thread> threads_;
  size_t next_ = 0;
};

namespace {

// One client: the hello, then its session. Everything but the sink's calls runs on the
// connection's loop; the sink posts there. Holds itself (self_) from start() until closed.
class DirectConnection final : public SessionSink,
                               public std::enable_shared_from_this<DirectConnection> {
 public:
  DirectConnection(StoreDirect::Impl* impl, asio::io_context& io, std::vector<char>& scratch,
                   tcp::socket socket)
      : impl_(impl), io_(io), scratch_(scratch), socket_(std::move(socket)), timer_(io) {
    boost::system::error_code ec;
    auto remote = socket_.remote_endpoint(ec);
    peer_ = ec ? std::string("?") : fmt::format("{}:{}", remote.address().to_string(), remote.port());
    socket_.non_blocking(true, ec);
    direct::watchPeer(socket_.native_handle());
  }

  ~DirectConnection() override {
    release();
    if (!closed_) {
      impl_->forget(this, ended_);
      leaveGreeting();
    }
    account(0);
  }

  asio::io_context& executor() { return io_; }
  bool hasSession() const { return state_ != nullptr; }

  void start() {
    self_ = shared_from_this();
    timer_.expires_after(impl_->options_.helloTimeout);
    timer_.async_wait([weak = weak_from_this()](boost::system::error_code ec) {
      auto self = weak.lock();
      if (ec || !self || self->greeted_ || self->closed_) return;
      self->impl_->warnForeign(fmt::format(
          "store direct path: {} sent no hello within {} ms; closed", self->peer_,
          self->impl_->options_.helloTimeout.count()));
      self->closeNow();
    });
    read();
  }

  // The service is gone or going: no more session, no more socket.
  void forceClose() {
    release();
    closeNow();
  }

  void startWrite(const pb::StoreResponse& response) override {
    post(frameOf(direct::Kind::kAnswer, response), Role::kAnswer);
  }

  void finish(const grpc::Status& status) override {
    pb::StoreResponse end;
    end.set_code(static_cast<int>(status.error_code()));
    end.set_message(status.error_message());
    post(frameOf(direct::Kind::kEnd, end), Role::kEnd);
  }

 private:
  enum class Role { kAnswer, kEnd, kWelcome, kPing };

  // One frame, shared by the write that carries it.
  static std::shared_ptr<std::string> frameOf(direct::Kind kind,
                                              const google::protobuf::MessageLite& message) {
    auto frame = std::make_shared<std::string>();
    direct::appendFrame(*frame, kind, message);
    return frame;
  }

  // From any thread (the session's lock held): queues the frame on the loop.
  void post(std::shared_ptr<std::string> frame, Role role) {
    auto self = weak_from_this().lock();
    if (!self) return;  // being destroyed: release() detaches it
    asio::post(io_, [self = std::move(self), frame = std::move(frame), role] {
      self->queueFrame(std::move(frame), role);
    });
  }

  void queueFrame(std::shared_ptr<std::string> frame, Role role) {
    if (closed_ || ended_) {
      // Nothing more reaches the client: the session learns it as a failed write.
      if (role == Role::kAnswer && state_) state_->writeDone(false);
      if (role == Role::kEnd) release();
      return;
    }
    out_.emplace_back(std::move(frame), role);
    writeNext();
  }

  void writeNext() {
    if (writing_ || out_.empty() || closed_) return;
    writing_ = true;
    auto [frame, role] = out_.front();
    out_.pop_front();
    asio::async_write(socket_, asio::buffer(*frame),
                      [self = shared_from_this(), frame = frame, role = role](
                          boost::system::error_code ec, size_t) {
                        self->writing_ = false;
                        self->lastWrite_ = std::chrono::steady_clock::now();
                        self->written(role, !ec);
                      });
  }

  void written(Role role, bool ok) {
    switch (role) {
      case Role::kAnswer:
        if (state_) state_->writeDone(ok);
        break;
      case Role::kEnd:
        release();
        linger();
        return;
      case Role::kWelcome:
      case Role::kPing:
        if (!ok && state_) state_->close(grpc::Status::CANCELLED);
        break;
    }
    writeNext();
  }

  // After the end frame: no more writes; what the client still sends is read and dropped
  // until it closes, so that the kernel does not reset the connection (losing the end frame)
  // for input left unread. Bounded by kLinger.
  void linger() {
    if (closed_) return;
    ended_ = true;
    impl_->ended();
    stopReading_ = true;
    boost::system::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    timer_.expires_after(kLinger);
    timer_.async_wait([weak = weak_from_this()](boost::system::error_code e) {
      if (auto self = weak.lock(); self && !e) self->closeNow();
    });
    drain();
  }

  void drain() {
    if (closed_) return;
    socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](boost::system::error_code ec) {
      if (self->closed_) return;
      boost::system::error_code readError;
      size_t n = ec ? 0 : self->socket_.read_some(asio::buffer(self->scratch_), readError);
      if (ec || (readError && readError != asio::error::would_block) || (n == 0 && !readError)) {
        self->closeNow();
        return;
      }
      self->drain();
    });
  }

  // Waits for input, then takes what has come into the loop's buffer.
  void read() {
    if (closed_ || stopReading_) return;
    socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](boost::system::error_code ec) {
      if (self->closed_ || self->stopReading_) return;
      boost::system::error_code readError = ec;
      size_t n = 0;
      if (!ec) n = self->socket_.read_some(asio::buffer(self->scratch_), readError);
      if (readError == asio::error::would_block) {
        self->read();
        return;
      }
      if (readError) {
        // The end of its requests (half-closed): answer what is due, then end. Reset: gone.
        if (!self->state_) {
          self->closeNow();
        } else {
          self->state_->close(readError == asio::error::eof ? grpc::Status::OK
                                                            : grpc::Status::CANCELLED);
        }
        return;
      }
      self->in_.append(self->scratch_.data(), n);
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
      size_t most = greeted_ ? impl_->options_.maxMessageBytes + 1 : kMaxHelloBytes;
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
      if (!greeted_) {
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
    if (closed_) return;
    in_.erase(0, at);
    if (in_.empty() && in_.capacity() > kKeptInputCapacity) std::string().swap(in_);
    // A request still arriving counts against the budget of all connections together.
    if (!account(in_.size())) {
      refuse(grpc::StatusCode::RESOURCE_EXHAUSTED,
             fmt::format("the store's input buffers are full ({} bytes across its direct "
                         "connections)", impl_->bufferedInput()));
    }
  }

  // Keeps this connection's share of the buffered input at `bytes`; false when the budget
  // has no room for it (the share stays as it was).
  bool account(size_t bytes) {
    if (bytes > accounted_) {
      if (!impl_->reserveInput(bytes - accounted_)) return false;
    } else {
      impl_->releaseInput(accounted_ - bytes);
    }
    accounted_ = bytes;
    return true;
  }

  void hello(direct::Kind kind, const char* body, int bytes) {
    pb::DirectHello hello;
    if (kind != direct::Kind::kHello || !hello.ParseFromArray(body, bytes)) {
      impl_->warnForeign(fmt::format("store direct path: {} sent no hello; closed", peer_));
      closeNow();
      return;
    }
    greeted_ = true;
    leaveGreeting();
    bool admitted = impl_->gate_.admitsToken(hello.token(), peer_);
    state_ = impl_->sessions_.openSession(true);
    if (!admitted) {
      stopReading_ = true;
      state_->close(grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                                 "missing or wrong token (x-muster-token)"));
    } else {
      // The welcome names this run of the store: the client checks it is the one it met.
      pb::ServerInfo welcome;
      welcome.set_batching(true);
      welcome.set_instance(impl_->sessions_.instance());
      queueFrame(frameOf(direct::Kind::kWelcome, welcome), Role::kWelcome);
      keepAlive();
    }
    state_->attach(this);
  }

  // A ping when nothing was written for half of pingEvery, looked at every half: so that no
  // gap without a frame is much longer than pingEvery, and the client can tell a quiet store
  // from a lost one.
  void keepAlive() {
    timer_.expires_after(impl_->options_.pingEvery / 2);
    timer_.async_wait([weak = weak_from_this()](boost::system::error_code ec) {
      auto self = weak.lock();
      if (ec || !self || self->closed_ || self->ended_) return;
      if (!self->writing_ && self->out_.empty() &&
          std::chrono::steady_clock::now() - self->lastWrite_ >= self->impl_->options_.pingEvery / 2) {
        self->queueFrame(frameOf(direct::Kind::kPing, pb::DirectHello()), Role::kPing);
      }
      self->keepAlive();
    });
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
    impl_->sessions_.forget(state);
  }

  void leaveGreeting() {
    if (!counted_) return;
    counted_ = false;
    impl_->greeting_.fetch_sub(1);
  }

  void closeNow() {
    if (closed_) return;
    closed_ = true;
    leaveGreeting();
    boost::system::error_code ec;
    timer_.cancel();
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    impl_->forget(this, ended_);
    in_.clear();
    std::string().swap(in_);
    account(0);
    out_.clear();
    self_.reset();  // the handlers under way hold it until they end
  }

  StoreDirect::Impl* impl_;
  asio::io_context& io_;
  std::vector<char>& scratch_;
  tcp::socket socket_;
  asio::steady_timer timer_;  // the hello's deadline, then the pings, then the linger
  std::string peer_;
  std::shared_ptr<DirectConnection> self_;
  std::shared_ptr<StoreSessions::SessionState> state_;
  std::string in_;
  size_t accounted_ = 0;
  std::deque<std::pair<std::shared_ptr<std::string>, Role>> out_;
  bool writing_ = false;
  std::chrono::steady_clock::time_point lastWrite_ = std::chrono::steady_clock::now();
  pb::StoreRequest request_;
  bool magicSeen_ = false;
  bool greeted_ = false;
  bool stopReading_ = false;
  bool ended_ = false;  // the end frame is written
  bool closed_ = false;
  bool counted_ = true;  // counted in the connections that have not said hello
};

}  // namespace

void StoreDirect::Impl::accept() {
  accept_->start([this](int fd, tcp protocol) {
    bool full;
    {
      std::lock_guard<std::mutex> lock(mu_);
      full = live_.size() >= options_.maxConnections;
    }
    if (full || greeting_.load() >= options_.maxGreeting) {
      std::string why = full ? fmt::format("the store's direct path has {} connections already",
                                           options_.maxConnections)
                             : fmt::format("{} connections to the store's direct path have not "
                                           "said hello yet", options_.maxGreeting);
      warnForeign(fmt::format("store direct path: {}; closing a new one", why));
      // Said to the client (best effort: the frame is small, the socket's buffer empty); a
      // busy store is no reason for it to give the port up.
      pb::StoreResponse end;
      end.set_code(static_cast<int>(grpc::StatusCode::UNAVAILABLE));
      end.set_message(why);
      std::string frame;
      direct::appendFrame(frame, direct::Kind::kEnd, end);
      [[maybe_unused]] ssize_t sent = ::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      ::shutdown(fd, SHUT_WR);
      ::close(fd);
      return;
    }
    size_t i = next_++ % loops_.size();
    asio::io_context& io = *loops_[i];
    boost::system::error_code assignError;
    tcp::socket socket(io);
    socket.assign(protocol, fd, assignError);
    if (assignError) {
      ::close(fd);
      return;
    }
    greeting_.fetch_add(1);
    auto c = std::make_shared<DirectConnection>(this, io, scratch_[i], std::move(socket));
    {
      std::lock_guard<std::mutex> lock(mu_);
      live_.emplace(c.get(), c);
    }
    asio::post(io, [c] { c->start(); });
  });
}

void StoreDirect::Impl::shutdown(Millis grace) {
  std::lock_guard<std::mutex> once(shutdownMu_);
  if (down_) return;
  down_ = true;
  if (threads_.empty()) return;
  auto closeWhere = [this](bool withSession) {
    std::vector<std::shared_ptr<DirectConnection>> open;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [raw, weak] : live_) {
        if (auto c = weak.lock()) open.push_back(std::move(c));
      }
    }
    for (auto& c : open) {
      asio::post(c->executor(), [c, withSession] {
        if (withSession || !c->hasSession()) c->forceClose();
      });
    }
  };
  // No new connections; those that have no session yet go now (closeAll cannot end them);
  // then time for the sessions closing to say so.
  std::promise<void> closed;
  asio::post(*loops_[0], [this, &closed] {
    accept_->close();
    closed.set_value();
  });
  closed.get_future().wait();
  closeWhere(false);
  {
    // Sessions that have said their end need not be waited for (their client may never read
    // it, and may never close).
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, grace, [&] { return live_.size() == lingering_; });
  }
  // The rest (a client that reads nothing, a half-open socket) are closed now, each on its loop.
  closeWhere(true);
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, Millis(2000), [&] { return live_.empty(); });
  }
  work_.clear();
  for (auto& loop : loops_) loop->stop();
  for (auto& t : threads_) t.join();
  threads_.clear();
  // Any left (their loop stopped before it got to them) are closed here, no loop running.
  std::vector<std::shared_ptr<DirectConnection>> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [raw, weak] : live_) {
      if (auto c = weak.lock()) left.push_back(std::move(c));
    }
  }
  for (auto& c : left) c->forceClose();
}

absl::StatusOr<std::unique_ptr<StoreDirect>> StoreDirect::start(StoreSessions& sessions,
                                                                TokenGate& gate,
                                                                DirectOptions options) {
  std::string why;
  int fd = net::listenTcp(options.host, options.port, why);
  if (fd < 0) return absl::UnavailableError(fmt::format("store direct path: cannot listen: {}", why));
  int port = net::boundPort(fd);
  options.maxConnections = connectionRoom(options.maxConnections);
  auto impl = std::make_shared<Impl>(sessions, gate, std::move(options));
  if (auto s = impl->adopt(fd); !s.ok()) return s;
  impl->run();
  return std::unique_ptr<StoreDirect>(new StoreDirect(std::move(impl), port));
}

StoreDirect::~StoreDirect() { shutdown(Millis(0)); }

size_t StoreDirect::connections() const { return impl_->connections(); }

void StoreDirect::shutdown(Millis grace) { impl_->shutdown(grace); }

}  // namespace muster::rendezvous
