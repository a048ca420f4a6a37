// EtcdRendezvous: its thread, the node's lease, the watches and who decides (the roles), the
// view the watches keep, and RoundClient's calls. The rounds' decisions: etcd_rounds.cc.
#include "launcher/etcd_rendezvous.h"

#include <algorithm>

#include <fmt/format.h>
#include <google/protobuf/util/json_util.h>

#include "absl/strings/numbers.h"
#include "common/log.h"
#include "etcd/run_keys.h"
#include "etcd/run_values.h"
#include "launcher/etcd_rounds.h"

namespace muster::launcher {

namespace pb = ::muster::v1;
using nlohmann::json;
using etcd_rounds::kWriteDeadline;
using etcd_rounds::logger;

namespace {

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

// A key whose value launch did not write, said in one line.
std::string notLaunchs(const std::string& key, const absl::Status& shape) {
  return fmt::format("etcd key {} holds what launch does not write ({}): delete it, or give another --rdzv_id", key,
                     std::string(shape.message()));
}

}  // namespace

EtcdRendezvous::EtcdRendezvous(etcd::Options options, const std::string& runId, int storePort, Millis retention)
    : options_(std::move(options)),
      runId_(runId),
      prefix_(etcd::runPrefix(runId, options_.runsPrefix)),
      storePort_(storePort),
      retention_(retention) {
  for (const auto& e : options_.endpoints) target_ += (target_.empty() ? "" : ",") + e;
  target_ = "etcd " + target_;
  thread_ = std::thread([this] { run(); });
}

EtcdRendezvous::~EtcdRendezvous() {
  stopRequested_ = true;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
  role_.clear();
  shared_.clear();
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
      // Who decides is to be chosen again (the node to follow went while it was chosen): soon,
      // not at the next event, which may never come.
      if (roleStale_) wake = std::min(wake, deadlineAfter(Millis(50)));
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
  // A cluster not up yet is waited for until the join's deadline (it may be starting with the
  // job), in slices, so that cancel() and the destructor are not held behind it.
  absl::StatusOr<std::unique_ptr<etcd::Client>> connected;
  do {
    if (stopRequested_) return absl::CancelledError("the rendezvous client is closing");
    connected = etcd::Client::connect(options_, std::min(deadline, deadlineAfter(Millis(2000))));
  } while (!connected.ok() && connected.status().code() == absl::StatusCode::kUnavailable && Clock::now() < deadline);
  if (!connected.ok()) return connected.status();
  client_ = std::move(*connected);
  deadline = std::min(deadline, deadlineAfter(kWriteDeadline));  // it answered: the rest is quick
  nodeId_ = request.node().node_id();
  // The lease's time to live is the keep-alive bound, in whole seconds (etcd's unit).
  int64_t ttl = std::max<int64_t>(2, static_cast<int64_t>((request.keep_alive_ms() + 999) / 1000));
  ttl_ = Millis(ttl * 1000);
  auto lease = client_->grantLease(ttl, deadline);
  if (!lease.ok()) return lease.status();
  lease_ = *lease;
  Millis interval(std::max<int64_t>(200, ttl * 1000 / 3));
  keepAlive_ = std::make_unique<etcd::KeepAlive>(*client_, lease_, interval, ttl_,
                                                 [this](const std::string& why) { post([this, why] { lost(why); }); });
  // The run's state and the questions asked of it now, then every change after.
  int64_t revision = 0;
  for (const char* rest : {etcd::kStateKey, etcd::kStacksDir}) {
    etcd::pb::RangeRequest read;
    read.set_key(key(rest));
    read.set_range_end(etcd::prefixEnd(key(rest)));
    auto snapshot = client_->range(read, deadline);
    if (!snapshot.ok()) return snapshot.status();
    for (const auto& kv : snapshot->kvs()) applyPut(kv.key(), kv.value(), kv.create_revision(), kv.mod_revision());
    if (!lostWhy_.empty()) return absl::DataLossError(lostWhy_);
    revision = snapshot->header().revision();
    shared_.push_back(watchKeys(rest, revision + 1, /*role=*/false));
  }
  logger()->info("run '{}' at {}: node {} holds lease {:x} ({} s)", runId_, target_, nodeId_, lease_, ttl);
  return absl::OkStatus();
}

std::unique_ptr<etcd::Watch> EtcdRendezvous::watchKeys(const std::string& rest, int64_t revision, bool role) {
  uint64_t generation = roleGeneration_;
  return std::make_unique<etcd::Watch>(
      *client_, key(rest), revision, ttl_,
      [this, role, generation](etcd::Watch::Events events, int64_t) {
        post([this, role, generation, events = std::move(events)] {
          // Events a replaced role's watch sent before it was stopped are older than the read
          // that started the new one.
          if (!role || generation == roleGeneration_) apply(events);
        });
      },
      [this, role, generation](const std::string& why) {
        post([this, role, generation, why] {
          if (!role || generation == roleGeneration_) lost(why);
        });
      });
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
  const std::string stacksDir = etcd::kStacksDir;
  if (rest.rfind(stacksDir, 0) == 0) {
    uint64_t id = 0;
    if (absl::SimpleAtoi(rest.substr(stacksDir.size()), &id)) view_.stacks.insert(id);
    return;
  }
  // Every value is checked before it is read (etcd/run_values.h): a join or report key that
  // launch did not write is left out of the round; a state key, without which no node can go
  // on, ends this node's rendezvous with one line.
  json parsed = json::parse(value, nullptr, /*allow_exceptions=*/false);
  enum class Kind { kState, kJoin, kReport } kind;
  absl::Status shape;
  if (rest == etcd::kStateKey) {
    kind = Kind::kState;
    shape = etcd::checkState(parsed);
  } else if (splitRoundKey(rest, "join", &round, &node)) {
    kind = Kind::kJoin;
    shape = etcd::checkJoin(parsed);
  } else if (splitRoundKey(rest, "report", &round, &node)) {
    kind = Kind::kReport;
    shape = etcd::checkReport(parsed);
  } else {
    return;  // not a key this node reads
  }
  if (!shape.ok()) {
    std::string why = notLaunchs(fullKey, shape);
    if (kind == Kind::kState) {
      lost(why);
    } else {
      logger()->warn("run '{}': {}; ignored", runId_, why);
    }
    return;
  }
  if (kind == Kind::kState) {
    const json& was = view_.state;
    if (!was.is_object() || was.value("round", uint64_t{0}) != parsed.value("round", uint64_t{0}) ||
        was.value("phase", std::string()) != parsed.value("phase", std::string())) {
      roleStale_ = true;
    }
    view_.state = std::move(parsed);
    view_.stateRevision = modRevision;
    if (view_.state.value("phase", std::string()) == "ended") {
      view_.ended[view_.state.value("round", uint64_t{0})] = view_.state.value("event", json::object());
    }
    // Rounds before the one before this are over for everyone: forget them.
    uint64_t now = view_.state.value("round", uint64_t{0});
    while (!view_.joins.empty() && view_.joins.begin()->first + 1 < now) view_.joins.erase(view_.joins.begin());
    while (!view_.reports.empty() && view_.reports.begin()->first + 1 < now) view_.reports.erase(view_.reports.begin());
    while (!view_.ended.empty() && view_.ended.begin()->first + 1 < now) view_.ended.erase(view_.ended.begin());
  } else if (kind == Kind::kJoin) {
    view_.joins[round].put(node, {std::move(parsed), createRevision});
  } else {
    view_.reports[round][node] = std::move(parsed);
  }
}

void EtcdRendezvous::applyDelete(const std::string& fullKey) {
  if (fullKey.rfind(prefix_, 0) != 0) return;
  std::string rest = fullKey.substr(prefix_.size());
  if (rest == roleKey_) roleStale_ = true;  // the decider this node followed is gone
  uint64_t round = 0;
  std::string node;
  if (rest == etcd::kStateKey) {
    view_.state = nullptr;
    view_.stateRevision = 0;
    roleStale_ = true;
  } else if (splitRoundKey(rest, "join", &round, &node)) {
    if (auto it = view_.joins.find(round); it != view_.joins.end()) it->second.erase(node);
  } else if (splitRoundKey(rest, "report", &round, &node)) {
    if (auto it = view_.reports.find(round); it != view_.reports.end()) it->second.erase(node);
  }
}

void EtcdRendezvous::RoundJoins::put(const std::string& node, JoinEntry entry) {
  erase(node);
  byRevision[entry.createRevision] = node;
  byNode[node] = std::move(entry);
}

void EtcdRendezvous::RoundJoins::erase(const std::string& node) {
  auto it = byNode.find(node);
  if (it == byNode.end()) return;
  byRevision.erase(it->second.createRevision);
  byNode.erase(it);
}

const EtcdRendezvous::JoinEntry* EtcdRendezvous::RoundJoins::first() const {
  return byRevision.empty() ? nullptr : &byNode.at(byRevision.begin()->second);
}

void EtcdRendezvous::step() {
  if (!lostWhy_.empty()) return;
  if (roleStale_) chooseRole();
  if (join_) stepJoin();
  if (watching_) stepWatch();
  if (roleKey_ == "decider" && lostWhy_.empty()) decide();
}

void EtcdRendezvous::chooseRole() {
  roleStale_ = false;
  const json& state = view_.state;
  std::string phase = state.is_object() ? state.value("phase", std::string()) : "";
  uint64_t stateRound = state.is_object() ? state.value("round", uint64_t{0}) : 0;
  if (join_ && join_->keyRound && phase == "running" && stateRound + 1 == *join_->keyRound) {
    // This node waits to be taken in while a round runs: that round's decider does it. Should
    // none of its nodes be left, this node ends it.
    auto found = writerOf(stateRound, state["nodes"]);
    if (!found) return;  // etcd did not answer: lost
    const std::string& writer = *found;
    if (writer == nodeId_) {
      becomeDecider();  // its key still there (a join from before this one)
    } else if (writer.empty()) {
      endRound(stateRound, etcd_rounds::nodeEvent(
                               pb::RoundEvent::NODE_LOST, json::object(), -1,
                               fmt::format("round {} of run '{}' has none of its nodes left", stateRound, runId_)));
      } else {
      follow(etcd::joinKey(stateRound, writer));
    }
  } else if (join_ && join_->keyRound && !(phase == "running" && stateRound >= *join_->keyRound)) {
    // A gathering round: its first joiner still there decides, and its --nnodes is the run's.
    etcd::pb::RangeRequest read;
    read.set_key(key(etcd::joinKey(*join_->keyRound, "")));
    read.set_range_end(etcd::prefixEnd(read.key()));
    read.set_sort_target(etcd::pb::RangeRequest::CREATE);
    read.set_sort_order(etcd::pb::RangeRequest::ASCEND);
    read.set_limit(1);
    auto first = client_->range(read, deadlineAfter(kWriteDeadline));
    if (!first.ok()) {
      lost(fmt::format("etcd at {}: {}", client_->endpointList(), std::string(first.status().message())));
      return;
    }
    if (first->kvs_size() == 0) {
      becomeDecider();  // not even this node's key: the watch will bring it
      return;
    }
    const auto& kv = first->kvs(0);
    json node = json::parse(kv.value(), nullptr, false);
    if (auto shape = etcd::checkJoin(node); !shape.ok()) {
      lost(notLaunchs(kv.key(), shape));  // the round's first joiner decides it: nobody can
      return;
    }
    join_->first = JoinEntry{node, kv.create_revision()};
    std::string id = node.value("id", std::string());
    if (id == nodeId_) {
      becomeDecider();
    } else {
      follow(etcd::joinKey(*join_->keyRound, id));
    }
  } else if (watching_ && phase == "running" && stateRound == watching_->round) {
    auto writer = writerOf(stateRound, state["nodes"]);
    if (!writer) return;  // etcd did not answer: lost
    if (*writer == nodeId_) {
      becomeDecider();
    } else if (!writer->empty()) {
      follow(etcd::joinKey(stateRound, *writer));
    }
  } else {
    drop();  // nothing of this node's to decide or follow now
  }
}

void EtcdRendezvous::drop() {
  if (roleKey_.empty()) return;
  ++roleGeneration_;
  role_.clear();
  roleKey_.clear();
  view_.joins.clear();
  view_.reports.clear();
}

std::optional<std::string> EtcdRendezvous::writerOf(uint64_t round, const json& nodes) {
  // Rank by rank, one key each: group rank 0 is nearly always there, and every node of
  // thousands asking for all their keys would be each of them read by each.
  for (const auto& node : nodes) {
    auto id = node.value("id", std::string());
    etcd::pb::RangeRequest read;
    read.set_key(key(etcd::joinKey(round, id)));
    read.set_keys_only(true);
    auto there = client_->range(read, deadlineAfter(kWriteDeadline));
    if (!there.ok()) {
      lost(fmt::format("etcd at {}: {}", client_->endpointList(), std::string(there.status().message())));
      return std::nullopt;
    }
    if (there->kvs_size() > 0) return id;
  }
  return std::string();
}

void EtcdRendezvous::becomeDecider() {
  if (roleKey_ == "decider") return;
  ++roleGeneration_;
  role_.clear();
  roleKey_ = "decider";
  // Every join and report key as it is now, then every change after.
  view_.joins.clear();
  view_.reports.clear();
  std::vector<std::pair<const char*, int64_t>> reads;
  for (const char* rest : {etcd::kJoinDir, etcd::kReportDir}) {
    etcd::pb::RangeRequest read;
    read.set_key(key(rest));
    read.set_range_end(etcd::prefixEnd(read.key()));
    auto all = client_->range(read, deadlineAfter(kWriteDeadline));
    if (!all.ok()) {
      lost(fmt::format("etcd at {}: {}", client_->endpointList(), std::string(all.status().message())));
      return;
    }
    for (const auto& kv : all->kvs()) applyPut(kv.key(), kv.value(), kv.create_revision(), kv.mod_revision());
    role_.push_back(watchKeys(rest, all->header().revision() + 1, /*role=*/true));
  }
  logger()->debug("run '{}': node {} decides", runId_, nodeId_);
}

void EtcdRendezvous::follow(const std::string& rest) {
  if (roleKey_ == rest) return;
  ++roleGeneration_;
  role_.clear();
  view_.joins.clear();
  view_.reports.clear();
  roleKey_ = rest;
  etcd::pb::RangeRequest read;
  read.set_key(key(rest));
  auto there = client_->range(read, deadlineAfter(kWriteDeadline));
  if (!there.ok()) {
    lost(fmt::format("etcd at {}: {}", client_->endpointList(), std::string(there.status().message())));
    return;
  }
  if (there->kvs_size() == 0) {
    roleStale_ = true;  // gone already: choose again
    roleKey_.clear();
    return;
  }
  role_.push_back(watchKeys(rest, there->header().revision() + 1, /*role=*/true));
  logger()->debug("run '{}': node {} follows {}", runId_, nodeId_, rest);
}

void EtcdRendezvous::failJoin(absl::Status status) {
  auto done = std::move(join_->done);
  if (client_ && join_->keyRound) {
    etcd::pb::DeleteRangeRequest del;
    del.set_key(key(etcd::joinKey(*join_->keyRound, nodeId_)));
    (void)client_->deleteRange(del, deadlineAfter(Millis(2000)));
    heldKeyRound_.reset();
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
    roleStale_ = true;
    if (!lostWhy_.empty()) lost(lostWhy_);
  });
}

void EtcdRendezvous::stopWatch() {
  std::lock_guard lock(watchMu_);
  ++watchGeneration_;
}

void EtcdRendezvous::report(const pb::ReportRequest& request, Deadline deadline,
                            std::function<void(absl::StatusOr<pb::ReportResponse>)> done) {
  post([this, request, deadline, done = std::move(done)] {
    if (!client_) {
      done(absl::FailedPreconditionError("this node never joined"));
      return;
    }
    etcd::pb::PutRequest put;
    put.set_key(key(etcd::reportKey(request.round(), nodeId_)));
    json r = {{"outcome", request.outcome() == pb::ReportRequest::SUCCEEDED ? "succeeded" : "failed"},
              {"exit_code", request.exit_code()},
              {"message", request.message()}};
    put.set_value(etcd_rounds::dumped(r));
    put.set_lease(lease_);
    auto written = client_->put(put, std::min(deadline, deadlineAfter(kWriteDeadline)));
    if (!written.ok()) {
      done(written.status());
      return;
    }
    done(pb::ReportResponse());
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
    put.set_key(key(etcd::stacksAnswerKey(request.request(), nodeId_)));
    put.set_value(request.json());
    put.set_lease(lease_);
    done(client_->put(put, std::min(deadline, deadlineAfter(kWriteDeadline))).status());
  });
}

void EtcdRendezvous::setStatus(const pb::NodeStatus& status) {
  post([this, status] {
    if (!client_ || lease_ == 0 || !lostWhy_.empty()) return;
    auto now = Clock::now();
    constexpr Millis kStatusRefresh{30000};
    bool changed = rendezvous::ranksChanged(statusSaid_ ? &*statusSaid_ : nullptr, status);
    if (!changed && now - statusWritten_ < kStatusRefresh) return;
    statusWritten_ = now;
    statusSaid_ = status;
    std::string body;
    google::protobuf::util::JsonPrintOptions options;
    options.always_print_primitive_fields = true;
    if (!google::protobuf::util::MessageToJsonString(status, &body, options).ok()) return;
    json value = {{"unix_ms", etcd::unixMs()},
                  {"round", heldKeyRound_.value_or(0)},
                  {"status", json::parse(body, nullptr, false)}};
    etcd::pb::PutRequest put;
    put.set_key(key(etcd::statusKey(nodeId_)));
    put.set_value(etcd_rounds::dumped(value));
    put.set_lease(lease_);
    if (auto s = client_->put(put, deadlineAfter(Millis(2000))); !s.ok()) {
      logger()->debug("run '{}': could not write this node's status: {}", runId_, std::string(s.status().message()));
    }
  });
}

void EtcdRendezvous::cancel() {
  stopRequested_ = true;  // a connection under way gives up
  post([this] {
    stopRequested_ = false;
    if (join_) failJoin(absl::CancelledError("cancelled"));
  });
}

}  // namespace muster::launcher
