// RendezvousState: joining, closing rounds, assigning ranks, ending rounds.
#include "rendezvous/membership/rendezvous_state.h"

#include <fmt/format.h>

#include <cstdint>
#include <limits>

#include "common/log.h"

namespace muster::rendezvous {
namespace {

auto logger() {
  static auto l = log::get("rendezvous");
  return l;
}

std::string who(const pb::NodeInfo& n) { return fmt::format("{} ({})", n.host(), n.node_id()); }

std::string nnodes(int lo, int hi) { return lo == hi ? std::to_string(lo) : fmt::format("{}:{}", lo, hi); }

// "a, b, c, and 13 more": the first items of a list for a log line or an error, each as
// `show(item, position)` writes it, then a count (a line, not a megabyte, at 65,536 nodes).
template <typename Range, typename Show>
std::string briefly(const Range& items, Show show) {
  constexpr size_t kShown = 16;
  std::string out;
  size_t n = 0;
  for (const auto& item : items) {
    if (n < kShown) out += (n ? ", " : "") + show(item, n);
    ++n;
  }
  if (n > kShown) out += fmt::format(", and {} more", n - kShown);
  return out;
}

}  // namespace

RendezvousState::RendezvousState(RunRetention retention) : retention_(retention) {
  timer_ = std::thread([this] { timerLoop(); });
}

RendezvousState::~RendezvousState() {
  shutdown();
  timer_.join();
}

size_t RendezvousState::pendingJoins() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [id, run] : runs_) n += run.pending.size();
  return n;
}

size_t RendezvousState::runCount() const {
  std::lock_guard<std::mutex> lock(mu_);
  return runs_.size() + finished_.size();
}

bool RendezvousState::idle(const Run& run) {
  return !run.running && !run.finished && run.pending.empty() && run.members.empty() &&
         run.watchers.empty();
}

void RendezvousState::noteIfIdle(const std::string& runId, Run& run) {
  if (!idle(run) || run.idleNoted) return;
  run.idleNoted = true;
  run.idleSince = Clock::now();
  run.idleSeq = ++retentionSeq_;
  remember(runId, run.idleSeq);
}

void RendezvousState::remember(const std::string& runId, uint64_t seq) {
  retentions_.push_back({deadlineAfter(retention_.ttl), runId, seq});
  wakeTimerFor(retentions_.size() > retention_.maxRuns ? Clock::now() : retentions_.back().at);
}

void RendezvousState::wakeTimerFor(Deadline d) {
  if (d < timerAt_) cv_.notify_all();
}

void RendezvousState::addPending(Run& run, Pending p) {
  run.pendingByNode[p.node.node_id()] = p.id;
  if (p.node.wanted_rank() >= 0) run.pendingByRank[p.node.wanted_rank()] = p.id;
  uint64_t id = p.id;
  run.pending.emplace(id, std::move(p));
}

RendezvousState::Pending RendezvousState::takePending(Run& run, uint64_t joinId) {
  auto it = run.pending.find(joinId);
  Pending p = std::move(it->second);
  run.pending.erase(it);
  if (auto n = run.pendingByNode.find(p.node.node_id()); n != run.pendingByNode.end() && n->second == joinId) {
    run.pendingByNode.erase(n);
  }
  if (auto r = run.pendingByRank.find(p.node.wanted_rank()); r != run.pendingByRank.end() && r->second == joinId) {
    run.pendingByRank.erase(r);
  }
  return p;
}

void RendezvousState::retire(std::map<std::string, Run>::iterator it, pb::RunSummary summary) {
  for (const auto& [watcherId, w] : it->second.watchers) watcherRuns_.erase(watcherId);
  for (const auto& [id, p] : it->second.pending) joinRuns_.erase(id);
  uint64_t seq = ++retentionSeq_;
  auto now = Clock::now();
  summary.set_state(pb::RunSummary::FINISHED);
  finished_[it->first] = {now, seq, std::move(summary), it->second.lastEnd.value_or(pb::RoundEvent())};
  remember(it->first, seq);
  runs_.erase(it);
}

RendezvousState::Stats RendezvousState::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s = counts_;
  s.runsActive = runs_.size();
  s.runsFinished = finished_.size();
  s.watchers = watcherRuns_.size();
  for (const auto& [id, run] : runs_) {
    s.roundsRunning += run.running ? 1 : 0;
    s.pendingJoins += run.pending.size();  // as pendingJoins()
  }
  return s;
}

void RendezvousState::forgetDue(Actions& actions) {
  auto now = Clock::now();
  while (!endsByAge_.empty() && (endsByAge_.front().first <= now || endsByAge_.size() > retention_.maxRuns)) {
    auto [until, runId] = std::move(endsByAge_.front());
    endsByAge_.pop_front();
    if (auto e = forgottenEnds_.find(runId); e != forgottenEnds_.end() && e->second.until == until) {
      forgottenEnds_.erase(e);
    }
  }
  auto forgot = [&](const std::string& runId) {
    ++counts_.runsForgotten;
    if (onForget_) actions.push_back([hook = onForget_, runId] { hook(runId); });
  };
  while (!retentions_.empty() &&
         (retentions_.front().at <= now || retentions_.size() > retention_.maxRuns)) {
    Retention r = std::move(retentions_.front());
    retentions_.pop_front();
    if (auto f = finished_.find(r.runId); f != finished_.end() && f->second.seq == r.seq) {
      auto until = now + kEndGrace;
      forgottenEnds_[r.runId] = {until, f->second.end};
      endsByAge_.emplace_back(until, r.runId);
      finished_.erase(f);
      forgot(r.runId);
      logger()->debug("forgot finished run '{}'; its id may start a new run", r.runId);
    } else if (auto it = runs_.find(r.runId);
               it != runs_.end() && it->second.idleSeq == r.seq && idle(it->second)) {
      runs_.erase(it);
      forgot(r.runId);
      logger()->debug("forgot run '{}': no node for {:.0f} s", r.runId,
                      retention_.ttl.count() / 1000.0);
    }
  }
}

void RendezvousState::failPending(Run& run, uint64_t joinId, absl::Status status, Actions& actions) {
  Pending p = takePending(run, joinId);
  joinRuns_.erase(p.id);
  actions.push_back([done = std::move(p.done), status] { done(status); });
}

uint64_t RendezvousState::join(const pb::JoinRequest& req, JoinDone done) {
  Actions actions;
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = nextId_++;
    ++counts_.joins;
    const pb::NodeInfo& node = req.node();
    auto reject = [&](absl::Status s) { actions.push_back([done, s] { done(s); }); };
    if (shutdown_) {
      reject(absl::UnavailableError("the rendezvous is shutting down"));
    } else if (req.min_nodes() < 1 || req.max_nodes() < req.min_nodes() || node.local_world_size() < 1) {
      reject(absl::InvalidArgumentError("a join needs 1 <= min_nodes <= max_nodes and local_world_size >= 1"));
    } else if (auto finished = finished_.find(req.run_id()); finished != finished_.end()) {
      double ago = std::chrono::duration<double>(Clock::now() - finished->second.at).count();
      double left = std::max(0.0, retention_.ttl.count() / 1000.0 - ago);
      reject(absl::FailedPreconditionError(fmt::format(
          "run '{}' has already finished ({:.0f} s ago); its id can start a new run once the "
          "service forgets it, in {:.0f} s (rendezvousd --finished-run-ttl), or give another "
          "--rdzv_id",
          req.run_id(), ago, left)));
    } else {
      Run& run = runs_[req.run_id()];
      bool created = run.firstNode.empty();
      if (created) {
        run.minNodes = req.min_nodes();
        run.maxNodes = req.max_nodes();
        run.lastCallMs = req.last_call_ms();
        run.keepAliveMs = req.keep_alive_ms();
        run.joinTimeoutMs = req.join_timeout_ms();
        run.firstNode = who(node);
      }
      if (req.min_nodes() != run.minNodes || req.max_nodes() != run.maxNodes) {
        reject(absl::InvalidArgumentError(fmt::format(
            "node {} asks for --nnodes={} but run '{}' was started with --nnodes={} by node {}",
            who(node), nnodes(req.min_nodes(), req.max_nodes()), req.run_id(),
            nnodes(run.minNodes, run.maxNodes), run.firstNode)));
      } else if (node.wanted_rank() >= run.maxNodes) {
        reject(absl::InvalidArgumentError(fmt::format(
            "node {} asks for node rank {} but the run has {} nodes", who(node), node.wanted_rank(), run.maxNodes)));
        if (created) runs_.erase(req.run_id());  // a refused first join leaves no run behind
      } else {
        // The same agent joining again (a retried call): the old join gives way.
        if (auto same = run.pendingByNode.find(node.node_id()); same != run.pendingByNode.end()) {
          failPending(run, same->second, absl::CancelledError("superseded by a newer join of the same node"), actions);
        }
        bool duplicate = false;
        if (node.wanted_rank() >= 0 && run.running) {
          auto m = run.memberByRank.find(node.wanted_rank());
          if (m != run.memberByRank.end() && m->second != node.node_id()) {
            reject(absl::AlreadyExistsError(fmt::format(
                "node rank {} is claimed by two nodes: {} (running) and {}; give each node its own --node_rank",
                node.wanted_rank(), who(run.members.at(m->second).node), who(node))));
            duplicate = true;
          }
        }
        if (!duplicate && node.wanted_rank() >= 0) {
          if (auto other = run.pendingByRank.find(node.wanted_rank()); other != run.pendingByRank.end()) {
            auto s = absl::AlreadyExistsError(fmt::format(
                "node rank {} is claimed by two nodes: {} and {}; give each node its own --node_rank",
                node.wanted_rank(), who(run.pending.at(other->second).node), who(node)));
            failPending(run, other->second, s, actions);
            reject(s);
            duplicate = true;
          }
        }
        if (!duplicate) {
          Deadline deadline = deadlineAfter(Millis(static_cast<int64_t>(req.join_timeout_ms())));
          addPending(run, {id, node, std::move(done), deadline});
          joinRuns_[id] = req.run_id();
          run.idleNoted = false;
          wakeTimerFor(deadline);
          if (logger()->should_log(spdlog::level::debug)) {
            logger()->debug("run '{}' round {}: {} waits for the round ({} waiting, {} to {} nodes)",
                            req.run_id(), run.round, who(node), run.pending.size(), req.min_nodes(),
                            req.max_nodes());
          }
          if (run.running) {
            // A node arrives while a round runs: it waits; below MAX the round ends to take it in.
            if (static_cast<int>(run.members.size()) < run.maxNodes) {
              pb::RoundEvent e;
              e.set_kind(pb::RoundEvent::NODE_WAITING);
              e.set_node_id(node.node_id());
              e.set_host(node.host());
              e.set_message(fmt::format("node {} waits to join; restarting to take it in", who(node)));
              endRound(run, e, actions);
            }
          } else if (static_cast<int>(run.pending.size()) >= run.maxNodes) {
            closeRound(req.run_id(), run, actions);
          } else if (static_cast<int>(run.pending.size()) >= run.minNodes && run.lastCall == kNoDeadline) {
            run.lastCall = deadlineAfter(Millis(static_cast<int64_t>(run.lastCallMs)));
            wakeTimerFor(run.lastCall);
          }
        }
      }
    }
  }
  for (auto& a : actions) a();
  return id;
}

void RendezvousState::cancelJoin(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = joinRuns_.find(id);
  if (it == joinRuns_.end()) return;
  auto found = runs_.find(it->second);
  if (found == runs_.end()) {
    joinRuns_.erase(it);
    return;
  }
  Run& run = found->second;
  if (run.pending.count(id)) takePending(run, id);
  if (static_cast<int>(run.pending.size()) < run.minNodes) run.lastCall = kNoDeadline;
  std::string runId = it->second;
  joinRuns_.erase(it);
  noteIfIdle(runId, run);
}

void RendezvousState::closeRound(const std::string& runId, Run& run, Actions& actions) {
  std::vector<Pending> joined;
  joined.reserve(run.pending.size());
  for (auto& [id, p] : run.pending) joined.push_back(std::move(p));  // in the order they came
  run.pending.clear();
  run.pendingByNode.clear();
  run.pendingByRank.clear();
  run.lastCall = kNoDeadline;
  bool byWantedRank = true;
  for (const auto& p : joined) byWantedRank = byWantedRank && p.node.wanted_rank() >= 0;
  if (byWantedRank) {
    std::sort(joined.begin(), joined.end(),
              [](const Pending& a, const Pending& b) { return a.node.wanted_rank() < b.node.wanted_rank(); });
  }
  // Ranks are int32 on the wire: a round whose nodes' local world sizes add up past that is
  // refused to every node (found by fuzz/rendezvous_state: the sum overflowed).
  int64_t ranks = 0;
  for (const auto& p : joined) ranks += p.node.local_world_size();
  if (ranks > std::numeric_limits<int32_t>::max()) {
    auto why = absl::InvalidArgumentError(
        fmt::format("run '{}': the nodes' local world sizes add up to {} ranks, more than 2^31-1", runId, ranks));
    for (auto& p : joined) {
      joinRuns_.erase(p.id);
      actions.push_back([done = std::move(p.done), why]() mutable { done(why); });
    }
    noteIfIdle(runId, run);
    return;
  }
  pb::Assignment base;
  base.set_round(run.round);
  base.set_group_world_size(static_cast<int>(joined.size()));
  int world = static_cast<int>(ranks);
  base.set_world_size(world);
  run.worldSize = world;
  base.set_master_addr(joined.front().node.host());
  base.set_master_port(joined.front().node.master_port());
  run.members.clear();
  run.memberByRank.clear();
  run.membersDone = 0;
  run.running = true;
  Deadline expiry = deadlineAfter(Millis(static_cast<int64_t>(run.keepAliveMs)));
  // Each role's ranks count apart too (ROLE_RANK, ROLE_WORLD_SIZE), in group-rank order.
  std::map<std::string, int> roleWorld, roleOffset;
  for (const auto& p : joined) roleWorld[p.node.role()] += p.node.local_world_size();
  int offset = 0;
  for (size_t r = 0; r < joined.size(); ++r) {
    pb::Assignment a = base;
    a.set_group_rank(static_cast<int>(r));
    a.set_rank_offset(offset);
    offset += joined[r].node.local_world_size();
    int& roleAt = roleOffset[joined[r].node.role()];
    a.set_role_rank_offset(roleAt);
    a.set_role_world_size(roleWorld[joined[r].node.role()]);
    roleAt += joined[r].node.local_world_size();
    if (joined[r].node.wanted_rank() >= 0) run.memberByRank[joined[r].node.wanted_rank()] = joined[r].node.node_id();
    run.members[joined[r].node.node_id()] = {joined[r].node, static_cast<int>(r), expiry, false, a.rank_offset(), Clock::now(), std::nullopt};
    joinRuns_.erase(joined[r].id);
    actions.push_back([done = std::move(joined[r].done), a = std::move(a)]() mutable { done(std::move(a)); });
  }
  ++counts_.roundsStarted;
  wakeTimerFor(expiry);
  std::string layout = briefly(joined, [](const Pending& p, size_t r) {
    return fmt::format("{}={}x{}", r, p.node.host(), p.node.local_world_size());
  });
  logger()->info("run '{}' round {}: {} node(s), world size {} [{}]", runId, run.round, joined.size(), world, layout);
}

void RendezvousState::endRound(Run& run, const pb::RoundEvent& event, Actions& actions) {
  pb::RoundEvent e = event;
  e.set_round(run.round);
  run.lastEnd = e;  // for a watch or a report that comes after the end
  if (e.kind() >= 0 && e.kind() < 5) ++counts_.roundsEnded[e.kind()];
  for (auto it = run.watchers.begin(); it != run.watchers.end();) {
    if (it->second.round == run.round) {
      actions.push_back([sink = it->second.sink, e] { sink(e); });
      watcherRuns_.erase(it->first);
      it = run.watchers.erase(it);
    } else {
      ++it;
    }
  }
  run.running = false;
  run.members.clear();
  run.memberByRank.clear();
  run.membersDone = 0;
  if (e.kind() == pb::RoundEvent::JOB_SUCCEEDED) {
    run.finished = true;
    while (!run.pending.empty()) {
      failPending(run, run.pending.rbegin()->first,
                  absl::FailedPreconditionError("the job finished before this node could join"), actions);
    }
  } else {
    ++run.round;
    // Nodes that waited while the round ran now form the next one with the survivors.
    if (static_cast<int>(run.pending.size()) >= run.minNodes && run.lastCall == kNoDeadline) {
      run.lastCall = deadlineAfter(Millis(static_cast<int64_t>(run.lastCallMs)));
      wakeTimerFor(run.lastCall);
    }
  }
}

absl::StatusOr<uint64_t> RendezvousState::heartbeat(const std::string& runId, const std::string& nodeId,
                                                    const pb::NodeStatus* status) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = runs_.find(runId);
  if (it == runs_.end()) {
    // A node of a finished run still remembered, between its last report and its exit.
    if (finished_.count(runId)) return uint64_t{0};
    return absl::NotFoundError(fmt::format("no run '{}'", runId));
  }
  auto m = it->second.members.find(nodeId);
  if (m != it->second.members.end()) {
    m->second.expiry = deadlineAfter(Millis(static_cast<int64_t>(it->second.keepAliveMs)));
    m->second.lastHeartbeat = Clock::now();
    if (status) m->second.status = *status;
  }
  uint64_t request = it->second.stacksRequest;
  auto call = stacksCalls_.find(request);
  if (request == 0 || call == stacksCalls_.end() || !call->second.waiting.count(nodeId)) return uint64_t{0};
  return request;
}

void RendezvousState::requestStacks(const std::string& runId, Millis timeout, StacksDone done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = runs_.find(runId);
    if (it != runs_.end() && it->second.running && !it->second.members.empty()) {
      Run& run = it->second;
      uint64_t id = nextStacks_++;
      StacksCall call{.runId = runId, .done = std::move(done), .deadline = deadlineAfter(timeout)};
      for (const auto& [nodeId, m] : run.members) call.waiting[nodeId] = fmt::format("{} ({})", m.node.host(), nodeId);
      stacksCalls_[id] = std::move(call);
      run.stacksRequest = id;
      logger()->info("run '{}' round {}: stack roll-call {} asked of {} node(s)", runId, run.round, id,
                     run.members.size());
      wakeTimerFor(stacksCalls_[id].deadline);
      return;
    }
  }
  done(absl::NotFoundError(fmt::format("run '{}' has no running round", runId)));
}

void RendezvousState::putStacks(const pb::PutStacksRequest& request) {
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = stacksCalls_.find(request.request());
    if (it == stacksCalls_.end() || it->second.runId != request.run_id() ||
        !it->second.waiting.erase(request.node_id())) {
      return;
    }
    auto run = runs_.find(request.run_id());
    auto* node = it->second.reply.add_nodes();
    node->set_node_id(request.node_id());
    node->set_json(request.json());
    if (run != runs_.end()) {
      if (auto m = run->second.members.find(request.node_id()); m != run->second.members.end()) {
        node->set_host(m->second.node.host());
        node->set_group_rank(m->second.groupRank);
      }
    }
    if (it->second.waiting.empty()) endStacks(it, actions);
  }
  for (auto& a : actions) a();
}

void RendezvousState::endStacks(std::map<uint64_t, StacksCall>::iterator it, Actions& actions) {
  auto run = runs_.find(it->second.runId);
  if (run != runs_.end() && run->second.stacksRequest == it->first) run->second.stacksRequest = 0;
  for (const auto& [nodeId, who] : it->second.waiting) it->second.reply.add_missing(who);
  actions.push_back([done = std::move(it->second.done), reply = std::move(it->second.reply)] { done(reply); });
  stacksCalls_.erase(it);
}

absl::StatusOr<uint64_t> RendezvousState::watch(const std::string& runId, const std::string& nodeId,
                                                uint64_t round, EventSink sink) {
  std::optional<pb::RoundEvent> ended;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = runs_.find(runId);
    if (it != runs_.end() && it->second.running && it->second.round == round &&
        it->second.members.count(nodeId)) {
      uint64_t id = nextId_++;
      it->second.watchers[id] = {nodeId, round, std::move(sink)};
      watcherRuns_[id] = runId;
      return id;
    }
    ended = endOf(runId, round);
    if (!ended) {
      return absl::NotFoundError(fmt::format("round {} of run '{}' is not running with node {}", round, runId, nodeId));
    }
  }
  sink(*ended);
  return uint64_t{0};
}

std::optional<pb::RoundEvent> RendezvousState::endOf(const std::string& runId, uint64_t round) const {
  if (auto it = runs_.find(runId); it != runs_.end()) {
    const Run& run = it->second;
    if (run.lastEnd && run.lastEnd->round() == round && !(run.running && run.round == round)) return run.lastEnd;
  } else if (auto f = finished_.find(runId); f != finished_.end()) {
    if (f->second.end.round() == round && f->second.end.kind() != pb::RoundEvent::UNKNOWN) return f->second.end;
  } else if (auto g = forgottenEnds_.find(runId); g != forgottenEnds_.end() && g->second.until > Clock::now() &&
                                                 g->second.end.round() == round &&
                                                 g->second.end.kind() != pb::RoundEvent::UNKNOWN) {
    return g->second.end;
  }
  return std::nullopt;
}

void RendezvousState::unwatch(uint64_t id, bool clientGone) {
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto r = watcherRuns_.find(id);
    if (r == watcherRuns_.end()) return;
    auto found = runs_.find(r->second);
    if (found == runs_.end()) {
      watcherRuns_.erase(r);
      return;
    }
    Run& run = found->second;
    auto w = run.watchers.find(id);
    std::string runId = r->second;
    watcherRuns_.erase(r);
    if (w == run.watchers.end()) return;
    Watcher watcher = std::move(w->second);
    run.watchers.erase(w);
    auto m = run.members.find(watcher.nodeId);
    if (clientGone && run.running && run.round == watcher.round && m != run.members.end() && !m->second.done) {
      pb::RoundEvent e;
      e.set_kind(pb::RoundEvent::NODE_LOST);
      e.set_node_id(watcher.nodeId);
      e.set_host(m->second.node.host());
      e.set_group_rank(m->second.groupRank);
      e.set_message(fmt::format("node {} (group rank {}) was lost: its agent went away",
                                who(m->second.node), m->second.groupRank));
      logger()->warn("run '{}' round {}: {}", runId, run.round, e.message());
      ++counts_.nodesLostAgentGone;
      endRound(run, e, actions);
    }
    noteIfIdle(runId, run);
  }
  for (auto& a : actions) a();
}

absl::StatusOr<pb::ReportResponse> RendezvousState::report(const pb::ReportRequest& req) {
  Actions actions;
  pb::ReportResponse answer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = runs_.find(req.run_id());
    if (it == runs_.end()) {
      // A finished run, still remembered: this node's report came again, or after the end.
      if (auto ended = endOf(req.run_id(), req.round())) {
        *answer.mutable_ended() = *ended;
        return answer;
      }
      return absl::NotFoundError(fmt::format("no run '{}'", req.run_id()));
    }
    Run& run = it->second;
    auto m = run.members.find(req.node_id());
    if (!run.running || run.round != req.round() || m == run.members.end()) {
      if (auto ended = endOf(req.run_id(), req.round())) *answer.mutable_ended() = *ended;
      return answer;
    }
    if (req.outcome() == pb::ReportRequest::SUCCEEDED) {
      if (!m->second.done) ++run.membersDone;
      m->second.done = true;
      if (run.membersDone == run.members.size()) {
        pb::RoundEvent e;
        e.set_kind(pb::RoundEvent::JOB_SUCCEEDED);
        e.set_message("every node's workers succeeded");
        logger()->info("run '{}' round {}: every node succeeded", req.run_id(), run.round);
        pb::RunSummary last = summarize(it->first, run, Clock::now());  // its nodes and ranks, before the end
        endRound(run, e, actions);
        *answer.mutable_ended() = *run.lastEnd;
        retire(it, std::move(last));
      }
    } else {
      pb::RoundEvent e;
      e.set_kind(pb::RoundEvent::NODE_FAILED);
      e.set_node_id(req.node_id());
      e.set_host(m->second.node.host());
      e.set_group_rank(m->second.groupRank);
      e.set_exit_code(req.exit_code());
      e.set_message(req.message());
      logger()->warn("run '{}' round {}: node {} failed: {}", req.run_id(), run.round, who(m->second.node), req.message());
      endRound(run, e, actions);
      *answer.mutable_ended() = *run.lastEnd;
      noteIfIdle(req.run_id(), run);
    }
  }
  for (auto& a : actions) a();
  return answer;
}

void RendezvousState::shutdown() {
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_) return;
    shutdown_ = true;
    for (auto& [id, run] : runs_) {
      while (!run.pending.empty()) {
        failPending(run, run.pending.rbegin()->first, absl::UnavailableError("the rendezvous is shutting down"),
                    actions);
      }
    }
    while (!stacksCalls_.empty()) endStacks(stacksCalls_.begin(), actions);
  }
  cv_.notify_all();
  for (auto& a : actions) a();
}

Deadline RendezvousState::nextDeadline() const {
  Deadline next = kNoDeadline;
  for (const auto& [id, call] : stacksCalls_) next = std::min(next, call.deadline);
  if (!retentions_.empty()) {
    next = retentions_.size() > retention_.maxRuns ? Clock::now() : retentions_.front().at;
  }
  for (const auto& [id, run] : runs_) {
    next = std::min(next, run.lastCall);
    for (const auto& [id, p] : run.pending) next = std::min(next, p.deadline);
    if (run.running) {
      for (const auto& [nid, m] : run.members) {
        if (!m.done) next = std::min(next, m.expiry);
      }
    }
  }
  return next;
}

void RendezvousState::timerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!shutdown_) {
    Deadline next = nextDeadline();
    if (next == kNoDeadline) {
      timerAt_ = kNoDeadline;
      cv_.wait(lock);
      timerAt_ = Deadline::min();
      continue;
    }
    if (Clock::now() < next) {
      timerAt_ = next;
      cv_.wait_until(lock, next);
      timerAt_ = Deadline::min();
      continue;
    }
    Actions actions;
    forgetDue(actions);
    auto now = Clock::now();
    for (auto it = stacksCalls_.begin(); it != stacksCalls_.end();) {
      auto next = std::next(it);
      if (it->second.deadline <= now) endStacks(it, actions);
      it = next;
    }
    for (auto& [runId, run] : runs_) {
      if (run.lastCall <= now) {
        run.lastCall = kNoDeadline;
        if (!run.running && static_cast<int>(run.pending.size()) >= run.minNodes) closeRound(runId, run, actions);
      }
      std::vector<uint64_t> late;
      for (const auto& [id, p] : run.pending) {
        if (p.deadline <= now) late.push_back(id);
      }
      if (!late.empty()) {
        // Who was there, once for all the late joins.
        std::string present = briefly(run.pending, [](const auto& entry, size_t) { return entry.second.node.host(); });
        size_t joined = run.pending.size();
        for (uint64_t id : late) {
          failPending(run, id, absl::DeadlineExceededError(fmt::format(
              "timed out after {:.1f} s waiting for nodes: {}/{} joined ({})", run.joinTimeoutMs / 1000.0,
              joined, run.minNodes, present)), actions);
        }
      }
      if (run.running) {
        for (const auto& [nodeId, m] : run.members) {
          if (m.done || m.expiry > now) continue;
          pb::RoundEvent e;
          e.set_kind(pb::RoundEvent::NODE_LOST);
          e.set_node_id(nodeId);
          e.set_host(m.node.host());
          e.set_group_rank(m.groupRank);
          e.set_message(fmt::format("node {} (group rank {}) was lost: no heartbeat for {:.1f} s", who(m.node),
                                    m.groupRank, run.keepAliveMs / 1000.0));
          logger()->warn("run '{}' round {}: {}", runId, run.round, e.message());
          ++counts_.nodesLostSilent;
          endRound(run, e, actions);
          break;
        }
      }
      noteIfIdle(runId, run);
    }
    lock.unlock();
    for (auto& a : actions) a();
    lock.lock();
  }
}

}  // namespace muster::rendezvous
