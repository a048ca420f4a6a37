// RendezvousState's views for operators: every run (rendezvousctl runs) and one run's nodes
// (rendezvousctl status), read under the state's lock and copied out.
#include <algorithm>

#include <fmt/format.h>

#include "rendezvous/membership/rendezvous_state.h"

namespace muster::rendezvous {

namespace {

uint64_t millisBetween(Clock::time_point from, Clock::time_point to) {
  return static_cast<uint64_t>(std::max<int64_t>(0, std::chrono::duration_cast<Millis>(to - from).count()));
}

// A finished run's summary as of `now`: kept as it was at `at`, its age and the time until it
// is forgotten (after `ttl`) moved on.
pb::RunSummary finishedAsOf(pb::RunSummary s, Clock::time_point at, Millis ttl, Clock::time_point now) {
  auto due = at + ttl;
  s.set_forgotten_in_ms(due > now ? millisBetween(now, due) : 0);
  s.set_age_ms(s.age_ms() + millisBetween(at, now));
  return s;
}

}  // namespace

pb::RunSummary RendezvousState::summarize(const std::string& runId, const Run& run, Clock::time_point now) const {
  pb::RunSummary s;
  s.set_run_id(runId);
  s.set_round(run.round);
  s.set_min_nodes(run.minNodes);
  s.set_max_nodes(run.maxNodes);
  s.set_age_ms(millisBetween(run.created, now));
  if (run.running) {
    s.set_state(pb::RunSummary::RUNNING);
    s.set_nodes(static_cast<int>(run.members.size()));
    s.set_ranks(run.worldSize);
  } else if (idle(run) && run.idleNoted) {
    s.set_state(pb::RunSummary::STOPPED);
    auto due = run.idleSince + retention_.ttl;
    s.set_forgotten_in_ms(due > now ? millisBetween(now, due) : 0);
  } else {
    s.set_state(pb::RunSummary::WAITING);
    s.set_nodes(static_cast<int>(run.pending.size()));
  }
  return s;
}

std::vector<pb::RunSummary> RendezvousState::runs() const {
  std::lock_guard<std::mutex> lock(mu_);
  auto now = Clock::now();
  std::vector<pb::RunSummary> out;
  out.reserve(runs_.size() + finished_.size());
  for (const auto& [id, run] : runs_) out.push_back(summarize(id, run, now));
  for (const auto& [id, f] : finished_) out.push_back(finishedAsOf(f.summary, f.at, retention_.ttl, now));
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.run_id() < b.run_id(); });
  return out;
}

absl::StatusOr<pb::StatusReply> RendezvousState::status(const std::string& runId) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto now = Clock::now();
  pb::StatusReply reply;
  if (auto f = finished_.find(runId); f != finished_.end()) {
    *reply.mutable_run() = finishedAsOf(f->second.summary, f->second.at, retention_.ttl, now);
    return reply;
  }
  auto it = runs_.find(runId);
  if (it == runs_.end()) {
    return absl::NotFoundError(fmt::format("no run '{}' here (never started, or forgotten)", runId));
  }
  const Run& run = it->second;
  *reply.mutable_run() = summarize(runId, run, now);
  std::vector<const Member*> members;
  for (const auto& [id, m] : run.members) members.push_back(&m);
  std::sort(members.begin(), members.end(), [](const Member* a, const Member* b) { return a->groupRank < b->groupRank; });
  for (const Member* m : members) {
    auto* v = reply.add_nodes();
    v->set_node_id(m->node.node_id());
    v->set_host(m->node.host());
    v->set_group_rank(m->groupRank);
    v->set_first_rank(m->firstRank);
    v->set_local_world_size(m->node.local_world_size());
    v->set_heartbeat_age_ms(static_cast<int64_t>(millisBetween(m->lastHeartbeat, now)));
    if (m->status) *v->mutable_status() = *m->status;
  }
  for (const auto& [id, p] : run.pending) {
    auto* v = reply.add_nodes();
    v->set_node_id(p.node.node_id());
    v->set_host(p.node.host());
    v->set_group_rank(-1);
    v->set_first_rank(-1);
    v->set_local_world_size(p.node.local_world_size());
    v->set_heartbeat_age_ms(-1);
  }
  return reply;
}

}  // namespace muster::rendezvous
