// torchelastic's event layout, and JSON written as Python's json.dumps writes it.
#include "launcher/events.h"

#include <fmt/format.h>

#include "common/files.h"

namespace muster::launcher {

std::string pythonJson(const nlohmann::ordered_json& v) {
  if (v.is_object()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [key, value] : v.items()) {
      if (!first) out += ", ";
      first = false;
      out += nlohmann::ordered_json(key).dump(-1, ' ', true) + ": " + pythonJson(value);
    }
    return out + "}";
  }
  if (v.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + pythonJson(v[i]);
    return out + "]";
  }
  if (v.is_number_float()) {
    double d = v.get<double>();
    // Python writes 3.0, not 3.
    std::string text = fmt::format("{}", d);
    if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
    return text;
  }
  return v.dump(-1, ' ', true);  // strings ASCII-escaped, as ensure_ascii=True
}

std::string eventRawError(const std::string& errorFile, int exitCode, const TorchrunVersion& version) {
  if (auto text = readFile(errorFile, "error file"); text.ok()) {
    try {
      return pythonJson(nlohmann::ordered_json::parse(*text));
    } catch (const std::exception&) {
      return *text;
    }
  }
  nlohmann::ordered_json none = {{"message", "<NONE>"}};
  if (exitCode > 0 && version.marksSystemTerminatedErrors()) {
    none["errorTraits"] = {{"category", "system_terminated_error"}, {"retryability", "False"}};
  }
  return pythonJson(none);
}

std::string eventLine(const ElasticEvent& e) {
  using J = nlohmann::ordered_json;
  auto opt = [](const auto& o) { return o ? J(*o) : J(nullptr); };
  auto one = [](const auto& o) { return o ? J::array({*o}) : J::array({nullptr}); };
  J md = J::object();
  md["group_world_size"] = opt(e.groupWorldSize);
  md["entry_point"] = e.entryPoint;
  if (e.fromWorker) {
    // torchelastic writes these as one-element tuples.
    md["local_rank"] = one(e.localRank);
    md["role_rank"] = one(e.roleRank);
    md["role_world_size"] = one(e.roleWorldSize);
    md["exit_code"] = one(e.exitCode);
    md["worker_pid"] = one(e.workerPid);
  }
  J metadata = J::object();
  metadata["run_id"] = e.runId;
  metadata["global_rank"] = opt(e.globalRank);
  metadata["group_rank"] = opt(e.groupRank);
  metadata["worker_id"] = e.workerId ? J(std::to_string(*e.workerId)) : J(nullptr);
  metadata["role"] = e.role;
  metadata["hostname"] = e.hostname;
  metadata["state"] = e.state;
  metadata["total_run_time"] = static_cast<int64_t>(e.totalRunTimeS);
  metadata["rdzv_backend"] = e.rdzvBackend;
  metadata["raw_error"] = opt(e.rawError);
  metadata["metadata"] = pythonJson(md);
  metadata["agent_restarts"] = e.agentRestarts;
  metadata["duration_ms"] = opt(e.durationMs);
  J event = J::object();
  event["name"] = "torchelastic.worker.status." + e.state;
  event["source"] = e.fromWorker ? "WORKER" : "AGENT";
  event["timestamp"] = 0;
  event["metadata"] = metadata;
  return pythonJson(event);
}

}  // namespace muster::launcher
