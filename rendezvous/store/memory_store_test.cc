// MemoryStore's own contract: completions run exactly once, cancel, the waiter cap, shutdown.
#include "rendezvous/store/memory_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <memory>
#include <thread>

namespace muster::rendezvous {
namespace {

pb::StoreRequest get(const std::string& key, uint64_t timeoutMs, uint64_t id = 7) {
  pb::StoreRequest req;
  req.set_id(id);
  req.set_ns("t");
  req.set_timeout_ms(timeoutMs);
  req.mutable_get()->set_key(key);
  return req;
}

pb::StoreRequest set(const std::string& key, const std::string& value) {
  pb::StoreRequest req;
  req.set_ns("t");
  req.mutable_set()->set_key(key);
  req.mutable_set()->set_value(value);
  return req;
}

TEST(MemoryStore, PresentKeyAnswersBeforeExecuteReturns) {
  MemoryStore store;
  store.execute(set("k", "v"), [](pb::StoreResponse&&) {});
  bool answered = false;
  auto id = store.execute(get("k", 0), [&](pb::StoreResponse&& r) {
    answered = true;
    EXPECT_EQ(r.value(), "v");
    EXPECT_EQ(r.id(), 7u);
  });
  EXPECT_TRUE(answered);
  EXPECT_EQ(id, MemoryStore::kNotPending);
}

TEST(MemoryStore, ParkedGetCompletesOnceWhenTheKeyArrives) {
  MemoryStore store;
  std::atomic<int> calls{0};
  std::string value;
  auto id = store.execute(get("k", 0), [&](pb::StoreResponse&& r) {
    ++calls;
    value = r.value();
  });
  EXPECT_NE(id, MemoryStore::kNotPending);
  EXPECT_EQ(store.pendingWaiters(), 1u);
  store.execute(set("k", "v1"), [](pb::StoreResponse&&) {});
  store.execute(set("k", "v2"), [](pb::StoreResponse&&) {});
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(value, "v1");
  EXPECT_EQ(store.pendingWaiters(), 0u);
  EXPECT_FALSE(store.cancel(id));
}

TEST(MemoryStore, CancelledWaiterNeverCompletes) {
  MemoryStore store;
  std::atomic<int> calls{0};
  auto id = store.execute(get("k", 50), [&](pb::StoreResponse&&) { ++calls; });
  EXPECT_TRUE(store.cancel(id));
  EXPECT_FALSE(store.cancel(id));
  store.execute(set("k", "v"), [](pb::StoreResponse&&) {});
  // Past its deadline too: the timer must not fire for it either.
  std::promise<void> later;
  store.execute(get("other", 100), [&](pb::StoreResponse&&) { later.set_value(); });
  later.get_future().wait();
  EXPECT_EQ(calls.load(), 0);
}

TEST(MemoryStore, DeadlinesFireInOrderOnTheTimerThread) {
  MemoryStore store;
  std::mutex mu;
  std::vector<uint64_t> order;
  std::promise<void> all;
  for (uint64_t i : {3, 1, 2}) {
    store.execute(get("never", i * 40, i), [&, i](pb::StoreResponse&& r) {
      EXPECT_EQ(r.code(), 4);
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(r.id());
      if (order.size() == 3) all.set_value();
    });
  }
  all.get_future().wait();
  EXPECT_EQ(order, (std::vector<uint64_t>{1, 2, 3}));
}

TEST(MemoryStore, WaiterCapSaysResourceExhausted) {
  StoreLimits limits;
  limits.maxWaiters = 2;
  MemoryStore store(limits);
  store.execute(get("a", 0), [](pb::StoreResponse&&) {});
  store.execute(get("b", 0), [](pb::StoreResponse&&) {});
  pb::StoreResponse third;
  store.execute(get("c", 0), [&](pb::StoreResponse&& r) { third = r; });
  EXPECT_EQ(third.code(), 8);
  EXPECT_NE(third.message().find("max_waiters=2"), std::string::npos) << third.message();
}

// Runs one request in namespace `ns` and returns its answer, or code -1 when it parked. The
// callback owns what it writes to: a parked request is answered later, at the latest by
// ~MemoryStore, when this frame is gone (UBSan's finding when it wrote to a local).
pb::StoreResponse runIn(MemoryStore& store, const std::string& ns, pb::StoreRequest req) {
  req.set_ns(ns);
  auto out = std::make_shared<pb::StoreResponse>();
  out->set_code(-1);
  store.execute(req, [out](pb::StoreResponse&& r) { *out = std::move(r); });
  return *out;
}

// One job at its quota is refused, naming the quota and its numbers; another job (and the
// store as a whole) is not affected, and what the job frees is its to use again.
TEST(MemoryStore, AJobAtItsQuotaIsRefusedAndOtherJobsAreNot) {
  StoreLimits limits;
  limits.maxJobBytes = 100;
  limits.maxJobKeys = 3;
  limits.maxJobWaiters = 1;
  MemoryStore store(limits);
  // Bytes: job "a" (its namespaces a/0 and a/1 together).
  EXPECT_EQ(runIn(store, "a/0", set("k1", std::string(60, 'x'))).code(), 0);
  auto full = runIn(store, "a/1", set("k2", std::string(60, 'x')));
  EXPECT_EQ(full.code(), 8);
  EXPECT_NE(full.message().find("job 'a' is at its quota"), std::string::npos) << full.message();
  EXPECT_NE(full.message().find("62 more bytes, 62 of max_job_bytes=100"), std::string::npos)
      << full.message();
  EXPECT_EQ(runIn(store, "b/0", set("k2", std::string(60, 'x'))).code(), 0) << "job b is not a's";
  // Overwriting with a smaller value needs no room.
  EXPECT_EQ(runIn(store, "a/0", set("k1", "small")).code(), 0);
  // Keys.
  EXPECT_EQ(runIn(store, "a/1", set("k2", "v")).code(), 0);
  EXPECT_EQ(runIn(store, "a/1", set("k3", "v")).code(), 0);
  auto keys = runIn(store, "a/1", set("k4", "v"));
  EXPECT_EQ(keys.code(), 8);
  EXPECT_NE(keys.message().find("max_job_keys=3"), std::string::npos) << keys.message();
  // Waiters.
  store.execute([] {
    auto r = get("never", 0);
    r.set_ns("a/2");
    return r;
  }(), [](pb::StoreResponse&&) {});
  auto waiter = runIn(store, "a/2", get("never2", 0));
  EXPECT_EQ(waiter.code(), 8);
  EXPECT_NE(waiter.message().find("max_job_waiters=1"), std::string::npos) << waiter.message();
  auto other = runIn(store, "b/1", get("k2", 0, 9));
  EXPECT_EQ(other.code(), -1) << "job b's get parks: it is not over a's quota";
  // Clearing a round gives the job its room back.
  pb::StoreRequest clear;
  clear.mutable_clear();
  EXPECT_EQ(runIn(store, "a/1", clear).code(), 0);
  EXPECT_EQ(runIn(store, "a/1", set("k4", "v")).code(), 0);
}

pb::StoreRequest multiSet(std::vector<std::pair<std::string, std::string>> pairs) {
  pb::StoreRequest r;
  for (auto& [k, v] : pairs) {
    r.mutable_multi_set()->add_keys(k);
    r.mutable_multi_set()->add_values(v);
  }
  return r;
}

// A multi_set is one change: refused, it changes nothing; taken, all of it. The room is that of
// what the call leaves (a key set twice counts once, at its last value), and a key that grows
// before another shrinks is no refusal of part of it (found reading the store for its fuzz
// target: the call was checked as a whole, then each key again on its own).
TEST(MemoryStore, AMultiSetIsTakenWholeOrNotAtAll) {
  StoreLimits limits;
  limits.maxJobBytes = 100;
  MemoryStore store(limits);
  ASSERT_EQ(runIn(store, "a/0", set("A", std::string(60, 'x'))).code(), 0);
  // B grows by 51 bytes (over the 39 left) before A shrinks by 60: the call needs -9 in all.
  auto both = runIn(store, "a/0", multiSet({{"B", std::string(50, 'y')}, {"A", ""}}));
  EXPECT_EQ(both.code(), 0) << both.message();
  EXPECT_EQ(runIn(store, "a/0", get("A", 0)).value(), "");
  EXPECT_EQ(runIn(store, "a/0", get("B", 0)).value(), std::string(50, 'y'));
  EXPECT_EQ(store.totalBytes(), 52u);
  // A key set twice: its last value is what stays, and what is counted.
  auto twice = runIn(store, "a/0", multiSet({{"C", std::string(40, 'z')}, {"C", "1"}}));
  EXPECT_EQ(twice.code(), 0) << twice.message();
  EXPECT_EQ(runIn(store, "a/0", get("C", 0)).value(), "1");
  EXPECT_EQ(store.totalBytes(), 54u);
  // B shrinks first, then grows past the room the call leaves: refused, and nothing changed.
  auto over = runIn(store, "a/0", multiSet({{"B", ""}, {"B", std::string(98, 'w')}}));
  EXPECT_EQ(over.code(), 8) << over.message();
  EXPECT_EQ(runIn(store, "a/0", get("B", 0)).value(), std::string(50, 'y'));
  EXPECT_EQ(store.totalBytes(), 54u);
}

TEST(MemoryStore, ShutdownEndsEveryWaiterAndRefusesNewRequests) {
  MemoryStore store;
  std::vector<pb::StoreResponse> answers;
  std::mutex mu;
  for (int i = 0; i < 3; ++i) {
    store.execute(get("k" + std::to_string(i), 0), [&](pb::StoreResponse&& r) {
      std::lock_guard<std::mutex> lock(mu);
      answers.push_back(r);
    });
  }
  store.shutdown();
  ASSERT_EQ(answers.size(), 3u);
  for (const auto& a : answers) EXPECT_EQ(a.code(), 14);
  pb::StoreResponse late;
  store.execute(set("k", "v"), [&](pb::StoreResponse&& r) { late = r; });
  EXPECT_EQ(late.code(), 14);
}

TEST(MemoryStore, TotalBytesFollowSetsDeletesAndClear) {
  MemoryStore store;
  store.execute(set("ab", "1234"), [](pb::StoreResponse&&) {});
  EXPECT_EQ(store.totalBytes(), 6u);
  store.execute(set("ab", "12"), [](pb::StoreResponse&&) {});
  EXPECT_EQ(store.totalBytes(), 4u);
  pb::StoreRequest clear;
  clear.set_ns("t");
  clear.mutable_clear();
  store.execute(clear, [](pb::StoreResponse&&) {});
  EXPECT_EQ(store.totalBytes(), 0u);
}

TEST(MemoryStore, ManyThreadsSettingAndWaitingLoseNothing) {
  MemoryStore store;
  constexpr int kKeys = 2000;
  std::atomic<int> answered{0};
  std::thread waiters([&] {
    for (int i = 0; i < kKeys; ++i) {
      store.execute(get("k" + std::to_string(i), 0),
                    [&, i](pb::StoreResponse&& r) {
                      EXPECT_EQ(r.value(), std::to_string(i));
                      ++answered;
                    });
    }
  });
  std::thread setters([&] {
    for (int i = kKeys - 1; i >= 0; --i) {
      store.execute(set("k" + std::to_string(i), std::to_string(i)), [](pb::StoreResponse&&) {});
    }
  });
  waiters.join();
  setters.join();
  EXPECT_EQ(answered.load(), kKeys);
  EXPECT_EQ(store.pendingWaiters(), 0u);
}

TEST(MemoryStore, RequestWithoutOperationIsInvalid) {
  MemoryStore store;
  pb::StoreResponse resp;
  store.execute(pb::StoreRequest(), [&](pb::StoreResponse&& r) { resp = r; });
  EXPECT_EQ(resp.code(), 3);
}

// Every request fits the largest one the server takes (gRPC's receive limit): a multi_set that
// would not is refused with a message saying to split it, and a namespace is held to the key
// limit.
TEST(MemoryStore, AMultiSetLargerThanTheLargestRequestIsRefused) {
  StoreLimits limits{.maxKeyBytes = 16, .maxValueBytes = 100, .maxKeysPerCall = 100};
  pb::StoreRequest fits;
  fits.mutable_multi_set()->add_keys("a");
  fits.mutable_multi_set()->add_values(std::string(100, 'x'));
  EXPECT_TRUE(validateRequest(fits, limits).ok());
  pb::StoreRequest big;
  for (int i = 0; i < 80; ++i) {
    big.mutable_multi_set()->add_keys("k" + std::to_string(i));
    big.mutable_multi_set()->add_values(std::string(100, 'x'));
  }
  auto status = validateRequest(big, limits);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("split it"), std::string::npos) << status;
  EXPECT_LE(fits.ByteSizeLong(), largestRequest(limits));
  pb::StoreRequest longNs;
  longNs.set_ns(std::string(17, 'n'));
  longNs.mutable_num_keys();
  EXPECT_NE(validateRequest(longNs, limits).message().find("namespace of 17 bytes"), std::string::npos);
}

}  // namespace
}  // namespace muster::rendezvous
