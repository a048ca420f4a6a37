// The stop record: its path, its JSON, and its file written whole.
#include "launcher/stop_record.h"

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace muster::launcher {

namespace fs = std::filesystem;
using nlohmann::json;

std::string stopRecordPath(const std::string& given, const std::string& sharedDir, const std::string& runId) {
  if (!given.empty()) return given;
  if (sharedDir.empty()) return "";
  std::string name;
  for (unsigned char c : runId) {
    bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                 c == '_' || c == '-';
    name += plain ? std::string(1, static_cast<char>(c)) : fmt::format("%{:02X}", c);
  }
  return (fs::path(sharedDir) / (".muster-stopped-" + name + ".json")).string();
}

std::string formatStopRecord(const StopRecord& r) {
  json j = {{"run_id", r.runId}, {"step", r.step}, {"reason", r.reason}, {"unix_ms", r.unixMs}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

absl::StatusOr<StopRecord> parseStopRecord(std::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::DataLossError("not a JSON object");
  auto field = [&](const char* name, bool (json::*is)() const noexcept) -> absl::Status {
    auto it = j.find(name);
    if (it == j.end()) return absl::DataLossError(fmt::format("no field '{}'", name));
    if (!((*it).*is)()) return absl::DataLossError(fmt::format("field '{}' is of another type", name));
    return absl::OkStatus();
  };
  for (auto s : {field("run_id", &json::is_string), field("step", &json::is_number_integer),
                 field("reason", &json::is_string), field("unix_ms", &json::is_number_integer)}) {
    if (!s.ok()) return s;
  }
  StopRecord r;
  r.runId = j["run_id"].get<std::string>();
  r.reason = j["reason"].get<std::string>();
  // A number beyond int64 reads as unsigned: refused.
  if (!j["step"].is_number_unsigned() && j["step"].get<int64_t>() < 0) return absl::DataLossError("a negative step");
  if (j["step"].is_number_unsigned() && j["step"].get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    return absl::DataLossError("a step past 2^63");
  }
  r.step = j["step"].get<int64_t>();
  r.unixMs = j["unix_ms"].is_number_unsigned() && j["unix_ms"].get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                 ? 0
                 : j["unix_ms"].get<int64_t>();
  return r;
}

absl::Status writeStopRecord(const std::string& path, const StopRecord& record) {
  // Several nodes may write one shared file: the temporary one is this host's and process's.
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::string tmp = fmt::format("{}.{}.{}.tmp", path, host, getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << formatStopRecord(record);
    out.flush();
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      return absl::InternalError(fmt::format("cannot write {}: {}", tmp, std::strerror(errno)));
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return absl::InternalError(fmt::format("cannot write {}: {}", path, ec.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<StopRecord> readStopRecord(const std::string& path) {
  std::error_code ec;
  auto size = fs::file_size(path, ec);
  if (ec == std::errc::no_such_file_or_directory) return absl::NotFoundError(fmt::format("no {}", path));
  if (ec) return absl::DataLossError(fmt::format("{}: {}", path, ec.message()));
  if (size > 65536) return absl::DataLossError(fmt::format("{}: {} bytes, larger than a stop record", path, size));
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in && !in.eof()) return absl::DataLossError(fmt::format("{}: cannot be read", path));
  auto r = parseStopRecord(text.str());
  if (!r.ok()) {
    return absl::DataLossError(
        fmt::format("{}: not a stop record launch writes: {}", path, std::string(r.status().message())));
  }
  return r;
}

}  // namespace muster::launcher
