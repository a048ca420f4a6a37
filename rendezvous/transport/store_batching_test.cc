// Several requests per stream message, and one connection per process: the server applies a
// message's batch in order and puts answers that are ready together in one message for a
// client that asks; StoreClient shares its process's connection and batches what its threads
// send at once. Against a real server on 127.0.0.1:0.
#include <dirent.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <set>
#include <thread>

#include "muster/v1/store.grpc.pb.h"
#include "rendezvous/server/rendezvous_server.h"
#include "rendezvous/store/store_sessions.h"
#include "rendezvous/client/store_client.h"
#include "tests/support/store_server.h"

namespace muster::rendezvous {
namespace {

namespace fs = std::filesystem;

using testing::eventually;
using testing::startServer;

pb::StoreRequest request(uint64_t id) {
  pb::StoreRequest r;
  r.set_id(id);
  r.set_ns("raw");
  return r;
}

// Sockets this process has open (its clients' and, in-process, the server's side).
size_t openSockets() {
  size_t n = 0;
  for (const auto& entry : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    auto target = fs::read_symlink(entry.path(), ec);
    if (!ec && target.string().rfind("socket:", 0) == 0) ++n;
  }
  return n;
}

// Bounded wait until `count` operations are parked in the server's store.
bool eventuallyParked(const RendezvousServer& server, size_t count) {
  return eventually([&] { return server.memory()->pendingWaiters() == count; }, Millis(30000));
}

struct RawSession {
  explicit RawSession(const RendezvousServer& server, bool batchAnswers)
      : stub(pb::Store::NewStub(
            grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()))) {
    if (batchAnswers) context.AddMetadata(kBatchMetadataKey, "1");
    stream = stub->Session(&context);
  }
  // Reads messages until `answers` answers came; returns them by id, counting the messages.
  std::map<uint64_t, pb::StoreResponse> read(size_t answers, size_t* messages) {
    std::map<uint64_t, pb::StoreResponse> byId;
    *messages = 0;
    pb::StoreResponse response;
    while (byId.size() < answers && stream->Read(&response)) {
      ++*messages;
      for (auto& more : *response.mutable_batch()) byId[more.id()] = std::move(more);
      response.clear_batch();
      byId[response.id()] = response;
    }
    return byId;
  }
  std::unique_ptr<pb::Store::Stub> stub;
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<pb::StoreRequest, pb::StoreResponse>> stream;
};

TEST(StoreBatching, TheServerSaysItBatches) {
  auto server = startServer();
  RawSession session(*server, false);
  auto info = request(1);
  info.mutable_info();
  ASSERT_TRUE(session.stream->Write(info));
  size_t messages;
  auto answers = session.read(1, &messages);
  ASSERT_EQ(answers.count(1), 1u);
  EXPECT_TRUE(answers[1].info().batching());
}

// One message: a quiet set, then a get, an add, a second set and a get of it, and an entry
// carrying a batch of its own. Each is applied in order and answered on its own; the nested
// batch is refused alone.
TEST(StoreBatching, ABatchIsAppliedInOrderAndEachRequestAnswered) {
  auto server = startServer();
  RawSession session(*server, false);
  auto message = request(1);
  message.set_quiet(true);
  message.mutable_set()->set_key("k");
  message.mutable_set()->set_value("v1");
  auto get = request(2);
  get.mutable_get()->set_key("k");
  get.set_timeout_ms(10000);
  auto add = request(3);
  add.mutable_add()->set_key("n");
  add.mutable_add()->set_delta(5);
  auto set = request(4);
  set.mutable_set()->set_key("k");
  set.mutable_set()->set_value("v2");
  auto again = get;
  again.set_id(5);
  auto nested = request(6);
  nested.mutable_num_keys();
  *nested.add_batch() = add;
  *message.add_batch() = get;
  *message.add_batch() = add;
  *message.add_batch() = set;
  *message.add_batch() = again;
  *message.add_batch() = nested;
  ASSERT_TRUE(session.stream->Write(message));
  size_t messages;
  auto answers = session.read(5, &messages);
  ASSERT_EQ(answers.size(), 5u);
  EXPECT_EQ(answers.count(1), 0u) << "a quiet set that succeeds is not answered";
  EXPECT_EQ(answers[2].value(), "v1");
  EXPECT_EQ(answers[3].number(), 5);
  EXPECT_EQ(answers[4].code(), 0);
  EXPECT_EQ(answers[5].value(), "v2");
  EXPECT_EQ(answers[6].code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(answers[6].message().find("batch of its own"), std::string::npos);
  // The nested batch was not applied: n is still 5.
  auto check = request(7);
  check.mutable_add()->set_key("n");
  ASSERT_TRUE(session.stream->Write(check));
  answers = session.read(1, &messages);
  EXPECT_EQ(answers[7].number(), 5);
}

// 2,000 gets parked on one key are released by one set: a client that asks for batched answers
// gets them in fewer messages than answers; one that does not, one answer per message.
TEST(StoreBatching, AnswersReadyTogetherShareMessagesWhenAsked) {
  constexpr size_t kWaiters = 2000;
  auto server = startServer();
  for (bool batched : {true, false}) {
    RawSession session(*server, batched);
    std::string key = batched ? "go-batched" : "go-single";
    auto message = request(1);
    message.mutable_get()->set_key(key);
    message.set_timeout_ms(60000);
    for (uint64_t id = 2; id <= kWaiters; ++id) {
      auto get = request(id);
      get.mutable_get()->set_key(key);
      get.set_timeout_ms(60000);
      *message.add_batch() = get;
    }
    ASSERT_TRUE(session.stream->Write(message));
    auto setter = StoreClient::connect({.target = server->address(), .ns = "raw"},
                                       deadlineAfter(Millis(10000)));
    ASSERT_TRUE(setter.ok()) << setter.status();
    // Every get is parked before the set (the session's requests are applied in order).
    ASSERT_TRUE(eventuallyParked(*server, kWaiters));
    ASSERT_TRUE((*setter)->set(key, "now").ok());
    size_t messages;
    auto answers = session.read(kWaiters, &messages);
    ASSERT_EQ(answers.size(), kWaiters);
    for (const auto& [id, answer] : answers) ASSERT_EQ(answer.value(), "now") << id;
    if (batched) {
      EXPECT_LT(messages, kWaiters);
    } else {
      EXPECT_EQ(messages, kWaiters);
    }
  }
}

// Clients of one store in one process share one TCP connection, each on its own stream.
TEST(StoreBatching, ClientsInOneProcessShareOneConnection) {
  auto server = startServer();
  auto first = StoreClient::connect({.target = server->address(), .ns = "job"},
                                    deadlineAfter(Millis(10000)));
  ASSERT_TRUE(first.ok()) << first.status();
  size_t before = openSockets();
  std::vector<std::unique_ptr<StoreClient>> clients;
  for (int i = 0; i < 32; ++i) {
    auto client = StoreClient::connect({.target = server->address(), .ns = "job"},
                                       deadlineAfter(Millis(10000)));
    ASSERT_TRUE(client.ok()) << client.status();
    ASSERT_TRUE((*client)->set("k" + std::to_string(i), "v").ok());
    clients.push_back(std::move(*client));
  }
  // A set is write-behind, and the server applies each stream in order but the streams of one
  // connection side by side: an answer on each client's own stream proves its set applied.
  for (auto& client : clients) ASSERT_TRUE(client->numKeys().ok());
  EXPECT_EQ(clients.back()->numKeys().value(), 32);
  EXPECT_LE(openSockets(), before + 2) << "32 clients opened connections of their own";
  EXPECT_GE(server->sessions().openSessions(), 33u) << "each client has its own stream";
}

// 16 threads on one client: what they send at once goes out batched, and every answer comes
// back to its own caller.
TEST(StoreBatching, ThreadsSharingAClientEachGetTheirOwnAnswers) {
  auto server = startServer();
  auto client = StoreClient::connect({.target = server->address(), .ns = "job"},
                                     deadlineAfter(Millis(10000)));
  ASSERT_TRUE(client.ok()) << client.status();
  constexpr int kThreads = 16, kRounds = 300;
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        std::string key = fmt::format("t{}/{}", t, i % 7), value = fmt::format("{}:{}", t, i);
        if (!(*client)->set(key, value).ok()) ++wrong;
        auto got = (*client)->get(key, deadlineAfter(Millis(30000)));
        if (!got.ok() || *got != value) ++wrong;
        if (!(*client)->add("total", 1).ok()) ++wrong;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ((*client)->add("total", 0).value(), kThreads * kRounds);
}

}  // namespace
}  // namespace muster::rendezvous
