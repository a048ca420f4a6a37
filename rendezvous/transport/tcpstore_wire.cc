// TCPStore's wire format: the two generations' type tables, the request decoder and encoders.
#include "rendezvous/transport/tcpstore_wire.h"

#include <fmt/format.h>

#include <array>
#include <bit>
#include <cstring>
#include <optional>

namespace muster::rendezvous::tcpstore {
namespace {

static_assert(std::endian::native == std::endian::little,
              "TCPStore sends host-order integers; muster speaks it on little-endian hosts");

// Type byte -> op, per generation (c10d's QueryType enums).
constexpr std::array<Op, 9> kV1Ops{Op::kSet,   Op::kCompareSet, Op::kGet,
                                   Op::kAdd,   Op::kCheck,      Op::kWait,
                                   Op::kNumKeys, Op::kWatchKey, Op::kDeleteKey};
constexpr std::array<Op, 19> kV2Ops{
    Op::kValidate,  Op::kSet,      Op::kCompareSet, Op::kGet,        Op::kAdd,
    Op::kCheck,     Op::kWait,     Op::kNumKeys,    Op::kDeleteKey,  Op::kAppend,
    Op::kMultiGet,  Op::kMultiSet, Op::kCancelWait, Op::kPing,       Op::kQueuePush,
    Op::kQueuePop,  Op::kQueueLen, Op::kList,       Op::kBarrier};

std::optional<uint8_t> typeByte(Op op, Generation g) {
  const Op* begin = g == Generation::kV1 ? kV1Ops.data() : kV2Ops.data();
  size_t n = g == Generation::kV1 ? kV1Ops.size() : kV2Ops.size();
  for (size_t i = 0; i < n; ++i) {
    if (begin[i] == op) return static_cast<uint8_t>(i);
  }
  return std::nullopt;
}

// Reads from a prefix of the connection's bytes. Each read says: done, need more bytes, or
// (for lengths and counts) over a cap.
class Reader {
 public:
  // `dry`: check lengths and caps, copy nothing.
  Reader(std::string_view data, const WireLimits& limits, bool dry)
      : data_(data), limits_(limits), dry_(dry) {}
  size_t used() const { return pos_; }
  // With incomplete(): the bytes (from the reader's start) needed to get further.
  size_t needed() const { return needed_; }
  bool incomplete() const { return incomplete_; }
  const std::string& error() const { return error_; }
  bool ok() const { return !incomplete_ && error_.empty(); }

  template <typename T>
  bool fixed(T& out) {
    if (!ok()) return false;
    if (data_.size() - pos_ < sizeof(T)) {
      incomplete_ = true;
      needed_ = pos_ + sizeof(T);
      return false;
    }
    std::memcpy(&out, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool bytes(std::string& out, size_t cap, const char* what) {
    uint64_t n = 0;
    if (!fixed(n)) return false;
    if (n > cap) {
      error_ = fmt::format("a {} of {} bytes exceeds the cap of {}", what, n, cap);
      return false;
    }
    if (pos_ + n > limits_.maxRequestBytes) {
      error_ = fmt::format("the request grows past {} bytes, the cap of one request",
                           limits_.maxRequestBytes);
      return false;
    }
    if (data_.size() - pos_ < n) {
      incomplete_ = true;
      needed_ = pos_ + n;
      return false;
    }
    if (!dry_) out.assign(data_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool key(std::vector<std::string>& keys) {
    if (dry_) return bytes(scratch_, limits_.maxKeyBytes, "key");
    keys.emplace_back();
    return bytes(keys.back(), limits_.maxKeyBytes, "key");
  }
  bool value(std::vector<std::string>& values) {
    if (dry_) return bytes(scratch_, limits_.maxValueBytes, "value");
    values.emplace_back();
    return bytes(values.back(), limits_.maxValueBytes, "value");
  }
  bool count(uint64_t& n) {
    if (!fixed(n)) return false;
    if (n > limits_.maxKeysPerCall) {
      error_ = fmt::format("{} keys in one request exceed the cap of {}", n,
                           limits_.maxKeysPerCall);
      return false;
    }
    return true;
  }

 private:
  std::string_view data_;
  const WireLimits& limits_;
  const bool dry_;
  size_t pos_ = 0, needed_ = 0;
  bool incomplete_ = false;
  std::string error_;
  std::string scratch_;  // never written in a dry run
};

}  // namespace

std::string_view opName(Op op) {
  switch (op) {
    case Op::kValidate: return "VALIDATE";
    case Op::kSet: return "SET";
    case Op::kCompareSet: return "COMPARE_SET";
    case Op::kGet: return "GET";
    case Op::kAdd: return "ADD";
    case Op::kCheck: return "CHECK";
    case Op::kWait: return "WAIT";
    case Op::kNumKeys: return "GETNUMKEYS";
    case Op::kWatchKey: return "WATCH_KEY";
    case Op::kDeleteKey: return "DELETE_KEY";
    case Op::kAppend: return "APPEND";
    case Op::kMultiGet: return "MULTI_GET";
    case Op::kMultiSet: return "MULTI_SET";
    case Op::kCancelWait: return "CANCEL_WAIT";
    case Op::kPing: return "PING";
    case Op::kQueuePush: return "QUEUE_PUSH";
    case Op::kQueuePop: return "QUEUE_POP";
    case Op::kQueueLen: return "QUEUE_LEN";
    case Op::kList: return "LIST";
    case Op::kBarrier: return "BARRIER";
  }
  return "?";
}

absl::StatusOr<size_t> decode(std::string_view data, Generation& generation,
                              const WireLimits& limits, Request& out, size_t* needed) {
  if (needed) *needed = data.size() + 1;
  if (data.empty()) return 0;
  bool first = generation == Generation::kUnknown;
  if (first) {
    // 2.x opens with 00 CE F7 85 3C. A 1.13 SET (also type 0) would need a key of about 1 GB
    // for its length to begin with those bytes, and any other 1.13 op starts with 1-8.
    if (static_cast<uint8_t>(data[0]) != 0) {
      generation = Generation::kV1;
    } else if (data.size() < 5) {
      return 0;
    } else {
      uint32_t magic = 0;
      std::memcpy(&magic, data.data() + 1, 4);
      generation = magic == kValidationMagic ? Generation::kV2 : Generation::kV1;
    }
  }
  uint8_t type = static_cast<uint8_t>(data[0]);
  const bool v1 = generation == Generation::kV1;
  if ((v1 && type >= kV1Ops.size()) || (!v1 && type >= kV2Ops.size())) {
    return absl::InvalidArgumentError(fmt::format(
        "unknown TCPStore query type {} for a torch {} client", type, v1 ? "1.13" : "2.x"));
  }
  out = Request{};
  out.op = v1 ? kV1Ops[type] : kV2Ops[type];
  if (out.op == Op::kValidate && !first) {
    return absl::InvalidArgumentError("VALIDATE after the connection's first message");
  }
  auto parse = [&](Reader& r) {
    uint64_t n = 0;
    switch (out.op) {
      case Op::kValidate:
      case Op::kPing:
        r.fixed(out.word);
        break;
      case Op::kSet:
      case Op::kAppend:
      case Op::kQueuePush:
        r.key(out.keys) && r.value(out.values);
        break;
      case Op::kCompareSet:
        r.key(out.keys) && r.value(out.values) && r.value(out.values);
        break;
      case Op::kGet:
      case Op::kWatchKey:
      case Op::kDeleteKey:
      case Op::kQueuePop:
      case Op::kQueueLen:
        r.key(out.keys);
        break;
      case Op::kAdd:
      case Op::kBarrier:
        r.key(out.keys) && r.fixed(out.number);
        break;
      case Op::kCheck:
      case Op::kWait:
      case Op::kMultiGet:
        if (r.count(n)) {
          for (uint64_t i = 0; i < n && r.key(out.keys); ++i) {
          }
        }
        break;
      case Op::kMultiSet:
        if (r.count(n)) {
          for (uint64_t i = 0; i < n && r.key(out.keys) && r.value(out.values); ++i) {
          }
        }
        break;
      case Op::kNumKeys:
      case Op::kCancelWait:
      case Op::kList:
        break;
    }
  };
  // First only scan: a request still arriving is neither copied nor allocated.
  Reader scan(data.substr(1), limits, /*dry=*/true);
  parse(scan);
  if (!scan.error().empty()) {
    return absl::InvalidArgumentError(fmt::format("{}: {}", opName(out.op), scan.error()));
  }
  if (scan.incomplete()) {
    if (first) generation = Generation::kUnknown;  // decide again with the whole message
    if (needed) *needed = 1 + scan.needed();
    return 0;
  }
  Reader r(data.substr(1), limits, /*dry=*/false);
  parse(r);
  if (out.op == Op::kValidate && out.word != kValidationMagic) {
    return absl::InvalidArgumentError(
        fmt::format("VALIDATE with magic {:#x}, expected {:#x}", out.word, kValidationMagic));
  }
  return 1 + r.used();
}

void putU8(std::string& out, uint8_t v) { out.push_back(static_cast<char>(v)); }

void putU32(std::string& out, uint32_t v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

void putI64(std::string& out, int64_t v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

void putBytes(std::string& out, std::string_view bytes) {
  uint64_t n = bytes.size();
  out.append(reinterpret_cast<const char*>(&n), sizeof(n));
  out.append(bytes.data(), bytes.size());
}

std::string encode(const Request& req, Generation generation) {
  std::string out;
  auto type = typeByte(req.op, generation);
  if (!type) return out;
  putU8(out, *type);
  switch (req.op) {
    case Op::kValidate:
    case Op::kPing:
      putU32(out, req.word);
      break;
    case Op::kAdd:
    case Op::kBarrier:
      putBytes(out, req.keys.at(0));
      putI64(out, req.number);
      break;
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet:
      putI64(out, static_cast<int64_t>(req.keys.size()));
      for (const auto& k : req.keys) putBytes(out, k);
      break;
    case Op::kMultiSet:
      putI64(out, static_cast<int64_t>(req.keys.size()));
      for (size_t i = 0; i < req.keys.size(); ++i) {
        putBytes(out, req.keys[i]);
        putBytes(out, req.values.at(i));
      }
      break;
    default:
      for (const auto& k : req.keys) putBytes(out, k);
      for (const auto& v : req.values) putBytes(out, v);
      break;
  }
  return out;
}

}  // namespace muster::rendezvous::tcpstore
