// The TCPStore front against PyTorch's own clients and server: torch 1.13's Python client and
// LibTorch's C++ client run the same operations against the front and against torch's
// TCPStore server in the same test; torch 2.x's messages byte by byte over a real socket;
// garbage, absurd lengths and clients that vanish mid-message.
#include "rendezvous/transport/tcpstore_front.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <unistd.h>

#include <fcntl.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/contract.h"
#include "common/net.h"
#include "rendezvous/store/local_store.h"
#include "rendezvous/transport/tcpstore_wire.h"
#include "tests/support/child.h"

namespace muster {
namespace {

using rendezvous::MemoryStore;
using rendezvous::TcpStoreFront;
using testing::Child;
namespace wire = rendezvous::tcpstore;
using Ms = std::chrono::milliseconds;

constexpr char kPython[] = "/usr/bin/python3";

std::string source(const std::string& rel) { return testing::sourceDir() + "/" + rel; }

// A plain TCP client: what the bytes on the wire do, without any library in between.
class RawClient {
 public:
  explicit RawClient(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    EXPECT_EQ(connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  }
  ~RawClient() {
    if (fd_ >= 0) close(fd_);
  }
  void send(const std::string& bytes) {
    ASSERT_EQ(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
  }
  void send(const wire::Request& r) { send(wire::encode(r, wire::Generation::kV2)); }
  // Exactly n bytes, or what came before the deadline or EOF.
  std::string recv(size_t n, Ms timeout = Ms(10000)) {
    std::string out;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (out.size() < n) {
      auto left = std::chrono::duration_cast<Ms>(deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left)) <= 0) break;
      char buf[65536];
      ssize_t got = ::recv(fd_, buf, std::min(sizeof(buf), n - out.size()), 0);
      if (got <= 0) break;
      out.append(buf, static_cast<size_t>(got));
    }
    return out;
  }
  // True when the server closed the connection within the timeout.
  bool closedByServer(Ms timeout = Ms(10000)) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return false;
    char c;
    return ::recv(fd_, &c, 1, 0) <= 0;
  }
  int64_t i64() {
    std::string b = recv(8);
    int64_t v = -1;
    if (b.size() == 8) std::memcpy(&v, b.data(), 8);
    return v;
  }
  std::string bytes() {
    int64_t n = i64();
    return n < 0 ? "<none>" : recv(static_cast<size_t>(n));
  }

 private:
  int fd_ = -1;
};

std::string u32(uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }

class Front : public ::testing::Test {
 protected:
  void SetUp() override {
    memory_ = std::make_shared<MemoryStore>();
    std::string why;
    int fd = net::listenTcp("127.0.0.1", 0, why);
    ASSERT_GE(fd, 0) << why;
    auto front = TcpStoreFront::start(memory_, fd, {.runId = "job", .round = 0});
    ASSERT_TRUE(front.ok()) << front.status();
    front_ = std::move(*front);
  }
  rendezvous::LocalStore round(uint64_t r) {
    return rendezvous::LocalStore(memory_, contract::roundNamespace("job", r));
  }
  RawClient v2() {
    RawClient c(front_->port());
    c.send(std::string("\x00", 1) + u32(wire::kValidationMagic));
    c.send(std::string("\x0d", 1) + u32(4242));
    EXPECT_EQ(c.recv(4), u32(4242)) << "PING is echoed";
    return c;
  }
  std::shared_ptr<MemoryStore> memory_;
  std::unique_ptr<TcpStoreFront> front_;
};

TEST_F(Front, Torch113PythonClientSeesWhatTorchsOwnServerShows) {
  Child ref({kPython, source("tests/compat/tcpstore_ops.py"), "ref"});
  ASSERT_EQ(ref.wait(Ms(120000))->code, 0) << ref.stderrText();
  Child ours({kPython, source("tests/compat/tcpstore_ops.py"), "127.0.0.1", std::to_string(front_->port())});
  ASSERT_EQ(ours.wait(Ms(120000))->code, 0) << ours.stderrText();
  auto theirs = nlohmann::json::parse(ref.stdoutText());
  auto mine = nlohmann::json::parse(ours.stdoutText());
  // Kept on purpose (tcpstore_parity.sh says why): a get after a timed-out get and a set of its
  // key fails on torch 1.13's server, on a stray STOP_WAITING; the front sent none, always.
  EXPECT_EQ(mine["to_get_same_key"], "x") << mine.dump();
  mine.erase("to_get_same_key");
  theirs.erase("to_get_same_key");
  EXPECT_EQ(mine, theirs) << "ours:   " << mine.dump() << "\ntheirs: " << theirs.dump();
  EXPECT_EQ(mine["blocked_get"], "arrived");
  EXPECT_EQ(mine["wait_timeout"], "raised");
  // The keys live in the round's namespace, as the C++ side names them.
  auto value = round(0).get(contract::storeKeyFromC10d("k"), deadlineAfter(Ms(1000)));
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "swapped");
  EXPECT_EQ(*round(0).get("init/", deadlineAfter(Ms(1000))), "2") << "TCPStore's own counter";
}

TEST_F(Front, ANewRoundStartsEmptyAndKeepsToItself) {
  Child first({kPython, "-c",
               "import torch.distributed as d, datetime, sys\n"
               "s = d.PrefixStore('/worker/attempt_0', d.TCPStore('127.0.0.1', int(sys.argv[1]), 1, "
               "False, datetime.timedelta(seconds=20)))\n"
               "s.set('mine', 'round0')\n",
               std::to_string(front_->port())});
  ASSERT_EQ(first.wait(Ms(60000))->code, 0) << first.stderrText();
  front_->setRound(1);
  // Restart count 1 on this node; another node of the same round may say 0: both land in
  // round 1, which does not hold round 0's key.
  Child second({kPython, "-c",
                "import torch.distributed as d, datetime, sys\n"
                "t = d.TCPStore('127.0.0.1', int(sys.argv[1]), 1, False, datetime.timedelta(seconds=20))\n"
                "a = d.PrefixStore('/worker/attempt_1', t)\n"
                "print(a.num_keys(), flush=True)\n"
                "a.set_timeout(datetime.timedelta(milliseconds=200))\n"
                "try:\n    a.get('mine'); print('seen')\nexcept RuntimeError:\n    print('not seen')\n"
                "d.PrefixStore('/worker/attempt_0', t).set('other', 'x')\n",
                std::to_string(front_->port())});
  ASSERT_EQ(second.wait(Ms(60000))->code, 0) << second.stderrText();
  EXPECT_EQ(second.stdoutText(), "1\nnot seen\n") << "only its own init/ counter";
  EXPECT_TRUE(*round(1).check({"/other"}));
  EXPECT_TRUE(*round(0).check({"/mine"}));
}

// LibTorch's C++ client (torch 1.13), the same calls against torch's server and the front.
std::vector<std::string> libtorchSession(const std::string& host, int port) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(port);
  opts.isServer = false;
  opts.numWorkers = 1;
  opts.timeout = std::chrono::seconds(20);
  c10d::TCPStore store(host, opts);
  std::vector<std::string> log;
  auto text = [](const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); };
  auto bytes = [](const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); };
  store.set("a", bytes("1"));
  log.push_back(text(store.get("a")));
  log.push_back(std::to_string(store.add("c", 41)));
  log.push_back(std::to_string(store.add("c", 1)));
  log.push_back(text(store.compareSet("a", bytes("1"), bytes("2"))));
  log.push_back(store.check({"a", "c"}) ? "ready" : "not ready");
  log.push_back(store.check({"a", "zzz"}) ? "ready" : "not ready");
  log.push_back(std::to_string(store.getNumKeys()));
  log.push_back(store.deleteKey("a") ? "deleted" : "absent");
  log.push_back(store.deleteKey("a") ? "deleted" : "absent");
  try {
    store.wait({"zzz"}, std::chrono::milliseconds(200));
    log.push_back("wait returned");
  } catch (const std::exception&) {
    log.push_back("wait timed out");
  }
  log.push_back(std::to_string(store.add("c", 0)));
  return log;
}

TEST_F(Front, LibTorchCppClientSeesWhatTorchsOwnServerShows) {
  c10d::TCPStoreOptions serverOpts;
  serverOpts.port = 0;
  serverOpts.isServer = true;
  serverOpts.waitWorkers = false;
  serverOpts.timeout = std::chrono::seconds(20);
  c10d::TCPStore server("127.0.0.1", serverOpts);
  auto theirs = libtorchSession("127.0.0.1", server.getPort());
  auto mine = libtorchSession("127.0.0.1", front_->port());
  EXPECT_EQ(mine, theirs);
  EXPECT_EQ(mine.back(), "42");
}

TEST_F(Front, Torch2MessagesByteByByte) {
  RawClient c = v2();
  using wire::Op;
  c.send({.op = Op::kSet, .keys = {"/k"}, .values = {"v"}});
  c.send({.op = Op::kWait, .keys = {"/k"}});
  EXPECT_EQ(c.recv(1), std::string(1, wire::kStopWaiting));
  c.send({.op = Op::kGet, .keys = {"/k"}});
  EXPECT_EQ(c.bytes(), "v");
  c.send({.op = Op::kAppend, .keys = {"/k"}, .values = {"++"}});
  c.send({.op = Op::kMultiSet, .keys = {"/x", "/y"}, .values = {"1", "2"}});
  c.send({.op = Op::kMultiGet, .keys = {"/k", "/x", "/y"}});
  EXPECT_EQ(c.bytes(), "v++");
  EXPECT_EQ(c.bytes(), "1");
  EXPECT_EQ(c.bytes(), "2");
  c.send({.op = Op::kCheck, .keys = {"/x", "/missing"}});
  EXPECT_EQ(c.recv(1), std::string(1, wire::kNotReady));
  c.send({.op = Op::kAdd, .keys = {"/n"}, .number = 7});
  EXPECT_EQ(c.i64(), 7);
  c.send({.op = Op::kNumKeys});
  EXPECT_EQ(c.i64(), 4);
  c.send({.op = Op::kList});
  int64_t n = c.i64();
  ASSERT_EQ(n, 4);
  std::set<std::string> keys;
  for (int64_t i = 0; i < n; ++i) keys.insert(c.bytes());
  EXPECT_EQ(keys, (std::set<std::string>{"/k", "/x", "/y", "/n"}));
  // A wait that times out on the client: CANCEL_WAIT gets exactly WAIT_CANCELED.
  c.send({.op = Op::kWait, .keys = {"/later"}});
  EXPECT_EQ(c.recv(1, Ms(200)), "") << "the key is not there: no reply yet";
  EXPECT_EQ(memory_->pendingWaiters(), 1u);
  c.send({.op = Op::kCancelWait});
  EXPECT_EQ(c.recv(1), std::string(1, wire::kWaitCanceled));
  EXPECT_EQ(memory_->pendingWaiters(), 0u) << "the parked wait is withdrawn";
  // The key arriving now sends nothing more.
  RawClient other = v2();
  other.send({.op = Op::kSet, .keys = {"/later"}, .values = {"x"}});
  c.send({.op = Op::kAdd, .keys = {"/n"}, .number = 0});
  EXPECT_EQ(c.i64(), 7) << "no stray STOP_WAITING before the reply";
  // Queues: pop never waits; WAIT on a queue's key is released by a push.
  c.send({.op = Op::kQueuePop, .keys = {"/q"}});
  EXPECT_EQ(c.i64(), 0);
  c.send({.op = Op::kWait, .keys = {"/q"}});
  other.send({.op = Op::kQueuePush, .keys = {"/q"}, .values = {"first"}});
  other.send({.op = Op::kQueuePush, .keys = {"/q"}, .values = {"second"}});
  EXPECT_EQ(c.recv(1), std::string(1, wire::kStopWaiting));
  c.send({.op = Op::kQueueLen, .keys = {"/q"}});
  EXPECT_EQ(c.i64(), 2);
  c.send({.op = Op::kQueuePop, .keys = {"/q"}});
  EXPECT_EQ(c.i64(), 2);
  EXPECT_EQ(c.bytes(), "first");
  c.send({.op = Op::kDeleteKey, .keys = {"/k"}});
  EXPECT_EQ(c.i64(), 1);
  c.send({.op = Op::kCompareSet, .keys = {"/k"}, .values = {"", "new"}});
  EXPECT_EQ(c.bytes(), "new");
}

TEST_F(Front, Torch2CancelAfterTheKeyArrivedReadsStopThenCanceled) {
  RawClient c = v2();
  c.send(wire::Request{.op = wire::Op::kWait, .keys = {"/k"}});
  RawClient setter = v2();
  setter.send(wire::Request{.op = wire::Op::kSet, .keys = {"/k"}, .values = {"v"}});
  // The client's timer fires just as the key arrives: it has not read the 00 yet.
  std::this_thread::sleep_for(Ms(100));
  c.send(wire::Request{.op = wire::Op::kCancelWait});
  EXPECT_EQ(c.recv(2), std::string("\x00\x01", 2));
  EXPECT_EQ(c.recv(1, Ms(200)), "") << "nothing after WAIT_CANCELED";
}

// torch 2.14's BARRIER, as its own server answers it (tcpstore_parity.sh compares the two):
// arrivals counted on the key, everyone through at the world size, a key used again lets later
// arrivals through at once, and a rank's timeout (CANCEL_WAIT) withdraws it alone.
TEST_F(Front, Torch214BarrierCountsArrivalsAndLetsAllThroughAtTheWorldSize) {
  RawClient a = v2(), b = v2(), c = v2();
  using wire::Op;
  a.send({.op = Op::kBarrier, .keys = {"/bk"}, .number = 3});
  b.send({.op = Op::kBarrier, .keys = {"/bk"}, .number = 3});
  EXPECT_EQ(a.recv(1, Ms(200)), "") << "two of three arrived: no answer yet";
  EXPECT_EQ(b.recv(1, Ms(50)), "");
  c.send({.op = Op::kBarrier, .keys = {"/bk"}, .number = 3});
  EXPECT_EQ(c.recv(1), std::string(1, wire::kStopWaiting)) << "the third arrival goes through";
  EXPECT_EQ(a.recv(1), std::string(1, wire::kStopWaiting));
  EXPECT_EQ(b.recv(1), std::string(1, wire::kStopWaiting));
  a.send({.op = Op::kGet, .keys = {"/bk"}});
  EXPECT_EQ(a.bytes(), "3");
  b.send({.op = Op::kBarrier, .keys = {"/bk"}, .number = 3});
  EXPECT_EQ(b.recv(1), std::string(1, wire::kStopWaiting)) << "the count is never reset";
  // An ADD through the front counts too (once a's arrival is counted, as c reads it).
  a.send({.op = Op::kBarrier, .keys = {"/two"}, .number = 2});
  for (std::string seen; seen != "1";) {
    c.send({.op = Op::kGet, .keys = {"/two"}});  // GET follows its own WAIT in a real client
    seen = c.bytes();
  }
  EXPECT_EQ(a.recv(1, Ms(100)), "");
  c.send({.op = Op::kAdd, .keys = {"/two"}, .number = 1});
  EXPECT_EQ(c.i64(), 2);
  EXPECT_EQ(a.recv(1), std::string(1, wire::kStopWaiting));
  // A rank's timeout: CANCEL_WAIT gets WAIT_CANCELED alone, its arrival stays counted, and a
  // later arrival that reaches the world size sends it nothing more.
  a.send({.op = Op::kBarrier, .keys = {"/late"}, .number = 2});
  EXPECT_EQ(a.recv(1, Ms(100)), "");
  a.send({.op = Op::kCancelWait});
  EXPECT_EQ(a.recv(1), std::string(1, wire::kWaitCanceled));
  b.send({.op = Op::kBarrier, .keys = {"/late"}, .number = 2});
  EXPECT_EQ(b.recv(1), std::string(1, wire::kStopWaiting));
  a.send({.op = Op::kAdd, .keys = {"/late"}, .number = 0});
  EXPECT_EQ(a.i64(), 2) << "no stray STOP_WAITING before the reply";
  // A parked rank that goes away is forgotten; the others still get through.
  {
    RawClient gone = v2();
    gone.send({.op = Op::kBarrier, .keys = {"/g"}, .number = 3});
    EXPECT_EQ(gone.recv(1, Ms(100)), "");
  }
  b.send({.op = Op::kBarrier, .keys = {"/g"}, .number = 3});
  c.send({.op = Op::kBarrier, .keys = {"/g"}, .number = 3});
  EXPECT_EQ(c.recv(1), std::string(1, wire::kStopWaiting));
  EXPECT_EQ(b.recv(1), std::string(1, wire::kStopWaiting));
  // A world size of 0 or less, or a key whose value is no count, as torch's server: through at
  // once, and the connection closed.
  c.send({.op = Op::kBarrier, .keys = {"/z"}, .number = 0});
  EXPECT_EQ(c.recv(1), std::string(1, wire::kStopWaiting));
  c.send({.op = Op::kSet, .keys = {"/txt"}, .values = {"hello"}});
  c.send({.op = Op::kBarrier, .keys = {"/txt"}, .number = 1});
  EXPECT_TRUE(c.closedByServer()) << "closed without an answer";
}

TEST_F(Front, GarbageAbsurdLengthsAndVanishingClientsAreClosedAlone) {
  RawClient good = v2();
  good.send(wire::Request{.op = wire::Op::kSet, .keys = {"/keep"}, .values = {"1"}});
  {
    RawClient garbage(front_->port());
    garbage.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT_TRUE(garbage.closedByServer()) << "'G' is no TCPStore type";
  }
  {
    // A SET announcing a 1 TiB value is refused when its length arrives, not buffered.
    RawClient huge = v2();
    std::string req = wire::encode({.op = wire::Op::kSet, .keys = {"/big"}, .values = {""}},
                                   wire::Generation::kV2);
    uint64_t tib = uint64_t{1} << 40;
    std::memcpy(req.data() + req.size() - 8, &tib, 8);
    huge.send(req);
    EXPECT_TRUE(huge.closedByServer());
  }
  {
    // Half a message, then gone; and a parked wait whose client vanishes.
    RawClient half = v2();
    half.send(wire::encode({.op = wire::Op::kSet, .keys = {"/half"}, .values = {"xyz"}},
                           wire::Generation::kV2)
                  .substr(0, 12));
    RawClient waiter = v2();
    waiter.send(wire::Request{.op = wire::Op::kWait, .keys = {"/never"}});
    auto deadline = std::chrono::steady_clock::now() + Ms(5000);
    while (memory_->pendingWaiters() != 1 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(Ms(5));
    }
    EXPECT_EQ(memory_->pendingWaiters(), 1u);
  }
  auto deadline = std::chrono::steady_clock::now() + Ms(5000);
  while ((memory_->pendingWaiters() != 0 || front_->connections() != 1) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(Ms(5));
  }
  EXPECT_EQ(memory_->pendingWaiters(), 0u) << "the vanished client's wait is withdrawn";
  EXPECT_EQ(front_->connections(), 1u);
  EXPECT_FALSE(*round(0).check({"/half", "/big"}));
  good.send(wire::Request{.op = wire::Op::kGet, .keys = {"/keep"}});
  EXPECT_EQ(good.bytes(), "1") << "the others go on";
}

// A client that asks and never reads: the front stops working for it once its unread
// replies pass a bound, instead of queueing gigabytes; when it reads again, work resumes.
TEST_F(Front, AClientThatDoesNotReadGetsNoMoreWorkDone) {
  RawClient c = v2();
  std::string value(4u << 20, 'x');
  c.send(wire::Request{.op = wire::Op::kSet, .keys = {"/big"}, .values = {value}});
  size_t before = muster::testing::memoryBytes(getpid(), "VmRSS");
  std::string gets;
  for (int i = 0; i < 1000; ++i) {  // 4 GB of replies asked for
    gets += wire::encode({.op = wire::Op::kGet, .keys = {"/big"}}, wire::Generation::kV2);
  }
  c.send(gets);
  std::this_thread::sleep_for(Ms(500));
  EXPECT_LT(muster::testing::memoryBytes(getpid(), "VmRSS"), before + (200u << 20)) << "replies piled up";
  for (int i = 0; i < 3; ++i) EXPECT_EQ(c.bytes(), value) << "reply " << i;
  // One request that would answer 64 GiB is refused, alone.
  RawClient greedy = v2();
  greedy.send(wire::Request{.op = wire::Op::kMultiGet,
                            .keys = std::vector<std::string>(16384, "/big")});
  EXPECT_TRUE(greedy.closedByServer());
  EXPECT_LT(muster::testing::memoryBytes(getpid(), "VmRSS"), before + (200u << 20));
}

// A large request arriving in small pieces is put together without copying it again and
// again; partly received requests of all clients share one budget.
TEST_F(Front, LargeRequestsInPiecesAndTheInputBudget) {
  RawClient c = v2();
  std::string value(32u << 20, 'y');
  std::string req = wire::encode({.op = wire::Op::kSet, .keys = {"/v"}, .values = {value}},
                                 wire::Generation::kV2);
  for (size_t at = 0; at < req.size(); at += 4096) c.send(req.substr(at, 4096));
  c.send(wire::Request{.op = wire::Op::kGet, .keys = {"/v"}});
  EXPECT_EQ(c.bytes(), value);

  auto small = std::make_shared<MemoryStore>();
  std::string why;
  int fd = net::listenTcp("127.0.0.1", 0, why);
  auto front = TcpStoreFront::start(small, fd, {.runId = "job", .maxBufferedInput = 3u << 20});
  ASSERT_TRUE(front.ok());
  RawClient a((*front)->port()), b((*front)->port());
  std::string partial = wire::encode({.op = wire::Op::kSet, .keys = {"/p"}, .values = {std::string(8u << 20, 'z')}},
                                     wire::Generation::kV1);
  a.send(partial.substr(0, 2u << 20));
  b.send(partial.substr(0, 2u << 20));
  // Whichever arrives second passes the budget and is closed; the other waits for the rest.
  bool aClosed = a.closedByServer(Ms(3000)), bClosed = b.closedByServer(Ms(3000));
  EXPECT_NE(aClosed, bClosed) << "exactly one of two 2 MiB partial requests fits in 3 MiB";
}

// A connection belongs to the round of its first request: a worker of an old round that is
// still going never writes into the next one.
TEST_F(Front, AConnectionKeepsTheRoundItStartedIn) {
  RawClient old = v2();
  old.send(wire::Request{.op = wire::Op::kAdd, .keys = {"/n"}, .number = 1});
  EXPECT_EQ(old.i64(), 1);
  front_->setRound(1);
  old.send(wire::Request{.op = wire::Op::kSet, .keys = {"/late"}, .values = {"x"}});
  RawClient fresh = v2();
  fresh.send(wire::Request{.op = wire::Op::kSet, .keys = {"/new"}, .values = {"y"}});
  fresh.send(wire::Request{.op = wire::Op::kNumKeys});
  EXPECT_EQ(fresh.i64(), 1);
  EXPECT_TRUE(*round(0).check({"/late"}));
  EXPECT_FALSE(*round(1).check({"/late"}));
}

// Accepted sockets are close-on-exec: a worker spawned while clients connect inherits none.
TEST_F(Front, AcceptedSocketsAreCloseOnExec) {
  RawClient a = v2(), b = v2();
  std::this_thread::sleep_for(Ms(100));
  int sockets = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    auto target = std::filesystem::read_symlink(e.path(), ec).string();
    if (target.rfind("socket:", 0) != 0) continue;
    int fd = std::stoi(e.path().filename().string());
    ++sockets;
    EXPECT_TRUE(fcntl(fd, F_GETFD) & FD_CLOEXEC) << "descriptor " << fd;
  }
  EXPECT_GE(sockets, 5) << "listening socket, two clients, two accepted";
}

TEST_F(Front, SixtyFourClientsAddingAtOnceLoseNothing) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 64; ++t) {
    threads.emplace_back([this] {
      RawClient c = v2();
      for (int i = 0; i < 100; ++i) {
        c.send(wire::Request{.op = wire::Op::kAdd, .keys = {"/count"}, .number = 1});
        c.i64();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(*round(0).get("/count", deadlineAfter(Ms(1000))), "6400");
}

}  // namespace
}  // namespace muster
