// rendezvousd and rendezvousctl as real processes: flags, the bound address, blocking across
// processes, token, port in use, graceful shutdown.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <thread>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "muster/v1/store.grpc.pb.h"
#include "rendezvous/client/store_client.h"
#include "tests/support/child.h"
#include "tests/support/programs.h"
#include "tests/support/metrics.h"

// Under ASan or TSan the daemon's memory is read from its heap metrics (MemoryRise).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MUSTER_HEAP_FROM_METRICS 1
#endif

namespace muster {
namespace {

using testing::Child;
namespace fs = std::filesystem;

std::string daemon() { return testing::rendezvousdPath(); }
std::string ctl() { return testing::ctlPath(); }
constexpr Millis kStart{15000};

// A running rendezvousd on 127.0.0.1 and a free port, read back from its log.
struct Daemon {
  // `prefix`: a command that execs the daemon (prlimit ... --).
  explicit Daemon(std::vector<std::string> extra = {}, std::vector<std::string> prefix = {}) {
    std::vector<std::string> argv = prefix;
    for (std::string a : {daemon(), std::string("--host"), std::string("127.0.0.1"), std::string("--port"), std::string("0")}) {
      argv.push_back(a);
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    child = std::make_unique<Child>(argv);
    auto line = child->waitForLine(R"(store listening on (127\.0\.0\.1:(\d+)))", kStart);
    if (line) {
      address = (*line)[1];
      port = std::stoi((*line)[2]);
    }
  }
  std::unique_ptr<Child> child;
  std::string address;
  int port = 0;
};

TEST(Rendezvousd, LogsTheAddressItBoundOnPortZero) {
  Daemon d;
  ASSERT_GT(d.port, 0) << d.child->stderrText();
  Child set({ctl(), "--addr", d.address, "set", "greeting", "hello"});
  ASSERT_EQ(set.wait(kStart)->code, 0) << set.stderrText();
  Child get({ctl(), "--addr", d.address, "get", "greeting"});
  ASSERT_EQ(get.wait(kStart)->code, 0) << get.stderrText();
  EXPECT_EQ(get.stdoutText(), "hello\n");
  Child health({ctl(), "--addr", d.address, "health"});
  ASSERT_EQ(health.wait(kStart)->code, 0) << health.stderrText();
  EXPECT_EQ(health.stdoutText(), "SERVING\n");
}

TEST(Rendezvousd, GetBlockedInOneProcessIsReleasedBySetFromAnother) {
  Daemon d;
  ASSERT_GT(d.port, 0);
  Child getter({ctl(), "--addr", d.address, "--ns", "job7", "--timeout", "60", "get", "ready"});
  // Still waiting: nobody has set the key.
  EXPECT_FALSE(getter.wait(Millis(300)).has_value());
  Child setter({ctl(), "--addr", d.address, "--ns", "job7", "set", "ready", "go"});
  ASSERT_EQ(setter.wait(kStart)->code, 0) << setter.stderrText();
  auto done = getter.wait(kStart);
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->code, 0) << getter.stderrText();
  EXPECT_EQ(getter.stdoutText(), "go\n");
}

TEST(Rendezvousd, TimedOutGetSaysWhichKeyIsMissing) {
  Daemon d;
  // The timeout covers connecting too: 0.3 s was used up by the connection alone under TSan on
  // a busy machine ("no store answered"), never reaching the wait this test is about.
  Child getter({ctl(), "--addr", d.address, "--timeout", "2", "get", "absent"});
  auto done = getter.wait(kStart);
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->code, 1);
  EXPECT_NE(getter.stderrText().find("missing 'absent'"), std::string::npos)
      << getter.stderrText();
}

TEST(Rendezvousd, SigtermEndsPendingWaitsWithAnErrorAndExitsZero) {
  Daemon d;
  ASSERT_GT(d.port, 0);
  // One stream: a get that cannot be answered, then num_keys. The daemon handles a session's
  // requests in order, so num_keys's answer proves the get is parked.
  auto stub = rendezvous::pb::Store::NewStub(
      grpc::CreateChannel(d.address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  auto stream = stub->Session(&context);
  rendezvous::pb::StoreRequest get;
  get.set_id(1);
  get.set_timeout_ms(60000);
  get.mutable_get()->set_key("never");
  rendezvous::pb::StoreRequest count;
  count.set_id(2);
  count.mutable_num_keys();
  ASSERT_TRUE(stream->Write(get));
  ASSERT_TRUE(stream->Write(count));
  rendezvous::pb::StoreResponse response;
  ASSERT_TRUE(stream->Read(&response));
  ASSERT_EQ(response.id(), 2u);
  auto start = Clock::now();
  d.child->kill(SIGTERM);
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.id(), 1u);
  EXPECT_EQ(response.code(), 14);  // UNAVAILABLE
  EXPECT_NE(response.message().find("shutting down"), std::string::npos) << response.message();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  auto exit = d.child->wait(kStart);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->code, 0) << d.child->stderrText();
  EXPECT_TRUE(d.child->waitForLine("received SIGTERM; shutting down", Millis(0)).has_value());
  EXPECT_TRUE(d.child->waitForLine(R"(shut down \(1 pending waits ended\))", Millis(0)).has_value())
      << d.child->stderrText();
}

TEST(Rendezvousd, TokenFileGuardsTheStore) {
  fs::path token = fs::temp_directory_path() / ("muster-token-" + std::to_string(getpid()));
  std::ofstream(token) << "let-me-in\n";
  Daemon d({"--token-file", token.string()});
  ASSERT_GT(d.port, 0) << d.child->stderrText();
  Child anonymous({ctl(), "--addr", d.address, "--timeout", "5", "set", "k", "v"});
  auto refused = anonymous.wait(kStart);
  EXPECT_EQ(refused->code, 1);
  EXPECT_NE(anonymous.stderrText().find("UNAUTHENTICATED"), std::string::npos)
      << anonymous.stderrText();
  Child member({ctl(), "--addr", d.address, "--token-file", token.string(), "set", "k", "v"});
  EXPECT_EQ(member.wait(kStart)->code, 0) << member.stderrText();
  EXPECT_TRUE(d.child->waitForLine("rejected a request from .* without a valid token", kStart));
  fs::remove(token);
}

TEST(Rendezvousd, PortInUseIsOneLineNamingTheAddressAndExitOne) {
  Daemon first;
  ASSERT_GT(first.port, 0);
  Child second({daemon(), "--host", "127.0.0.1", "--port", std::to_string(first.port)});
  auto exit = second.wait(kStart);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->code, 1);
  ASSERT_EQ(second.stderrLines().size(), 1u) << second.stderrText();
  EXPECT_NE(second.stderrText().find(first.address), std::string::npos) << second.stderrText();
  EXPECT_NE(second.stderrText().find("in use"), std::string::npos) << second.stderrText();
}

struct BadFlags {
  std::vector<std::string> args;
  std::string mentions;
};

class RendezvousdBadFlags : public ::testing::TestWithParam<BadFlags> {};

TEST_P(RendezvousdBadFlags, OneLineAndExitTwo) {
  std::vector<std::string> argv{daemon()};
  argv.insert(argv.end(), GetParam().args.begin(), GetParam().args.end());
  Child child(argv);
  auto exit = child.wait(kStart);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->code, 2) << child.stderrText();
  EXPECT_EQ(child.stderrLines().size(), 1u) << child.stderrText();
  EXPECT_NE(child.stderrText().find(GetParam().mentions), std::string::npos) << child.stderrText();
}

INSTANTIATE_TEST_SUITE_P(
    Flags, RendezvousdBadFlags,
    ::testing::Values(BadFlags{{"--bogus"}, "--bogus"},
                      BadFlags{{"--port", "70000"}, "--port"},
                      BadFlags{{"--port", "abc"}, "--port"},
                      BadFlags{{"--token-file", "/nonexistent/token"}, "/nonexistent/token"},
                      BadFlags{{"--max-value-bytes", "-5"}, "--max-value-bytes"},
                      BadFlags{{"--log-level", "loud"}, "--log-level"},
                      BadFlags{{"--tls-cert", "/etc/hostname"}, "--tls-key"},
                      BadFlags{{"--max-inflight-bytes", "1000"}, "max_inflight_bytes=1000"}));

// Any byte string as a key or value: as the shell passes it, or C-escaped with --escaped
// (NUL included), and printed escaped, unambiguously.
TEST(Rendezvousctl, KeysAndValuesAreAnyBytes) {
  Daemon d;
  std::string raw("\xff\xfe", 2);
  Child set({ctl(), "--addr", d.address, "set", raw, "v\xc3"});
  ASSERT_EQ(set.wait(kStart)->code, 0) << set.stderrText();
  Child get({ctl(), "--addr", d.address, "--escaped", "get", "\\xff\\xfe"});
  ASSERT_EQ(get.wait(kStart)->code, 0) << get.stderrText();
  EXPECT_EQ(get.stdoutText(), "v\\xc3\n");
  Child setNul({ctl(), "--addr", d.address, "--escaped", "set", "a\\0b", "x\\ny"});
  ASSERT_EQ(setNul.wait(kStart)->code, 0) << setNul.stderrText();
  Child getNul({ctl(), "--addr", d.address, "--escaped", "get", "a\\000b"});
  ASSERT_EQ(getNul.wait(kStart)->code, 0) << getNul.stderrText();
  EXPECT_EQ(getNul.stdoutText(), "x\\ny\n");
  Child raw2({ctl(), "--addr", d.address, "get", raw});
  ASSERT_EQ(raw2.wait(kStart)->code, 0) << raw2.stderrText();
  EXPECT_EQ(raw2.stdoutText(), "v\xc3\n");
  // A bad escape is one line and exit 2; nothing reaches the store.
  Child bad({ctl(), "--addr", d.address, "--escaped", "set", "k\\x", "v"});
  ASSERT_EQ(bad.wait(kStart)->code, 2);
  EXPECT_NE(bad.stderrText().find("key 'k\\x'"), std::string::npos) << bad.stderrText();
  EXPECT_EQ(bad.stderrLines().size(), 1u) << bad.stderrText();
}

// A key that is not UTF-8 from a caller without the token: refused for the token, once in
// the log; protobuf never sees a malformed request to log about (keys were `string`, and each
// attempt logged libprotobuf errors before any token check).
TEST(Rendezvousd, NonUtf8KeysFromStrangersAreRefusedWithoutALogFlood) {
  fs::path token = fs::temp_directory_path() / ("muster-token-utf8-" + std::to_string(getpid()));
  std::ofstream(token) << "let-me-in\n";
  Daemon d({"--token-file", token.string()});
  ASSERT_GT(d.port, 0) << d.child->stderrText();
  for (int i = 0; i < 5; ++i) {
    Child stranger({ctl(), "--addr", d.address, "--timeout", "2", "--escaped", "set", "\\xff\\xfe", "v"});
    auto exit = stranger.wait(kStart);
    ASSERT_TRUE(exit.has_value());
    EXPECT_EQ(exit->code, 1) << stranger.stderrText();
    EXPECT_NE(stranger.stderrText().find("token"), std::string::npos) << stranger.stderrText();
  }
  EXPECT_TRUE(d.child->waitForLine("rejected a request from .* without a valid token", kStart));
  Child member({ctl(), "--addr", d.address, "--token-file", token.string(), "--escaped", "set",
                "\\xff\\xfe", "v"});
  EXPECT_EQ(member.wait(kStart)->code, 0) << member.stderrText();
  Child read({ctl(), "--addr", d.address, "--token-file", token.string(), "--escaped", "get",
              "\\xff\\xfe"});
  EXPECT_EQ(read.wait(kStart)->code, 0) << read.stderrText();
  EXPECT_EQ(read.stdoutText(), "v\n");
  std::string log = d.child->stderrText();
  EXPECT_EQ(log.find("libprotobuf"), std::string::npos) << log;
  EXPECT_EQ(log.find("UTF-8"), std::string::npos) << log;
  fs::remove(token);
}

// `n` TCP connections to 127.0.0.1:port, open until closed (the kernel completes them from
// the listen backlog whether or not the server accepts); from the loopback address `from`.
std::vector<int> connectMany(int port, int n, const char* from = "127.0.0.1") {
  std::vector<int> fds;
  for (int i = 0; i < n; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in local{};
    local.sin_family = AF_INET;
    local.sin_addr.s_addr = inet_addr(from);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof(local)) == 0 &&
        connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      fds.push_back(fd);
    } else if (fd >= 0) {
      close(fd);
    }
  }
  return fds;
}

// A flood of connections. gRPC 1.51's listener stopped for good after a failed accept, so the
// daemon exited for its supervisor when the descriptors ran out (300 connections at a limit of
// 128): every job's rendezvous state went with it, and anyone who reached the port, with no
// token, could do it. The port is the daemon's own now (ConnectionGate): it stays up, a member's
// session goes on through the flood, and health answers within a second of it ending.
TEST(Rendezvousd, AFloodOfConnectionsNeitherEndsTheDaemonNorAMembersSession) {
  fs::path token = fs::temp_directory_path() / ("muster-token-flood-" + std::to_string(getpid()));
  std::ofstream(token) << "let-me-in\n";
  Daemon d({"--token-file", token.string()}, {"/usr/bin/prlimit", "--nofile=128:128", "--"});
  ASSERT_GT(d.port, 0) << d.child->stderrText();
  // A member's session: one stream on one connection, kept open through the flood. Were its
  // connection closed to make room, the stream would end (no client here reconnects it).
  auto stub = rendezvous::pb::Store::NewStub(
      grpc::CreateChannel(d.address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.AddMetadata("x-muster-token", "let-me-in");
  auto session = stub->Session(&context);
  uint64_t id = 0;
  auto numKeys = [&]() -> int {
    rendezvous::pb::StoreRequest count;
    count.set_id(++id);
    count.set_ns("job");
    count.mutable_num_keys();
    rendezvous::pb::StoreResponse response;
    if (!session->Write(count) || !session->Read(&response)) return -1;
    return response.code() == 0 ? static_cast<int>(response.number()) : -2;
  };
  ASSERT_EQ(numKeys(), 0);

  // 600 connections opened and closed, then 300 held: well past the 64 the daemon holds at a
  // limit of 128 descriptors, each newcomer pushing out the oldest stranger.
  for (int round = 0; round < 2; ++round) {
    for (int fd : connectMany(d.port, 300)) close(fd);
  }
  auto held = connectMany(d.port, 300);
  EXPECT_GT(held.size(), 100u);
  // While the flood is held: the member's session works, and so does a newcomer's health check.
  EXPECT_EQ(numKeys(), 0) << d.child->stderrText();
  {
    Child health({ctl(), "--addr", d.address, "--timeout", "5", "health"});
    ASSERT_EQ(health.wait(kStart)->code, 0) << health.stderrText() << d.child->stderrText();
  }
  EXPECT_TRUE(d.child->waitForLine("connection from 127\\.0\\.0\\.1 closed to make room", Millis(2000)))
      << d.child->stderrText();
  for (int fd : held) close(fd);
  // Within a second of the flood's end (the call's own deadline).
  Child health({ctl(), "--addr", d.address, "--timeout", "1", "health"});
  ASSERT_EQ(health.wait(kStart)->code, 0) << health.stderrText() << d.child->stderrText();
  EXPECT_EQ(health.stdoutText(), "SERVING\n");
  EXPECT_EQ(numKeys(), 0) << "the member's session did not survive the flood";
  EXPECT_FALSE(d.child->wait(Millis(0)).has_value()) << d.child->stderrText();
  session->WritesDone();
  fs::remove(token);
}

// Connections from one address past --max-connections-per-peer: that address's oldest that
// never made a call with the token give way; when all of its connections are members', the
// newcomer is refused. Other addresses are not touched.
TEST(Rendezvousd, OneAddressPastItsCapGivesWayOnlyItself) {
  Daemon d({"--max-connections-per-peer", "4"});
  ASSERT_GT(d.port, 0) << d.child->stderrText();
  // A member from 127.0.0.1 (no token on this daemon: any call makes a member).
  auto member = rendezvous::StoreClient::connect({.target = d.address, .ns = "job"}, deadlineAfter(kStart));
  ASSERT_TRUE(member.ok()) << member.status();
  ASSERT_TRUE((*member)->set("k", "v").ok());
  // 20 silent connections from 127.0.0.2: at most 4 stay open.
  auto strangers = connectMany(d.port, 20, "127.0.0.2");
  ASSERT_EQ(strangers.size(), 20u);
  // The daemon closes 16 of them (the oldest). gRPC's settings come first: a closed one reads
  // end-of-file (or a reset) after them.
  std::vector<bool> ended(strangers.size(), false);
  size_t closed = 0;
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (closed < 16 && std::chrono::steady_clock::now() < until) {
    for (size_t i = 0; i < strangers.size(); ++i) {
      char buffer[4096];
      ssize_t n;
      while (!ended[i] && (n = recv(strangers[i], buffer, sizeof(buffer), MSG_DONTWAIT)) != -1) {
        if (n == 0) ended[i] = true;
      }
      if (!ended[i] && errno == ECONNRESET) ended[i] = true;
    }
    closed = static_cast<size_t>(std::count(ended.begin(), ended.end(), true));
    if (closed < 16) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(closed, 16u) << d.child->stderrText();
  // The four left are the newest.
  for (size_t i = 16; i < strangers.size(); ++i) EXPECT_FALSE(ended[i]) << "connection " << i;
  // The member from the other address goes on.
  EXPECT_EQ((*member)->get("k", deadlineAfter(Millis(5000))).value_or(""), "v");
  EXPECT_TRUE(d.child->waitForLine("connection from 127\\.0\\.0\\.2 closed to make room", Millis(2000)))
      << d.child->stderrText();
  for (int fd : strangers) close(fd);
  EXPECT_FALSE(d.child->wait(Millis(0)).has_value()) << d.child->stderrText();
}

// One job at its quota while another keeps working: limits were global, so one job could use
// up max_total_bytes for every other job on the daemon.
TEST(Rendezvousd, AJobAtItsQuotaIsRefusedWhileAnotherKeepsWorking) {
  Daemon d({"--max-job-bytes", "100"});
  ASSERT_GT(d.port, 0) << d.child->stderrText();
  std::string sixty(60, 'x');
  auto setIn = [&](const std::string& ns, const std::string& key) {
    Child c({ctl(), "--addr", d.address, "--ns", ns, "set", key, sixty});
    auto exit = c.wait(kStart);
    return std::make_pair(exit ? exit->code : -1, c.stderrText());
  };
  EXPECT_EQ(setIn("job-a/0", "k1").first, 0);
  auto [code, err] = setIn("job-a/1", "k2");
  EXPECT_EQ(code, 1) << err;
  EXPECT_NE(err.find("job 'job-a' is at its quota"), std::string::npos) << err;
  EXPECT_NE(err.find("max_job_bytes=100"), std::string::npos) << err;
  EXPECT_EQ(setIn("job-b/0", "k1").first, 0) << "job-b is not job-a";
  EXPECT_EQ(setIn("job-b/0", "k1").first, 0);
}

// One call of `bytes` message bytes on `method`: a well-formed StoreRequest set of that size
// (its value is one 1 MiB slice repeated, so the sender holds 1 MiB). The status it ended with.
grpc::Status hugeCall(const std::string& address, const std::string& method, size_t bytes,
                      const std::string& token = "") {
  std::string head;
  auto varint = [&head](uint64_t v) {
    for (; v >= 0x80; v >>= 7) head.push_back(static_cast<char>((v & 0x7f) | 0x80));
    head.push_back(static_cast<char>(v));
  };
  size_t value = bytes - 32;
  std::string setOp = "\x0a\x01k\x12";
  std::string valueLen;
  std::swap(head, valueLen);
  varint(value);
  std::swap(head, valueLen);
  head.push_back('\x52');  // field 10 (set), length-delimited
  varint(setOp.size() + valueLen.size() + value);
  head += setOp + valueLen;
  grpc::Slice chunk(std::string(1u << 20, 'x'));
  std::vector<grpc::Slice> slices{grpc::Slice(head)};
  for (size_t left = value; left > 0; left -= std::min(left, chunk.size())) {
    slices.push_back(left >= chunk.size() ? chunk : grpc::Slice(std::string(left, 'x')));
  }
  grpc::ByteBuffer request(slices.data(), slices.size());
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  if (!token.empty()) context.AddMetadata("x-muster-token", token);
  grpc::CompletionQueue queue;
  auto call = stub.PrepareUnaryCall(&context, method, request, &queue);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, nullptr);
  void* tag;
  bool ok;
  queue.Next(&tag, &ok);
  return status;
}

// How much the daemon's memory rose above what it held when this was made, at its peak since.
// Normally its resident peak (VmHWM), what an operator sees. Under ASan or TSan, whose allocator
// (quarantine, per-thread caches, redzones) and shadow swell the resident set by themselves, the
// peak of the bytes the daemon's allocations held (muster_heap_peak_bytes, counted by the
// sanitizer's allocation hooks): what our code holds, under the same bound.
class MemoryRise {
 public:
  MemoryRise(pid_t pid, int metricsPort) : pid_(pid), metricsPort_(metricsPort) {
#ifdef MUSTER_HEAP_FROM_METRICS
    std::string text = testing::httpBody(testing::httpGet(metricsPort_, "/metrics"));
    before_ = static_cast<size_t>(testing::metricValue(text, "muster_heap_bytes").value_or(0));
    startPeak_ = static_cast<size_t>(testing::metricValue(text, "muster_heap_peak_bytes").value_or(0));
#else
    before_ = testing::memoryBytes(pid_, "VmHWM");
#endif
  }
  // 0 while the peak is still the one from before (the daemon's start): nothing since rose above it.
  size_t operator()() const {
#ifdef MUSTER_HEAP_FROM_METRICS
    std::string text = testing::httpBody(testing::httpGet(metricsPort_, "/metrics"));
    auto peak = static_cast<size_t>(testing::metricValue(text, "muster_heap_peak_bytes").value_or(0));
    return peak > startPeak_ ? peak - before_ : 0;
#else
    return testing::memoryBytes(pid_, "VmHWM") - before_;
#endif
  }
  // How far the start's own peak sits above `before`: a rise this test cannot see.
  size_t blind() const { return startPeak_ > before_ ? startPeak_ - before_ : 0; }

 private:
  [[maybe_unused]] pid_t pid_;
  [[maybe_unused]] int metricsPort_;
  size_t before_ = 0, startPeak_ = 0;
};

// A caller without the token sent 1 GB: the daemon read it all before it looked at the token,
// and peaked at 2.6 GB (9.4 GB with a key that parsed). Nothing is now read for a caller before
// its method and token are checked; a message is capped at the largest legal request; and what
// gRPC holds for calls in flight (an unguarded health check, a member's oversized call) is
// bounded by --max-inflight-bytes.
TEST(Rendezvousd, AGigabyteCallWithoutTheTokenCostsTheDaemonLittleMemory) {
  fs::path token = fs::temp_directory_path() / ("muster-token-huge-" + std::to_string(getpid()));
  std::ofstream(token) << "let-me-in\n";
  constexpr size_t kMiB = size_t{1} << 20;
  Daemon d({"--token-file", token.string(), "--max-value-bytes", std::to_string(16 * kMiB), "--max-keys-per-call", "1024",
            "--max-inflight-bytes", std::to_string(64 * kMiB), "--metrics-port", "0"});
  ASSERT_GT(d.port, 0) << d.child->stderrText();
  auto line = d.child->waitForLine(R"(metrics on http://127\.0\.0\.1:(\d+)/metrics)", kStart);
  ASSERT_TRUE(line.has_value()) << d.child->stderrText();
  MemoryRise rise(d.child->pid(), std::stoi((*line)[1]));
  ASSERT_LT(rise.blind(), 16 * kMiB);
  constexpr size_t kGigabyte = size_t{1} << 30;
  for (const char* method : {"/muster.v1.Store/Call", "/muster.v1.Store/Session",
                             "/muster.v1.Rendezvous/Join", "/muster.v1.Rendezvous/Watch",
                             "/muster.v1.Rendezvous/Heartbeat", "/muster.v1.Rendezvous/Report",
                             "/no.Such/Method"}) {
    auto status = hugeCall(d.address, method, kGigabyte);
    EXPECT_TRUE(status.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
                status.error_code() == grpc::StatusCode::UNIMPLEMENTED)
        << method << " " << status.error_code() << " " << status.error_message();
    EXPECT_LT(rise(), 16 * kMiB) << method;
  }
  // Health needs no token, and a stranger's check is answered without being read.
  auto check = hugeCall(d.address, "/grpc.health.v1.Health/Check", kGigabyte);
  EXPECT_TRUE(check.ok()) << check.error_message();
  EXPECT_LT(rise(), 16 * kMiB);
  // A member's oversized call is refused for its size, within the in-flight bound.
  for (const char* method : {"/muster.v1.Store/Call", "/grpc.health.v1.Health/Check"}) {
    auto member = hugeCall(d.address, method, kGigabyte, "let-me-in");
    EXPECT_EQ(member.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << member.error_message();
  }
  EXPECT_LT(rise(), 256 * kMiB);
  Child health({ctl(), "--addr", d.address, "--timeout", "10", "health"});
  ASSERT_EQ(health.wait(kStart)->code, 0) << health.stderrText();
  EXPECT_EQ(health.stdoutText(), "SERVING\n");
  Child set({ctl(), "--addr", d.address, "--token-file", token.string(), "set", "k", "v"});
  EXPECT_EQ(set.wait(kStart)->code, 0) << set.stderrText();
  fs::remove(token);
}

TEST(Rendezvousd, MetricsAreScrapedOverHttpAndPassPromtool) {
  fs::path token = fs::temp_directory_path() / ("muster-token-metrics-" + std::to_string(getpid()));
  std::ofstream(token) << "let-me-in\n";
  Daemon d({"--token-file", token.string(), "--max-job-bytes", "100", "--metrics-port", "0"});
  ASSERT_GT(d.port, 0) << d.child->stderrText();
  auto line = d.child->waitForLine(R"(metrics on http://127\.0\.0\.1:(\d+)/metrics)", kStart);
  ASSERT_TRUE(line.has_value()) << d.child->stderrText();
  int metricsPort = std::stoi((*line)[1]);
  auto ctlAs = [&](bool member, std::vector<std::string> args) {
    std::vector<std::string> argv{ctl(), "--addr", d.address, "--ns", "job-a/0"};
    if (member) argv.insert(argv.end(), {"--token-file", token.string()});
    argv.insert(argv.end(), args.begin(), args.end());
    Child c(argv);
    auto exit = c.wait(kStart);
    return exit ? exit->code : -1;
  };
  EXPECT_EQ(ctlAs(true, {"set", "k", std::string(60, 'x')}), 0);
  EXPECT_EQ(ctlAs(true, {"set", "k2", std::string(60, 'x')}), 1);  // over max_job_bytes=100
  EXPECT_EQ(ctlAs(false, {"--timeout", "2", "set", "k3", "v"}), 1);  // no token

  std::vector<int> idle = connectMany(metricsPort, 100);
  auto start = Clock::now();
  std::string response = testing::httpGet(metricsPort, "/metrics");
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  for (int fd : idle) close(fd);
  ASSERT_EQ(response.rfind("HTTP/1.1 200", 0), 0u) << response;
  EXPECT_NE(response.find("text/plain; version=0.0.4"), std::string::npos) << response;
  std::string text = testing::httpBody(response);
  EXPECT_EQ(testing::promtoolProblems(text, (fs::temp_directory_path() /
                                             ("muster-metrics-" + std::to_string(getpid()))).string()),
            "");
  EXPECT_EQ(testing::metricValue(text, "muster_store_keys"), 1.0) << text;
  EXPECT_EQ(testing::metricValue(text, "muster_store_bytes"), 61.0) << text;
  EXPECT_EQ(testing::metricValue(text, "muster_store_jobs"), 1.0) << text;
  EXPECT_EQ(testing::metricValue(text, "muster_store_operations_total{op=\"set\"}"), 2.0) << text;
  EXPECT_GE(testing::metricValue(text, "muster_rejected_calls_total{reason=\"token\"}").value_or(0), 1.0) << text;
  EXPECT_EQ(testing::metricValue(text, "muster_rejected_calls_total{reason=\"job_quota\"}"), 1.0) << text;
  EXPECT_EQ(testing::metricValue(text, "muster_rendezvous_runs{state=\"active\"}"), 0.0) << text;
  EXPECT_GT(testing::metricValue(text, "process_resident_memory_bytes").value_or(0), 0.0) << text;
  EXPECT_GT(testing::metricValue(text, "muster_heap_bytes").value_or(0), 0.0) << text;
  EXPECT_GT(testing::metricValue(text, "process_max_fds").value_or(0), 0.0) << text;

  EXPECT_EQ(testing::httpGet(metricsPort, "/secrets").rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_EQ(testing::httpExchange(metricsPort, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
                .rfind("HTTP/1.1 405", 0),
            0u);
  // Garbage and an endless header are dropped; the endpoint goes on serving.
  testing::httpExchange(metricsPort, "\x16\x03\x01 not http\r\n\r\n", Millis(2000));
  testing::httpExchange(metricsPort, "GET /metrics HTTP/1.1\r\nX: " + std::string(100000, 'a'), Millis(2000));
  EXPECT_EQ(testing::httpGet(metricsPort, "/metrics").rfind("HTTP/1.1 200", 0), 0u);
  fs::remove(token);
}

TEST(Rendezvousctl, AnUnknownFlagIsNamedAndNoSubcommandIsSaid) {
  Child bogus({ctl(), "--bogus"});
  ASSERT_EQ(bogus.wait(kStart)->code, 2);
  EXPECT_NE(bogus.stderrText().find("--bogus"), std::string::npos) << bogus.stderrText();
  EXPECT_EQ(bogus.stderrLines().size(), 1u) << bogus.stderrText();
  Child none({ctl(), "--addr", "127.0.0.1:1"});
  ASSERT_EQ(none.wait(kStart)->code, 2);
  EXPECT_NE(none.stderrText().find("a subcommand is required: set, get"), std::string::npos)
      << none.stderrText();
}

TEST(Rendezvousctl, UnreachableStoreFailsWithinTheTimeout) {
  Child ctlChild({ctl(), "--addr", "127.0.0.1:1", "--timeout", "0.5", "num-keys"});
  auto exit = ctlChild.wait(kStart);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->code, 1);
  EXPECT_NE(ctlChild.stderrText().find("127.0.0.1:1"), std::string::npos) << ctlChild.stderrText();
}

}  // namespace
}  // namespace muster
