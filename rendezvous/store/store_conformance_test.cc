// One conformance suite, run against every Store implementation: c10d::Store's semantics.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <utility>
#include <vector>

#include "rendezvous/store/store_test_backends.h"

namespace muster::rendezvous {
namespace {

using testing::DirectBackend;
using testing::GrpcBackend;
using testing::LocalBackend;

// Waits (bounded) until `n` operations are parked in the store: lets a test release a get
// that is known to be blocked rather than one that has not started.
template <typename Backend>
void awaitParked(Backend& backend, size_t n) {
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (backend.memory().pendingWaiters() < n && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_GE(backend.memory().pendingWaiters(), n) << "the operation never parked";
}

template <typename Backend>
class StoreConformance : public ::testing::Test {
 protected:
  StoreConformance() : store(backend.open("job/0")) {}
  Backend backend;
  std::unique_ptr<Store> store;
};

using Backends = ::testing::Types<LocalBackend, GrpcBackend, DirectBackend>;
class BackendNames {
 public:
  template <typename T>
  static std::string GetName(int) {
    if (std::is_same_v<T, LocalBackend>) return "Local";
    return std::is_same_v<T, DirectBackend> ? "Direct" : "Grpc";
  }
};
TYPED_TEST_SUITE(StoreConformance, Backends, BackendNames);

TYPED_TEST(StoreConformance, SetThenGetReturnsValue) {
  ASSERT_TRUE(this->store->set("k", "v1").ok());
  EXPECT_EQ(this->store->get("k", deadlineAfter(Millis(1000))).value(), "v1");
  ASSERT_TRUE(this->store->set("k", "v2").ok());
  EXPECT_EQ(this->store->get("k", deadlineAfter(Millis(1000))).value(), "v2");
}

TYPED_TEST(StoreConformance, BinaryValuesSurviveIntact) {
  std::string value("a\0b\xff\x00z", 6);
  ASSERT_TRUE(this->store->set("bin", value).ok());
  EXPECT_EQ(this->store->get("bin", deadlineAfter(Millis(1000))).value(), value);
}

// c10d keys are byte strings: any bytes, NUL and invalid UTF-8 included, in keys and
// namespaces, through every operation that names a key.
TYPED_TEST(StoreConformance, KeysAndNamespacesAreBytes) {
  std::string key("\xff\xfe", 2), other("k\0\x80z", 4), value("v\xc3", 2);
  ASSERT_TRUE(this->store->set(key, value).ok());
  EXPECT_EQ(this->store->get(key, deadlineAfter(Millis(1000))).value(), value);
  EXPECT_FALSE(this->store->check({other}).value());
  ASSERT_TRUE(this->store->multiSet({other}, {"x"}).ok());
  EXPECT_EQ(this->store->multiGet({key, other}, deadlineAfter(Millis(1000))).value(),
            (std::vector<std::string>{value, "x"}));
  ASSERT_TRUE(this->store->wait({key, other}, deadlineAfter(Millis(1000))).ok());
  EXPECT_EQ(this->store->add(std::string("n\xff", 2), 2).value(), 2);
  EXPECT_EQ(this->store->append(key, "!").value(), 3);
  EXPECT_EQ(this->store->compareSet(other, "x", "y").value(), "y");
  EXPECT_EQ(this->store->numKeys().value(), 3);
  EXPECT_TRUE(this->store->deleteKey(key).value());
  EXPECT_FALSE(this->store->check({key}).value());
  // A namespace of any bytes is a namespace like any other, apart from the rest.
  auto odd = this->backend.open(std::string("job\xff/\x00", 6));
  ASSERT_TRUE(odd->set(other, "in odd").ok());
  EXPECT_EQ(odd->get(other, deadlineAfter(Millis(1000))).value(), "in odd");
  EXPECT_EQ(this->store->get(other, deadlineAfter(Millis(1000))).value(), "y");
}

TYPED_TEST(StoreConformance, GetBlocksUntilAnotherClientSets) {
  auto other = this->backend.open("job/0");
  std::thread setter([&] {
    awaitParked(this->backend, 1);
    ASSERT_TRUE(other->set("late", "here").ok());
  });
  auto value = this->store->get("late", deadlineAfter(Millis(10000)));
  setter.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "here");
}

TYPED_TEST(StoreConformance, GetTimesOutNamingTheMissingKey) {
  auto start = Clock::now();
  auto value = this->store->get("never", deadlineAfter(Millis(200)));
  auto took = Clock::now() - start;
  ASSERT_EQ(value.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(value.status().message().find("'never'"), std::string::npos) << value.status();
  EXPECT_NE(value.status().message().find("200 ms"), std::string::npos) << value.status();
  EXPECT_GE(took, std::chrono::milliseconds(190));
  EXPECT_EQ(this->backend.memory().pendingWaiters(), 0u);
}

TYPED_TEST(StoreConformance, AddCountsFromZeroAndStoresDecimalText) {
  EXPECT_EQ(this->store->add("n", 5).value(), 5);
  EXPECT_EQ(this->store->add("n", -7).value(), -2);
  EXPECT_EQ(this->store->get("n", deadlineAfter(Millis(1000))).value(), "-2");
  ASSERT_TRUE(this->store->set("n", "40").ok());
  EXPECT_EQ(this->store->add("n", 2).value(), 42);
}

TYPED_TEST(StoreConformance, AddRejectsNonIntegerAndOverflow) {
  ASSERT_TRUE(this->store->set("word", "abc").ok());
  auto bad = this->store->add("word", 1);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'word'"), std::string::npos);
  ASSERT_TRUE(this->store->set("big", "9223372036854775807").ok());
  EXPECT_EQ(this->store->add("big", 1).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(this->store->get("big", deadlineAfter(Millis(1000))).value(), "9223372036854775807");
}

// c10d's servers read the stored value of an ADD as std::stoll does (measured against torch
// 2.14's server): white space, a sign, the digits up to the first other byte.
TYPED_TEST(StoreConformance, AddReadsTheStoredValueAsStollDoes) {
  for (auto [stored, sum] : std::vector<std::pair<std::string, int64_t>>{
           {" 7", 8}, {"+5", 6}, {"12abc", 13}, {"\t\n8", 9}, {"-3x", -2}, {"0x10", 1}}) {
    ASSERT_TRUE(this->store->set("v", stored).ok());
    auto added = this->store->add("v", 1);
    ASSERT_TRUE(added.ok()) << "'" << stored << "': " << added.status();
    EXPECT_EQ(*added, sum) << "'" << stored << "'";
    EXPECT_EQ(this->store->get("v", deadlineAfter(Millis(1000))).value(), std::to_string(sum));
  }
  for (std::string stored : {"", " ", "+", "-", " +-1", "x1"}) {
    ASSERT_TRUE(this->store->set("v", stored).ok());
    EXPECT_EQ(this->store->add("v", 1).status().code(), absl::StatusCode::kInvalidArgument)
        << "'" << stored << "'";
  }
  ASSERT_TRUE(this->store->set("v", "99999999999999999999").ok());
  EXPECT_EQ(this->store->add("v", 1).status().code(), absl::StatusCode::kOutOfRange);
}

TYPED_TEST(StoreConformance, CompareSetFollowsC10dSemantics) {
  // Missing key, empty expected: created.
  EXPECT_EQ(this->store->compareSet("c", "", "first").value(), "first");
  // Existing, expected matches: swapped.
  EXPECT_EQ(this->store->compareSet("c", "first", "second").value(), "second");
  // Existing, expected differs: unchanged, the current value comes back.
  EXPECT_EQ(this->store->compareSet("c", "first", "third").value(), "second");
  // Missing key, non-empty expected: the expected value comes back, nothing is created.
  EXPECT_EQ(this->store->compareSet("absent", "x", "y").value(), "x");
  EXPECT_FALSE(this->store->check({"absent"}).value());
}

TYPED_TEST(StoreConformance, CheckIsTrueOnlyWhenAllKeysExist) {
  ASSERT_TRUE(this->store->set("a", "1").ok());
  EXPECT_TRUE(this->store->check({"a"}).value());
  EXPECT_FALSE(this->store->check({"a", "b"}).value());
  ASSERT_TRUE(this->store->set("b", "2").ok());
  EXPECT_TRUE(this->store->check({"a", "b"}).value());
}

TYPED_TEST(StoreConformance, WaitReturnsWhenEveryKeyArrives) {
  auto other = this->backend.open("job/0");
  std::thread setter([&] {
    awaitParked(this->backend, 1);
    ASSERT_TRUE(other->set("w1", "x").ok());
    ASSERT_TRUE(other->set("w2", "y").ok());
  });
  auto status = this->store->wait({"w1", "w2"}, deadlineAfter(Millis(10000)));
  setter.join();
  EXPECT_TRUE(status.ok()) << status;
}

TYPED_TEST(StoreConformance, WaitTimeoutListsOnlyMissingKeys) {
  ASSERT_TRUE(this->store->set("here", "1").ok());
  auto status = this->store->wait({"here", "gone"}, deadlineAfter(Millis(150)));
  ASSERT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(status.message().find("missing 'gone'"), std::string::npos) << status;
  EXPECT_NE(status.message().find("1 of 2"), std::string::npos) << status;
}

TYPED_TEST(StoreConformance, DeleteKeySaysWhetherItExisted) {
  ASSERT_TRUE(this->store->set("d", "1").ok());
  EXPECT_TRUE(this->store->deleteKey("d").value());
  EXPECT_FALSE(this->store->deleteKey("d").value());
  EXPECT_FALSE(this->store->check({"d"}).value());
  EXPECT_EQ(this->store->get("d", deadlineAfter(Millis(50))).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TYPED_TEST(StoreConformance, NumKeysCountsThisNamespaceOnly) {
  auto otherRound = this->backend.open("job/1");
  ASSERT_TRUE(this->store->set("x", "1").ok());
  ASSERT_TRUE(this->store->set("y", "1").ok());
  ASSERT_TRUE(otherRound->set("x", "1").ok());
  EXPECT_EQ(this->store->numKeys().value(), 2);
  EXPECT_EQ(otherRound->numKeys().value(), 1);
}

TYPED_TEST(StoreConformance, NamespacesNeverSeeEachOthersKeys) {
  auto next = this->backend.open("job/1");
  ASSERT_TRUE(this->store->set("rank0", "old").ok());
  EXPECT_FALSE(next->check({"rank0"}).value());
  EXPECT_EQ(next->get("rank0", deadlineAfter(Millis(50))).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(next->set("rank0", "new").ok());
  EXPECT_EQ(this->store->get("rank0", deadlineAfter(Millis(1000))).value(), "old");
  EXPECT_EQ(this->store->clear().value(), 1);
  EXPECT_EQ(this->store->numKeys().value(), 0);
  EXPECT_EQ(next->get("rank0", deadlineAfter(Millis(1000))).value(), "new");
}

TYPED_TEST(StoreConformance, MultiSetAndMultiGetKeepOrder) {
  ASSERT_TRUE(this->store->multiSet({"m1", "m2", "m3"}, {"a", "b", "c"}).ok());
  auto values = this->store->multiGet({"m3", "m1", "m2"}, deadlineAfter(Millis(1000)));
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(*values, (std::vector<std::string>{"c", "a", "b"}));
  EXPECT_EQ(this->store->multiSet({"a", "b"}, {"1"}).code(), absl::StatusCode::kInvalidArgument);
}

TYPED_TEST(StoreConformance, MultiGetBlocksUntilAllKeysExist) {
  auto other = this->backend.open("job/0");
  ASSERT_TRUE(this->store->set("g1", "one").ok());
  std::thread setter([&] {
    awaitParked(this->backend, 1);
    ASSERT_TRUE(other->set("g2", "two").ok());
  });
  auto values = this->store->multiGet({"g1", "g2"}, deadlineAfter(Millis(10000)));
  setter.join();
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(*values, (std::vector<std::string>{"one", "two"}));
}

TYPED_TEST(StoreConformance, AppendCreatesThenExtends) {
  EXPECT_EQ(this->store->append("log", "ab").value(), 2);
  EXPECT_EQ(this->store->append("log", "cde").value(), 5);
  EXPECT_EQ(this->store->get("log", deadlineAfter(Millis(1000))).value(), "abcde");
}

TYPED_TEST(StoreConformance, ConcurrentAddsGiveExactTotal) {
  constexpr int kThreads = 8, kAdds = 250;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      auto store = this->backend.open("job/0");
      for (int i = 0; i < kAdds; ++i) ASSERT_TRUE(store->add("total", 1).ok());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(this->store->add("total", 0).value(), kThreads * kAdds);
}

TYPED_TEST(StoreConformance, OversizedKeyIsRejectedNamingTheLimit) {
  std::string key(257, 'k');
  auto status = this->store->set(key, "v");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("max_key_bytes=256"), std::string::npos) << status;
  EXPECT_EQ(this->store->get(key, deadlineAfter(Millis(100))).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TYPED_TEST(StoreConformance, OversizedValueIsRejectedNamingTheLimit) {
  auto status = this->store->set("v", std::string((1 << 20) + 1, 'x'));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("max_value_bytes=1048576"), std::string::npos) << status;
  ASSERT_TRUE(this->store->append("v", std::string(1 << 20, 'x')).ok());
  EXPECT_EQ(this->store->append("v", "y").status().code(), absl::StatusCode::kInvalidArgument);
}

TYPED_TEST(StoreConformance, TooManyKeysInOneCallIsRejected) {
  std::vector<std::string> keys(65, "k");
  auto status = this->store->wait(keys, deadlineAfter(Millis(100)));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("max_keys_per_call=64"), std::string::npos) << status;
}

TYPED_TEST(StoreConformance, FullStoreSaysResourceExhaustedAndKeepsServing) {
  std::string chunk(1 << 20, 'x');
  absl::Status status;
  for (int i = 0; i < 8 && status.ok(); ++i) {
    status = this->store->set("chunk" + std::to_string(i), chunk);
    // Over a connection a set does not wait: its refusal comes with the next operation.
    if (status.ok()) status = this->store->numKeys().status();
  }
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(status.message().find("max_total_bytes=4194304"), std::string::npos) << status;
  EXPECT_EQ(this->store->numKeys().value(), 3);
  // Deleting frees room; small writes still work.
  EXPECT_TRUE(this->store->deleteKey("chunk0").value());
  EXPECT_TRUE(this->store->set("chunk9", chunk).ok());
  EXPECT_TRUE(this->store->set("small", "ok").ok());
  EXPECT_EQ(this->store->numKeys().value(), 4);
}

TYPED_TEST(StoreConformance, SetIsVisibleToTheNextOperationAtOnce) {
  for (int i = 0; i < 200; ++i) {
    ASSERT_TRUE(this->store->set("seq", std::to_string(i)).ok());
    ASSERT_EQ(this->store->get("seq", deadlineAfter(Millis(1000))).value(), std::to_string(i));
  }
  ASSERT_TRUE(this->store->set("other", "x").ok());
  EXPECT_TRUE(this->store->check({"other"}).value());
}

// flush() returns once every set is applied, with the first one refused: a tool (rendezvousctl
// set) or a rank that must know its sets landed asks for it.
TYPED_TEST(StoreConformance, FlushSaysWhetherEverySetLanded) {
  ASSERT_TRUE(this->store->set("a", "1").ok());
  EXPECT_TRUE(this->store->flush(deadlineAfter(Millis(5000))).ok());
  std::string chunk(1 << 20, 'x');
  absl::Status status;
  for (int i = 0; i < 8 && status.ok(); ++i) status = this->store->set("chunk" + std::to_string(i), chunk);
  if (status.ok()) status = this->store->flush(deadlineAfter(Millis(5000)));
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_TRUE(this->store->flush(deadlineAfter(Millis(5000))).ok()) << "a refusal is said once";
}

TYPED_TEST(StoreConformance, InfoReportsTheLimits) {
  auto info = this->store->info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->max_key_bytes(), 256u);
  EXPECT_EQ(info->max_value_bytes(), 1u << 20);
  EXPECT_EQ(info->max_keys_per_call(), 64u);
}

}  // namespace
}  // namespace muster::rendezvous
