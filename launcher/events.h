// torchelastic's event records (--event_log_handler=console): one JSON line per agent or
// worker event on stderr, in the layout torchelastic's Event.serialize() writes.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "launcher/torchrun_version.h"

namespace muster::launcher {

struct ElasticEvent {
  std::string state;  // RENDEZVOUS, ASSIGN_WORKER_RANKS, START, SUCCEEDED, FAILED, TERMINATED
  bool fromWorker = false;  // source WORKER, else AGENT
  std::string runId, role, hostname, rdzvBackend;
  std::optional<int> globalRank, groupRank, localRank, groupWorldSize, roleRank, roleWorldSize, exitCode;
  bool groupKnown = true;            // false: group rank and size null (before the first round)
  std::optional<long> workerId;      // the worker's pid, as its id
  std::optional<long> workerPid;     // the pid of a failed worker (torchelastic's failure.pid)
  int agentRestarts = 0;
  double totalRunTimeS = 0;
  std::optional<double> durationMs;
  std::optional<std::string> rawError;  // the error file's JSON, or a message
  std::string entryPoint;               // basename of the program
};

// {"name": "torchelastic.worker.status.<STATE>", "source": ..., "timestamp": 0, "metadata":
// {...}}, with Python's json.dumps separators (", " and ": ") and the inner "metadata" a JSON
// string, as torchelastic prints them.
std::string eventLine(const ElasticEvent& event);

// A failed worker's raw_error: json.dumps of its error file; {"message": "<NONE>"} without one,
// from 2.14 with "errorTraits" calling an exit code (not a signal) a system-terminated error;
// a file that is not JSON, its text.
std::string eventRawError(const std::string& errorFile, int exitCode, const TorchrunVersion& version);

// json.dumps(value) as Python writes it by default (ASCII-escaped, ", " and ": ").
std::string pythonJson(const nlohmann::ordered_json& value);

}  // namespace muster::launcher
