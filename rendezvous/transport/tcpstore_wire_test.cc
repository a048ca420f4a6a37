// TCPStore's wire format, byte by byte: the messages torch 1.13 and 2.x clients send (bytes
// taken from captures of the real clients), every prefix of them incomplete, and bad input.
#include "rendezvous/transport/tcpstore_wire.h"

#include <gtest/gtest.h>

namespace muster::rendezvous::tcpstore {
namespace {

std::string hex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) {
    if (h[i] == ' ') {
      --i;
      continue;
    }
    out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  }
  return out;
}

Request decodeAll(const std::string& bytes, Generation& g, size_t* used = nullptr) {
  Request r;
  auto n = decode(bytes, g, WireLimits{}, r);
  EXPECT_TRUE(n.ok()) << n.status();
  if (used) *used = n.value_or(0);
  return r;
}

TEST(TcpStoreWire, Torch113AddOfInitKeyAsCaptured) {
  // torch 1.13's TCPStore(..., world_size=N, is_master=False) opens with ADD "init/" 1.
  std::string bytes = hex("03 0500000000000000 696e69742f 0100000000000000");
  Generation g = Generation::kUnknown;
  size_t used = 0;
  Request r = decodeAll(bytes, g, &used);
  EXPECT_EQ(g, Generation::kV1);
  EXPECT_EQ(used, bytes.size());
  EXPECT_EQ(r.op, Op::kAdd);
  EXPECT_EQ(r.keys, std::vector<std::string>{"init/"});
  EXPECT_EQ(r.number, 1);
}

TEST(TcpStoreWire, Torch113SetIsTypeZeroWithoutTheMagic) {
  std::string bytes = hex("00 1600000000000000") + "//worker/attempt_0/foo" + hex("0300000000000000") + "bar";
  Generation g = Generation::kUnknown;
  Request r = decodeAll(bytes, g);
  EXPECT_EQ(g, Generation::kV1);
  EXPECT_EQ(r.op, Op::kSet);
  EXPECT_EQ(r.keys[0], "//worker/attempt_0/foo");
  EXPECT_EQ(r.values[0], "bar");
}

TEST(TcpStoreWire, Torch2OpensWithValidateThenPing) {
  std::string bytes = hex("00 cef7853c 0d 39300000");
  Generation g = Generation::kUnknown;
  size_t used = 0;
  Request r = decodeAll(bytes, g, &used);
  EXPECT_EQ(g, Generation::kV2);
  EXPECT_EQ(r.op, Op::kValidate);
  EXPECT_EQ(used, 5u);
  r = decodeAll(bytes.substr(used), g, &used);
  EXPECT_EQ(r.op, Op::kPing);
  EXPECT_EQ(r.word, 12345u);
  // A second VALIDATE is not allowed.
  Request again;
  EXPECT_FALSE(decode(hex("00 cef7853c"), g, WireLimits{}, again).ok());
}

TEST(TcpStoreWire, TypeNumbersOfBothGenerations) {
  // The same operation, one type number apart until GETNUMKEYS; DELETE_KEY is 8 in both.
  Request get{.op = Op::kGet, .keys = {"/k"}};
  EXPECT_EQ(encode(get, Generation::kV1)[0], 2);
  EXPECT_EQ(encode(get, Generation::kV2)[0], 3);
  Request del{.op = Op::kDeleteKey, .keys = {"/k"}};
  EXPECT_EQ(encode(del, Generation::kV1)[0], 8);
  EXPECT_EQ(encode(del, Generation::kV2)[0], 8);
  EXPECT_EQ(encode(Request{.op = Op::kCancelWait}, Generation::kV2), hex("0c"));
  EXPECT_EQ(encode(Request{.op = Op::kQueueLen, .keys = {"q"}}, Generation::kV2)[0], 16);
  EXPECT_EQ(encode(Request{.op = Op::kList}, Generation::kV2), hex("11"));
  // 2.x-only operations have no 1.13 number.
  EXPECT_TRUE(encode(Request{.op = Op::kAppend, .keys = {"k"}, .values = {"v"}}, Generation::kV1).empty());
  EXPECT_TRUE(encode(Request{.op = Op::kBarrier, .keys = {"k"}, .number = 2}, Generation::kV1).empty());
}

// torch 2.14's TCPStore.barrier("bk", 2, ...), as its client sent it to its own server (read
// off the loopback): type 18, the key, the world size.
TEST(TcpStoreWire, BarrierIsWhatTorch214Sends) {
  std::string bytes = hex("1203000000000000002f626b0200000000000000");
  EXPECT_EQ(encode(Request{.op = Op::kBarrier, .keys = {"/bk"}, .number = 2}, Generation::kV2), bytes);
  Generation g = Generation::kV2;
  Request r;
  auto used = decode(bytes, g, WireLimits{}, r);
  ASSERT_TRUE(used.ok()) << used.status();
  EXPECT_EQ(*used, bytes.size());
  EXPECT_EQ(r.op, Op::kBarrier);
  EXPECT_EQ(r.keys, std::vector<std::string>{"/bk"});
  EXPECT_EQ(r.number, 2);
  EXPECT_EQ(opName(Op::kBarrier), "BARRIER");
}

TEST(TcpStoreWire, EveryRequestRoundTripsAndEveryPrefixIsIncomplete) {
  std::vector<std::pair<Request, Generation>> cases = {
      {{.op = Op::kSet, .keys = {"/a"}, .values = {"xyz"}}, Generation::kV1},
      {{.op = Op::kCompareSet, .keys = {"/a"}, .values = {"", "new"}}, Generation::kV1},
      {{.op = Op::kAdd, .keys = {"/n"}, .number = -7}, Generation::kV1},
      {{.op = Op::kCheck, .keys = {"/a", "/b"}}, Generation::kV1},
      {{.op = Op::kWait, .keys = {"/a", "/b", "/c"}}, Generation::kV1},
      {{.op = Op::kNumKeys}, Generation::kV1},
      {{.op = Op::kWatchKey, .keys = {"/w"}}, Generation::kV1},
      {{.op = Op::kDeleteKey, .keys = {"/a"}}, Generation::kV2},
      {{.op = Op::kAppend, .keys = {"/a"}, .values = {"++"}}, Generation::kV2},
      {{.op = Op::kMultiGet, .keys = {"/a", "/b"}}, Generation::kV2},
      {{.op = Op::kMultiSet, .keys = {"/a", "/b"}, .values = {"1", "2"}}, Generation::kV2},
      {{.op = Op::kCancelWait}, Generation::kV2},
      {{.op = Op::kBarrier, .keys = {"/b"}, .number = 4}, Generation::kV2},
      {{.op = Op::kQueuePush, .keys = {"/q"}, .values = {"item"}}, Generation::kV2},
      {{.op = Op::kQueuePop, .keys = {"/q"}}, Generation::kV2},
      {{.op = Op::kList}, Generation::kV2},
  };
  for (const auto& [req, gen] : cases) {
    std::string bytes = encode(req, gen);
    ASSERT_FALSE(bytes.empty()) << opName(req.op);
    for (size_t cut = 0; cut < bytes.size(); ++cut) {
      Generation g = gen;
      Request r;
      auto n = decode(bytes.substr(0, cut), g, WireLimits{}, r);
      ASSERT_TRUE(n.ok()) << opName(req.op) << " cut at " << cut;
      EXPECT_EQ(*n, 0u) << opName(req.op) << " cut at " << cut;
    }
    Generation g = gen;
    Request r;
    auto n = decode(bytes + "tail", g, WireLimits{}, r);
    ASSERT_TRUE(n.ok()) << opName(req.op);
    EXPECT_EQ(*n, bytes.size()) << opName(req.op);
    EXPECT_EQ(r.op, req.op);
    EXPECT_EQ(r.keys, req.keys) << opName(req.op);
    EXPECT_EQ(r.values, req.values) << opName(req.op);
    EXPECT_EQ(r.number, req.number);
  }
}

TEST(TcpStoreWire, AbsurdLengthsAreRefusedBeforeTheBytesArrive) {
  WireLimits limits{.maxKeyBytes = 16, .maxValueBytes = 1024, .maxKeysPerCall = 4};
  Request r;
  Generation g = Generation::kV1;
  // A SET announcing a 2^62-byte key: refused at once, not waited for.
  auto n = decode(hex("00 0000000000000040"), g, limits, r);
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.status().message().find("key of 4611686018427387904 bytes exceeds the cap of 16"),
            std::string::npos)
      << n.status();
  g = Generation::kV1;
  auto big = decode(hex("00 0100000000000000") + "k" + hex("0104000000000000"), g, limits, r);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("value of 1025 bytes"), std::string::npos) << big.status();
  g = Generation::kV1;
  auto many = decode(hex("05 0500000000000000"), g, limits, r);
  ASSERT_FALSE(many.ok());
  EXPECT_NE(many.status().message().find("5 keys in one request"), std::string::npos);
}

TEST(TcpStoreWire, UnknownTypesAndBadMagicAreErrors) {
  Request r;
  Generation g = Generation::kUnknown;
  EXPECT_FALSE(decode(hex("09"), g, WireLimits{}, r).ok()) << "9 is no 1.13 type";
  g = Generation::kV2;
  EXPECT_FALSE(decode(hex("13"), g, WireLimits{}, r).ok()) << "19 is no 2.x type";
  g = Generation::kV2;
  EXPECT_FALSE(decode(hex("ff"), g, WireLimits{}, r).ok());
  // Garbage that happens to start with 0 is a 1.13 SET with an absurd key length.
  g = Generation::kUnknown;
  EXPECT_FALSE(decode(hex("00 ffffffffffffffff"), g, WireLimits{}, r).ok());
}

TEST(TcpStoreWire, RepliesAreLittleEndian) {
  std::string out;
  putI64(out, 5);
  putU8(out, kStopWaiting);
  putBytes(out, "v");
  putU32(out, 12345);
  EXPECT_EQ(out, hex("0500000000000000 00 0100000000000000") + "v" + hex("39300000"));
}

}  // namespace
}  // namespace muster::rendezvous::tcpstore
