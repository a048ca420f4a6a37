// TcpStoreFront: one asio loop on a thread of its own; each connection decodes TCPStore
// requests, runs them on the MemoryStore, and writes the replies back in order.
#include "rendezvous/transport/tcpstore_front.h"

#include <fmt/format.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <array>
#include <boost/asio.hpp>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "common/contract.h"
#include "common/limits.h"
#include "common/log.h"
#include "common/net.h"
#include "rendezvous/door/accept_loop.h"
#include "rendezvous/transport/tcpstore_wire.h"

namespace muster::rendezvous {
namespace asio = boost::asio;
using asio::ip::tcp;
using tcpstore::Op;

namespace {

auto logger() {
  static auto l = log::get("tcpstore");
  return l;
}

constexpr int kNotFound = 5;
constexpr size_t kReadChunk = 64 * 1024;
// Stop reading a client whose unread replies pass this: it gets no more work done for it.
constexpr size_t kMaxPendingOut = 8u << 20;

}  // namespace

class Connection;

class TcpStoreFront::Impl : public std::enable_shared_from_this<TcpStoreFront::Impl> {
 public:
  Impl(std::shared_ptr<MemoryStore> memory, FrontOptions options)
      : memory_(std::move(memory)),
        options_(std::move(options)),
        round_(options_.round) {
    const StoreLimits& l = memory_->limits();
    limits_ = {.maxKeyBytes = l.maxKeyBytes + contract::kAttemptPrefix.size() + 24,
               .maxValueBytes = l.maxValueBytes,
               .maxKeysPerCall = l.maxKeysPerCall,
               .maxRequestBytes = std::max(l.maxReplyBytes, l.maxValueBytes + (size_t{1} << 20))};
  }

  absl::Status adopt(int fd) {
    accept_ = std::make_unique<AcceptLoop>(io_, fmt::format("TCPStore front on port {}", net::boundPort(fd)),
                                           logger());
    return accept_->adopt(fd);
  }

  void run() {
    accept();
    thread_ = std::thread([self = shared_from_this()] { self->io_.run(); });
  }

  void stop() {
    std::call_once(stopped_, [this] {
      asio::post(io_, [self = shared_from_this()] { self->closeAll(); });
      if (thread_.joinable()) {
        if (thread_.get_id() == std::this_thread::get_id()) {
          thread_.detach();
        } else {
          thread_.join();
        }
      }
    });
  }

  void accept();
  void closeAll();
  void forget(Connection* c) {
    std::lock_guard<std::mutex> lock(mu_);
    live_.erase(c);
  }
  size_t connections() const {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.size();
  }
  // The namespace of the current round.
  std::string ns() const { return contract::roundNamespace(options_.runId, round_.load()); }
  // Input bytes buffered across connections (the loop's thread only).
  bool reserveInput(size_t more) const { return bufferedInput_ + more <= options_.maxBufferedInput; }
  void adjustInput(int64_t delta) { bufferedInput_ = static_cast<size_t>(static_cast<int64_t>(bufferedInput_) + delta); }
  size_t bufferedInput() const { return bufferedInput_; }

  // BARRIER's parked ranks (the loop's thread only), by namespace and key: each is answered
  // when a SET, ADD or BARRIER through the front brings the key's count to its world size (as
  // torch's classic server does: a set of "9" lets a barrier of 5 through).
  struct ParkedBarrier {
    int64_t worldSize;
    std::weak_ptr<Connection> connection;
    uint64_t seq;  // the connection's wait it answers
  };
  void parkBarrier(const std::string& where, ParkedBarrier parked) {
    barriers_[where].push_back(std::move(parked));
  }
  void unparkBarrier(const std::string& where, const Connection* c);
  void counted(const std::string& where, int64_t count);
  bool anyBarrier() const { return !barriers_.empty(); }
  // Barriers parked in a namespace that is dropped (a finished round) stay until their rank
  // times out or goes: launch stops an old round's workers before it starts the next.

  std::shared_ptr<MemoryStore> memory_;
  FrontOptions options_;
  tcpstore::WireLimits limits_;
  asio::io_context io_;
  std::unique_ptr<AcceptLoop> accept_;
  std::atomic<uint64_t> round_;
  std::thread thread_;
  std::once_flag stopped_;
  mutable std::mutex mu_;
  // Open connections (owned by their own handlers): counted from any thread, closed by
  // closeAll(). Guarded by mu_.
  std::unordered_map<Connection*, std::weak_ptr<Connection>> live_;
  size_t bufferedInput_ = 0;
  std::unordered_map<std::string, std::vector<ParkedBarrier>> barriers_;
};

// One client. Lives as long as a read, a write or a parked wait holds it. Everything runs on
// the front's loop; a parked wait's completion is posted there.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(std::shared_ptr<TcpStoreFront::Impl> front, tcp::socket socket)
      : front_(std::move(front)), socket_(std::move(socket)) {
    boost::system::error_code ec;
    auto remote = socket_.remote_endpoint(ec);
    peer_ = ec ? std::string("?") : fmt::format("{}:{}", remote.address().to_string(), remote.port());
    socket_.set_option(tcp::no_delay(true), ec);
  }

  void start() { read(); }

  void close(const std::string& why) {
    if (closed_) return;
    closed_ = true;
    if (!why.empty()) logger()->warn("TCPStore client {} closed: {}", peer_, why);
    withdrawWait();
    boost::system::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    account();
    in_.clear();
    in_.shrink_to_fit();
    front_->forget(this);
  }

 private:
  void read() {
    if (closed_ || reading_) return;
    if (out_.size() + writing_.size() > kMaxPendingOut) return;  // resumed when writes drain
    // The front's input buffers together stay under a budget: a client in the middle of a
    // request when the budget is spent is closed (legitimate requests are small).
    if (in_.size() > head_ && !front_->reserveInput(kReadChunk)) {
      close(fmt::format("the store's input buffers are full ({} bytes across its connections)",
                        front_->bufferedInput()));
      return;
    }
    reading_ = true;
    // Into a chunk of its own, then appended: process() may run while a read is in flight
    // (from a write's completion) and must see only bytes that arrived.
    socket_.async_read_some(asio::buffer(chunk_),
                            [self = shared_from_this()](boost::system::error_code ec, size_t n) {
                              self->reading_ = false;
                              if (ec) {
                                // EOF or reset: a client that goes away is ordinary.
                                self->close("");
                                return;
                              }
                              self->in_.append(self->chunk_.data(), n);
                              self->account();
                              self->process();
                              self->read();
                            });
  }

  // Keeps the front's count of buffered input bytes in step with this connection's.
  void account() {
    size_t now = closed_ ? 0 : in_.size() - head_;
    front_->adjustInput(static_cast<int64_t>(now) - static_cast<int64_t>(accounted_));
    accounted_ = now;
  }

  void process() {
    // Stop while replies pile up unread: a flood of small GETs of a large key must not turn
    // into unbounded output; the write's completion comes back here.
    while (!closed_ && head_ < in_.size() && out_.size() + writing_.size() <= kMaxPendingOut) {
      if (in_.size() - head_ < needed_) break;  // the request still arriving is short
      tcpstore::Request req;
      size_t needed = 0;
      auto used = tcpstore::decode(std::string_view(in_).substr(head_), generation_,
                                   front_->limits_, req, &needed);
      if (!used.ok()) {
        close(std::string(used.status().message()));
        return;
      }
      if (*used == 0) {
        needed_ = needed;
        break;
      }
      needed_ = 0;
      head_ += *used;
      handle(req);
    }
    if (head_ == in_.size()) {
      in_.clear();
      head_ = 0;
      if (in_.capacity() > (4u << 20)) in_.shrink_to_fit();
    } else if (head_ > (1u << 20) && head_ > in_.size() / 2) {
      in_.erase(0, head_);
      head_ = 0;
    }
    account();
    flush();
  }

  // Runs a request that never waits; returns its response (execute answers such requests
  // before it returns).
  pb::StoreResponse now(pb::StoreRequest& req) {
    req.set_ns(ns());
    std::optional<pb::StoreResponse> got;
    front_->memory_->execute(req, [&got](pb::StoreResponse&& r) { got = std::move(r); });
    return got ? std::move(*got) : pb::StoreResponse();
  }

  bool failed(const pb::StoreResponse& r, Op op) {
    if (r.code() == 0) return false;
    close(fmt::format("{} refused: {}", tcpstore::opName(op), r.message()));
    return true;
  }

  // The store's key for a wire key. The first attempt prefix a client puts before its keys
  // (1.13's init_process_group, or a script's own PrefixStore: a rank's own attempt) is
  // remembered, so that LIST gives the client its keys as it named them.
  std::string key(const std::string& wire) {
    std::string stored = contract::storeKeyFromTcpStore(wire);
    if (attemptPrefix_.empty() && stored.size() != wire.size()) {
      attemptPrefix_ = wire.substr(0, wire.size() - stored.size());
    }
    return stored;
  }

  // SET, APPEND and QUEUE_PUSH: one key, one value, no reply.
  template <typename KeyValueOp>
  void keyValue(pb::StoreRequest& req, KeyValueOp* op, const tcpstore::Request& q) {
    op->set_key(key(q.keys[0]));
    op->set_value(q.values[0]);
    failed(now(req), q.op);
  }

  // A key's value, or empty when it was deleted between the client's WAIT and its GET (as
  // c10d's libuv server answers); nullopt when the store refused (the connection is closed).
  std::optional<std::string> valueOrEmpty(const std::string& wireKey, Op op) {
    pb::StoreRequest req;
    req.set_no_wait(true);
    req.mutable_get()->set_key(key(wireKey));
    auto r = now(req);
    if (r.code() == kNotFound) return std::string();
    if (failed(r, op)) return std::nullopt;
    return std::move(*r.mutable_value());
  }
  // A connection belongs to the round in which it sent its first request: a worker of an old
  // round that is still shutting down never writes into the next round.
  const std::string& ns() {
    if (ns_.empty()) ns_ = front_->ns();
    return ns_;
  }

  void handle(const tcpstore::Request& q) {
    // A client has one request in flight: one that asks anything but CANCEL_WAIT while its WAIT
    // or BARRIER is parked gave up on it (1.13 times out without telling the server). Withdrawn
    // before the request runs, a SET of the waited key does not wake it: torch's server sends
    // the dead wait's STOP_WAITING there, which the client reads as the start of its next answer
    // (its next get fails); the front sends nothing, always (it used to, sometimes, by a race
    // between the posted wake-up and the next WAIT).
    if (waiting_ && q.op != Op::kCancelWait) withdrawWait();
    pb::StoreRequest req;
    switch (q.op) {
      case Op::kValidate:
        return;
      case Op::kPing:
        tcpstore::putU32(out_, q.word);
        return;
      case Op::kSet:
        keyValue(req, req.mutable_set(), q);
        if (!closed_ && front_->anyBarrier()) {  // a count set outright lets barriers through too
          int64_t count = 0;
          if (leadingInteger(q.values[0], count) == Leading::kNumber) counted(req.set().key(), count);
        }
        return;
      case Op::kAppend:
        keyValue(req, req.mutable_append(), q);
        return;
      case Op::kMultiSet: {
        auto* op = req.mutable_multi_set();
        for (size_t i = 0; i < q.keys.size(); ++i) {
          op->add_keys(key(q.keys[i]));
          op->add_values(q.values[i]);
        }
        failed(now(req), q.op);
        return;
      }
      case Op::kQueuePush:
        keyValue(req, req.mutable_queue_push(), q);
        return;
      case Op::kCompareSet: {
        auto* op = req.mutable_compare_set();
        op->set_key(key(q.keys[0]));
        op->set_expected(q.values[0]);
        op->set_desired(q.values[1]);
        auto r = now(req);
        if (!failed(r, q.op)) tcpstore::putBytes(out_, r.value());
        return;
      }
      case Op::kGet:
        if (auto v = valueOrEmpty(q.keys[0], q.op)) tcpstore::putBytes(out_, *v);
        return;
      case Op::kMultiGet: {
        req.set_no_wait(true);
        auto* op = req.mutable_multi_get();
        for (const auto& k : q.keys) op->add_keys(key(k));
        auto r = now(req);
        if (r.code() == kNotFound) {
          // A key deleted since the client's WAIT: each key on its own, missing ones empty.
          std::vector<std::string> values;
          for (const auto& k : q.keys) {
            auto v = valueOrEmpty(k, q.op);
            if (!v) return;
            values.push_back(std::move(*v));
          }
          for (const auto& v : values) tcpstore::putBytes(out_, v);
          return;
        }
        if (failed(r, q.op)) return;
        for (const auto& v : r.values().values()) tcpstore::putBytes(out_, v);
        return;
      }
      case Op::kAdd: {
        auto* op = req.mutable_add();
        op->set_key(key(q.keys[0]));
        op->set_delta(q.number);
        auto r = now(req);
        if (failed(r, q.op)) return;
        tcpstore::putI64(out_, r.number());
        counted(op->key(), r.number());
        return;
      }
      case Op::kBarrier:
        barrier(q);
        return;
      case Op::kCheck: {
        auto* op = req.mutable_check();
        for (const auto& k : q.keys) op->add_keys(key(k));
        auto r = now(req);
        if (!failed(r, q.op)) tcpstore::putU8(out_, r.flag() ? tcpstore::kReady : tcpstore::kNotReady);
        return;
      }
      case Op::kNumKeys: {
        req.mutable_num_keys();
        auto r = now(req);
        if (!failed(r, q.op)) tcpstore::putI64(out_, r.number());
        return;
      }
      case Op::kDeleteKey: {
        req.mutable_delete_key()->set_key(key(q.keys[0]));
        auto r = now(req);
        if (!failed(r, q.op)) tcpstore::putI64(out_, r.number());
        return;
      }
      case Op::kQueuePop: {
        req.mutable_queue_pop()->set_key(key(q.keys[0]));
        auto r = now(req);
        if (failed(r, q.op)) return;
        tcpstore::putI64(out_, r.queue_length());
        if (r.queue_length() > 0) tcpstore::putBytes(out_, r.value());
        return;
      }
      case Op::kQueueLen: {
        req.mutable_queue_len()->set_key(key(q.keys[0]));
        auto r = now(req);
        if (!failed(r, q.op)) tcpstore::putI64(out_, r.number());
        return;
      }
      case Op::kList: {
        req.mutable_list();
        auto r = now(req);
        if (failed(r, q.op)) return;
        tcpstore::putI64(out_, r.values().values_size());
        for (const auto& k : r.values().values()) {
          // "/K" as this client wrote it ("//worker/attempt_N/K" when it used the prefix).
          tcpstore::putBytes(out_, !attemptPrefix_.empty() && !k.empty() && k[0] == '/' ? attemptPrefix_ + k : k);
        }
        return;
      }
      case Op::kWait:
        wait(q);
        return;
      case Op::kCancelWait:
        cancelWait();
        return;
      case Op::kWatchKey:
        close("WATCH_KEY (torch 1.13's watchKey) is not supported by muster's store");
        return;
    }
  }

  // A client has one WAIT at a time: a new one means it gave up on the last (1.13 times out
  // without telling the server), which is withdrawn so that no stray reply follows.
  void wait(const tcpstore::Request& q) {
    withdrawWait();
    pb::StoreRequest req;
    auto* op = req.mutable_wait();
    for (const auto& k : q.keys) op->add_keys(key(k));
    // Most waits find their keys (every get is a WAIT then a GET): answer those at once.
    req.set_no_wait(true);
    auto quick = now(req);
    if (quick.code() == 0) {
      tcpstore::putU8(out_, tcpstore::kStopWaiting);
      return;
    }
    if (quick.code() != kNotFound && failed(quick, Op::kWait)) return;
    req.set_no_wait(false);
    uint64_t seq = ++waitSeq_;
    struct Slot {
      std::mutex mu;
      bool inCall = true;
      std::optional<pb::StoreResponse> resp;
    };
    auto slot = std::make_shared<Slot>();
    std::weak_ptr<Connection> weak = weak_from_this();
    // The completion may run on another thread after the front is gone: it holds the front
    // only weakly.
    std::weak_ptr<TcpStoreFront::Impl> front = front_;
    auto id = front_->memory_->execute(req, [slot, weak, front, seq](pb::StoreResponse&& r) {
      std::unique_lock<std::mutex> lock(slot->mu);
      if (slot->inCall) {
        slot->resp = std::move(r);
        return;
      }
      lock.unlock();
      if (auto f = front.lock()) {
        asio::post(f->io_, [weak, seq, r = std::move(r)] {
          if (auto self = weak.lock()) self->waitDone(seq, r);
        });
      }
    });
    std::optional<pb::StoreResponse> answered;
    {
      std::lock_guard<std::mutex> lock(slot->mu);
      slot->inCall = false;
      answered = std::move(slot->resp);
    }
    waiter_ = id;
    waiting_ = true;
    if (answered) waitDone(seq, *answered);
  }

  // torch 2.14's BARRIER, as its servers do it: the key counts arrivals (an ADD of 1), and the
  // rank is answered STOP_WAITING once the count reaches the world size: at once when its own
  // arrival got it there (or past: the count is never reset, so a key used again lets every
  // later arrival through), else when a later SET, ADD or BARRIER through the front does. Its
  // client gives up with CANCEL_WAIT at its timeout, which withdraws it as it does a WAIT.
  void barrier(const tcpstore::Request& q) {
    withdrawWait();
    pb::StoreRequest req;
    auto* op = req.mutable_add();
    op->set_key(key(q.keys[0]));
    op->set_delta(1);
    auto r = now(req);
    if (failed(r, q.op)) return;
    counted(op->key(), r.number());
    if (r.number() >= q.number) {
      tcpstore::putU8(out_, tcpstore::kStopWaiting);
      return;
    }
    waiting_ = true;
    waiter_ = MemoryStore::kNotPending;
    barrierAt_ = barrierPlace(op->key());
    front_->parkBarrier(barrierAt_, {q.number, weak_from_this(), ++waitSeq_});
  }

  // The front's table of parked barriers is by namespace and key.
  std::string barrierPlace(const std::string& storeKey) { return ns() + '\0' + storeKey; }

  // A key of this connection's namespace now counts `count`: the barriers it lets through go.
  void counted(const std::string& storeKey, int64_t count) {
    if (front_->anyBarrier()) front_->counted(barrierPlace(storeKey), count);
  }

 public:
  // A parked BARRIER's count reached its world size.
  void barrierDone(uint64_t seq) {
    if (closed_ || !waiting_ || seq != waitSeq_) return;  // withdrawn meanwhile
    waiting_ = false;
    barrierAt_.clear();
    tcpstore::putU8(out_, tcpstore::kStopWaiting);
    flush();
  }

 private:
  void waitDone(uint64_t seq, const pb::StoreResponse& r) {
    if (closed_ || !waiting_ || seq != waitSeq_) return;  // withdrawn meanwhile
    waiting_ = false;
    waiter_ = MemoryStore::kNotPending;
    if (failed(r, Op::kWait)) return;
    tcpstore::putU8(out_, tcpstore::kStopWaiting);
    flush();
  }

  // 2.x: the client's wait timed out. Exactly one WAIT_CANCELED answers; STOP_WAITING comes
  // before it only if the keys had already arrived (the client reads "00 01" then).
  void cancelWait() {
    dropBarrier();
    if (waiting_) {
      bool withdrawn = waiter_ == MemoryStore::kNotPending || front_->memory_->cancel(waiter_);
      if (!withdrawn) tcpstore::putU8(out_, tcpstore::kStopWaiting);
      waiting_ = false;
      waiter_ = MemoryStore::kNotPending;
      ++waitSeq_;
    }
    tcpstore::putU8(out_, tcpstore::kWaitCanceled);
  }

  void withdrawWait() {
    dropBarrier();
    if (!waiting_) return;
    if (waiter_ != MemoryStore::kNotPending) front_->memory_->cancel(waiter_);
    waiting_ = false;
    waiter_ = MemoryStore::kNotPending;
    ++waitSeq_;
  }

  // Takes this connection's parked BARRIER, if any, off the front's table.
  void dropBarrier() {
    if (barrierAt_.empty()) return;
    front_->unparkBarrier(barrierAt_, this);
    barrierAt_.clear();
  }

  void flush() {
    if (closed_ || writingNow_ || out_.empty()) return;
    writing_.swap(out_);
    out_.clear();
    writingNow_ = true;
    asio::async_write(socket_, asio::buffer(writing_),
                      [self = shared_from_this()](boost::system::error_code ec, size_t) {
                        self->writingNow_ = false;
                        self->writing_.clear();
                        if (ec) {
                          self->close("");
                          return;
                        }
                        self->process();  // requests held back while replies piled up
                        self->flush();
                        self->read();
                      });
  }

  std::shared_ptr<TcpStoreFront::Impl> front_;
  tcp::socket socket_;
  std::string peer_;
  tcpstore::Generation generation_ = tcpstore::Generation::kUnknown;
  std::string in_;
  size_t head_ = 0;
  std::string out_, writing_;
  bool reading_ = false, writingNow_ = false, closed_ = false;
  bool waiting_ = false;
  MemoryStore::WaiterId waiter_ = MemoryStore::kNotPending;
  uint64_t waitSeq_ = 0;
  std::string barrierAt_;  // where this connection's BARRIER is parked ("" when none)
  std::string ns_;
  std::string attemptPrefix_;  // "//worker/attempt_N": the first this client used; "" before
  size_t needed_ = 0;     // bytes the request at head_ needs before decoding again
  std::array<char, kReadChunk> chunk_;
  size_t accounted_ = 0;  // this connection's share of the front's buffered input
};

void TcpStoreFront::Impl::accept() {
  accept_->start(
      [this](int fd, tcp protocol) {
        bool full = false;
        {
          std::lock_guard<std::mutex> lock(mu_);
          full = live_.size() >= options_.maxConnections;
        }
        if (full) {
          logger()->warn("TCPStore front: {} connections already; closing a new one", options_.maxConnections);
          ::close(fd);
          return;
        }
        boost::system::error_code assignError;
        tcp::socket socket(io_);
        socket.assign(protocol, fd, assignError);
        if (assignError) {
          ::close(fd);
          return;
        }
        auto c = std::make_shared<Connection>(shared_from_this(), std::move(socket));
        {
          std::lock_guard<std::mutex> lock(mu_);
          live_.emplace(c.get(), c);
        }
        c->start();
      },
      weak_from_this());
}

void TcpStoreFront::Impl::unparkBarrier(const std::string& where, const Connection* c) {
  auto it = barriers_.find(where);
  if (it == barriers_.end()) return;
  std::erase_if(it->second, [c](const ParkedBarrier& p) {
    auto held = p.connection.lock();
    return !held || held.get() == c;
  });
  if (it->second.empty()) barriers_.erase(it);
}

void TcpStoreFront::Impl::counted(const std::string& where, int64_t count) {
  auto it = barriers_.find(where);
  if (it == barriers_.end()) return;
  std::vector<ParkedBarrier> through;
  std::erase_if(it->second, [&](const ParkedBarrier& p) {
    if (p.connection.expired()) return true;
    if (p.worldSize > count) return false;
    through.push_back(p);
    return true;
  });
  if (it->second.empty()) barriers_.erase(it);
  for (auto& p : through) {
    if (auto c = p.connection.lock()) c->barrierDone(p.seq);
  }
}

void TcpStoreFront::Impl::closeAll() {
  if (accept_) accept_->close();
  std::vector<std::shared_ptr<Connection>> open;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [raw, weak] : live_) {
      if (auto c = weak.lock()) open.push_back(std::move(c));
    }
  }
  for (auto& c : open) c->close("");  // each forgets itself
  // No io_.stop(): the aborted operations' handlers still run, dropping their connections,
  // and then run() returns by itself.
}

absl::StatusOr<std::unique_ptr<TcpStoreFront>> TcpStoreFront::start(
    std::shared_ptr<MemoryStore> memory, int listenFd, FrontOptions options) {
  if (listenFd < 0) return absl::InvalidArgumentError("TCPStore front: no listening socket");
  int port = net::boundPort(listenFd);
  // launch raises its soft descriptor limit to the hard one at start.
  options.maxConnections = connectionRoom(options.maxConnections);
  auto impl = std::make_shared<Impl>(std::move(memory), std::move(options));
  if (auto s = impl->adopt(listenFd); !s.ok()) return s;
  impl->run();
  logger()->debug("TCPStore front serving port {} for run '{}'", port, impl->options_.runId);
  return std::unique_ptr<TcpStoreFront>(new TcpStoreFront(std::move(impl), port));
}

TcpStoreFront::TcpStoreFront(std::shared_ptr<Impl> impl, int port)
    : impl_(std::move(impl)), port_(port) {}

TcpStoreFront::~TcpStoreFront() { shutdown(); }

void TcpStoreFront::setRound(uint64_t round) { impl_->round_.store(round); }

size_t TcpStoreFront::connections() const { return impl_->connections(); }

void TcpStoreFront::shutdown() { impl_->stop(); }

}  // namespace muster::rendezvous
