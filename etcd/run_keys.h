// muster's keys of a run kept in etcd (--rdzv_backend=etcd): launch's nodes write them and
// rendezvousctl reads them, so their names live here, once. Every key of run ID is under
// runPrefix(ID), readable with `etcdctl get --prefix /muster/runs/ID/` (etcd_prefix= moves
// /muster/runs):
//   state                  the run, JSON: {"round", "phase": running|ended|finished, "min",
//                          "max", "nodes": [{"id", "host", "local_world_size", "master_port",
//                          "store_port"}] of the running (or finished) round in group-rank
//                          order, "event" that ended it, "since": Unix ms of its first round};
//                          written only by transactions on its revision
//   join/<round>/<node>    a node waiting for, or running in, that round (on the node's lease)
//   report/<round>/<node>  how the node's part of the round ended (on the node's lease)
//   status/<node>          what the node says of itself and its ranks (rendezvousctl status):
//                          {"unix_ms", "round", "status": muster.v1.NodeStatus as JSON}; on the
//                          node's lease, rewritten at most once a second
//   stacks/<id>            a stack roll-call asked of the running round (on the asker's lease)
//   answers/<id>/<node>    a node's answer: its ranks' stacks (stacks::toJson; the node's lease);
//                          apart from the questions, which every node watches, so that no node
//                          but the asker receives every node's stacks
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <fmt/format.h>

namespace muster::etcd {

// "<runs>/<run id>/" (runs: Options::runsPrefix, "/muster/runs"), the id escaped (%2F for '/',
// and '%', control and non-ASCII bytes as %XX) so that no run's prefix holds another's.
inline std::string runPrefix(const std::string& runId, const std::string& runs = "/muster/runs") {
  std::string escaped;
  for (unsigned char c : runId) {
    if (c == '/' || c == '%' || c < 0x20 || c >= 0x7f) {
      escaped += fmt::format("%{:02X}", c);
    } else {
      escaped += static_cast<char>(c);
    }
  }
  return runs + "/" + escaped + "/";
}

// The rest of each key, after runPrefix.
// The wall clock in Unix milliseconds, as the run keys' values carry it ("since", "unix_ms"):
// written by one host, read by another.
inline int64_t unixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}
inline constexpr const char* kStateKey = "state";
inline std::string joinKey(uint64_t round, const std::string& node) { return fmt::format("join/{}/{}", round, node); }
inline std::string reportKey(uint64_t round, const std::string& node) { return fmt::format("report/{}/{}", round, node); }
inline constexpr const char* kStacksDir = "stacks/";
inline std::string stacksAskedKey(uint64_t id) { return fmt::format("stacks/{}", id); }
inline std::string stacksAnswersDir(uint64_t id) { return fmt::format("answers/{}/", id); }
inline std::string stacksAnswerKey(uint64_t id, const std::string& node) { return stacksAnswersDir(id) + node; }
inline constexpr const char* kJoinDir = "join/";
inline constexpr const char* kStatusDir = "status/";
inline std::string statusKey(const std::string& node) { return kStatusDir + node; }
inline constexpr const char* kReportDir = "report/";

}  // namespace muster::etcd
