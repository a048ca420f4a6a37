// failureReport: the root cause and torchrun's failure summary.
#include "launcher/failure_report.h"

#include <signal.h>

#include <filesystem>
#include <fstream>

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "launcher/events.h"

namespace muster::launcher {
namespace {
// torchrun's traceback for a rank that exited with a code and wrote no error file.
constexpr char kNoTracebackHint[] =
    "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html";
}  // namespace

std::string describeExit(const WorkerExit& e) {
  if (e.signal != 0) return fmt::format("was killed by {}", signalName(e.signal));
  return fmt::format("exited with code {}", e.code);
}

bool endedByStop(const WorkerExit& e) {
  return e.signal == SIGTERM || e.signal == SIGKILL || e.code == 128 + SIGTERM;
}

namespace {
// What the error file says: the structured form's stack (else its message), or the plain
// form's message; `structured` tells which.
struct ErrorFileText {
  std::string text;
  bool structured = false;
};

ErrorFileText explainErrorFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {};
  try {
    auto json = nlohmann::json::parse(in);
    const auto& message = json.at("message");
    if (message.is_string()) return {message.get<std::string>()};
    if (message.contains("extraInfo") && message["extraInfo"].contains("py_callstack") &&
        message["extraInfo"]["py_callstack"].is_string()) {
      return {message["extraInfo"]["py_callstack"].get<std::string>(), true};
    }
    if (message.contains("message")) {
      const auto& inner = message["message"];
      return {inner.is_string() ? inner.get<std::string>() : inner.dump(), true};
    }
    return {message.dump(), true};
  } catch (const std::exception& e) {
    return {fmt::format("(error file is not torchrun's JSON: {})", e.what())};
  }
}

// torchrun's summary indents a structured file's lines after the first by two spaces.
std::string asSummaryTraceback(const ErrorFileText& e) {
  return e.structured ? absl::StrReplaceAll(e.text, {{"\n", "\n  "}}) : e.text;
}
}  // namespace

std::string readErrorFile(const std::string& path) { return explainErrorFile(path).text; }

std::string summaryTraceback(const std::string& path) {
  return asSummaryTraceback(explainErrorFile(path));
}

absl::Status handOverErrorFile(const Failure& root, const std::string& dest) {
  if (root.errorFile.empty()) return absl::OkStatus();
  std::ifstream in(root.errorFile);
  nlohmann::ordered_json json;
  try {
    json = nlohmann::ordered_json::parse(in);
  } catch (const std::exception& e) {
    return absl::FailedPreconditionError(
        fmt::format("cannot hand {} over to {}: not JSON ({})", root.errorFile, dest, e.what()));
  }
  int code = root.exit.torchrunCode();
  if (code != 0 && json.is_object() && json.contains("message") && json["message"].is_object()) {
    json["message"]["errorCode"] = code;
  }
  std::error_code ec;
  std::filesystem::remove(dest, ec);
  std::ofstream out(dest, std::ios::trunc);
  out << pythonJson(json);
  out.close();
  if (!out) {
    return absl::FailedPreconditionError(
        fmt::format("cannot write the root cause's error file to {} (TORCHELASTIC_ERROR_FILE)", dest));
  }
  return absl::OkStatus();
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
    ErrorFileText said = explainErrorFile(w.spec.errorFile);  // read once, for both
    f.errorMessage = said.text;
    f.traceback = asSummaryTraceback(said);
  }
  f.lastLines.assign(w.lastErrLines.begin(), w.lastErrLines.end());
  return f;
}

std::string failureReport(const std::string& program, const std::optional<Failure>& rootCause,
                          const std::vector<Failure>& others, const std::string& host,
                          const TorchrunVersion& version) {
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
    // torchrun's words, so that what reads its summary reads this one; launch's own section
    // above says more (the cause, the last lines of stderr).
    std::string exitText = fmt::format("{} (pid: {})", f.exit.torchrunCode(), f.pid);
    if (version.namesSignalInSummary()) {
      exitText += f.exit.signal != 0 ? fmt::format("  ({})", signalName(f.exit.signal)) : " ";
    }
    std::string traceback =
        !f.traceback.empty() ? f.traceback
        : f.exit.signal != 0 ? fmt::format("Signal {} ({}) received by PID {}", f.exit.signal,
                                           signalName(f.exit.signal), f.pid)
                             : std::string(kNoTracebackHint);
    return fmt::format(
        "[{}]:\n  time      : {:%Y-%m-%d_%H:%M:%S}\n  host      : {}\n  rank      : {} "
        "(local_rank: {})\n  exitcode  : {}\n  error_file: {}\n  traceback : {}\n",
        idx, fmt::localtime(std::chrono::system_clock::to_time_t(f.when)), host, f.globalRank,
        f.localRank, exitText, f.errorFile.empty() ? "<N/A>" : f.errorFile, traceback);
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
