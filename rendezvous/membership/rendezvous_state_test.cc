// RendezvousState: runs nobody uses any more are forgotten (a finished run after its
// time-to-live, then its id starts a new run; an abandoned one likewise; never more of them
// than the cap); a node's joins (superseded, claimed ranks, time-outs); the timer; reports.
#include "rendezvous/membership/rendezvous_state.h"

#include <gtest/gtest.h>

#include <future>
#include <limits>
#include <thread>
#include <tuple>

namespace muster::rendezvous {
namespace {

pb::JoinRequest joinRequest(const std::string& runId, const std::string& nodeId, int nodes,
                            int wantedRank = -1) {
  pb::JoinRequest r;
  r.set_run_id(runId);
  r.mutable_node()->set_node_id(nodeId);
  r.mutable_node()->set_host("host-" + nodeId);
  r.mutable_node()->set_local_world_size(1);
  r.mutable_node()->set_wanted_rank(wantedRank);
  r.set_min_nodes(nodes);
  r.set_max_nodes(nodes);
  r.set_last_call_ms(0);
  r.set_join_timeout_ms(60000);
  r.set_keep_alive_ms(60000);
  return r;
}

absl::StatusOr<pb::Assignment> joinNow(RendezvousState& state, const pb::JoinRequest& r) {
  std::promise<absl::StatusOr<pb::Assignment>> done;
  auto result = done.get_future();
  state.join(r, [&done](absl::StatusOr<pb::Assignment> a) { done.set_value(std::move(a)); });
  if (result.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    return absl::DeadlineExceededError("the join did not complete");
  }
  return result.get();
}

// A node's report of its round.
pb::ReportRequest reportOf(const std::string& runId, const std::string& nodeId, uint64_t round,
                           bool succeeded, const std::string& message = "") {
  pb::ReportRequest report;
  report.set_run_id(runId);
  report.set_node_id(nodeId);
  report.set_round(round);
  report.set_outcome(succeeded ? pb::ReportRequest::SUCCEEDED : pb::ReportRequest::FAILED);
  report.set_message(message);
  return report;
}

// One node joins run `runId` alone and reports success: the job is done.
void runOneJob(RendezvousState& state, const std::string& runId) {
  auto a = joinNow(state, joinRequest(runId, "n1", 1));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(state.report(reportOf(runId, "n1", a->round(), true)).ok());
}

// Waits (bounded) for the timer thread to bring the count of runs to `n` or below.
bool awaitRunCount(RendezvousState& state, size_t n) {
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (state.runCount() > n && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return state.runCount() <= n;
}

TEST(RunRetention, AFinishedRunRefusesLateJoinsThenItsIdStartsANewRun) {
  RendezvousState state({.ttl = Millis(300), .maxRuns = 100});
  runOneJob(state, "x");
  EXPECT_EQ(state.runCount(), 1u);
  auto late = joinNow(state, joinRequest("x", "n2", 1));
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(late.status().message().find("run 'x' has already finished"), std::string::npos)
      << late.status();
  EXPECT_NE(late.status().message().find("--finished-run-ttl"), std::string::npos) << late.status();
  ASSERT_TRUE(awaitRunCount(state, 0)) << "the finished run was never forgotten";
  // A new job under the same id, with another size even.
  auto again = joinNow(state, joinRequest("x", "n3", 1));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->round(), 0u);
}

TEST(RunRetention, AbandonedRunsAreForgottenToo) {
  RendezvousState state({.ttl = Millis(200), .maxRuns = 100});
  // A join refused at once leaves no run (ARefusedFirstJoinLeavesNoRunBehind) to pin --nnodes.
  auto refused = joinNow(state, joinRequest("y", "n1", 2, /*wantedRank=*/5));
  ASSERT_FALSE(refused.ok());
  // A node that waits and goes away (its client cancelled): its run goes after the time-to-live.
  uint64_t id = state.join(joinRequest("z", "n1", 2), [](absl::StatusOr<pb::Assignment>) {});
  EXPECT_EQ(state.runCount(), 1u);
  state.cancelJoin(id);
  ASSERT_TRUE(awaitRunCount(state, 0));
  auto fresh = joinNow(state, joinRequest("y", "n1", 1));
  EXPECT_TRUE(fresh.ok()) << fresh.status();  // --nnodes=1 now: the old run is gone
}

TEST(RunRetention, NoMoreThanTheCapAreRememberedHoweverManyJobsRun) {
  RendezvousState state({.ttl = Millis(3600 * 1000), .maxRuns = 50});
  for (int i = 0; i < 300; ++i) runOneJob(state, "job-" + std::to_string(i));
  ASSERT_TRUE(awaitRunCount(state, 50)) << state.runCount();
  // The newest are the ones remembered.
  auto late = joinNow(state, joinRequest("job-299", "n2", 1));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition) << late.status();
  auto old = joinNow(state, joinRequest("job-0", "n2", 1));
  EXPECT_TRUE(old.ok()) << old.status();
}

// A join whose result is awaited later.
struct Joining {
  std::promise<absl::StatusOr<pb::Assignment>> done;
  std::future<absl::StatusOr<pb::Assignment>> result = done.get_future();
  absl::StatusOr<pb::Assignment> get() {
    if (result.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      return absl::DeadlineExceededError("the join did not complete within 10 s");
    }
    return result.get();
  }
};

std::unique_ptr<Joining> startJoin(RendezvousState& state, const pb::JoinRequest& r) {
  auto j = std::make_unique<Joining>();
  state.join(r, [p = j.get()](absl::StatusOr<pb::Assignment> a) { p->done.set_value(std::move(a)); });
  return j;
}

// Nodes a and b join run `runId` of two nodes: their assignments, a's then b's.
std::pair<absl::StatusOr<pb::Assignment>, absl::StatusOr<pb::Assignment>> twoNodes(RendezvousState& state,
                                                                                   const std::string& runId) {
  auto a = startJoin(state, joinRequest(runId, "a", 2));
  auto b = startJoin(state, joinRequest(runId, "b", 2));
  auto ra = a->get();
  return {std::move(ra), b->get()};
}

TEST(Joins, ANodeJoiningAgainSupersedesItsEarlierJoin) {
  RendezvousState state;
  auto first = startJoin(state, joinRequest("sup", "a", 2));
  auto again = startJoin(state, joinRequest("sup", "a", 2));
  auto cancelled = first->get();
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kCancelled) << cancelled.status();
  EXPECT_EQ(state.pendingJoins(), 1u);
  auto other = startJoin(state, joinRequest("sup", "b", 2));
  auto a = again->get(), b = other->get();
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  EXPECT_EQ(a->group_world_size(), 2);
  EXPECT_NE(a->group_rank(), b->group_rank());
}

TEST(Joins, TwoNodesClaimingOneNodeRankAreBothRefused) {
  RendezvousState state;
  auto first = startJoin(state, joinRequest("dup", "a", 3, 1));
  auto second = startJoin(state, joinRequest("dup", "b", 3, 1));
  for (auto* j : {first.get(), second.get()}) {
    auto r = j->get();
    EXPECT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists) << r.status();
    EXPECT_NE(r.status().message().find("node rank 1 is claimed by two nodes"), std::string::npos);
  }
  EXPECT_EQ(state.pendingJoins(), 0u);
  // While a round runs, a newcomer may not take a running node's rank; the node itself may
  // join again.
  auto r0 = startJoin(state, joinRequest("ranked", "a", 2, 0));
  auto r1 = startJoin(state, joinRequest("ranked", "b", 2, 1));
  ASSERT_TRUE(r0->get().ok() && r1->get().ok());
  auto thief = joinNow(state, joinRequest("ranked", "c", 2, 1));
  EXPECT_EQ(thief.status().code(), absl::StatusCode::kAlreadyExists) << thief.status();
  EXPECT_NE(thief.status().message().find("(running)"), std::string::npos) << thief.status();
}

// Found by fuzz/rendezvous_state: two nodes of 2^31-1 local ranks each overflowed the round's
// world size and the second node's rank offset (signed int). Such a round is refused to every
// node, and the run takes a sane round afterwards.
TEST(Joins, ARoundOfMoreThanTwoToThe31RanksIsRefusedToEveryNode) {
  RendezvousState state;
  auto huge = [](const std::string& node) {
    auto r = joinRequest("big", node, 2);
    r.mutable_node()->set_local_world_size(std::numeric_limits<int32_t>::max());
    return r;
  };
  auto a = startJoin(state, huge("a"));
  auto b = startJoin(state, huge("b"));
  for (auto* j : {a.get(), b.get()}) {
    auto r = j->get();
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find("add up to 4294967294 ranks"), std::string::npos) << r.status();
  }
  EXPECT_EQ(state.pendingJoins(), 0u);
  auto c = startJoin(state, joinRequest("big", "c", 2));
  auto d = startJoin(state, joinRequest("big", "d", 2));
  auto rc = c->get(), rd = d->get();
  ASSERT_TRUE(rc.ok() && rd.ok()) << rc.status() << rd.status();
  EXPECT_EQ(rc->world_size(), 2);
}

// Nodes of different --roles: each role's ranks count apart (ROLE_RANK, ROLE_WORLD_SIZE), in
// group-rank order, as torchrun's agent assigns them (PyTorch's test_assign_worker_ranks: ps
// of 4, trainers of 1, 2 and 3, ps of 5 give ps role ranks 0-3 and 4-8 of 9, trainers 0, 1-2
// and 3-5 of 6).
TEST(Joins, EachRoleCountsItsOwnRanksInGroupRankOrder) {
  RendezvousState state;
  std::vector<std::pair<std::string, int>> nodes{{"ps", 4}, {"trainer", 1}, {"trainer", 2}, {"trainer", 3}, {"ps", 5}};
  std::vector<std::unique_ptr<Joining>> joins;
  for (size_t i = 0; i < nodes.size(); ++i) {
    auto r = joinRequest("roles", "n" + std::to_string(i), 5, static_cast<int>(i));
    r.mutable_node()->set_role(nodes[i].first);
    r.mutable_node()->set_local_world_size(nodes[i].second);
    joins.push_back(startJoin(state, r));
  }
  std::vector<std::tuple<int, int, int, int>> got;  // rank offset, world, role rank offset, role world
  for (auto& j : joins) {
    auto a = j->get();
    ASSERT_TRUE(a.ok()) << a.status();
    got.emplace_back(a->rank_offset(), a->world_size(), a->role_rank_offset(), a->role_world_size());
  }
  EXPECT_EQ(got, (std::vector<std::tuple<int, int, int, int>>{
                     {0, 15, 0, 9}, {4, 15, 0, 6}, {5, 15, 1, 6}, {7, 15, 3, 6}, {10, 15, 4, 9}}));
}

TEST(Joins, JoinsThatTimeOutNameWhoWasThereBriefly) {
  RendezvousState state;
  std::vector<std::unique_ptr<Joining>> joins;
  for (int i = 0; i < 20; ++i) {
    auto r = joinRequest("late", "n" + std::to_string(i), 30);
    r.set_join_timeout_ms(2000);
    joins.push_back(startJoin(state, r));
  }
  for (size_t i = 0; i < joins.size(); ++i) {
    auto r = joins[i]->get();
    ASSERT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
    EXPECT_NE(r.status().message().find("timed out after 2.0 s waiting for nodes: "), std::string::npos)
        << r.status();
    // The first to time out saw all 20 (the others may go in a later sweep, with fewer there).
    if (i == 0) {
      EXPECT_NE(r.status().message().find("20/30 joined (host-n0, host-n1, "), std::string::npos) << r.status();
      EXPECT_NE(r.status().message().find("host-n15, and 4 more)"), std::string::npos) << r.status();
    }
  }
  EXPECT_EQ(state.pendingJoins(), 0u);
}

TEST(Timer, AnEarlierDeadlineWakesTheTimerAsleepUntilALaterOne) {
  std::unique_ptr<Joining> waiting;  // outlives the state, which fails it when it goes
  RendezvousState state;
  auto slow = joinRequest("slow", "a", 2);
  slow.set_join_timeout_ms(600000);  // the timer now sleeps for ten minutes
  waiting = startJoin(state, slow);
  // Give the timer thread time to fall asleep on that deadline (had it not yet, the test
  // passes without telling anything; it never fails for it).
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto quick = joinRequest("quick", "b", 2);
  quick.set_join_timeout_ms(200);
  auto start = Clock::now();
  auto r = joinNow(state, quick);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
}

TEST(Reports, TheJobSucceedsWhenEveryNodeHasReportedOnce) {
  RendezvousState state;
  auto [ra, rb] = twoNodes(state, "all");
  ASSERT_TRUE(ra.ok() && rb.ok());
  ASSERT_TRUE(state.report(reportOf("all", "a", ra->round(), true)).ok());
  ASSERT_TRUE(state.report(reportOf("all", "a", ra->round(), true)).ok());  // the same node twice counts once
  EXPECT_EQ(state.stats().runsFinished, 0u);
  ASSERT_TRUE(state.report(reportOf("all", "b", rb->round(), true)).ok());
  EXPECT_EQ(state.stats().runsFinished, 1u);
  // rendezvousctl runs: the finished run as it ran, its nodes and ranks.
  auto runs = state.runs();
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].state(), pb::RunSummary::FINISHED);
  EXPECT_EQ(runs[0].nodes(), 2);
  EXPECT_EQ(runs[0].ranks(), 2);
  EXPECT_GT(runs[0].forgotten_in_ms(), 0u);
}

// What a node's late calls meet once its round has ended: a watch the service takes after the
// node's own report (two calls, two threads, no order between them) gets the round's end, not
// NOT_FOUND, and the report that ends the round says how it ended.
//
// Watches and returns the event delivered (at once or later), or an error.
absl::StatusOr<pb::RoundEvent> watchNow(RendezvousState& state, const std::string& runId,
                                        const std::string& nodeId, uint64_t round) {
  auto event = std::make_shared<std::promise<pb::RoundEvent>>();
  auto got = event->get_future();
  auto id = state.watch(runId, nodeId, round, [event](const pb::RoundEvent& e) { event->set_value(e); });
  if (!id.ok()) return id.status();
  if (got.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    return absl::DeadlineExceededError("no event for the watch");
  }
  return got.get();
}

TEST(LateCalls, AWatchAfterTheLastReportGetsTheJobsSuccess) {
  RendezvousState state({.ttl = Millis(60000), .maxRuns = 100});
  auto a = joinNow(state, joinRequest("x33", "n1", 1));
  ASSERT_TRUE(a.ok()) << a.status();
  auto reported = state.report(reportOf("x33", "n1", a->round(), true));
  ASSERT_TRUE(reported.ok()) << reported.status();
  ASSERT_TRUE(reported->has_ended()) << "the report that ends the round says so";
  EXPECT_EQ(reported->ended().kind(), pb::RoundEvent::JOB_SUCCEEDED);
  EXPECT_EQ(reported->ended().round(), a->round());
  // The watch the node sent before its report, taken by the service after it.
  auto late = watchNow(state, "x33", "n1", a->round());
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(late->kind(), pb::RoundEvent::JOB_SUCCEEDED);
  EXPECT_EQ(late->round(), a->round());
  // The same report again (a retry) is answered the same way, as is a heartbeat.
  auto again = state.report(reportOf("x33", "n1", a->round(), true));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->ended().kind(), pb::RoundEvent::JOB_SUCCEEDED);
  EXPECT_TRUE(state.heartbeat("x33", "n1").ok());
  // A round the run never had is still unknown.
  auto other = watchNow(state, "x33", "n1", a->round() + 1);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kNotFound) << other.status();
}

TEST(LateCalls, AWatchAfterAnotherNodesFailureGetsThatFailure) {
  RendezvousState state;
  auto [ra, rb] = twoNodes(state, "f");
  ASSERT_TRUE(ra.ok() && rb.ok());
  auto failed = state.report(reportOf("f", "b", rb->round(), false, "rank 3 exited with 1"));
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(failed->ended().kind(), pb::RoundEvent::NODE_FAILED);
  auto late = watchNow(state, "f", "a", ra->round());
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(late->kind(), pb::RoundEvent::NODE_FAILED);
  EXPECT_EQ(late->message(), "rank 3 exited with 1");
  // a's own success after the round ended by b's failure: the answer says how it ended.
  auto mine = state.report(reportOf("f", "a", ra->round(), true));
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(mine->ended().kind(), pb::RoundEvent::NODE_FAILED);
}

// Two nodes, a ttl shorter than the time between their last calls: a's success report is
// answered while b still runs, b's ends the run, the run is forgotten, and only then does the
// service take a's watch. Its round's end is still known (for a minute), not NOT_FOUND.
TEST(LateCalls, ARunForgottenStillSaysHowItsRoundEnded) {
  RendezvousState state({.ttl = Millis(1), .maxRuns = 100});
  auto [ra, rb] = twoNodes(state, "quick");
  ASSERT_TRUE(ra.ok() && rb.ok());
  auto first = state.report(reportOf("quick", "a", ra->round(), true));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->has_ended()) << "b still runs";
  ASSERT_TRUE(state.report(reportOf("quick", "b", rb->round(), true)).ok());
  ASSERT_TRUE(awaitRunCount(state, 0)) << "the finished run was never forgotten";
  auto late = watchNow(state, "quick", "a", ra->round());
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(late->kind(), pb::RoundEvent::JOB_SUCCEEDED);
  auto again = state.report(reportOf("quick", "a", ra->round(), true));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->ended().kind(), pb::RoundEvent::JOB_SUCCEEDED);
  // Its id starts a new run all the same, whose rounds are its own.
  auto next = joinNow(state, joinRequest("quick", "c", 1));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(watchNow(state, "quick", "a", ra->round() + 5).status().code(), absl::StatusCode::kNotFound);
  // A run never seen is not found.
  EXPECT_EQ(state.report(reportOf("never", "n1", 0, true)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(watchNow(state, "never", "n1", 0).status().code(), absl::StatusCode::kNotFound);
}

TEST(Joins, ARefusedFirstJoinLeavesNoRunBehind) {
  RendezvousState state;
  auto r = joinNow(state, joinRequest("typo", "a", 2, /*wantedRank=*/5));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_EQ(state.runCount(), 0u);
  EXPECT_TRUE(state.runs().empty());
}

}  // namespace
}  // namespace muster::rendezvous
