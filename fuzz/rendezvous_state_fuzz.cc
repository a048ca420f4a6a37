// Rendezvous requests (any JoinRequest, heartbeats, watches, reports, roll-calls) against the
// state behind rendezvousd's Rendezvous service, a sequence per input over two runs and four
// nodes. Every join is answered at most once, never after it was dropped; a round's assignments
// number its nodes 0..n-1 with offsets that add up their local world sizes.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/log.h"
#include "rendezvous/membership/rendezvous_state.h"

using namespace muster::rendezvous;
using muster::Millis;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  muster::log::setLevel("off");
  return 0;
}

namespace {
struct Record {
  std::map<uint64_t, int> answers;  // by the harness's join number
  std::set<uint64_t> dropped;
  uint64_t joins = 0;  // joins asked
  bool broken = false;
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider p(data, size);
  auto record = std::make_shared<Record>();
  {
    // No time anywhere: the timer thread never acts, so a run is repeatable.
    RendezvousState state(RunRetention{.ttl = Millis(0), .maxRuns = SIZE_MAX});
    const char* runs[] = {"a", "b"};
    const char* nodes[] = {"n0", "n1", "n2", "n3"};
    auto run = [&] { return std::string(runs[p.ConsumeIntegralInRange(0, 1)]); };
    auto node = [&] { return std::string(nodes[p.ConsumeIntegralInRange(0, 3)]); };
    std::vector<std::pair<uint64_t, uint64_t>> joins;  // (harness number, state's id)
    std::vector<uint64_t> watches;
    while (p.remaining_bytes() > 0) {
      switch (p.ConsumeIntegralInRange(0, 8)) {
        case 0: {
          pb::JoinRequest r;
          if (p.ConsumeBool()) {
            (void)r.ParseFromString(p.ConsumeRandomLengthString(128));
          } else {
            // One read per statement: the order of reads is the input's meaning, whatever the
            // compiler's order of a call's arguments (a clang campaign's input replays under GCC).
            r.set_run_id(run());
            r.mutable_node()->set_node_id(node());
            r.mutable_node()->set_host(r.node().node_id());
            bool small = p.ConsumeBool();
            int32_t ranks = small ? p.ConsumeIntegralInRange(-1, 8) : p.ConsumeIntegral<int32_t>();
            r.mutable_node()->set_local_world_size(ranks);
            r.mutable_node()->set_wanted_rank(p.ConsumeIntegralInRange(-1, 4));
            r.set_min_nodes(p.ConsumeIntegralInRange(0, 3));
            r.set_max_nodes(p.ConsumeIntegralInRange(0, 4));
          }
          r.set_last_call_ms(0);
          r.set_join_timeout_ms(0);
          r.set_keep_alive_ms(0);
          uint64_t number = joins.size();
          record->joins = number + 1;
          uint64_t id = state.join(r, [record, number](absl::StatusOr<pb::Assignment> a) {
            if (record->dropped.count(number) != 0) record->broken = true;
            ++record->answers[number];
            if (a.ok() && (a->group_rank() < 0 || a->group_rank() >= a->group_world_size() || a->rank_offset() < 0)) {
              record->broken = true;
            }
          });
          joins.emplace_back(number, id);
          break;
        }
        case 1:
          if (!joins.empty()) {
            auto [number, id] = joins[p.ConsumeIntegralInRange<size_t>(0, joins.size() - 1)];
            if (record->answers[number] == 0) record->dropped.insert(number);
            state.cancelJoin(id);
          }
          break;
        case 2: {
          pb::NodeStatus status;
          bool with = p.ConsumeBool();
          if (with) (void)status.ParseFromString(p.ConsumeRandomLengthString(64));
          std::string runId = run();
          std::string nodeId = node();
          (void)state.heartbeat(runId, nodeId, with ? &status : nullptr);
          break;
        }
        case 3: {
          std::string runId = run();
          std::string nodeId = node();
          uint64_t round = p.ConsumeIntegralInRange<uint64_t>(0, 3);
          auto w = state.watch(runId, nodeId, round, [](const pb::RoundEvent&) {});
          if (w.ok() && *w != 0) watches.push_back(*w);
          break;
        }
        case 4:
          if (!watches.empty()) {
            uint64_t watch = watches[p.ConsumeIntegralInRange<size_t>(0, watches.size() - 1)];
            bool gone = p.ConsumeBool();
            state.unwatch(watch, gone);
          }
          break;
        case 5: {
          pb::ReportRequest r;
          r.set_run_id(run());
          r.set_node_id(node());
          r.set_round(p.ConsumeIntegralInRange<uint64_t>(0, 3));
          r.set_outcome(p.ConsumeBool() ? pb::ReportRequest::FAILED : pb::ReportRequest::SUCCEEDED);
          r.set_exit_code(p.ConsumeIntegral<int32_t>());
          (void)state.report(r);
          break;
        }
        case 6:
          state.requestStacks(run(), Millis(0), [](absl::StatusOr<pb::StacksReply>) {});
          break;
        case 7: {
          pb::PutStacksRequest r;
          r.set_run_id(run());
          r.set_node_id(node());
          r.set_request(p.ConsumeIntegralInRange<uint64_t>(0, 3));
          r.set_json(p.ConsumeRandomLengthString(64));
          state.putStacks(r);
          break;
        }
        default: {
          (void)state.runs();
          auto status = state.status(run());
          if (status.ok()) (void)status->ByteSizeLong();
          if (state.stats().pendingJoins != state.pendingJoins()) record->broken = true;
          break;
        }
      }
    }
  }  // ~RendezvousState: every join still waiting is answered UNAVAILABLE
  if (record->broken) __builtin_trap();
  for (const auto& [number, answers] : record->answers) {
    if (answers > 1) __builtin_trap();
  }
  for (uint64_t number = 0; number < record->joins; ++number) {
    if (record->answers.count(number) == 0 && record->dropped.count(number) == 0) {
      // A join neither answered nor dropped: the destructor must have answered it.
      __builtin_trap();
    }
  }
  return 0;
}
