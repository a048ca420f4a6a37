// One flag's value into its typed form, for launch's flag table (options.cc), the checks of
// the options together (options_validate.cc) and --nproc_per_node's words (devices.cc): each
// error is one INVALID_ARGUMENT line that names the flag, the value and what was expected.
// Internal to launcher/.
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "launcher/options.h"

namespace muster::launcher::flags {

// "FLAG=VALUE is invalid; expected EXPECTED".
absl::Status bad(const std::string& flag, const std::string& value, const std::string& expected);

// A whole number from `min` to 10^9.
absl::StatusOr<int> toInt(const std::string& flag, const std::string& value, int min,
                          const std::string& expected);

// A finite number of seconds >= 0.
absl::StatusOr<double> toSeconds(const std::string& flag, const std::string& value);

// torchrun's Std.from_str: "3" for every rank (key -1), or "0:1,1:2" per local rank (1 out,
// 2 err, 3 both).
absl::StatusOr<std::map<int, StdSpec>> parseStd(const std::string& flag, const std::string& value);

// "TERM" -> SIGTERM, as Python's signal module names them (the inverse of signalName()).
bool signalNumber(const std::string& abbrev, int& sig);

// --rdzv_conf's value into its typed form: one clear line for a malformed pair or value.
absl::Status parseRdzvConf(const std::string& v, LaunchOptions::RdzvConf& conf);

// An environment switch as torchrun reads one: set, and not 0/false/False.
bool isTrue(const std::string& v);

}  // namespace muster::launcher::flags
