// Any StoreRequest (the protobuf both of rendezvousd's transports hand the store) against
// MemoryStore, a sequence per input, some parked, some cancelled. Every request is answered once
// (a cancelled one never); a request of one operation refused at once changes no key and no
// byte (a multi_set is one change); dropping every job used empties the store and its accounting.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/log.h"
#include "rendezvous/store/memory_store.h"

using namespace muster::rendezvous;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  muster::log::setLevel("off");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider p(data, size);
  StoreLimits limits{.maxKeyBytes = 64,
                     .maxValueBytes = 256,
                     .maxKeysPerCall = 16,
                     .maxTotalBytes = p.ConsumeIntegralInRange<size_t>(64, 8192),
                     .maxWaiters = 32,
                     .maxJobBytes = p.ConsumeIntegralInRange<size_t>(32, 4096),
                     .maxJobKeys = 32,
                     .maxJobWaiters = 8,
                     .maxReplyBytes = 1024};
  auto calls = std::make_shared<std::vector<int>>();
  std::set<std::string> jobs;
  {
    auto memory = std::make_shared<MemoryStore>(limits);
    std::vector<std::pair<size_t, MemoryStore::WaiterId>> parked;
    while (p.remaining_bytes() > 0) {
      pb::StoreRequest request;
      if (!request.ParseFromString(p.ConsumeRandomLengthString(512))) continue;
      // No deadline: only this thread completes anything, so a run is repeatable.
      request.set_timeout_ms(0);
      for (auto& b : *request.mutable_batch()) b.set_timeout_ms(0);
      jobs.insert(request.ns().substr(0, request.ns().find('/')));
      for (const auto& b : request.batch()) jobs.insert(b.ns().substr(0, b.ns().find('/')));
      size_t seq = calls->size();
      calls->push_back(0);
      auto before = memory->stats();
      auto code = std::make_shared<int>(-1);
      auto waiter = memory->execute(request, [calls, seq, code](pb::StoreResponse&& r) {
        ++(*calls)[seq];
        *code = r.code();
      });
      if (request.batch_size() == 0 && *code > 0) {
        auto after = memory->stats();
        if (after.keys != before.keys || after.bytes != before.bytes) __builtin_trap();
      }
      if (waiter != MemoryStore::kNotPending) parked.emplace_back(seq, waiter);
      if (!parked.empty() && p.ConsumeBool()) {
        auto [s, id] = parked[p.ConsumeIntegralInRange<size_t>(0, parked.size() - 1)];
        if (memory->cancel(id)) (*calls)[s] -= 1000;  // a cancelled request is never answered
      }
    }
    for (const auto& job : jobs) memory->dropJob(job);
    auto stats = memory->stats();
    if (stats.keys != 0 || stats.bytes != 0 || stats.jobs != 0 || memory->totalBytes() != 0) __builtin_trap();
  }  // ~MemoryStore answers what is still parked
  for (int c : *calls) {
    if (c != 1 && c != -1000) __builtin_trap();
  }
  return 0;
}
