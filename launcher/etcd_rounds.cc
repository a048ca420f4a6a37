// EtcdRendezvous's rounds: a join waiting for its round (closed by the decider; its assignment
// read off `state` by every node), a running round's end (decided by its decider: a node
// failed, lost or waiting to join, or every node done), each a transaction on `state`.
#include <algorithm>

#include <fmt/format.h>

#include "common/log.h"
#include "common/net.h"
#include "etcd/run_keys.h"
#include "etcd/run_values.h"
#include "launcher/etcd_rendezvous.h"
#include "launcher/etcd_rounds.h"

namespace muster::launcher {

namespace pb = ::muster::v1;
using nlohmann::json;

namespace etcd_rounds {

std::shared_ptr<spdlog::logger> logger() {
  static auto l = log::get("etcd");
  return l;
}

pb::RoundEvent nodeEvent(pb::RoundEvent::Kind kind, const json& node, int rank, std::string message) {
  pb::RoundEvent e;
  e.set_kind(kind);
  e.set_node_id(node.value("id", std::string()));
  e.set_host(node.value("host", std::string()));
  if (rank >= 0) e.set_group_rank(rank);
  e.set_message(std::move(message));
  return e;
}

}  // namespace etcd_rounds

namespace {

using etcd_rounds::kWriteDeadline;
using etcd_rounds::logger;
using etcd_rounds::nodeEvent;

std::string nnodes(int64_t lo, int64_t hi) { return lo == hi ? std::to_string(lo) : fmt::format("{}:{}", lo, hi); }

std::string who(const json& node) {
  return fmt::format("{} ({})", node.value("host", std::string("?")), node.value("id", std::string("?")));
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

json eventToJson(const pb::RoundEvent& e) {
  return {{"kind", static_cast<int>(e.kind())}, {"node", e.node_id()},   {"host", e.host()},
          {"group_rank", e.group_rank()},       {"exit_code", e.exit_code()}, {"message", e.message()}};
}

// When the run began (its first round closed), in Unix milliseconds: kept from state to state.
int64_t since(const json& state) {
  if (state.is_object() && state.contains("since")) return state.value("since", int64_t{0});
  return etcd::unixMs();
}

// Whether `run` (the state, or another node's join) has this join's --nnodes.
bool sameNnodes(const json& run, const pb::JoinRequest& req) {
  return run.value("min", int64_t{1}) == static_cast<int64_t>(req.min_nodes()) &&
         run.value("max", int64_t{1}) == static_cast<int64_t>(req.max_nodes());
}

bool sameNnodes(const json& a, const json& b) {
  return a.value("min", int64_t{1}) == b.value("min", int64_t{1}) && a.value("max", int64_t{1}) == b.value("max", int64_t{1});
}

// This node's place in `nodes`, the running round's nodes in group-rank order, and among those
// of its role.
pb::Assignment assignment(const json& nodes, size_t rank, uint64_t round) {
  pb::Assignment a;
  a.set_round(round);
  a.set_group_rank(static_cast<int>(rank));
  a.set_group_world_size(static_cast<int>(nodes.size()));
  std::string role = nodes[rank].value("role", std::string());
  int offset = 0, world = 0, roleOffset = 0, roleWorld = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    int lws = nodes[i].value("local_world_size", 1);
    bool sameRole = nodes[i].value("role", std::string()) == role;
    if (i < rank) offset += lws;
    if (i < rank && sameRole) roleOffset += lws;
    world += lws;
    if (sameRole) roleWorld += lws;
  }
  a.set_rank_offset(offset);
  a.set_world_size(world);
  a.set_role_rank_offset(roleOffset);
  a.set_role_world_size(roleWorld);
  a.set_master_addr(nodes[0].value("host", std::string()));
  a.set_master_port(nodes[0].value("master_port", 0));
  a.set_standalone_service(false);
  if (int store = nodes[0].value("store_port", 0); store > 0) {
    a.set_store_endpoint(net::joinHostPort(nodes[0].value("host", std::string()), store));
  }
  return a;
}

}  // namespace

bool EtcdRendezvous::writeState(const json& state, int64_t lease) {
  if (wroteOver_ == view_.stateRevision) return false;
  etcd::pb::TxnRequest txn;
  auto* compare = txn.add_compare();
  compare->set_key(key(etcd::kStateKey));
  compare->set_target(etcd::pb::Compare::MOD);
  compare->set_result(etcd::pb::Compare::EQUAL);
  compare->set_mod_revision(view_.stateRevision);  // 0: the key is not there
  auto* put = txn.add_success()->mutable_request_put();
  put->set_key(key(etcd::kStateKey));
  put->set_value(etcd_rounds::dumped(state));
  put->set_lease(lease);
  auto done = client_->txn(txn, deadlineAfter(kWriteDeadline));
  if (!done.ok()) {
    logger()->warn("run '{}': could not write the run's state: {}", runId_, std::string(done.status().message()));
    return false;
  }
  if (done->succeeded()) wroteOver_ = view_.stateRevision;
  return done->succeeded();
}

void EtcdRendezvous::endRound(uint64_t round, pb::RoundEvent event) {
  if (wroteOver_ == view_.stateRevision) return;
  logger()->warn("run '{}' round {}: {}", runId_, round, event.message());
  json state = {{"round", round}, {"phase", "ended"}, {"event", eventToJson(event)}, {"since", since(view_.state)}};
  state["min"] = view_.state.value("min", 1);
  state["max"] = view_.state.value("max", 1);
  writeState(state);
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
      auto done = std::move(j.done);
      join_.reset();
      done(assignment(nodes, rank, stateRound));
      return;
    }
    target = stateRound + 1;
    mayClose = false;  // the next round closes once this one has ended (its decider ends it)
  } else if (phase == "ended") {
    target = stateRound + 1;
  }
  if (state.is_object() && !sameNnodes(state, req)) {
    // The run's --nnodes is its first round's, kept in `state`: a node asking for another is
    // refused before it joins (it would otherwise close or end a round it cannot be part of).
    failJoin(absl::InvalidArgumentError(fmt::format(
        "node {} ({}) asks for --nnodes={} but run '{}' runs with --nnodes={}", req.node().host(), nodeId_,
        nnodes(req.min_nodes(), req.max_nodes()), runId_,
        nnodes(state.value("min", int64_t{1}), state.value("max", int64_t{1})))));
    return;
  }
  if (!j.keyRound || *j.keyRound != target) {
    // This node's join key moves to the round it waits for.
    etcd::pb::TxnRequest txn;
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(key(etcd::joinKey(target, nodeId_)));
    json node = {{"id", nodeId_},
                 {"host", req.node().host()},
                 {"local_world_size", req.node().local_world_size()},
                 {"master_port", req.node().master_port()},
                 {"store_port", storePort_},
                 {"role", req.node().role()},
                 {"min", req.min_nodes()},
                 {"max", req.max_nodes()}};
    put->set_value(etcd_rounds::dumped(node));
    put->set_lease(lease_);
    // From the round it was in (an earlier join's, whose round may still run: its decider
    // then sees this node gone from it).
    if (heldKeyRound_ && *heldKeyRound_ != target) {
      txn.add_success()->mutable_request_delete_range()->set_key(key(etcd::joinKey(*heldKeyRound_, nodeId_)));
    }
    auto written = client_->txn(txn, std::min(j.deadline, deadlineAfter(kWriteDeadline)));
    if (!written.ok()) {
      failJoin(written.status());
      return;
    }
    j.keyRound = heldKeyRound_ = target;
    j.first.reset();
    j.closeAt = kNoDeadline;
    roleStale_ = true;  // who decides this round
    logger()->debug("run '{}': node {} waits for round {}", runId_, nodeId_, target);
    chooseRole();
    if (!join_ || !lostWhy_.empty()) return;
  }
  // The run's --nnodes is its first joiner's.
  if (j.first) {
    int64_t runMin = j.first->node.value("min", int64_t{1}), runMax = j.first->node.value("max", int64_t{1});
    if (runMin != req.min_nodes() || runMax != req.max_nodes()) {
      failJoin(absl::InvalidArgumentError(fmt::format(
          "node {} ({}) asks for --nnodes={} but run '{}' was started with --nnodes={} by node {}", req.node().host(),
          nodeId_, nnodes(req.min_nodes(), req.max_nodes()), runId_, nnodes(runMin, runMax), who(j.first->node))));
      return;
    }
  }
  auto now = Clock::now();
  if (mayClose && roleKey_ == "decider") {
    auto& joined = view_.joins[target];
    int64_t n = 0;
    for (const auto& [id, entry] : joined.byNode) n += sameNnodes(entry.node, req) ? 1 : 0;
    int64_t runMin = req.min_nodes(), runMax = req.max_nodes();
    if (n >= runMax || (n >= runMin && j.closeAt != kNoDeadline && now >= j.closeAt)) {
      json nodes = json::array();
      for (const auto& [revision, id] : joined.byRevision) {
        if (static_cast<int64_t>(nodes.size()) == runMax) break;
        const json& node = joined.byNode.at(id).node;
        if (!sameNnodes(node, req)) continue;  // it is refused, and leaves
        nodes.push_back({{"id", node["id"]},
                         {"host", node["host"]},
                         {"local_world_size", node["local_world_size"]},
                         {"master_port", node["master_port"]},
                         {"store_port", node.value("store_port", 0)},
                         {"role", node.value("role", std::string())}});
      }
      json closed = {{"round", target}, {"phase", "running"}, {"nodes", nodes},
                     {"min", runMin},    {"max", runMax},       {"since", since(view_.state)}};
      if (writeState(closed)) {
        logger()->info("run '{}' round {}: closed with {} node(s)", runId_, target, nodes.size());
        j.closeAt = kNoDeadline;  // written: nothing to wake for until the watch brings it
      }
      return;  // the watch brings the state, this node's or another's
    }
    if (n >= runMin && j.closeAt == kNoDeadline) j.closeAt = now + Millis(static_cast<int64_t>(req.last_call_ms()));
    if (n < runMin) j.closeAt = kNoDeadline;  // a node left during the last call
  }
  if (now >= j.deadline) {
    // Who is there, read once for the message (only the decider watches them).
    etcd::pb::RangeRequest read;
    read.set_key(key(etcd::joinKey(target, "")));
    read.set_range_end(etcd::prefixEnd(read.key()));
    auto there = client_->range(read, deadlineAfter(Millis(2000)));
    std::string present;
    int64_t n = there.ok() ? there->kvs_size() : 0;
    for (int64_t i = 0; there.ok() && i < std::min<int64_t>(n, 8); ++i) {
      json node = json::parse(there->kvs(static_cast<int>(i)).value(), nullptr, false);
      present += (present.empty() ? "" : ", ") + (etcd::checkJoin(node).ok() ? node.value("host", std::string("?")) : "?");
    }
    if (n > 8) present += fmt::format(", and {} more", n - 8);
    failJoin(absl::DeadlineExceededError(
        fmt::format("timed out after {:.1f} s waiting for nodes: {}/{} joined ({})", req.join_timeout_ms() / 1000.0,
                    n, req.min_nodes(), present)));
  }
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
    if (!w.asked.insert(id).second || !w.onStacks) continue;
    std::lock_guard lock(watchMu_);
    if (w.generation == watchGeneration_) w.onStacks(id);
  }
  const json& state = view_.state;
  if (!state.is_object()) return;
  std::string phase = state.value("phase", std::string());
  uint64_t stateRound = state.value("round", uint64_t{0});
  if (stateRound > w.round || (stateRound == w.round && phase == "ended")) {
    // How this round ended, even when a later state came with it in one batch.
    auto ended = view_.ended.find(w.round);
    pb::RoundEvent e = ended != view_.ended.end() ? eventFromJson(ended->second, w.round) : pb::RoundEvent();
    if (ended == view_.ended.end()) {
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
}

void EtcdRendezvous::decide() {
  const json& state = view_.state;
  if (!state.is_object() || state.value("phase", std::string()) != "running") return;
  uint64_t round = state.value("round", uint64_t{0});
  const auto& nodes = state["nodes"];
  auto& joined = view_.joins[round];
  auto& reports = view_.reports[round];
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
      endRound(round, e);
      return;
    }
    if (report != reports.end()) {
      ++succeeded;
      continue;  // done: its lease may go
    }
    if (!joined.byNode.count(id)) {
      // The join and report keys come on two watches: read both before calling the node lost
      // (its report may be on the way, or the join watch behind the state's).
      etcd::pb::TxnRequest read;
      read.add_success()->mutable_request_range()->set_key(key(etcd::joinKey(round, id)));
      read.add_success()->mutable_request_range()->set_key(key(etcd::reportKey(round, id)));
      auto fresh = client_->txn(read, deadlineAfter(kWriteDeadline));
      if (!fresh.ok()) return;  // the next event asks again
      const auto& joinRead = fresh->responses(0).response_range();
      const auto& reportRead = fresh->responses(1).response_range();
      // A key whose value fails its check is left out (applyPut): not read again, and the
      // node with no join key of launch's is lost.
      if (reportRead.kvs_size() > 0) {
        const auto& kv = reportRead.kvs(0);
        applyPut(kv.key(), kv.value(), kv.create_revision(), kv.mod_revision());
        if (reports.count(id)) return decide();
      }
      if (joinRead.kvs_size() > 0) {
        const auto& kv = joinRead.kvs(0);
        applyPut(kv.key(), kv.value(), kv.create_revision(), kv.mod_revision());
        if (joined.byNode.count(id)) continue;
      }
      endRound(round, nodeEvent(pb::RoundEvent::NODE_LOST, node, static_cast<int>(rank),
                                  fmt::format("node {} (group rank {}) was lost: its etcd lease ended (no keep-alive "
                                              "within the keep-alive bound, or its launch went away)",
                                              who(node), rank)));
      return;
    }
  }
  if (succeeded == nodes.size() && wroteOver_ != view_.stateRevision) {
    json done = {{"round", round},
                 {"phase", "finished"},
                 {"min", state.value("min", 1)},
                 {"max", state.value("max", 1)},
                 {"since", since(state)},
                 {"nodes", nodes}};
    // The finished run is remembered for the retention time, then its key goes with its lease.
    auto retention = client_->grantLease(std::max<int64_t>(2, retention_.count() / 1000), deadlineAfter(kWriteDeadline));
    if (retention.ok() && writeState(done, *retention)) logger()->info("run '{}' round {}: every node succeeded", runId_, round);
    return;
  }
  if (static_cast<int64_t>(nodes.size()) < state.value("max", int64_t{1})) {
    for (const auto& [id, entry] : view_.joins[round + 1].byNode) {
      if (members.count(id) || !sameNnodes(entry.node, state)) continue;
      endRound(round, nodeEvent(pb::RoundEvent::NODE_WAITING, entry.node, -1,
                                  fmt::format("node {} waits to join; restarting to take it in", who(entry.node))));
      return;
    }
  }
}

}  // namespace muster::launcher
