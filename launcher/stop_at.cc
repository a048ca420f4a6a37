// --stop_at: parsing it, and Slurm's end time through squeue.
#include "launcher/stop_at.h"

#include <time.h>

#include <charconv>
#include <cstdlib>
#include <string_view>

#include <boost/process.hpp>
#include <fmt/format.h>

#include "launcher/worker_command.h"

namespace muster::launcher {

namespace bp = boost::process;

namespace {

constexpr const char* kTakes =
    "Unix seconds, a local time YYYY-MM-DDTHH:MM:SS (Z at its end: UTC), slurm, or slurm-SECONDS (the Slurm job's "
    "end less SECONDS; slurm is slurm-300)";

// 2200-01-01T00:00:00Z: a time far enough for any job, and far from the clock's range.
constexpr int64_t kLatest = 7258118400;

absl::Status bad(const std::string& value, const std::string& why) {
  return absl::InvalidArgumentError(fmt::format("--stop_at '{}': {}; it takes {}", value, why, kTakes));
}

std::optional<int64_t> wholeNumber(std::string_view text) {
  int64_t v = 0;
  if (text.empty() || text[0] == '+' || text[0] == '-') return std::nullopt;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

// YYYY-MM-DDTHH:MM:SS as local time (utc: as UTC), in Unix seconds.
std::optional<int64_t> calendarTime(const std::string& text, bool utc) {
  struct tm t {};
  const char* end = strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &t);
  if (end == nullptr || *end != '\0') return std::nullopt;
  t.tm_isdst = -1;
  time_t at = utc ? timegm(&t) : mktime(&t);
  if (at == static_cast<time_t>(-1)) return std::nullopt;
  return static_cast<int64_t>(at);
}

}  // namespace

absl::StatusOr<StopAt> parseStopAt(const std::string& value) {
  StopAt at;
  if (value == "slurm") {
    at.slurm = true;
    return at;
  }
  if (value.rfind("slurm-", 0) == 0) {
    auto margin = wholeNumber(std::string_view(value).substr(6));
    if (!margin) return bad(value, "the margin is not a whole number of seconds");
    at.slurm = true;
    at.marginS = *margin;
    return at;
  }
  std::optional<int64_t> t = wholeNumber(value);
  if (!t) {
    bool utc = !value.empty() && value.back() == 'Z';
    t = calendarTime(utc ? value.substr(0, value.size() - 1) : value, utc);
  }
  if (!t) return bad(value, "not a time");
  if (*t > kLatest) return bad(value, "later than the year 2200");
  at.unixS = *t;
  return at;
}

absl::StatusOr<std::optional<int64_t>> parseSlurmTime(const std::string& text) {
  std::string t = text;
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ' || t.back() == '\r')) t.pop_back();
  for (const char* none : {"Unknown", "N/A", "NONE", "INVALID", "None"}) {
    if (t == none) return std::nullopt;
  }
  auto at = calendarTime(t, false);
  if (!at) return absl::InvalidArgumentError(fmt::format("'{}' is not a time as Slurm prints one", t));
  return *at;
}

absl::StatusOr<std::optional<int64_t>> slurmEndTime(const std::string& jobId) {
  const char* path = std::getenv("PATH");
  std::string squeue = findExecutable("squeue", path != nullptr ? path : "/usr/bin:/bin");
  if (squeue.empty()) return absl::NotFoundError("squeue is not on PATH");
  std::string text, errors;
  int code = -1;
  try {
    bp::ipstream out, err;
    // SLURM_TIME_FORMAT, set by a user, changes how %e prints: the standard form is asked for.
    auto env = boost::this_process::environment();
    env["SLURM_TIME_FORMAT"] = "standard";
    bp::child c(bp::exe = squeue, bp::args = {"-h", "-j", jobId, "-o", "%e"}, bp::std_out > out, bp::std_err > err,
                bp::std_in < bp::null, env);
    for (std::string line; std::getline(out, line);) text += line + "\n";
    for (std::string line; std::getline(err, line);) errors += line + " ";
    // Its output is closed: it has exited or is exiting (squeue bounds its waits with
    // slurm.conf's MessageTimeout).
    c.wait();
    code = c.exit_code();
  } catch (const std::exception& e) {
    return absl::UnavailableError(fmt::format("squeue: {}", e.what()));
  }
  while (!errors.empty() && errors.back() == ' ') errors.pop_back();
  if (code != 0 || text.empty()) {
    return absl::UnavailableError(fmt::format("squeue -j {} -o %e {}: {}", jobId,
                                              code != 0 ? fmt::format("exited {}", code) : "printed nothing",
                                              errors.empty() ? "no message" : errors));
  }
  auto end = parseSlurmTime(text.substr(0, text.find('\n')));
  if (!end.ok()) return absl::UnavailableError(fmt::format("squeue -j {} -o %e: {}", jobId, std::string(end.status().message())));
  return *end;
}

std::string localTimeText(int64_t unixS) {
  time_t at = static_cast<time_t>(unixS);
  struct tm t {};
  char text[32] = {};
  if (localtime_r(&at, &t) == nullptr || strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S", &t) == 0) {
    return std::to_string(unixS);
  }
  return text;
}

absl::StatusOr<std::optional<int64_t>> stopTime(const StopAt& at, const std::string& jobId) {
  if (!at.slurm) return at.unixS;
  if (jobId.empty()) {
    return absl::InvalidArgumentError("--stop_at=slurm: launch is not inside a Slurm job (no SLURM_JOB_ID)");
  }
  auto end = slurmEndTime(jobId);
  if (!end.ok()) return absl::UnavailableError(fmt::format("--stop_at=slurm: {}", std::string(end.status().message())));
  if (!*end) return std::nullopt;
  return **end - at.marginS;
}

}  // namespace muster::launcher
