// failureReport: the root cause and torchrun's failure summary.
#include "launcher/failure_report.h"

#include <signal.h>

#include <filesystem>
#include <fstream>

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_split.h"

namespace muster::launcher {

std::string describeExit(const WorkerExit& e) {
  if (e.signal != 0) return fmt::format("was killed by {}", signalName(e.signal));
  return fmt::format("exited with code {}", e.code);
}

bool endedByStop(const WorkerExit& e) {
  return e.signal == SIGTERM || e.signal == SIGKILL || e.code == 128 + SIGTERM;
}

std::string readErrorFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  try {
    auto json = nlohmann::json::parse(in);
    const auto& message = json.at("message");
    if (message.is_string()) return message.get<std::string>();
    if (message.contains("extraInfo") && message["extraInfo"].contains("py_callstack") &&
        message["extraInfo"]["py_callstack"].is_string()) {
      return message["extraInfo"]["py_callstack"].get<std::string>();
    }
    if (message.contains("message")) {
      const auto& inner = message["message"];
      return inner.is_string() ? inner.get<std::string>() : inner.dump();
    }
    return message.dump();
  } catch (const std::exception& e) {
    return fmt::format("(error file is not torchrun's JSON: {})", e.what());
  }
}

Failure describeFailure(const WorkerState& w) {
  Failure f;
  f.globalRank = w.spec.globalRank;
  f.localRank = w.spec.localRank;
  f.pid = w.pid;
  if (w.exit) f.exit = *w.exit;
  f.when = std::chrono::system_clock::now();
  std::error_code ec;
  if (!w.spec.errorFile.empty() && std::filesystem::exists(w.spec.errorFile, ec)) {
    f.errorFile = w.spec.errorFile;
    f.errorMessage = readErrorFile(w.spec.errorFile);
  }
  f.lastLines.assign(w.lastErrLines.begin(), w.lastErrLines.end());
  return f;
}

std::string failureReport(const std::string& program, const std::optional<Failure>& rootCause,
                          const std::vector<Failure>& others, const std::string& host) {
  std::string out;
  if (rootCause) {
    const Failure& f = *rootCause;
    out += fmt::format("launch: root cause: rank {} (local_rank {}, pid {}) {}{}\n", f.globalRank,
                       f.localRank, f.pid, describeExit(f.exit), f.cause.empty() ? "" : ": " + f.cause);
    if (!f.errorFile.empty()) {
      out += fmt::format("  error file {}:\n", f.errorFile);
      for (absl::string_view l : absl::StrSplit(f.errorMessage, '\n', absl::SkipEmpty())) {
        out += fmt::format("    {}\n", std::string(l));
      }
    }
    if (!f.lastLines.empty()) {
      out += fmt::format("  last {} line(s) of its stderr:\n", f.lastLines.size());
      for (const auto& l : f.lastLines) out += fmt::format("    {}\n", std::string(l));
    }
  }
  std::string rule(60, '='), thin(60, '-');
  auto entry = [&](size_t idx, const Failure& f) {
    std::string exitText = f.exit.signal != 0
                               ? fmt::format("-{} ({})", f.exit.signal, signalName(f.exit.signal))
                               : std::to_string(f.exit.code);
    std::string traceback =
        !f.errorMessage.empty() ? f.errorMessage
        : f.exit.signal != 0    ? fmt::format("Signal {} ({}) received by PID {}{}", f.exit.signal,
                                              signalName(f.exit.signal), f.pid,
                                              f.cause.empty() ? "" : ": " + f.cause)
        : f.lastLines.empty()   ? std::string("(no error file, no stderr)")
                                : f.lastLines.back();
    return fmt::format(
        "[{}]:\n  time      : {:%Y-%m-%d_%H:%M:%S}\n  host      : {}\n  rank      : {} "
        "(local_rank: {})\n  exitcode  : {} (pid: {})\n  error_file: {}\n  traceback : {}\n",
        idx, fmt::localtime(std::chrono::system_clock::to_time_t(f.when)), host, f.globalRank,
        f.localRank, exitText, f.pid, f.errorFile.empty() ? "<N/A>" : f.errorFile, traceback);
  };
  out += rule + "\n" + program + " FAILED\n" + thin + "\nFailures:\n";
  if (others.empty()) {
    out += "  <NO_OTHER_FAILURES>\n";
  } else {
    for (size_t i = 0; i < others.size(); ++i) out += entry(i + 1, others[i]);
  }
  out += thin + "\nRoot Cause (first observed failure):\n";
  if (rootCause) out += entry(0, *rootCause);
  out += rule + "\n";
  return out;
}

}  // namespace muster::launcher
