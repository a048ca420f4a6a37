// The run keys' values checked field by field (etcd/run_values.h).
#include "etcd/run_values.h"

#include <cstdint>
#include <limits>
#include <string>

#include <fmt/format.h>


namespace muster::etcd {

using nlohmann::json;

namespace {

constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
constexpr int64_t kIntMin = std::numeric_limits<int32_t>::min();

absl::Status bad(std::string_view field, std::string_view should) {
  return absl::InvalidArgumentError(fmt::format("\"{}\" should be {}", field, should));
}

// An integer field within [lo, hi]; absent is fine unless `required`. A float (1e300, 2.5) is
// not an integer: nlohmann would cast it.
absl::Status integer(const json& value, std::string_view field, int64_t lo, int64_t hi, bool required = false) {
  auto it = value.find(field);
  std::string should = hi == std::numeric_limits<int64_t>::max() ? fmt::format("an integer from {}", lo)
                                                                   : fmt::format("an integer from {} to {}", lo, hi);
  if (it == value.end()) return required ? bad(field, should) : absl::OkStatus();
  if (it->is_number_unsigned()) {  // nlohmann reads every integer from 0 up as unsigned
    uint64_t v = it->get<uint64_t>();
    if (v > static_cast<uint64_t>(hi) || (lo > 0 && v < static_cast<uint64_t>(lo))) return bad(field, should);
    return absl::OkStatus();
  }
  if (!it->is_number_integer()) return bad(field, should);
  int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) return bad(field, should);
  return absl::OkStatus();
}

// An unsigned 64-bit integer (a round).
absl::Status unsignedInteger(const json& value, std::string_view field) {
  auto it = value.find(field);
  if (it == value.end()) return absl::OkStatus();
  if (it->is_number_unsigned() || (it->is_number_integer() && it->get<int64_t>() >= 0)) return absl::OkStatus();
  return bad(field, "an integer from 0");
}

absl::Status string(const json& value, std::string_view field, bool required = false) {
  auto it = value.find(field);
  if (it == value.end()) return required ? bad(field, "a string") : absl::OkStatus();
  return it->is_string() ? absl::OkStatus() : bad(field, "a string");
}

absl::Status nnodes(const json& value) {
  if (auto s = integer(value, "min", 1, kIntMax); !s.ok()) return s;
  if (auto s = integer(value, "max", 1, kIntMax); !s.ok()) return s;
  if (value.value("max", int64_t{1}) < value.value("min", int64_t{1})) return bad("max", "at least \"min\"");
  return absl::OkStatus();
}

// Prefixes a nested value's message with where it is: "nodes[3]: \"id\" should be ...".
absl::Status within(const std::string& where, absl::Status s) {
  if (s.ok()) return s;
  return absl::InvalidArgumentError(fmt::format("{}: {}", where, std::string(s.message())));
}

}  // namespace

absl::Status checkJoin(const json& value) {
  if (!value.is_object()) return absl::InvalidArgumentError("not a JSON object");
  if (auto s = string(value, "id", true); !s.ok()) return s;
  if (value["id"].get_ref<const std::string&>().empty()) return bad("id", "a node id, not empty");
  if (auto s = string(value, "host", true); !s.ok()) return s;
  if (auto s = integer(value, "local_world_size", 1, kIntMax, true); !s.ok()) return s;
  if (auto s = integer(value, "master_port", 0, 65535, true); !s.ok()) return s;
  if (auto s = integer(value, "store_port", 0, 65535); !s.ok()) return s;
  if (auto s = string(value, "role"); !s.ok()) return s;
  return nnodes(value);
}

absl::Status checkRoundEvent(const json& value) {
  if (!value.is_object()) return absl::InvalidArgumentError("not a JSON object");
  // A kind this version does not know (a newer launch's) is kept as a number: the enum is open.
  if (auto s = integer(value, "kind", 0, kIntMax); !s.ok()) return s;
  for (const char* field : {"node", "host", "message"}) {
    if (auto s = string(value, field); !s.ok()) return s;
  }
  if (auto s = integer(value, "group_rank", -1, kIntMax); !s.ok()) return s;
  return integer(value, "exit_code", kIntMin, kIntMax);
}

absl::Status checkState(const json& value) {
  if (!value.is_object()) return absl::InvalidArgumentError("not a JSON object");
  if (auto s = unsignedInteger(value, "round"); !s.ok()) return s;
  if (auto s = string(value, "phase"); !s.ok()) return s;
  if (auto s = nnodes(value); !s.ok()) return s;
  if (auto s = integer(value, "since", 0, std::numeric_limits<int64_t>::max()); !s.ok()) return s;
  std::string phase = value.value("phase", std::string());
  auto nodes = value.find("nodes");
  // A running round's nodes are read by index. A finished state had none before b28b6a6 (an
  // older launch's, kept for the retention time): its nodes are only counted.
  if (nodes == value.end()) {
    if (phase == "running") return bad("nodes", "the round's nodes in a running state");
  } else {
    if (!nodes->is_array()) return bad("nodes", "an array of nodes");
    if (nodes->empty() && phase == "running") return bad("nodes", "one node or more");
    int64_t ranks = 0;
    for (size_t i = 0; i < nodes->size(); ++i) {
      if (auto s = within(fmt::format("nodes[{}]", i), checkJoin((*nodes)[i])); !s.ok()) return s;
      ranks += (*nodes)[i]["local_world_size"].get<int64_t>();
      if (ranks > kIntMax) return bad("nodes", "nodes of fewer than 2^31 ranks in all");
    }
  }
  auto event = value.find("event");
  if (event == value.end()) {
    if (phase == "ended") return bad("event", "how the round ended, in an ended state");
  } else if (auto s = within("event", checkRoundEvent(*event)); !s.ok()) {
    return s;
  }
  return absl::OkStatus();
}

absl::Status checkReport(const json& value) {
  if (!value.is_object()) return absl::InvalidArgumentError("not a JSON object");
  if (auto s = string(value, "outcome"); !s.ok()) return s;
  if (auto o = value.value("outcome", std::string("failed")); o != "succeeded" && o != "failed") {
    return bad("outcome", "\"succeeded\" or \"failed\"");
  }
  if (auto s = integer(value, "exit_code", kIntMin, kIntMax); !s.ok()) return s;
  return string(value, "message");
}

absl::Status checkStatus(const json& value) {
  if (!value.is_object()) return absl::InvalidArgumentError("not a JSON object");
  if (auto s = integer(value, "unix_ms", 0, std::numeric_limits<int64_t>::max()); !s.ok()) return s;
  if (auto s = unsignedInteger(value, "round"); !s.ok()) return s;
  if (auto it = value.find("status"); it != value.end() && !it->is_object()) return bad("status", "a JSON object");
  return absl::OkStatus();
}

}  // namespace muster::etcd
