// Flag values into their typed forms (option_values.h).
#include "launcher/option_values.h"

#include <fmt/format.h>

#include <cmath>
#include <csignal>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "etcd/options.h"

namespace muster::launcher::flags {

absl::Status bad(const std::string& flag, const std::string& value, const std::string& expected) {
  return absl::InvalidArgumentError(
      fmt::format("{}={} is invalid; expected {}", flag, value, expected));
}

absl::StatusOr<int> toInt(const std::string& flag, const std::string& value, int min,
                          const std::string& expected) {
  try {
    size_t used = 0;
    long long v = std::stoll(value, &used);
    if (used != value.size() || v < min || v > 1'000'000'000) return bad(flag, value, expected);
    return static_cast<int>(v);
  } catch (...) {
    return bad(flag, value, expected);
  }
}

absl::StatusOr<double> toSeconds(const std::string& flag, const std::string& value) {
  try {
    size_t used = 0;
    double v = std::stod(value, &used);
    if (used != value.size() || !std::isfinite(v) || v < 0) {
      return bad(flag, value, "a number of seconds >= 0");
    }
    return v;
  } catch (...) {
    return bad(flag, value, "a number of seconds >= 0");
  }
}

absl::StatusOr<std::map<int, StdSpec>> parseStd(const std::string& flag, const std::string& value) {
  auto one = [](int v) { return StdSpec{(v & 1) != 0, (v & 2) != 0}; };
  std::map<int, StdSpec> out;
  const std::string expected = "0-3, or LOCAL_RANK:0-3 pairs (e.g. 0:3,1:2)";
  if (value.find(':') == std::string::npos) {
    auto v = toInt(flag, value, 0, expected);
    if (!v.ok() || *v > 3) return bad(flag, value, expected);
    out[-1] = one(*v);
    return out;
  }
  for (absl::string_view part : absl::StrSplit(value, ',')) {
    std::vector<std::string> kv = absl::StrSplit(part, ':');
    if (kv.size() != 2) return bad(flag, value, expected);
    auto rank = toInt(flag, kv[0], 0, expected);
    auto v = toInt(flag, kv[1], 0, expected);
    if (!rank.ok() || !v.ok() || *v > 3) return bad(flag, value, expected);
    out[*rank] = one(*v);
  }
  return out;
}

bool signalNumber(const std::string& abbrev, int& sig) {
  for (int s = 1; s < NSIG; ++s) {
    const char* name = sigabbrev_np(s);
    if (name != nullptr && abbrev == name) {
      sig = s;
      return true;
    }
  }
  return false;
}

absl::Status parseRdzvConf(const std::string& v, LaunchOptions::RdzvConf& conf) {
  conf = LaunchOptions::RdzvConf{};
  auto pairs = etcd::parseConf(v, "--rdzv_conf");
  if (!pairs.ok()) return pairs.status();
  for (const auto& pair : *pairs) {
    const std::string &key = pair.first, &value = pair.second;  // named: clang 14's lambdas take no bindings
    conf.given[key] = value;
    auto wrong = [&](const char* expected) {
      return absl::InvalidArgumentError(
          fmt::format("--rdzv_conf {}={} is invalid; expected {}", key, value, expected));
    };
    double secs = 0;
    if (key == "join_timeout" || key == "last_call_timeout" || key == "keep_alive_interval") {
      if (!absl::SimpleAtod(value, &secs) || !std::isfinite(secs) || secs <= 0 || secs > 1e9) {
        return wrong("seconds > 0");
      }
      Millis ms(std::max<int64_t>(1, static_cast<int64_t>(secs * 1000)));
      (key == "join_timeout" ? conf.joinTimeout : key == "last_call_timeout" ? conf.lastCall : conf.keepAliveInterval) = ms;
    } else if (key == "keep_alive_max_attempt") {
      if (!absl::SimpleAtoi(value, &conf.keepAliveMaxAttempt) || conf.keepAliveMaxAttempt < 1) {
        return wrong("a whole number >= 1");
      }
    } else if (key == "is_host") {
      bool host = false;
      if (!absl::SimpleAtob(value, &host)) return wrong("true or false (1, 0, yes, no)");
      conf.isHost = host;
    }
  }
  return absl::OkStatus();
}

bool isTrue(const std::string& v) { return !v.empty() && v != "0" && v != "false" && v != "False"; }

}  // namespace muster::launcher::flags
