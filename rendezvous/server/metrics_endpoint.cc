// MetricsEndpoint: an Asio acceptor and one Beast session per client, on one thread.
#include "rendezvous/server/metrics_endpoint.h"

#include <fmt/format.h>

#include <atomic>
#include <deque>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <thread>

#include "common/log.h"

namespace muster::rendezvous {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr auto kClientTimeout = std::chrono::seconds(10);
constexpr size_t kMaxHeaderBytes = 8192;

auto logger() {
  static auto l = log::get("metrics");
  return l;
}

}  // namespace

class MetricsEndpoint::Impl {
 public:
  Impl(Render render) : render_(std::move(render)), acceptor_(io_), retry_(io_) {}

  absl::Status listen(const std::string& host, int port) {
    beast::error_code ec;
    auto address = asio::ip::make_address(host, ec);
    if (ec) return absl::InvalidArgumentError(fmt::format("metrics: '{}' is not an IP address", host));
    tcp::endpoint endpoint(address, static_cast<unsigned short>(port));
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(
          fmt::format("cannot serve metrics on {}:{}: {}", host, port, ec.message()));
    }
    port_ = acceptor_.local_endpoint().port();
    accept();
    thread_ = std::thread([this] { io_.run(); });
    return absl::OkStatus();
  }

  ~Impl() {
    asio::post(io_, [this] {
      beast::error_code ignored;
      acceptor_.close(ignored);
      retry_.cancel();
    });
    io_.stop();
    if (thread_.joinable()) thread_.join();
  }

  int port() const { return port_; }

 private:
  class Session;

  void accept();

  Render render_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  asio::steady_timer retry_;
  std::thread thread_;
  int port_ = 0;
  // Sessions alive; shared with them, as the io_context may destroy the last ones after this.
  std::shared_ptr<std::atomic<int>> clients_ = std::make_shared<std::atomic<int>>(0);
  std::deque<std::weak_ptr<Session>> sessions_;  // oldest first; on the io thread only
  log::OncePerSecond warnLimit_;
};

class MetricsEndpoint::Impl::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Impl* owner, tcp::socket socket)
      : owner_(owner), clients_(owner->clients_), stream_(std::move(socket)) {
    ++*clients_;
    parser_.header_limit(kMaxHeaderBytes);
    parser_.body_limit(kMaxHeaderBytes);
  }
  ~Session() { --*clients_; }

  // Closes the connection; its pending read or write ends, and with it the session.
  void drop() {
    beast::error_code ignored;
    stream_.socket().close(ignored);
  }

  void start() {
    stream_.expires_after(kClientTimeout);
    http::async_read(stream_, buffer_, parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->answer(ec); });
  }

 private:
  void answer(beast::error_code ec) {
    if (ec) return;  // timed out, too large, malformed or gone: drop it
    const auto& request = parser_.get();
    auto response = std::make_shared<http::response<http::string_body>>();
    response->version(request.version());
    response->keep_alive(false);
    response->set(http::field::server, "rendezvousd");
    std::string_view target(request.target().data(), request.target().size());
    if (request.method() != http::verb::get && request.method() != http::verb::head) {
      response->result(http::status::method_not_allowed);
      response->set(http::field::allow, "GET, HEAD");
      response->body() = "only GET\n";
    } else if (target != "/metrics" && target.rfind("/metrics?", 0) != 0) {
      response->result(http::status::not_found);
      response->body() = "metrics are at /metrics\n";
    } else {
      response->result(http::status::ok);
      response->set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      response->body() = owner_->render_();
    }
    if (response->result() != http::status::ok) {
      response->set(http::field::content_type, "text/plain; charset=utf-8");
    }
    response->prepare_payload();
    if (request.method() == http::verb::head) response->body().clear();
    stream_.expires_after(kClientTimeout);
    http::async_write(stream_, *response, [self = shared_from_this(), response](beast::error_code, size_t) {
      beast::error_code ignored;
      self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    });
  }

  Impl* owner_;
  std::shared_ptr<std::atomic<int>> clients_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_{kMaxHeaderBytes};
  http::request_parser<http::string_body> parser_;
};

void MetricsEndpoint::Impl::accept() {
  acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (ec) {
      // Out of descriptors (or another transient error): pause, then accept again.
      if (warnLimit_.pass()) logger()->warn("metrics: accept failed ({}); retrying", ec.message());
      retry_.expires_after(std::chrono::milliseconds(100));
      retry_.async_wait([this](beast::error_code e) {
        if (!e) accept();
      });
      return;
    }
    // At the cap the oldest client goes (idle ones would linger until their timeout): a
    // stalled or hostile client never keeps a scrape out.
    while (!sessions_.empty() && (sessions_.front().expired() || *clients_ >= kMaxClients)) {
      if (auto oldest = sessions_.front().lock()) oldest->drop();
      sessions_.pop_front();
    }
    auto session = std::make_shared<Session>(this, std::move(socket));
    sessions_.push_back(session);
    session->start();
    accept();
  });
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::start(const std::string& host, int port,
                                                                        Render render) {
  auto impl = std::make_unique<Impl>(std::move(render));
  if (auto s = impl->listen(host, port); !s.ok()) return s;
  return std::unique_ptr<MetricsEndpoint>(new MetricsEndpoint(std::move(impl)));
}

MetricsEndpoint::MetricsEndpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MetricsEndpoint::~MetricsEndpoint() = default;
int MetricsEndpoint::port() const { return impl_->port(); }

}  // namespace muster::rendezvous
