// SharedDirChannel in one process: ranks are threads with their own channels on one
// in-memory store and real files; faults are made by hand on the files.
#include "worker/shared_dir_channel.h"

#include <gtest/gtest.h>
#include <xxhash.h>
#include <sys/mount.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "rendezvous/store/local_store.h"
#include "tests/support/child.h"
#include "worker/c10d_store.h"

namespace muster::worker {
namespace {

namespace fs = std::filesystem;

class ChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = muster::testing::freshTestDir("muster-chan");
    memory_ = std::make_shared<rendezvous::MemoryStore>();
  }
  void TearDown() override {
    if (mounted_) umount(dir_.c_str());
    fs::remove_all(dir_);
  }

  WorkerEnv env(int rank, int world) {
    WorkerEnv e;
    e.rank = rank;
    e.worldSize = world;
    e.localRank = rank;
    e.localWorldSize = world;
    e.runId = e.jobId = "job";
    e.sharedDir = dir_.string();
    return e;
  }
  std::unique_ptr<SharedDirChannel> open(int rank, int world, Millis timeout = Millis(10000),
                                         const std::string& dir = "") {
    std::shared_ptr<rendezvous::Store> local =
        std::make_shared<rendezvous::LocalStore>(memory_, "job/0");
    auto store = c10::make_intrusive<C10dStore>(local, std::chrono::milliseconds(10000));
    auto c = SharedDirChannel::create(env(rank, world), store, {.dir = dir, .timeout = timeout});
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }
  // Runs body(rank, channel) on `world` threads.
  void ranks(int world, const std::function<void(int, SharedDirChannel&)>& body) {
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        auto c = open(r, world);
        ASSERT_NE(c, nullptr);
        body(r, *c);
      });
    }
    for (auto& t : threads) t.join();
  }
  std::vector<fs::path> files(const std::string& ext) {
    std::vector<fs::path> out;
    for (const auto& e : fs::recursive_directory_iterator(dir_)) {
      if (e.path().extension() == ext) out.push_back(e.path());
    }
    return out;
  }

  fs::path dir_;
  std::shared_ptr<rendezvous::MemoryStore> memory_;
  bool mounted_ = false;
};

TEST_F(ChannelTest, SendRecvKeepsEveryDtypeAndShape) {
  std::vector<at::Tensor> tensors{
      torch::randn({3, 4}), torch::randn({2, 3, 5}, torch::kFloat64),
      torch::arange(10, torch::kInt64), torch::arange(-5, 5, torch::kInt32).to(torch::kInt8),
      torch::randint(0, 255, {7}, torch::kUInt8), torch::rand({4}) > 0.5,
      torch::randn({8}).to(torch::kFloat16), torch::randn({8}).to(torch::kBFloat16),
      torch::tensor(3.5),  // 0-d
      torch::empty({0, 4}),
      torch::randn({4, 6}).t(),  // not contiguous
  };
  ranks(2, [&](int rank, SharedDirChannel& c) {
    for (const auto& t : tensors) {
      if (rank == 0) {
        ASSERT_TRUE(c.send(t, 1).ok());
      } else {
        auto got = c.recv(0);
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_EQ(got->scalar_type(), t.scalar_type());
        EXPECT_EQ(got->sizes(), t.sizes());
        EXPECT_TRUE(torch::equal(*got, t)) << t.scalar_type();
      }
    }
  });
  EXPECT_TRUE(files(".mt").empty()) << "received files must be deleted";
}

TEST_F(ChannelTest, ReceivedTensorLivesOnTheMappedFile) {
  auto c = open(0, 1);
  ASSERT_TRUE(c->send(torch::arange(1 << 20, torch::kFloat32), 0).ok());
  auto path = files(".mt").at(0).string();
  auto got = c->recv(0);
  ASSERT_TRUE(got.ok());
  // Deleted by its last (only) receiver, yet still mapped under the tensor: no copy was made.
  EXPECT_FALSE(fs::exists(path));
  std::ifstream maps("/proc/self/maps");
  std::string text((std::istreambuf_iterator<char>(maps)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find(path + " (deleted)"), std::string::npos);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(got->data_ptr()) % 64, 0u);
  EXPECT_EQ(got->index({12345}).item<float>(), 12345.0f);
}

TEST_F(ChannelTest, CollectivesOnFourRanks) {
  ranks(4, [&](int rank, SharedDirChannel& c) {
    auto mine = torch::full({3}, static_cast<float>(rank));
    auto b = c.broadcast(rank == 2 ? torch::arange(5, torch::kInt64) : at::Tensor(), 2);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE(torch::equal(*b, torch::arange(5, torch::kInt64)));
    auto g = c.gather(mine, 1);
    ASSERT_TRUE(g.ok()) << g.status();
    if (rank == 1) {
      ASSERT_EQ(g->size(), 4u);
      for (int r = 0; r < 4; ++r) EXPECT_TRUE(torch::equal((*g)[r], torch::full({3}, float(r))));
    } else {
      EXPECT_TRUE(g->empty());
    }
    auto all = c.allGather(mine);
    ASSERT_TRUE(all.ok()) << all.status();
    for (int r = 0; r < 4; ++r) EXPECT_TRUE(torch::equal((*all)[r], torch::full({3}, float(r))));
  });
  EXPECT_TRUE(files(".mt").empty());
}

TEST_F(ChannelTest, BytesAndStringsInEveryOperation) {
  std::string binary("a\0b\xff", 4);
  ranks(3, [&](int rank, SharedDirChannel& c) {
    std::string mine = "decoded sentence from rank " + std::to_string(rank);
    if (rank == 0) {
      ASSERT_TRUE(c.sendBytes(binary, 2).ok());
    }
    if (rank == 2) {
      EXPECT_EQ(c.recvBytes(0).value(), binary);
    }
    EXPECT_EQ(c.broadcastBytes(rank == 0 ? "vocab" : "", 0).value(), "vocab");
    auto g = c.gatherBytes(mine, 0);
    ASSERT_TRUE(g.ok());
    if (rank == 0) {
      EXPECT_EQ((*g)[2], "decoded sentence from rank 2");
    }
    auto all = c.allGatherBytes(mine);
    ASSERT_TRUE(all.ok());
    EXPECT_EQ((*all)[1], "decoded sentence from rank 1");
    EXPECT_EQ(c.broadcastBytes(rank == 1 ? std::string() : "x", 1).value(), "");
  });
}

TEST_F(ChannelTest, ManyTransfersInFlightDoNotMix) {
  ranks(2, [&](int rank, SharedDirChannel& c) {
    if (rank == 0) {
      for (int i = 0; i < 3; ++i) ASSERT_TRUE(c.send(torch::full({2}, float(i)), 1, 0).ok());
      for (int i = 0; i < 2; ++i) ASSERT_TRUE(c.send(torch::full({2}, float(10 + i)), 1, 7).ok());
    } else {
      // Tag 7 first, although tag 0 was sent first.
      EXPECT_EQ(c.recv(0, 7)->index({0}).item<float>(), 10.0f);
      EXPECT_EQ(c.recv(0, 0)->index({0}).item<float>(), 0.0f);
      EXPECT_EQ(c.recv(0, 7)->index({0}).item<float>(), 11.0f);
      EXPECT_EQ(c.recv(0, 0)->index({0}).item<float>(), 1.0f);
      EXPECT_EQ(c.recv(0, 0)->index({0}).item<float>(), 2.0f);
    }
  });
}

// One rank sends to itself; `spoil` damages the file before the receive.
absl::Status spoiledReceive(SharedDirChannel& c,
                            const std::function<void(const fs::path&)>& spoil) {
  EXPECT_TRUE(c.send(torch::arange(1000, torch::kFloat32), 0).ok());
  spoil(c.roundDir() + std::string("/p2p.0.0.0.") + "0.mt");
  return c.recv(0).status();
}

TEST_F(ChannelTest, CorruptedFileIsRefusedNamingFileAndRank) {
  auto c = open(0, 1);
  auto s = spoiledReceive(*c, [](const fs::path& p) {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(500);
    f.put('\x42');
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("corrupted"), std::string::npos) << s;
  EXPECT_NE(s.message().find("p2p.0.0.0.0.mt from rank 0"), std::string::npos) << s;
}

// Rewrites `n` bytes of the header at `offset` and, like a forger would, its checksum.
void forgeHeader(const fs::path& p, size_t offset, const void* bytes, size_t n) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  std::string head(128, '\0');
  f.read(head.data(), static_cast<std::streamsize>(head.size()));
  uint32_t headerBytes = 0;
  std::memcpy(&headerBytes, head.data() + 52, 4);
  head.resize(headerBytes);
  f.clear();
  f.seekg(0);
  f.read(head.data(), headerBytes);
  std::memcpy(head.data() + offset, bytes, n);
  std::memset(head.data() + 56, 0, 8);
  uint64_t sum = XXH3_64bits(head.data(), head.size());
  std::memcpy(head.data() + 56, &sum, 8);
  f.clear();
  f.seekp(0);
  f.write(head.data(), headerBytes);
}
void forgeFirstDimension(const fs::path& p, int64_t dim) { forgeHeader(p, 64, &dim, 8); }
void forgeKind(const fs::path& p, uint32_t kind) { forgeHeader(p, 12, &kind, 4); }

// A file whose header says it holds bytes, with a shape larger than the file: recv() made a
// tensor of that dtype and shape without checking them against the file's length (reads past
// the mapping). A kind there is not is refused too.
TEST_F(ChannelTest, AFileOfAnotherKindIsCheckedAsStrictly) {
  {
    auto c = open(0, 1);
    auto s = spoiledReceive(*c, [](const fs::path& p) {
      forgeKind(p, 2);
      forgeFirstDimension(p, int64_t{1} << 20);
    });
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(s.message().find("do not add up"), std::string::npos) << s;
  }
  {
    auto c = open(0, 1);
    auto s = spoiledReceive(*c, [](const fs::path& p) { forgeKind(p, 7); });
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(s.message().find("unknown payload kind 7"), std::string::npos) << s;
  }
  {
    // Undefined is below NumOptions but has no element size: c10::Error came out of recv().
    auto c = open(0, 1);
    auto s = spoiledReceive(*c, [](const fs::path& p) {
      auto undefined = static_cast<int32_t>(at::ScalarType::Undefined);
      forgeHeader(p, 40, &undefined, 4);
    });
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(s.message().find("unknown dtype code"), std::string::npos) << s;
  }
}

TEST_F(ChannelTest, HeaderIsCheckedCompletely) {
  {
    auto c = open(0, 1);
    // A flipped shape byte: the header's own checksum catches it.
    auto s = spoiledReceive(*c, [](const fs::path& p) {
      std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(65);
      f.put('\x7f');
    });
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(s.message().find("the header's checksum does not match"), std::string::npos) << s;
  }
  {
    auto c = open(0, 1);
    auto s = spoiledReceive(*c, [](const fs::path& p) { forgeFirstDimension(p, -1000); });
    EXPECT_NE(s.message().find("negative dimension (-1000)"), std::string::npos) << s;
  }
  {
    auto c = open(0, 1);
    auto s = spoiledReceive(*c, [](const fs::path& p) { forgeFirstDimension(p, int64_t{1} << 62); });
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(s.message().find("do not add up"), std::string::npos) << s;
  }
}

// A received tensor is an ordinary tensor: in-place ops work (they crashed on the read-only
// mapping), and change neither the file nor what another receiver gets.
TEST_F(ChannelTest, ReceivedTensorsAreWritableAndPrivate) {
  ranks(3, [](int rank, SharedDirChannel& c) {
    auto got = c.broadcast(torch::arange(4096, torch::kFloat32), 0);
    ASSERT_TRUE(got.ok()) << got.status();
    got->add_(rank * 1000);
    got->mul_(2);
    EXPECT_EQ(got->index({10}).item<float>(), (10.0f + rank * 1000) * 2);
    auto again = c.allGather(torch::tensor({static_cast<float>(rank)}));
    ASSERT_TRUE(again.ok());
  });
}

TEST_F(ChannelTest, TruncatedFileIsRefused) {
  auto c = open(0, 1);
  auto s = spoiledReceive(*c, [](const fs::path& p) { fs::resize_file(p, 1000); });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s;
  auto c2 = open(0, 1);
  (void)c2;
}

TEST_F(ChannelTest, ForeignFileWithTheSameNameIsRefused) {
  auto c = open(0, 1);
  // A valid channel file from another transfer, put in place of the announced one.
  ASSERT_TRUE(c->send(torch::arange(1000, torch::kFloat32), 0, 99).ok());
  fs::path other = c->roundDir() + std::string("/p2p.0.0.99.0.mt");
  auto s = spoiledReceive(*c, [&](const fs::path& p) { fs::rename(other, p); });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("foreign"), std::string::npos) << s;
}

TEST_F(ChannelTest, NonChannelFileIsRefused) {
  auto c = open(0, 1);
  auto s = spoiledReceive(*c, [](const fs::path& p) { std::ofstream(p) << std::string(5000, 'x'); });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("bad magic"), std::string::npos) << s;
}

TEST_F(ChannelTest, MissingAnnouncementTimesOutNamingTheSender) {
  auto start = std::chrono::steady_clock::now();
  std::thread other([&] { auto c = open(1, 2, Millis(300)); });
  auto c = open(0, 2, Millis(300));
  other.join();
  auto s = c->recv(1).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("rank 1 did not announce"), std::string::npos) << s;
  EXPECT_NE(s.message().find("p2p.1.0.0.0.mt"), std::string::npos) << s;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST_F(ChannelTest, FullFilesystemFailsTheSenderAndTellsTheReceiver) {
  if (mount("tmpfs", dir_.c_str(), "tmpfs", 0, "size=1m") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root): " << std::strerror(errno);
  }
  mounted_ = true;
  auto c = open(0, 1);
  auto sent = c->send(torch::zeros({1 << 20}), 0);  // 4 MiB into 1 MiB
  EXPECT_EQ(sent.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(sent.message().find("No space left"), std::string::npos) << sent;
  EXPECT_NE(sent.message().find("rank 0"), std::string::npos) << sent;
  auto got = c->recv(0).status();
  EXPECT_EQ(got.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(got.message().find("rank 0 could not send"), std::string::npos) << got;
  EXPECT_TRUE(files(".tmp").empty()) << "a failed write must not leave its temporary file";
  EXPECT_TRUE(c->send(torch::zeros({1000}), 0).ok()) << "small transfers still fit";
}

TEST_F(ChannelTest, DirectoryThatIsNotSharedIsCaughtAtStart) {
  fs::path elsewhere = dir_ / "node1-local";
  fs::create_directories(elsewhere);
  std::vector<absl::Status> results(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      std::shared_ptr<rendezvous::Store> local =
          std::make_shared<rendezvous::LocalStore>(memory_, "job/0");
      auto store = c10::make_intrusive<C10dStore>(local, std::chrono::milliseconds(10000));
      auto e = env(r, 2);
      if (r == 1) e.sharedDir = elsewhere.string();  // rank 1's "shared" dir is its own
      results[r] = SharedDirChannel::create(e, store, {.timeout = Millis(5000)}).status();
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& s : results) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("rank 1 cannot see"), std::string::npos) << s;
  }
}

TEST_F(ChannelTest, DeadRoundsAreCleanedWhenANewRoundStarts) {
  fs::create_directories(dir_ / "job" / "0");
  std::ofstream(dir_ / "job" / "0" / ".stale.123.tmp") << "half a file";
  auto e = env(0, 1);
  e.round = 1;  // MUSTER_ROUND
  std::shared_ptr<rendezvous::Store> local = std::make_shared<rendezvous::LocalStore>(memory_, "job/1");
  auto c = SharedDirChannel::create(e, c10::make_intrusive<C10dStore>(local), {});
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(fs::exists(dir_ / "job" / "0"));
  EXPECT_EQ((*c)->roundDir(), (dir_ / "job" / "1").string());
}

}  // namespace
}  // namespace muster::worker
