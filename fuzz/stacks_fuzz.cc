// A rank's stack dump (Python's faulthandler or the worker library's native handler, written by
// the rank into a file launch reads) through everything launch does with it: parsed, grouped,
// summarized, written as the report, and sent to the rendezvous as JSON that rendezvousctl reads
// back. And any JSON where rendezvousctl expects that: a json::exception is its one documented
// outcome.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <string>
#include <vector>

#include "stacks/stacks.h"

using namespace muster::stacks;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider p(data, size);
  if (p.ConsumeBool()) {
    std::string text = p.ConsumeRemainingBytesAsString();
    RankStacks r;
    r.rank = 0;
    r.localRank = 0;
    r.pid = 1;
    r.host = "h";
    r.kind = "native";
    r.threads = parseDump(text);
    std::vector<RankStacks> ranks{r, r, r};
    ranks[1].rank = 1;
    ranks[2].rank = 2;
    ranks[2].answer = Answer::kNoAnswer;
    ranks[2].state = "D (futex_wait_queue)";
    ranks[2].threads.clear();
    for (const auto& g : groupRanks(ranks)) (void)describeGroup(ranks, g);
    (void)summary(ranks, "fuzz");
    (void)fullReport(ranks, "fuzz");
    // What launch sends, and rendezvousctl reads back: the same ranks and threads.
    std::string wire = toJson(ranks).dump();
    auto back = fromJson(nlohmann::json::parse(wire));
    if (back.size() != ranks.size() || back[0].threads.size() != r.threads.size()) __builtin_trap();
    if (toJson(back).dump() != wire) __builtin_trap();
  } else {
    auto json = nlohmann::json::parse(p.ConsumeRemainingBytesAsString(), nullptr, /*allow_exceptions=*/false);
    if (json.is_discarded()) return 0;
    try {
      auto ranks = fromJson(json);
      (void)fullReport(ranks, "fuzz");
      (void)summary(ranks, "fuzz");
    } catch (const nlohmann::json::exception&) {
    }
  }
  return 0;
}
