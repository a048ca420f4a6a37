// The values at a run's keys in etcd, as launch's etcd rendezvous, rendezvousctl's run views
// and the roll-call read them (etcd/run_values.h): any bytes at any key are refused by the
// key's check, or read field by field as those readers do (value(key, default) of each named
// type, `nodes` indexed, the ranks added up in an int) without a throw, a cast out of range or
// an overflow. JSON that is not the key's is a refusal, never an exception.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "etcd/run_values.h"

using nlohmann::json;
using namespace muster::etcd;

namespace {

void readJoin(const json& node) {
  (void)node.value("id", std::string());
  (void)node.value("host", std::string());
  (void)node.value("local_world_size", 1);
  (void)node.value("master_port", 0);
  (void)node.value("store_port", 0);
  (void)node.value("role", std::string());
  (void)node.value("min", int64_t{1});
  (void)node.value("max", int64_t{1});
  (void)node.value("min", 1);
  (void)node.value("max", 1);
  // What launch copies from a join into the state it writes.
  (void)json{{"id", node["id"]}, {"host", node["host"]}, {"local_world_size", node["local_world_size"]},
             {"master_port", node["master_port"]}};
}

void readEvent(const json& e) {
  (void)e.value("kind", 0);
  (void)e.value("node", std::string());
  (void)e.value("host", std::string());
  (void)e.value("group_rank", 0);
  (void)e.value("exit_code", 0);
  (void)e.value("message", std::string());
}

void readState(const json& state) {
  std::string phase = state.value("phase", std::string());
  (void)state.value("round", uint64_t{0});
  (void)state.value("since", int64_t{0});
  (void)state.value("min", 1);
  (void)state.value("max", 1);
  if (phase == "running") {
    const json& nodes = state["nodes"];
    if (!nodes.is_array() || nodes.empty()) __builtin_trap();
    int world = 0;
    for (size_t i = 0; i < nodes.size(); ++i) {
      readJoin(nodes[i]);
      if (__builtin_add_overflow(world, nodes[i].value("local_world_size", 1), &world)) __builtin_trap();
    }
  } else {
    for (const auto& n : state.value("nodes", json::array())) readJoin(n);
  }
  if (phase == "ended") readEvent(state.at("event"));
  if (state.contains("event")) readEvent(state.value("event", json::object()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider p(data, size);
  int key = p.ConsumeIntegralInRange(0, 3);
  json value = json::parse(p.ConsumeRemainingBytesAsString(), nullptr, /*allow_exceptions=*/false);
  switch (key) {
    case 0:
      if (checkState(value).ok()) readState(value);
      break;
    case 1:
      if (checkJoin(value).ok()) readJoin(value);
      break;
    case 2:
      if (checkReport(value).ok()) {
        (void)value.value("outcome", std::string());
        (void)value.value("exit_code", 1);
        (void)value.value("message", std::string());
      }
      break;
    default:
      if (checkStatus(value).ok()) {
        (void)value.value("unix_ms", int64_t{0});
        (void)value.value("round", uint64_t{0});
        if (value.contains("status")) (void)value["status"].dump();
      }
      break;
  }
  return 0;
}
