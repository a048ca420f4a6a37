// EtcdRendezvous: one thread applies the watch's events to the view and steps the join and
// the watch of the round on; every decision is a transaction on `state`.
#include "launcher/etcd_rendezvous.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/log.h"
#include "common/net.h"

namespace muster::launcher {

namespace pb = ::muster::v1;
using nlohmann::json;

namespace {

auto logger() {
  static auto l = log::get("etcd");
  return l;
}

// How long writes of a report, an answer or a revoke may take: the cluster answers at once,
// or after an election.
constexpr Millis kWriteDeadline{10000};

std::string nnodes(int64_t lo, int64_t hi) { return lo == hi ? std::to_string(lo) : fmt::format("{}:{}", lo, hi); }

std::string who(const json& node) {
  return fmt::format("{} ({})", node.value("host", std::string("?")), node.value("id", std::string("?")));
}

// "join/3/node-a" -> {"join", 3, "node-a"}; false for anything else.
bool splitRoundKey(const std::string& rest, const std::string& kind, uint64_t* round, std::string* node) {
  if (rest.rfind(kind + "/", 0) != 0) return false;
  auto slash = rest.find('/', kind.size() + 1);
  if (slash == std::string::npos || slash + 1 >= rest.size()) return false;
  try {
    size_t used = 0;
    auto digits = rest.substr(kind.size() + 1, slash - kind.size() - 1);
    *round = std::stoull(digits, &used);
    if (used != digits.size()) return false;
  } catch (const std::exception&) {
    return false;
  }
  *node = rest.substr(slash + 1);
  return true;
}

pb::RoundEvent eventFromJson(const json& e, uint64_t round) {
  pb::RoundEvent out;
  out.set_kind(static_cast<pb::RoundEvent::Kind>(e.value("kind", 0)));
  out.set_round(round);
  out.set_node_id(e.value("node", std::string()));
  out.set_host(e.value("host", std::string()));
  out.set_group_rank(e.value("group_rank", 0));
  out.set_exit_code(e.value("exit_code", 0));
  out.set_message(e.value("message", std::string()));
  return out;
}

// The end of a round on account of `node` (of the running round's nodes, at `rank`; -1 for a
// node not in it).
pb::RoundEvent nodeEvent(pb::RoundEvent::Kind kind, const json& node, int rank, std::string message) {
  pb::RoundEvent e;
  e.set_kind(kind);
  e.set_node_id(node.value("id", std::string()));
  e.set_host(node.value("host", std::string()));
  if (rank >= 0) e.set_group_rank(rank);
  e.set_message(std::move(message));
  return e;
}

json eventToJson(const pb::RoundEvent& e) {
  return {{"kind", static_cast<int>(e.kind())}, {"node", e.node_id()},   {"host", e.host()},
          {"group_rank", e.group_rank()},       {"exit_code", e.exit_code()}, {"message", e.message()}};
}

}  // namespace

std::string EtcdRendezvous::prefixOf(const std::string& runId) {
  std::string escaped;
  for (unsigned char c : runId) {
    if (c == '/' || c == '%' || c < 0x20 || c >= 0x7f) {
      escaped += fmt::format("%{:02X}", c);
    } else {
      escaped += static_cast<char>(c);
    }
  }
  return "/muster/runs/" + escaped + "/";
}

EtcdRendezvous::EtcdRendezvous(etcd::Options options, const std::string& runId, int storePort, Millis retention)
    : options_(std::move(options)), runId_(runId), prefix_(prefixOf(runId)), storePort_(storePort), retention_(retention) {
  for (const auto& e : options_.endpoints) target_ += (target_.empty() ? "" : ",") + e;
  target_ = "etcd " + target_;
  thread_ = std::thread([this] { run(); });
}

EtcdRendezvous::~EtcdRendezvous() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
  watch_.reset();
  keepAlive_.reset();
  if (client_ && lease_ != 0) {
    // Every key of this node goes now: the others see it gone at once, not at the lease's end.
    if (auto s = client_->revokeLease(lease_, deadlineAfter(Millis(2000))); !s.ok()) {
      logger()->debug("could not revoke this node's lease: {}", std::string(s.message()));
    }
  }
}

void EtcdRendezvous::post(std::function<void()> task) {
  {
    std::lock_guard lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_all();
}

void EtcdRendezvous::run() {
  while (true) {
    std::deque<std::function<void()>> tasks;
    {
      std::unique_lock lock(mu_);
      Deadline wake = kNoDeadline;
      if (join_) wake = std::min(join_->deadline, join_->closeAt);
      auto ready = [this] { return stopping_ || !tasks_.empty(); };
      if (wake == kNoDeadline) {
        cv_.wait(lock, ready);
      } else {
        cv_.wait_until(lock, wake, ready);
      }
      if (stopping_) break;
      tasks.swap(tasks_);
    }
    for (auto& task : tasks) task();
    step();
  }
  if (join_) failJoin(absl::CancelledError("the rendezvous client is closing"));
}

absl::Status EtcdRendezvous::start(const pb::JoinRequest& request, Deadline deadline) {
  if (client_) return absl::OkStatus();
  auto connected = etcd::Client::connect(options_, deadline);
  if (!connected.ok()) return connected.status();
  client_ = std::move(*connected);
  nodeId_ = request.node().node_id();
  // The lease's time to live is the keep-alive bound, in whole seconds (etcd's unit).
  int64_t ttl = std::max<int64_t>(2, static_cast<int64_t>((request.keep_alive_ms() + 999) / 1000));
  auto lease = client_->grantLease(ttl, deadline);
  if (!lease.ok()) return lease.status();
  lease_ = *lease;
  Millis interval(std::max<int64_t>(200, ttl * 1000 / 3));
  keepAlive_ = std::make_unique<etcd::KeepAlive>(*client_, lease_, interval, Millis(ttl * 1000),
                                                 [this](const std::string& why) { post([this, why] { lost(why); }); });
  // What is there now, then every change after it.
  etcd::pb::RangeRequest all;
  all.set_key(prefix_);
  all.set_range_end(etcd::prefixEnd(prefix_));
  auto snapshot = client_->range(all, deadline);
  if (!snapshot.ok()) return snapshot.status();
  for (const auto& kv : snapshot->kvs()) applyPut(kv.key(), kv.value(), kv.create_revision(), kv.mod_revision());
  watch_ = std::make_unique<etcd::Watch>(
      *client_, prefix_, snapshot->header().revision() + 1, Millis(ttl * 1000),
      [this](etcd::Watch::Events events, int64_t) { post([this, events = std::move(events)] { apply(events); }); },
      [this](const std::string& why) { post([this, why] { lost(why); }); });
  logger()->info("run '{}' at {}: node {} holds lease {:x} ({} s); {} key(s) there", runId_, target_, nodeId_, lease_,
                 ttl, snapshot->kvs_size());
  return absl::OkStatus();
}

void EtcdRendezvous::apply(const etcd::Watch::Events& events) {
  for (const auto& e : events) {
    if (e.type() == ::mvccpb::Event::DELETE) {
      applyDelete(e.kv().key());
    } else {
      applyPut(e.kv().key(), e.kv().value(), e.kv().create_revision(), e.kv().mod_revision());
    }
  }
}

void EtcdRendezvous::applyPut(const std::string& fullKey, const std::string& value, int64_t createRevision,
                              int64_t modRevision) {
  if (fullKey.rfind(prefix_, 0) != 0) return;
  std::string rest = fullKey.substr(prefix_.size());
  uint64_t round = 0;
  std::string node;
  if (rest.rfind("stacks/", 0) == 0) {
    if (rest.find('/', 7) != std::string::npos) return;  // an answer
    try {
      view_.stacks.insert(std::stoull(rest.substr(7)));
    } catch (const std::exception&) {
    }
    return;
  }
  json parsed = json::parse(value, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object()) {
    logger()->warn("run '{}': key '{}' is not muster's (not a JSON object); ignored", runId_, fullKey);
    return;
  }
  if (rest == "state") {
    view_.state = std::move(parsed);
    view_.stateRevision = modRevision;
    // Rounds before the one before this are over for everyone: forget them.
    uint64_t now = view_.state.value("round", uint64_t{0});
    while (!view_.joins.empty() && view_.joins.begin()->first + 1 < now) view_.joins.erase(view_.joins.begin());
    while (!view_.reports.empty() && view_.reports.begin()->first + 1 < now) view_.reports.erase(view_.reports.begin());
  } else if (splitRoundKey(rest, "join", &round, &node)) {
    view_.joins[round][node] = {std::move(parsed), createRevision};
  } else if (splitRoundKey(rest, "report", &round, &node)) {
    view_.reports[round][node] = std::move(parsed);
  }
}

void EtcdRendezvous::applyDelete(const std::string& fullKey) {
  if (fullKey.rfind(prefix_, 0) != 0) return;
  std::string rest = fullKey.substr(prefix_.size());
  uint64_t round = 0;
  std::string node;
  if (rest == "state") {
    view_.state = nullptr;
    view_.stateRevision = 0;
  } else if (splitRoundKey(rest, "join", &round, &node)) {
    if (auto it = view_.joins.find(round); it != view_.joins.end()) it->second.erase(node);
  } else if (splitRoundKey(rest, "report", &round, &node)) {
    if (auto it = view_.reports.find(round); it != view_.reports.end()) it->second.erase(node);
  }
}

void EtcdRendezvous::step() {
  if (join_) stepJoin();
  if (watching_) stepWatch();
}

void EtcdRendezvous::failJoin(absl::Status status) {
  auto done = std::move(join_->done);
  if (client_ && join_->keyRound) {
    etcd::pb::DeleteRangeRequest del;
    del.set_key(key(fmt::format("join/{}/{}", *join_->keyRound, nodeId_)));
    (void)client_->deleteRange(del, deadlineAfter(Millis(2000)));
  }
  join_.reset();
  done(std::move(status));
}

void EtcdRendezvous::lost(const std::string& why) {
  if (lostWhy_.empty()) logger()->error("run '{}': {}", runId_, why);
  lostWhy_ = why;
  if (join_) failJoin(absl::UnavailableError(why));
  if (watching_) {
    std::lock_guard lock(watchMu_);
    if (watching_->generation == watchGeneration_ && watching_->onError) watching_->onError(why);
    watching_.reset();
  }
}

bool EtcdRendezvous::writeState(const json& state, int64_t lease) {
  etcd::pb::TxnRequest txn;
  auto* compare = txn.add_compare();
  compare->set_key(key("state"));
  compare->set_target(etcd::pb::Compare::MOD);
  compare->set_result(etcd::pb::Compare::EQUAL);
  compare->set_mod_revision(view_.stateRevision);  // 0: the key is not there
  auto* put = txn.add_success()->mutable_request_put();
  put->set_key(key("state"));
  put->set_value(state.dump());
  put->set_lease(lease);
  auto done = client_->txn(txn, deadlineAfter(kWriteDeadline));
  if (!done.ok()) {
    logger()->warn("run '{}': could not write the run's state: {}", runId_, std::string(done.status().message()));
    return false;
  }
  return done->succeeded();
}

void EtcdRendezvous::endRound(uint64_t round, pb::RoundEvent event) {
  logger()->warn("run '{}' round {}: {}", runId_, round, event.message());
  json state = {{"round", round}, {"phase", "ended"}, {"event", eventToJson(event)}};
  state["min"] = view_.state.value("min", 1);
  state["max"] = view_.state.value("max", 1);
  writeState(state);
}

void EtcdRendezvous::join(const pb::JoinRequest& request, Deadline deadline,
                          std::function<void(absl::StatusOr<pb::Assignment>)> done) {
  post([this, request, deadline, done = std::move(done)]() mutable {
    if (join_) failJoin(absl::CancelledError("superseded by a newer join of the same node"));
    if (!lostWhy_.empty()) {
      done(absl::UnavailableError(lostWhy_));
      return;
    }
    if (request.min_nodes() < 1 || request.max_nodes() < request.min_nodes() ||
        request.node().local_world_size() < 1) {
      done(absl::InvalidArgumentError("a join needs 1 <= min_nodes <= max_nodes and local_world_size >= 1"));
      return;
    }
    // The join's own timeout, within the caller's deadline; a cluster not reachable at all is
    // waited for that long too (it may be starting with the job).
    Deadline own = std::min(deadline, deadlineAfter(Millis(static_cast<int64_t>(request.join_timeout_ms()))));
    if (auto s = start(request, own); !s.ok()) {
      done(s);
      return;
    }
    join_ = PendingJoin{request, own, std::move(done)};
  });
}

void EtcdRendezvous::stepJoin() {
  auto& j = *join_;
  const auto& req = j.request;
  const json& state = view_.state;
  std::string phase = state.is_object() ? state.value("phase", std::string()) : "";
  uint64_t stateRound = state.is_object() ? state.value("round", uint64_t{0}) : 0;
  if (phase == "finished") {
    failJoin(absl::FailedPreconditionError(fmt::format(
        "run '{}' has already finished; its id can start a new run once etcd forgets it (within {} s), or give "
        "another --rdzv_id",
        runId_, retention_.count() / 1000)));
    return;
  }
  uint64_t target = 0;
  bool mayClose = true;
  if (phase == "running") {
    const auto& nodes = state["nodes"];
    for (size_t rank = 0; rank < nodes.size(); ++rank) {
      if (nodes[rank].value("id", std::string()) != nodeId_ || !j.keyRound || *j.keyRound != stateRound) continue;
      // This node is in the round that closed: its assignment.
      pb::Assignment a;
      a.set_round(stateRound);
      a.set_group_rank(static_cast<int>(rank));
      a.set_group_world_size(static_cast<int>(nodes.size()));
      int offset = 0, world = 0;
      for (size_t i = 0; i < nodes.size(); ++i) {
        int lws = nodes[i].value("local_world_size", 1);
        if (i < rank) offset += lws;
        world += lws;
      }
      a.set_rank_offset(offset);
      a.set_world_size(world);
      a.set_master_addr(nodes[0].value("host", std::string()));
      a.set_master_port(nodes[0].value("master_port", 0));
      a.set_standalone_service(false);
      if (int store = nodes[0].value("store_port", 0); store > 0) {
        a.set_store_endpoint(net::joinHostPort(nodes[0].value("host", std::string()), store));
      }
      auto done = std::move(j.done);
      join_.reset();
      done(std::move(a));
      return;
    }
    // A running round whose nodes are gone (every one of them, say, with nobody left to end
    // it) is ended by whoever comes next.
    for (size_t rank = 0; rank < nodes.size(); ++rank) {
      auto id = nodes[rank].value("id", std::string());
      if (!view_.joins[stateRound].count(id)) {
        endRound(stateRound, nodeEvent(pb::RoundEvent::NODE_LOST, nodes[rank], static_cast<int>(rank),
                                       fmt::format("node {} (group rank {}) was lost: its etcd lease ended",
                                                   who(nodes[rank]), rank)));
        return;
      }
    }
    target = stateRound + 1;
    mayClose = false;  // the next round closes once this one has ended
  } else if (phase == "ended") {
    target = stateRound + 1;
  }
  if (!j.keyRound || *j.keyRound != target) {
    // This node's join key moves to the round it waits for.
    etcd::pb::TxnRequest txn;
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(key(fmt::format("join/{}/{}", target, nodeId_)));
    json node = {{"id", nodeId_},
                 {"host", req.node().host()},
                 {"local_world_size", req.node().local_world_size()},
                 {"master_port", req.node().master_port()},
                 {"store_port", storePort_},
                 {"min", req.min_nodes()},
                 {"max", req.max_nodes()}};
    put->set_value(node.dump());
    put->set_lease(lease_);
    if (j.keyRound) txn.add_success()->mutable_request_delete_range()->set_key(key(fmt::format("join/{}/{}", *j.keyRound, nodeId_)));
    auto written = client_->txn(txn, std::min(j.deadline, deadlineAfter(kWriteDeadline)));
    if (!written.ok()) {
      failJoin(written.status());
      return;
    }
    j.keyRound = target;
    j.closeAt = kNoDeadline;
    logger()->debug("run '{}': node {} waits for round {}", runId_, nodeId_, target);
    return;  // the watch brings the key back
  }
  auto& joined = view_.joins[target];
  if (!joined.count(nodeId_)) return;  // not seen back yet
  // The run's --nnodes is the first joiner's.
  const JoinEntry* first = nullptr;
  for (const auto& [id, entry] : joined) {
    if (!first || entry.createRevision < first->createRevision) first = &entry;
  }
  int64_t runMin = first->node.value("min", int64_t{1}), runMax = first->node.value("max", int64_t{1});
  if (runMin != req.min_nodes() || runMax != req.max_nodes()) {
    failJoin(absl::InvalidArgumentError(fmt::format(
        "node {} ({}) asks for --nnodes={} but run '{}' was started with --nnodes={} by node {}", req.node().host(),
        nodeId_, nnodes(req.min_nodes(), req.max_nodes()), runId_, nnodes(runMin, runMax), who(first->node))));
    return;
  }
  auto now = Clock::now();
  auto n = static_cast<int64_t>(joined.size());
  if (mayClose && (n >= runMax || (n >= runMin && j.closeAt != kNoDeadline && now >= j.closeAt))) {
    std::vector<std::pair<int64_t, const json*>> order;
    for (const auto& [id, entry] : joined) order.emplace_back(entry.createRevision, &entry.node);
    std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    if (static_cast<int64_t>(order.size()) > runMax) order.resize(static_cast<size_t>(runMax));
    json nodes = json::array();
    for (const auto& [rev, node] : order) {
      nodes.push_back({{"id", (*node)["id"]},
                       {"host", (*node)["host"]},
                       {"local_world_size", (*node)["local_world_size"]},
                       {"master_port", (*node)["master_port"]},
                       {"store_port", node->value("store_port", 0)}});
    }
    json state = {{"round", target}, {"phase", "running"}, {"nodes", nodes}, {"min", runMin}, {"max", runMax}};
    if (writeState(state)) {
      logger()->info("run '{}' round {}: closed with {} node(s)", runId_, target, nodes.size());
    }
    return;  // the watch brings the state, this node's or another's
  }
  if (n >= runMin && j.closeAt == kNoDeadline) {
    j.closeAt = now + Millis(static_cast<int64_t>(req.last_call_ms()));
  }
  if (now >= j.deadline) {
    std::string present;
    size_t shown = 0;
    for (const auto& [id, entry] : joined) {
      if (shown++ < 8) present += (present.empty() ? "" : ", ") + entry.node.value("host", std::string("?"));
    }
    if (joined.size() > 8) present += fmt::format(", and {} more", joined.size() - 8);
    failJoin(absl::DeadlineExceededError(
        fmt::format("timed out after {:.1f} s waiting for nodes: {}/{} joined ({})", req.join_timeout_ms() / 1000.0,
                    n, runMin, present)));
  }
}

void EtcdRendezvous::watch(const std::string&, const std::string&, uint64_t round, Millis, Millis,
                           std::function<void(const pb::RoundEvent&)> onEvent, std::function<void(const std::string&)> onError,
                           std::function<void(uint64_t)> onStacks) {
  uint64_t generation;
  {
    std::lock_guard lock(watchMu_);
    generation = ++watchGeneration_;
  }
  post([this, round, generation, onEvent = std::move(onEvent), onError = std::move(onError),
        onStacks = std::move(onStacks)] {
    watching_ = RoundWatch{round, onEvent, onError, onStacks, {}, generation};
    // Roll-calls asked before this round began are not this round's.
    watching_->asked = view_.stacks;
    if (!lostWhy_.empty()) lost(lostWhy_);
  });
}

void EtcdRendezvous::stopWatch() {
  std::lock_guard lock(watchMu_);
  ++watchGeneration_;
}

void EtcdRendezvous::stepWatch() {
  auto& w = *watching_;
  auto deliver = [&](const pb::RoundEvent& e) {
    {
      std::lock_guard lock(watchMu_);
      if (w.generation == watchGeneration_ && w.onEvent) w.onEvent(e);
    }
    watching_.reset();
  };
  {
    std::lock_guard lock(watchMu_);
    if (w.generation != watchGeneration_) {
      watching_.reset();
      return;
    }
  }
  for (uint64_t id : view_.stacks) {
    if (w.asked.insert(id).second && w.onStacks) w.onStacks(id);
  }
  const json& state = view_.state;
  if (!state.is_object()) return;
  std::string phase = state.value("phase", std::string());
  uint64_t stateRound = state.value("round", uint64_t{0});
  if (stateRound > w.round || (stateRound == w.round && phase == "ended")) {
    pb::RoundEvent e = stateRound == w.round ? eventFromJson(state.value("event", json::object()), w.round)
                                              : pb::RoundEvent();
    if (stateRound != w.round) {
      e.set_kind(pb::RoundEvent::NODE_LOST);
      e.set_round(w.round);
      e.set_message(fmt::format("round {} of run '{}' was ended by the others", w.round, runId_));
    }
    deliver(e);
    return;
  }
  if (stateRound != w.round) return;
  if (phase == "finished") {
    pb::RoundEvent e;
    e.set_kind(pb::RoundEvent::JOB_SUCCEEDED);
    e.set_round(w.round);
    deliver(e);
    return;
  }
  if (phase != "running") return;
  const auto& nodes = state["nodes"];
  auto& joined = view_.joins[w.round];
  auto& reports = view_.reports[w.round];
  size_t succeeded = 0;
  std::set<std::string> members;
  for (size_t rank = 0; rank < nodes.size(); ++rank) {
    const auto& node = nodes[rank];
    auto id = node.value("id", std::string());
    members.insert(id);
    auto report = reports.find(id);
    if (report != reports.end() && report->second.value("outcome", std::string()) == "failed") {
      auto e = nodeEvent(pb::RoundEvent::NODE_FAILED, node, static_cast<int>(rank),
                         report->second.value("message", std::string()));
      e.set_exit_code(report->second.value("exit_code", 1));
      endRound(w.round, e);
      return;
    }
    if (report != reports.end()) {
      ++succeeded;
      continue;  // done: its lease may go
    }
    if (!joined.count(id)) {
      endRound(w.round, nodeEvent(pb::RoundEvent::NODE_LOST, node, static_cast<int>(rank),
                                  fmt::format("node {} (group rank {}) was lost: its etcd lease ended (no keep-alive "
                                              "within the keep-alive bound, or its launch went away)",
                                              who(node), rank)));
      return;
    }
  }
  if (succeeded == nodes.size()) {
    json done = {{"round", w.round}, {"phase", "finished"}, {"min", state.value("min", 1)}, {"max", state.value("max", 1)}};
    // The finished run is remembered for the retention time, then its key goes with its lease.
    auto retention = client_->grantLease(std::max<int64_t>(2, retention_.count() / 1000), deadlineAfter(kWriteDeadline));
    if (retention.ok() && writeState(done, *retention)) logger()->info("run '{}' round {}: every node succeeded", runId_, w.round);
    return;
  }
  if (static_cast<int64_t>(nodes.size()) < state.value("max", int64_t{1})) {
    for (const auto& [id, entry] : view_.joins[w.round + 1]) {
      if (members.count(id)) continue;
      endRound(w.round, nodeEvent(pb::RoundEvent::NODE_WAITING, entry.node, -1,
                                  fmt::format("node {} waits to join; restarting to take it in", who(entry.node))));
      return;
    }
  }
}

void EtcdRendezvous::report(const pb::ReportRequest& request, Deadline deadline, std::function<void(absl::Status)> done) {
  post([this, request, deadline, done = std::move(done)] {
    if (!client_) {
      done(absl::FailedPreconditionError("this node never joined"));
      return;
    }
    etcd::pb::PutRequest put;
    put.set_key(key(fmt::format("report/{}/{}", request.round(), nodeId_)));
    json r = {{"outcome", request.outcome() == pb::ReportRequest::SUCCEEDED ? "succeeded" : "failed"},
              {"exit_code", request.exit_code()},
              {"message", request.message()}};
    put.set_value(r.dump());
    put.set_lease(lease_);
    auto written = client_->put(put, std::min(deadline, deadlineAfter(kWriteDeadline)));
    done(written.status());
  });
}

void EtcdRendezvous::putStacks(const pb::PutStacksRequest& request, Deadline deadline,
                               std::function<void(absl::Status)> done) {
  post([this, request, deadline, done = std::move(done)] {
    if (!client_) {
      done(absl::FailedPreconditionError("this node never joined"));
      return;
    }
    etcd::pb::PutRequest put;
    put.set_key(key(fmt::format("stacks/{}/{}", request.request(), nodeId_)));
    put.set_value(request.json());
    put.set_lease(lease_);
    done(client_->put(put, std::min(deadline, deadlineAfter(kWriteDeadline))).status());
  });
}

void EtcdRendezvous::cancel() {
  post([this] {
    if (join_) failJoin(absl::CancelledError("cancelled"));
  });
}

}  // namespace muster::launcher
