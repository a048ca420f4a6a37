// The checks of what a run's keys hold: what launch writes passes; each field of the wrong
// type, out of range or missing where it is required is refused, named.
#include "etcd/run_values.h"

#include <gtest/gtest.h>

#include <string>

namespace muster::etcd {
namespace {

using nlohmann::json;

json node(const std::string& id, int lws = 2) {
  return {{"id", id}, {"host", "node-" + id}, {"local_world_size", lws}, {"master_port", 29500}, {"store_port", 0}};
}

json running() {
  return {{"round", 3}, {"phase", "running"}, {"nodes", {node("a"), node("b")}}, {"min", 1}, {"max", 2}, {"since", 1}};
}

// The field a refusal names, and that it is a refusal.
std::string refused(const absl::Status& s) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  return std::string(s.message());
}

TEST(RunValues, WhatLaunchWritesPasses) {
  EXPECT_TRUE(checkState(running()).ok());
  json ended = {{"round", 0}, {"phase", "ended"}, {"min", 2}, {"max", 2}, {"since", 17},
                {"event", {{"kind", 2}, {"node", "b"}, {"host", "h"}, {"group_rank", 1}, {"exit_code", 1}, {"message", "m"}}}};
  EXPECT_TRUE(checkState(ended).ok());
  json finished = running();
  finished["phase"] = "finished";
  EXPECT_TRUE(checkState(finished).ok());
  finished.erase("nodes");  // as launch wrote it before b28b6a6
  EXPECT_TRUE(checkState(finished).ok());
  json join = node("a");
  join["min"] = 1;
  join["max"] = 4;
  EXPECT_TRUE(checkJoin(join).ok());
  EXPECT_TRUE(checkReport({{"outcome", "failed"}, {"exit_code", -9}, {"message", "killed"}}).ok());
  EXPECT_TRUE(checkStatus({{"unix_ms", 1795000000000}, {"round", 0}, {"status", json::object()}}).ok());
  // A field of a later version's is no refusal.
  json later = running();
  later["stop_step"] = 120;
  EXPECT_TRUE(checkState(later).ok());
}

TEST(RunValues, AFieldOfTheWrongTypeIsRefusedByName) {
  json s = running();
  s["round"] = "x";
  EXPECT_EQ(refused(checkState(s)), "\"round\" should be an integer from 0");
  s = running();
  s["round"] = -1;
  EXPECT_EQ(refused(checkState(s)), "\"round\" should be an integer from 0");
  s = running();
  s["phase"] = 7;
  EXPECT_EQ(refused(checkState(s)), "\"phase\" should be a string");
  s = running();
  s["min"] = 1e300;  // a float nlohmann would cast to int
  EXPECT_EQ(refused(checkState(s)), "\"min\" should be an integer from 1 to 2147483647");
  s = running();
  s["max"] = 0;
  EXPECT_EQ(refused(checkState(s)), "\"max\" should be an integer from 1 to 2147483647");
  s["max"] = 1;
  s["min"] = 2;
  EXPECT_EQ(refused(checkState(s)), "\"max\" should be at least \"min\"");
  s = running();
  s["since"] = -5;
  EXPECT_NE(refused(checkState(s)).find("\"since\""), std::string::npos);
  s = running();
  s["nodes"][1]["id"] = 5;
  EXPECT_EQ(refused(checkState(s)), "nodes[1]: \"id\" should be a string");
  s = running();
  s["nodes"][0] = "a";
  EXPECT_EQ(refused(checkState(s)), "nodes[0]: not a JSON object");
  EXPECT_EQ(refused(checkState(json::array())), "not a JSON object");
  EXPECT_EQ(refused(checkState(json::parse("{", nullptr, false))), "not a JSON object");  // not JSON at all
}

TEST(RunValues, WhatAReaderIndexesMustBeThere) {
  json s = running();
  s.erase("nodes");
  EXPECT_EQ(refused(checkState(s)), "\"nodes\" should be the round's nodes in a running state");
  s["nodes"] = json::array();
  EXPECT_EQ(refused(checkState(s)), "\"nodes\" should be one node or more");
  s["phase"] = "ended";
  s.erase("nodes");
  EXPECT_EQ(refused(checkState(s)), "\"event\" should be how the round ended, in an ended state");
  s["event"] = {{"kind", -1}};
  EXPECT_EQ(refused(checkState(s)), "event: \"kind\" should be an integer from 0 to 2147483647");
  s["event"] = {{"kind", 9}};  // a newer launch's kind
  EXPECT_TRUE(checkState(s).ok());
  for (const char* field : {"id", "host", "local_world_size", "master_port"}) {
    json j = node("a");
    j.erase(field);
    EXPECT_NE(refused(checkJoin(j)).find(std::string("\"") + field + "\""), std::string::npos) << field;
  }
  json j = node("");
  EXPECT_EQ(refused(checkJoin(j)), "\"id\" should be a node id, not empty");
}

TEST(RunValues, NumbersThatWouldOverflowTheirReadersAreRefused) {
  json j = node("a", 0);
  EXPECT_EQ(refused(checkJoin(j)), "\"local_world_size\" should be an integer from 1 to 2147483647");
  j["local_world_size"] = 2147483648LL;
  EXPECT_EQ(refused(checkJoin(j)), "\"local_world_size\" should be an integer from 1 to 2147483647");
  j = node("a");
  j["master_port"] = 65536;
  EXPECT_EQ(refused(checkJoin(j)), "\"master_port\" should be an integer from 0 to 65535");
  // Two nodes of 2^31-1 ranks each: the world size would not fit an int.
  json s = running();
  s["nodes"] = {node("a", 2147483647), node("b", 2147483647)};
  EXPECT_EQ(refused(checkState(s)), "\"nodes\" should be nodes of fewer than 2^31 ranks in all");
  EXPECT_EQ(refused(checkReport({{"outcome", "maybe"}})), "\"outcome\" should be \"succeeded\" or \"failed\"");
  EXPECT_EQ(refused(checkReport({{"exit_code", 1e10}})), "\"exit_code\" should be an integer from -2147483648 to 2147483647");
  EXPECT_EQ(refused(checkStatus({{"status", "up"}})), "\"status\" should be a JSON object");
  EXPECT_EQ(refused(checkStatus({{"unix_ms", -1}})).find("\"unix_ms\""), 0u);
}

}  // namespace
}  // namespace muster::etcd
