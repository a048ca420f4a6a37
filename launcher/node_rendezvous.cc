// NodeRendezvous: join with retries, watch, report; completions posted to the loop.
#include "launcher/node_rendezvous.h"

#include "common/log.h"

namespace muster::launcher {
namespace asio = boost::asio;

namespace {

auto logger() {
  static auto l = log::get("launch");
  return l;
}

// How long a report may take: the service answers at once, or is not there.
constexpr Millis kReportDeadline{10000};
// Beyond the join timeout: the service says "timed out" itself, with the numbers.
constexpr Millis kJoinAnswerMargin{5000};

}  // namespace

NodeRendezvous::NodeRendezvous(asio::io_context& io, const std::string& endpoint,
                               const std::string& token, Node node,
                               LaunchOptions::RdzvConf conf, const std::string& tlsCaPem,
                               const std::string& tlsServerName)
    : io_(io),
      node_(std::move(node)),
      conf_(conf),
      client_(std::make_unique<rendezvous::RendezvousClient>(endpoint, token, tlsCaPem, tlsServerName)),
      retryTimer_(io) {}

NodeRendezvous::NodeRendezvous(asio::io_context& io, std::unique_ptr<rendezvous::RoundClient> client, Node node,
                               LaunchOptions::RdzvConf conf)
    : io_(io), node_(std::move(node)), conf_(conf), client_(std::move(client)), retryTimer_(io) {}

NodeRendezvous::~NodeRendezvous() {
  *alive_ = false;
  retryTimer_.cancel();
  // client_'s destructor cancels every call and waits for their callbacks, which only post.
}

void NodeRendezvous::join(int masterPort, bool serviceRestarts,
                          std::function<void(absl::StatusOr<muster::v1::Assignment>)> done) {
  muster::v1::JoinRequest req;
  req.set_run_id(node_.runId);
  auto* node = req.mutable_node();
  node->set_node_id(node_.nodeId);
  node->set_host(node_.host);
  node->set_local_world_size(node_.localWorldSize);
  node->set_wanted_rank(node_.wantedRank);
  node->set_role(node_.role);
  node->set_master_port(masterPort);
  req.set_min_nodes(node_.minNodes);
  req.set_max_nodes(node_.maxNodes);
  req.set_last_call_ms(static_cast<uint64_t>(conf_.lastCall.count()));
  req.set_join_timeout_ms(static_cast<uint64_t>(conf_.joinTimeout.count()));
  req.set_keep_alive_ms(
      static_cast<uint64_t>(conf_.keepAliveInterval.count() * conf_.keepAliveMaxAttempt));
  joinRequest_ = std::move(req);
  joined_ = std::move(done);
  joinDeadline_ = deadlineAfter(conf_.joinTimeout + kJoinAnswerMargin);
  joinBackoff_.reset();
  retryUnavailable_ = serviceRestarts;
  ++joinGeneration_;
  retryTimer_.cancel();
  sendJoin();
}

void NodeRendezvous::sendJoin() {
  client_->join(joinRequest_, joinDeadline_,
               [this, alive = alive_, generation = joinGeneration_](
                   absl::StatusOr<muster::v1::Assignment> result) {
    asio::post(io_, [this, alive, generation, result = std::move(result)]() mutable {
      if (!*alive || generation != joinGeneration_ || !joined_) return;
      Millis pause = joinBackoff_.next();
      if (retryUnavailable_ && !result.ok() &&
          result.status().code() == absl::StatusCode::kUnavailable &&
          Clock::now() + pause < joinDeadline_) {
        // The connection broke under the call (a rendezvousd that was just restarted, the
        // old connection not yet seen closed), or it is restarting: ask the new one.
        logger()->debug("join: {}; asking again in {} ms", std::string(result.status().message()),
                        pause.count());
        retryTimer_.expires_after(pause);
        retryTimer_.async_wait([this, alive, generation](const boost::system::error_code& ec) {
          if (!ec && *alive && generation == joinGeneration_ && joined_) sendJoin();
        });
        return;
      }
      auto done = std::move(joined_);
      joined_ = nullptr;
      done(std::move(result));
    });
  });
}

void NodeRendezvous::watch(uint64_t round,
                           std::function<void(const muster::v1::RoundEvent&)> onEvent,
                           std::function<void(const std::string&)> onError,
                           std::function<void(uint64_t)> onStacks) {
  auto alive = alive_;
  client_->watch(
      node_.runId, node_.nodeId, round, conf_.keepAliveInterval,
      conf_.keepAliveInterval * conf_.keepAliveMaxAttempt,
      [this, alive, onEvent = std::move(onEvent)](const muster::v1::RoundEvent& e) {
        asio::post(io_, [alive, onEvent, e] {
          if (*alive) onEvent(e);
        });
      },
      [this, alive, onError = std::move(onError)](const std::string& why) {
        asio::post(io_, [alive, onError, why] {
          if (*alive) onError(why);
        });
      },
      [this, alive, onStacks = std::move(onStacks)](uint64_t request) {
        asio::post(io_, [alive, onStacks, request] {
          if (*alive) onStacks(request);
        });
      });
}

void NodeRendezvous::putStacks(uint64_t request, std::string json) {
  muster::v1::PutStacksRequest req;
  req.set_run_id(node_.runId);
  req.set_node_id(node_.nodeId);
  req.set_request(request);
  req.set_json(std::move(json));
  client_->putStacks(req, deadlineAfter(kReportDeadline), [](absl::Status s) {
    if (!s.ok()) logger()->warn("could not send this node's stacks to the rendezvous: {}", std::string(s.message()));
  });
}

void NodeRendezvous::stopWatch() { client_->stopWatch(); }

void NodeRendezvous::report(uint64_t round, bool succeeded, const std::string& message, Reported then) {
  muster::v1::ReportRequest req;
  req.set_run_id(node_.runId);
  req.set_node_id(node_.nodeId);
  req.set_round(round);
  req.set_outcome(succeeded ? muster::v1::ReportRequest::SUCCEEDED
                            : muster::v1::ReportRequest::FAILED);
  req.set_exit_code(succeeded ? 0 : 1);
  req.set_message(message);
  ++pendingReports_;
  // The loop must not run out of work (and return) while the report is on its way.
  auto work = std::make_shared<asio::executor_work_guard<asio::io_context::executor_type>>(
      io_.get_executor());
  client_->report(req, deadlineAfter(kReportDeadline),
                 [this, alive = alive_, work, then = std::move(then)](absl::StatusOr<muster::v1::ReportResponse> r) {
    asio::post(io_, [this, alive, work, r = std::move(r), then] {
      if (!*alive) return;
      std::optional<muster::v1::RoundEvent> ended;
      if (!r.ok()) {
        logger()->warn("could not report to the rendezvous: {}", std::string(r.status().message()));
      } else if (r->has_ended()) {
        ended = r->ended();
      }
      --pendingReports_;
      if (then) then(ended);
    });
  });
}

void NodeRendezvous::stopJoining() {
  ++joinGeneration_;
  joined_ = nullptr;
  retryTimer_.cancel();
}

void NodeRendezvous::cancel() {
  stopJoining();
  client_->cancel();
}

}  // namespace muster::launcher
