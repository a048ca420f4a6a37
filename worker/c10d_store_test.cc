// The c10d::Store conformance suite, run against c10d::TCPStore (LibTorch 1.13, the reference)
// and against muster's store through C10dStore, each also under a PrefixStore.
#include "worker/c10d_store.h"

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <thread>

#include <torch/torch.h>

#include "rendezvous/client/store_client.h"
#include "worker/process_group.h"
#include "rendezvous/server/rendezvous_server.h"

namespace muster::worker {
namespace {

using Bytes = std::vector<uint8_t>;
Bytes b(const std::string& s) { return Bytes(s.begin(), s.end()); }
std::string s(const Bytes& v) { return std::string(v.begin(), v.end()); }

constexpr std::chrono::milliseconds kTimeout{2000};

struct TcpStoreBackend {
  TcpStoreBackend() {
    c10d::TCPStoreOptions opts;
    opts.port = 0;
    opts.isServer = true;
    opts.waitWorkers = false;
    opts.timeout = kTimeout;
    server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", opts);
  }
  c10::intrusive_ptr<c10d::Store> open() {
    c10d::TCPStoreOptions opts;
    opts.port = server->getPort();
    opts.waitWorkers = false;
    opts.timeout = kTimeout;
    return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", opts);
  }
  c10::intrusive_ptr<c10d::TCPStore> server;
};

struct MusterBackend {
  MusterBackend() {
    rendezvous::ServerOptions options;
    options.host = "127.0.0.1";
    options.port = 0;
    server = std::move(*rendezvous::RendezvousServer::start(options));
  }
  c10::intrusive_ptr<c10d::Store> open() {
    auto client = rendezvous::StoreClient::connect({.target = server->address(), .ns = "job/0"},
                                                   deadlineAfter(Millis(10000)));
    std::shared_ptr<rendezvous::Store> shared(std::move(*client));
    return c10::make_intrusive<C10dStore>(shared, kTimeout);
  }
  std::unique_ptr<rendezvous::RendezvousServer> server;
};

// Each backend, bare and under a PrefixStore (as ProcessGroupGloo uses it).
template <typename Backend, bool kPrefixed>
struct Variant {
  Backend backend;
  c10::intrusive_ptr<c10d::Store> open() {
    auto store = backend.open();
    if (kPrefixed) return c10::make_intrusive<c10d::PrefixStore>("pg/0", store);
    return store;
  }
};

template <typename T>
class C10dConformance : public ::testing::Test {
 protected:
  C10dConformance() : store(v.open()) {}
  T v;
  c10::intrusive_ptr<c10d::Store> store;
};

using Variants = ::testing::Types<Variant<TcpStoreBackend, false>, Variant<MusterBackend, false>,
                                  Variant<TcpStoreBackend, true>, Variant<MusterBackend, true>>;
class VariantNames {
 public:
  template <typename T>
  static std::string GetName(int i) {
    static const char* names[] = {"TCPStore", "Muster", "PrefixedTCPStore", "PrefixedMuster"};
    return names[i];
  }
};
TYPED_TEST_SUITE(C10dConformance, Variants, VariantNames);

TYPED_TEST(C10dConformance, SetGetAndOverwrite) {
  this->store->set("k", b("v1"));
  EXPECT_EQ(s(this->store->get("k")), "v1");
  this->store->set("k", b("v2"));
  EXPECT_EQ(s(this->store->get("k")), "v2");
}

TYPED_TEST(C10dConformance, GetWaitsForAnotherClient) {
  auto other = this->v.open();
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    other->set("late", b("x"));
  });
  EXPECT_EQ(s(this->store->get("late")), "x");
  setter.join();
}

TYPED_TEST(C10dConformance, GetOfAMissingKeyThrowsAfterTheTimeout) {
  this->store->setTimeout(std::chrono::milliseconds(200));
  auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(this->store->get("missing"), c10::Error);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(150));
}

TYPED_TEST(C10dConformance, AddCountsAndStoresDecimalText) {
  EXPECT_EQ(this->store->add("n", 3), 3);
  EXPECT_EQ(this->store->add("n", -5), -2);
  EXPECT_EQ(s(this->store->get("n")), "-2");
}

TYPED_TEST(C10dConformance, CompareSetMatchesTcpStore) {
  EXPECT_EQ(s(this->store->compareSet("c", b(""), b("first"))), "first");
  EXPECT_EQ(s(this->store->compareSet("c", b("first"), b("second"))), "second");
  EXPECT_EQ(s(this->store->compareSet("c", b("nope"), b("third"))), "second");
  EXPECT_EQ(s(this->store->compareSet("absent", b("x"), b("y"))), "x");
  EXPECT_FALSE(this->store->check({"absent"}));
}

TYPED_TEST(C10dConformance, CheckDeleteAndCount) {
  int64_t before = this->store->getNumKeys();
  this->store->set("a", b("1"));
  this->store->set("b", b("2"));
  EXPECT_TRUE(this->store->check({"a", "b"}));
  EXPECT_FALSE(this->store->check({"a", "z"}));
  EXPECT_EQ(this->store->getNumKeys(), before + 2);
  EXPECT_TRUE(this->store->deleteKey("a"));
  EXPECT_FALSE(this->store->deleteKey("a"));
  EXPECT_EQ(this->store->getNumKeys(), before + 1);
}

TYPED_TEST(C10dConformance, WaitReturnsWhenKeysArriveAndThrowsOnTimeout) {
  auto other = this->v.open();
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    other->set("w1", b("1"));
    other->set("w2", b("2"));
  });
  // The setter is joined whatever the wait does: a wait that throws fails the test with its
  // message (a joinable thread going out of scope would abort the process instead).
  try {
    this->store->wait({"w1", "w2"}, std::chrono::milliseconds(5000));
  } catch (const std::exception& e) {
    setter.join();
    FAIL() << "waiting for w1 and w2: " << e.what();
  }
  setter.join();
  EXPECT_THROW(this->store->wait({"w1", "never"}, std::chrono::milliseconds(100)), c10::Error);
}

// clone() (LibTorch 2.x's, which c10d calls for a thread's own store) is the same store.
TEST(C10dStore, CloneSeesTheSameKeys) {
  MusterBackend backend;
  auto store = backend.open();
  auto clone = static_cast<C10dStore&>(*store).clone();
  store->set("k", b("v"));
  EXPECT_EQ(s(clone->get("k")), "v");
  clone->add("n", 2);
  EXPECT_EQ(store->add("n", 1), 3);
}

// closeGroup ends a group (an NCCL group's is a shutdown) and may be called again;
// a GroupCloser does it at the end of its scope.
TEST(ProcessGroup, CloseGroupEmptiesTheGroupAndMayBeCalledTwice) {
  WorkerEnv env;  // a world of one with no store address: an in-process store
  auto group = createProcessGroup(env, {.backend = "gloo", .timeout = kTimeout});
  ASSERT_TRUE(group.ok()) << group.status();
  {
    GroupCloser closer(*group);
    std::vector<at::Tensor> t{torch::ones({4})};
    group->pg->allreduce(t)->wait();
    EXPECT_TRUE(torch::equal(t[0], torch::ones({4})));
  }
  EXPECT_FALSE(group->pg);
  closeGroup(*group);
  EXPECT_FALSE(group->pg);
}

}  // namespace
}  // namespace muster::worker
