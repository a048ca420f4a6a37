// Runs nobody uses any more are forgotten: a finished run after its time-to-live (then its id
// starts a new run), an abandoned one likewise, and never more of them than the cap.
#include "rendezvous/rendezvous_state.h"

#include <gtest/gtest.h>

#include <future>
#include <thread>

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

// One node joins run `runId` alone and reports success: the job is done.
void runOneJob(RendezvousState& state, const std::string& runId) {
  auto a = joinNow(state, joinRequest(runId, "n1", 1));
  ASSERT_TRUE(a.ok()) << a.status();
  pb::ReportRequest report;
  report.set_run_id(runId);
  report.set_node_id("n1");
  report.set_round(a->round());
  report.set_outcome(pb::ReportRequest::SUCCEEDED);
  ASSERT_TRUE(state.report(report).ok());
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
  // A join refused at once leaves a run that pins --nnodes; it goes after the time-to-live.
  auto refused = joinNow(state, joinRequest("y", "n1", 2, /*wantedRank=*/5));
  ASSERT_FALSE(refused.ok());
  // A node that waits and goes away (its client cancelled).
  uint64_t id = state.join(joinRequest("z", "n1", 2), [](absl::StatusOr<pb::Assignment>) {});
  EXPECT_EQ(state.runCount(), 2u);
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

}  // namespace
}  // namespace muster::rendezvous
