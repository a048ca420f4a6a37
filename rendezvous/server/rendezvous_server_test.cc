// The gRPC store as a server: many clients, parked waiters, disconnects, limits, token, TLS,
// health, shutdown and reconnect, all against a real server on 127.0.0.1:0. Over 700 lines
// on purpose: one case per guarantee of one server, sharing its start-up helpers.
#include <dirent.h>
#include <gtest/gtest.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <filesystem>
#include <thread>

#include "common/files.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "muster/v1/rendezvous.grpc.pb.h"
#include "muster/v1/store.grpc.pb.h"
#include "rendezvous/client/store_client.h"
#include "rendezvous/server/rendezvous_server.h"
#include "rendezvous/rpc/auth.h"
#include "rendezvous/store/store_sessions.h"
#include "tests/support/store_server.h"
#include "tests/support/tcp_proxy.h"

namespace muster::rendezvous {
namespace {

namespace fs = std::filesystem;

using testing::eventually;
using testing::startServer;

absl::StatusOr<std::unique_ptr<StoreClient>> connectTo(const RendezvousServer& server,
                                                       ClientOptions options = {},
                                                       Millis timeout = Millis(10000)) {
  options.target = server.address();
  return StoreClient::connect(options, deadlineAfter(timeout));
}

size_t threadCount() {
  size_t n = 0;
  for (const auto& entry : fs::directory_iterator("/proc/self/task")) {
    (void)entry;
    ++n;
  }
  return n;
}


pb::StoreRequest getRequest(uint64_t id, const std::string& key, uint64_t timeoutMs) {
  pb::StoreRequest req;
  req.set_id(id);
  req.set_ns("raw");
  req.set_timeout_ms(timeoutMs);
  req.mutable_get()->set_key(key);
  return req;
}

// A client of namespace job/0 whose connection passes through `proxy`.
absl::StatusOr<std::unique_ptr<StoreClient>> throughProxy(const testing::TcpProxy& proxy) {
  return StoreClient::connect({.target = "127.0.0.1:" + std::to_string(proxy.port()), .ns = "job/0"},
                              deadlineAfter(Millis(10000)));
}

// A set is posted (write-behind: the client does not wait), and the connection breaks before
// the server has it. The client sends it again on its new connection: no set is lost. It used
// to reconnect and never resend; another rank then waited for the key until its deadline.
TEST(RendezvousServer, ASetLostWithItsConnectionIsSentAgain) {
  auto server = startServer();
  ASSERT_NE(server, nullptr);
  testing::TcpProxy proxy(server->port());
  auto client = throughProxy(proxy);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->set("before", "1").ok());
  ASSERT_EQ((*client)->get("before", deadlineAfter(Millis(5000))).value(), "1");
  proxy.hold();
  ASSERT_TRUE((*client)->set("lost", "v").ok());
  ASSERT_TRUE((*client)->multiSet({"a", "b"}, {"1", "2"}).ok());
  ASSERT_TRUE(eventually([&] { return proxy.held() > 0; })) << "the sets never left the client";
  proxy.dropAll();
  // Another client, straight to the server, waits for what was posted.
  auto other = connectTo(*server, {.ns = "job/0"});
  ASSERT_TRUE(other.ok()) << other.status();
  // The poster's next operation finds the connection gone, reconnects and sends the sets again
  // first.
  EXPECT_TRUE((*client)->check({"before"}).value());
  auto values = (*other)->multiGet({"lost", "a", "b"}, deadlineAfter(Millis(10000)));
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(*values, (std::vector<std::string>{"v", "1", "2"}));
}

// A client that posts a set and goes away at once, its connection broken under it: the set is
// sent again on a new connection before the client is gone.
TEST(RendezvousServer, ASetLostJustBeforeTheClientEndsIsSentAgainFirst) {
  auto server = startServer();
  ASSERT_NE(server, nullptr);
  testing::TcpProxy proxy(server->port());
  {
    auto client = throughProxy(proxy);
    ASSERT_TRUE(client.ok()) << client.status();
    ASSERT_TRUE((*client)->numKeys().ok());
    proxy.hold();
    ASSERT_TRUE((*client)->set("last words", "bye").ok());
    ASSERT_TRUE(eventually([&] { return proxy.held() > 0; }));
    proxy.dropAll();
  }  // the client goes at once
  auto other = connectTo(*server, {.ns = "job/0"});
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ((*other)->get("last words", deadlineAfter(Millis(5000))).value(), "bye");
}

TEST(RendezvousServer, SixtyFourClientsAddingConcurrentlyGetTheExactTotal) {
  auto server = startServer();
  constexpr int kClients = 64, kAdds = 100;
  std::vector<std::unique_ptr<StoreClient>> clients;
  for (int i = 0; i < kClients; ++i) {
    auto client = connectTo(*server, {.ns = "job"});
    ASSERT_TRUE(client.ok()) << client.status();
    clients.push_back(std::move(*client));
  }
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (auto& client : clients) {
    threads.emplace_back([&client, &failures] {
      for (int i = 0; i < kAdds; ++i) {
        if (!client->add("counter", 1).ok()) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(clients[0]->add("counter", 0).value(), kClients * kAdds);
  EXPECT_GE(server->sessions().openSessions(), static_cast<size_t>(kClients));
}

TEST(RendezvousServer, TenThousandBlockedGetsParkWithoutThreads) {
  auto server = startServer();
  constexpr int kWaiters = 10000;
  size_t threadsBefore = threadCount();
  auto channel = grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials());
  auto stub = pb::Store::NewStub(channel);
  grpc::ClientContext context;
  auto stream = stub->Session(&context);
  for (int i = 0; i < kWaiters; ++i) {
    ASSERT_TRUE(stream->Write(getRequest(i + 1, "key" + std::to_string(i), 60000)));
  }
  // The server reads a session's requests in order: once num_keys is answered, every get
  // before it has been parked.
  pb::StoreRequest barrier;
  barrier.set_id(kWaiters + 1);
  barrier.set_ns("raw");
  barrier.mutable_num_keys();
  ASSERT_TRUE(stream->Write(barrier));
  pb::StoreResponse response;
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.id(), static_cast<uint64_t>(kWaiters + 1));
  EXPECT_EQ(server->memory()->pendingWaiters(), static_cast<size_t>(kWaiters));
  // Parked operations hold no thread: the process has about as many threads as before.
  EXPECT_LT(threadCount(), threadsBefore + 32);

  auto setter = connectTo(*server, {.ns = "raw"});
  ASSERT_TRUE(setter.ok());
  for (int base = 0; base < kWaiters; base += 1000) {
    std::vector<std::string> keys, values;
    for (int i = base; i < base + 1000; ++i) {
      keys.push_back("key" + std::to_string(i));
      values.push_back("value" + std::to_string(i));
    }
    ASSERT_TRUE((*setter)->multiSet(keys, values).ok());
  }
  std::vector<bool> seen(kWaiters + 1, false);
  for (int i = 0; i < kWaiters; ++i) {
    ASSERT_TRUE(stream->Read(&response));
    ASSERT_EQ(response.code(), 0) << response.message();
    ASSERT_GE(response.id(), 1u);
    ASSERT_LE(response.id(), static_cast<uint64_t>(kWaiters));
    EXPECT_EQ(response.value(), "value" + std::to_string(response.id() - 1));
    seen[response.id()] = true;
  }
  EXPECT_EQ(std::count(seen.begin() + 1, seen.end(), true), kWaiters);
  EXPECT_EQ(server->memory()->pendingWaiters(), 0u);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST(RendezvousServer, SessionAnswersOutOfOrderSoABlockedGetHoldsNothingBack) {
  auto server = startServer();
  auto stub = pb::Store::NewStub(
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  auto stream = stub->Session(&context);
  ASSERT_TRUE(stream->Write(getRequest(1, "later", 30000)));
  pb::StoreRequest set;
  set.set_id(2);
  set.set_ns("raw");
  set.mutable_set()->set_key("later");
  set.mutable_set()->set_value("now");
  ASSERT_TRUE(stream->Write(set));
  pb::StoreResponse first, second;
  ASSERT_TRUE(stream->Read(&first));
  ASSERT_TRUE(stream->Read(&second));
  // The get is released by the set, so the set is answered first, or both come together.
  std::map<uint64_t, pb::StoreResponse> byId{{first.id(), first}, {second.id(), second}};
  ASSERT_EQ(byId.size(), 2u);
  EXPECT_EQ(byId[1].value(), "now");
  EXPECT_EQ(byId[2].code(), 0);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST(RendezvousServer, ClientThatDisconnectsMidWaitFreesItsWaiter) {
  auto server = startServer();
  auto stub = pb::Store::NewStub(
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext context;
    auto stream = stub->Session(&context);
    ASSERT_TRUE(stream->Write(getRequest(1, "never", 0)));
    ASSERT_TRUE(eventually([&] { return server->memory()->pendingWaiters() == 1; }));
    context.TryCancel();
    stream->Finish();
  }
  EXPECT_TRUE(eventually([&] { return server->memory()->pendingWaiters() == 0; }));
  EXPECT_TRUE(eventually([&] { return server->sessions().openSessions() == 0; }));

  // A unary get bounded only by its gRPC deadline: the server drops the waiter at the deadline.
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + Millis(200));
  pb::StoreResponse response;
  auto status = stub->Call(&context, getRequest(1, "never", 0), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(eventually([&] { return server->memory()->pendingWaiters() == 0; }));
}

// One-request calls are served on several completion queues, each call's events on its own
// queue's thread (FrontDoor). Thousands of unary gets park over four connections; half their
// clients leave (some the moment they started), and each such waiter is dropped at once; the
// other half are answered by sets; every call is over on both sides and nothing is left in
// flight.
TEST(RendezvousServer, ParkedUnaryCallsOverSeveralConnectionsEndOnceEach) {
  auto server = startServer();
  constexpr int kConnections = 4;
  constexpr int kCalls = 2000;
  std::vector<std::unique_ptr<pb::Store::Stub>> stubs;
  for (int c = 0; c < kConnections; ++c) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection each
    stubs.push_back(pb::Store::NewStub(
        grpc::CreateCustomChannel(server->address(), grpc::InsecureChannelCredentials(), args)));
  }
  struct Call {
    grpc::ClientContext context;
    pb::StoreRequest request;
    pb::StoreResponse response;
    grpc::Status status;
  };
  std::vector<std::unique_ptr<Call>> calls;
  std::mutex mu;
  std::condition_variable cv;
  int left = kCalls;
  auto startCall = [&](int i) {
    auto call = std::make_unique<Call>();
    call->request = getRequest(0, "key" + std::to_string(i), 60000);
    call->request.set_ns("parked");
    Call* p = call.get();
    calls.push_back(std::move(call));
    stubs[i % kConnections]->async()->Call(&p->context, &p->request, &p->response, [&, p](grpc::Status s) {
      std::lock_guard<std::mutex> lock(mu);
      p->status = std::move(s);
      if (--left == 0) cv.notify_all();
    });
  };
  // Every fourth call is cancelled by its client as soon as it has started: its end may reach
  // the server before the call itself has been looked at.
  for (int i = 0; i < kCalls; ++i) {
    startCall(i);
    if (i % 4 == 1) calls.back()->context.TryCancel();
  }
  ASSERT_TRUE(eventually([&] { return server->memory()->pendingWaiters() == kCalls * 3 / 4; },
                         Millis(60000)))
      << server->memory()->pendingWaiters();
  // The other odd ones leave while parked.
  for (int i = 3; i < kCalls; i += 4) calls[i]->context.TryCancel();
  ASSERT_TRUE(eventually([&] { return server->memory()->pendingWaiters() == kCalls / 2; }, Millis(60000)))
      << server->memory()->pendingWaiters();
  auto setter = connectTo(*server, {.ns = "parked"});
  ASSERT_TRUE(setter.ok());
  std::vector<std::string> keys, values;
  for (int i = 0; i < kCalls; i += 2) {
    keys.push_back("key" + std::to_string(i));
    values.push_back("value" + std::to_string(i));
  }
  ASSERT_TRUE((*setter)->multiSet(keys, values).ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return left == 0; })) << left << " calls open";
  }
  for (int i = 0; i < kCalls; ++i) {
    if (i % 2 == 0) {
      ASSERT_TRUE(calls[i]->status.ok()) << i << ": " << calls[i]->status.error_message();
      EXPECT_EQ(calls[i]->response.value(), "value" + std::to_string(i));
    } else {
      EXPECT_EQ(calls[i]->status.error_code(), grpc::StatusCode::CANCELLED) << i;
    }
  }
  EXPECT_EQ(server->memory()->pendingWaiters(), 0u);
  EXPECT_TRUE(eventually([&] { return server->callsInFlight() == 0; })) << server->callsInFlight();
}

// Shutdown with unary calls parked: each ends UNAVAILABLE, and the server's queues drain.
TEST(RendezvousServer, ShutdownEndsParkedUnaryCalls) {
  auto server = startServer();
  auto stub = pb::Store::NewStub(grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  constexpr int kCalls = 200;
  std::vector<grpc::ClientContext> contexts(kCalls);
  std::vector<pb::StoreRequest> requests(kCalls);
  std::vector<pb::StoreResponse> responses(kCalls);
  std::vector<grpc::Status> statuses(kCalls);
  std::mutex mu;
  std::condition_variable cv;
  int left = kCalls;
  for (int i = 0; i < kCalls; ++i) {
    requests[i] = getRequest(0, "never", 60000);
    stub->async()->Call(&contexts[i], &requests[i], &responses[i], [&, i](grpc::Status s) {
      std::lock_guard<std::mutex> lock(mu);
      statuses[i] = std::move(s);
      if (--left == 0) cv.notify_all();
    });
  }
  ASSERT_TRUE(eventually([&] { return server->memory()->pendingWaiters() == kCalls; }, Millis(30000)));
  EXPECT_EQ(server->callsInFlight(), kCalls);
  server->shutdown();
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return left == 0; }));
  for (const auto& status : statuses) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  }
  EXPECT_EQ(server->callsInFlight(), 0);
}

// Bytes that are no StoreRequest on a session: the session ends INVALID_ARGUMENT, saying so,
// and the server goes on serving.
TEST(RendezvousServer, ASessionRequestThatDoesNotParseEndsTheSession) {
  auto server = startServer();
  auto channel = grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials());
  grpc::GenericStub generic(channel);
  grpc::ClientContext context;
  grpc::CompletionQueue cq;
  auto stream = generic.PrepareCall(&context, "/muster.v1.Store/Session", &cq);
  void* tag;
  bool ok;
  stream->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  grpc::Slice garbage(std::string("\xff\xff\xff\xff not a protobuf"));
  grpc::ByteBuffer bytes(&garbage, 1);
  stream->Write(bytes, reinterpret_cast<void*>(2));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  grpc::Status status;
  stream->Finish(&status, reinterpret_cast<void*>(3));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_NE(status.error_message().find("does not parse"), std::string::npos) << status.error_message();
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  auto client = connectTo(*server, {.ns = "after"});
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->set("k", "v").ok());
  EXPECT_EQ(*(*client)->get("k", deadlineAfter(Millis(10000))), "v");
}

TEST(RendezvousServer, UnaryCallServesEveryOperation) {
  auto server = startServer();
  auto stub = pb::Store::NewStub(
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  pb::StoreRequest req;
  req.set_ns("u");
  req.mutable_add()->set_key("n");
  req.mutable_add()->set_delta(3);
  pb::StoreResponse resp;
  grpc::ClientContext c1;
  ASSERT_TRUE(stub->Call(&c1, req, &resp).ok());
  EXPECT_EQ(resp.number(), 3);
  grpc::ClientContext c2;
  pb::StoreResponse got;
  auto get = getRequest(0, "n", 1000);
  get.set_ns("u");
  ASSERT_TRUE(stub->Call(&c2, get, &got).ok());
  EXPECT_EQ(got.value(), "3");
  // A store error is the call's gRPC status too, with the store's message.
  grpc::ClientContext c3;
  auto missing = getRequest(0, "n", 50);
  auto status = stub->Call(&c3, missing, &got);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_NE(status.error_message().find("missing 'n'"), std::string::npos);
}

TEST(RendezvousServer, OversizedRequestFailsAloneAndTheServerKeepsServing) {
  ServerOptions options;
  options.limits.maxValueBytes = 1024;
  auto server = startServer(options);
  auto client = connectTo(*server, {.ns = "job"});
  ASSERT_TRUE(client.ok());
  auto status = (*client)->set("big", std::string(4096, 'x'));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("max_value_bytes=1024"), std::string::npos) << status;
  EXPECT_TRUE((*client)->set("small", "fits").ok());
  auto other = connectTo(*server, {.ns = "job"});
  ASSERT_TRUE(other.ok());
  EXPECT_EQ((*other)->get("small", deadlineAfter(Millis(1000))).value(), "fits");
}

TEST(RendezvousServer, TokenIsRequiredWhenConfigured) {
  ServerOptions options;
  options.token = "s3cret";
  auto server = startServer(options);
  auto anonymous = connectTo(*server, {.ns = "job"});
  EXPECT_EQ(anonymous.status().code(), absl::StatusCode::kUnauthenticated) << anonymous.status();
  auto wrong = connectTo(*server, {.ns = "job", .token = "guess"});
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kUnauthenticated) << wrong.status();
  auto right = connectTo(*server, {.ns = "job", .token = "s3cret"});
  ASSERT_TRUE(right.ok()) << right.status();
  EXPECT_TRUE((*right)->set("k", "v").ok());

  auto stub = pb::Store::NewStub(
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  pb::StoreResponse response;
  auto status = stub->Call(&context, getRequest(1, "k", 100), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_GE(server->rejectedCalls(), 3u);
}

TEST(RendezvousServer, RendezvousBesideTheStoreAsksForTheSameToken) {
  ServerOptions options;
  options.token = "s3cret";
  auto server = startServer(options);
  auto stub = pb::Rendezvous::NewStub(
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  pb::HeartbeatRequest request;
  request.set_run_id("job");
  request.set_node_id("n");
  pb::HeartbeatResponse response;
  grpc::ClientContext anonymous;
  EXPECT_EQ(stub->Heartbeat(&anonymous, request, &response).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  grpc::ClientContext wrong;
  wrong.AddMetadata(kTokenMetadataKey, "s3cre7");
  EXPECT_EQ(stub->Heartbeat(&wrong, request, &response).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  grpc::ClientContext member;
  member.AddMetadata(kTokenMetadataKey, "s3cret");
  // Admitted: the service answers for itself (there is no such run yet).
  EXPECT_EQ(stub->Heartbeat(&member, request, &response).error_code(), grpc::StatusCode::NOT_FOUND);
}

// The order a node's calls reach the service in is not the order it sent them: a watch sent
// before the node's success report can be taken after it, when the round has ended. Over the
// wire, in that order: the report's answer says the job succeeded, and the watch gets the same
// end, not NOT_FOUND (which launch took for a lost node, and a good job for a failed one).
TEST(RendezvousServer, AWatchTakenAfterTheLastReportGetsTheJobsSuccess) {
  auto server = startServer();
  auto stub = pb::Rendezvous::NewStub(
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  pb::JoinRequest join;
  join.set_run_id("x33");
  join.mutable_node()->set_node_id("n1");
  join.mutable_node()->set_host("h1");
  join.mutable_node()->set_local_world_size(1);
  join.mutable_node()->set_wanted_rank(-1);
  join.set_min_nodes(1);
  join.set_max_nodes(1);
  join.set_join_timeout_ms(30000);
  join.set_keep_alive_ms(30000);
  pb::Assignment assignment;
  grpc::ClientContext joining;
  joining.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  ASSERT_TRUE(stub->Join(&joining, join, &assignment).ok());

  pb::ReportRequest report;
  report.set_run_id("x33");
  report.set_node_id("n1");
  report.set_round(assignment.round());
  report.set_outcome(pb::ReportRequest::SUCCEEDED);
  pb::ReportResponse reported;
  grpc::ClientContext reporting;
  ASSERT_TRUE(stub->Report(&reporting, report, &reported).ok());
  ASSERT_TRUE(reported.has_ended());
  EXPECT_EQ(reported.ended().kind(), pb::RoundEvent::JOB_SUCCEEDED);

  pb::WatchRequest watch;
  watch.set_run_id("x33");
  watch.set_node_id("n1");
  watch.set_round(assignment.round());
  grpc::ClientContext watching;
  watching.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto reader = stub->Watch(&watching, watch);
  pb::RoundEvent event;
  ASSERT_TRUE(reader->Read(&event)) << "the watch of an ended round ended without its end: "
                                    << reader->Finish().error_message();
  EXPECT_EQ(event.kind(), pb::RoundEvent::JOB_SUCCEEDED);
  EXPECT_EQ(event.round(), assignment.round());
  EXPECT_FALSE(reader->Read(&event));
  EXPECT_TRUE(reader->Finish().ok());

  // A heartbeat between the end and the node's exit is answered, not refused.
  pb::HeartbeatRequest beat;
  beat.set_run_id("x33");
  beat.set_node_id("n1");
  pb::HeartbeatResponse beaten;
  grpc::ClientContext beating;
  EXPECT_TRUE(stub->Heartbeat(&beating, beat, &beaten).ok());
}

TEST(RendezvousServer, WithoutTokenAnyClientIsServed) {
  auto server = startServer();
  auto client = connectTo(*server, {.ns = "job", .token = "unneeded"});
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->set("k", "v").ok());
}

class TlsFiles {
 public:
  TlsFiles() {
    dir_ = fs::temp_directory_path() / ("muster-tls-" + std::to_string(getpid()));
    fs::create_directories(dir_);
    for (const char* name : {"good", "other"}) {
      std::string cmd = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
                        "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout " +
                        (dir_ / (std::string(name) + ".key")).string() + " -out " +
                        (dir_ / (std::string(name) + ".crt")).string() + " 2>/dev/null";
      ok_ = ok_ && std::system(cmd.c_str()) == 0;
    }
  }
  ~TlsFiles() { fs::remove_all(dir_); }
  bool ok() const { return ok_; }
  std::string read(const std::string& name) const {
    return readFile((dir_ / name).string(), "test file").value();
  }

 private:
  fs::path dir_;
  bool ok_ = true;
};

TEST(RendezvousServer, TlsServesTrustingClientsOnly) {
  TlsFiles tls;
  ASSERT_TRUE(tls.ok()) << "openssl could not make a test certificate";
  ServerOptions options;
  options.tlsCertPem = tls.read("good.crt");
  options.tlsKeyPem = tls.read("good.key");
  auto server = startServer(options);

  auto trusted = connectTo(*server, {.ns = "job", .tlsCaPem = tls.read("good.crt"),
                                     .tlsServerName = "localhost"});
  ASSERT_TRUE(trusted.ok()) << trusted.status();
  EXPECT_TRUE((*trusted)->set("k", "over tls").ok());
  EXPECT_EQ((*trusted)->get("k", deadlineAfter(Millis(1000))).value(), "over tls");

  auto plaintext = connectTo(*server, {.ns = "job"}, Millis(500));
  EXPECT_FALSE(plaintext.ok());
  auto wrongCa = connectTo(*server, {.ns = "job", .tlsCaPem = tls.read("other.crt"),
                                     .tlsServerName = "localhost"},
                           Millis(500));
  EXPECT_FALSE(wrongCa.ok());
}

// A key that is not the certificate's, or material that is not PEM, is named as such; it was
// "cannot listen on ...: the address is not available".
TEST(RendezvousServer, AWrongTlsKeyIsNamedNotTakenForAnAddressProblem) {
  TlsFiles tls;
  ASSERT_TRUE(tls.ok()) << "openssl could not make a test certificate";
  ServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.tlsCertPem = tls.read("good.crt");
  options.tlsKeyPem = tls.read("other.key");
  auto mismatched = RendezvousServer::start(options);
  EXPECT_EQ(mismatched.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mismatched.status().message().find("the TLS key does not match the certificate"),
            std::string::npos) << mismatched.status();
  options.tlsKeyPem = "not a key";
  auto garbage = RendezvousServer::start(options);
  EXPECT_NE(garbage.status().message().find("the TLS key is not"), std::string::npos) << garbage.status();
  options.tlsCertPem = tls.read("good.key");
  options.tlsKeyPem = tls.read("good.key");
  auto swapped = RendezvousServer::start(options);
  EXPECT_NE(swapped.status().message().find("the TLS certificate is not a PEM certificate"), std::string::npos)
      << swapped.status();
}

TEST(RendezvousServer, TlsNeedsBothCertificateAndKey) {
  ServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.tlsCertPem = "x";
  auto server = RendezvousServer::start(options);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
}

// grpc.health.v1 as gRPC's own service answers it, without the token (probes carry none):
// Check for the server and each service, NOT_FOUND for others; Watch hears of shutdown.
TEST(RendezvousServer, HealthAnswersCheckAndWatchWithoutTheToken) {
  ServerOptions options;
  options.token = "s3cret";
  auto server = startServer(options);
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  using grpc::health::v1::HealthCheckResponse;
  for (const char* service : {"", "muster.v1.Store", "muster.v1.Rendezvous"}) {
    grpc::ClientContext context;
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(service);
    HealthCheckResponse response;
    ASSERT_TRUE(stub->Check(&context, request, &response).ok()) << service;
    EXPECT_EQ(response.status(), HealthCheckResponse::SERVING) << service;
  }
  // A stranger's request is not read (it could be large): every name gets the server's status.
  // A member's is.
  grpc::health::v1::HealthCheckRequest other;
  other.set_service("no.Such");
  HealthCheckResponse response;
  grpc::ClientContext stranger;
  ASSERT_TRUE(stub->Check(&stranger, other, &response).ok());
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);
  grpc::ClientContext member;
  member.AddMetadata(kTokenMetadataKey, "s3cret");
  EXPECT_EQ(stub->Check(&member, other, &response).error_code(), grpc::StatusCode::NOT_FOUND);

  grpc::ClientContext watching;
  auto watch = stub->Watch(&watching, grpc::health::v1::HealthCheckRequest());
  ASSERT_TRUE(watch->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);
  server->shutdown();
  ASSERT_TRUE(watch->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
  EXPECT_FALSE(watch->Read(&response));
  EXPECT_TRUE(watch->Finish().ok());
}

// The server's memory for calls in flight cannot be set below one largest request, and the
// largest request must fit gRPC's 2 GiB messages.
TEST(RendezvousServer, AnInflightBoundBelowTheLargestRequestIsRefused) {
  ServerOptions options;
  options.limits.maxValueBytes = 1u << 20;
  options.maxInflightBytes = 1u << 20;
  auto server = RendezvousServer::start(options);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(server.status().message().find("cannot hold the largest request"), std::string::npos)
      << server.status();
  options.maxInflightBytes = 0;
  options.limits.maxValueBytes = size_t{3} << 30;
  EXPECT_EQ(RendezvousServer::start(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RendezvousServer, ShutdownEndsPendingWaitsWithUnavailable) {
  auto server = startServer();
  auto client = connectTo(*server, {.ns = "job"});
  ASSERT_TRUE(client.ok());
  absl::StatusOr<std::string> result;
  std::thread waiter([&] { result = (*client)->get("never", deadlineAfter(Millis(60000))); });
  ASSERT_TRUE(eventually([&] { return server->memory()->pendingWaiters() == 1; }));
  auto start = Clock::now();
  server->shutdown();
  waiter.join();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable) << result.status();
  EXPECT_NE(result.status().message().find("shutting down"), std::string::npos) << result.status();
}

// Sessions opening while the server shuts down: a session admitted just before it closes is
// finished as it starts (it used to be finished before it had a call to finish: a crash), and
// every stream ends: OK, UNAVAILABLE, or CANCELLED for one that reached gRPC after its
// shutdown had begun (gRPC's own answer to those).
TEST(RendezvousServer, SessionsOpeningDuringShutdownEachEnd) {
  auto server = startServer();
  std::atomic<bool> stop{false};
  std::atomic<int> opened{0}, unexpected{0};
  std::vector<std::thread> openers;
  for (int t = 0; t < 4; ++t) {
    openers.emplace_back([&] {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      auto stub = pb::Store::NewStub(
          grpc::CreateCustomChannel(server->address(), grpc::InsecureChannelCredentials(), args));
      while (!stop.load()) {
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
        auto stream = stub->Session(&context);
        pb::StoreRequest set;
        set.set_ns("raw");
        set.set_id(1);
        set.mutable_set()->set_key("k");
        set.mutable_set()->set_value("v");
        stream->Write(set);
        stream->WritesDone();
        pb::StoreResponse response;
        while (stream->Read(&response)) {
        }
        auto status = stream->Finish();
        ++opened;
        if (!status.ok() && status.error_code() != grpc::StatusCode::UNAVAILABLE &&
            status.error_code() != grpc::StatusCode::CANCELLED) {
          ++unexpected;
          ADD_FAILURE() << status.error_code() << ": " << status.error_message();
        }
      }
    });
  }
  ASSERT_TRUE(eventually([&] { return opened.load() >= 50; }, Millis(60000)));
  auto start = Clock::now();
  server->shutdown();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  stop = true;
  for (auto& t : openers) t.join();
  EXPECT_EQ(unexpected.load(), 0);
  EXPECT_EQ(server->sessions().openSessions(), 0u);
}

TEST(RendezvousServer, SecondServerOnTheSamePortIsRefusedNamingTheAddress) {
  auto first = startServer();
  ServerOptions options;
  options.host = "127.0.0.1";
  options.port = first->port();
  auto second = RendezvousServer::start(options);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find(first->address()), std::string::npos)
      << second.status();
  EXPECT_NE(second.status().message().find("in use"), std::string::npos) << second.status();
}

TEST(RendezvousServer, ClientReconnectsAfterTheStoreComesBack) {
  auto server = startServer();
  int port = server->port();
  auto client = connectTo(*server, {.ns = "job"});
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->set("k", "before").ok());
  server.reset();
  server = startServer({}, port);
  ASSERT_NE(server, nullptr);
  // Idempotent operations go through on a new session; the old keys died with the old store.
  EXPECT_TRUE((*client)->set("k", "after").ok());
  EXPECT_EQ((*client)->get("k", deadlineAfter(Millis(5000))).value(), "after");
  EXPECT_EQ((*client)->add("n", 1).value(), 1);
}

TEST(RendezvousServer, ConnectToNothingFailsWithinTheDeadlineNamingTheTarget) {
  auto server = startServer();
  std::string address = server->address();
  server.reset();
  auto start = Clock::now();
  auto client = StoreClient::connect({.target = address}, deadlineAfter(Millis(300)));
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(client.status().message().find(address), std::string::npos) << client.status();
}

}  // namespace
}  // namespace muster::rendezvous
