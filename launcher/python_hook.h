// The start-up hook launch gives Python workers: a sitecustomize.py first on PYTHONPATH that
// registers faulthandler on the roll-call signal (common/contract.h) and then runs the
// sitecustomize it hides, if any, so that the program behaves as without it.
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace muster::launcher {

// Writes the hook into <dir>/python and returns that folder. Errors name the file.
absl::StatusOr<std::string> writePythonHook(const std::string& dir);

// PYTHONPATH with `hookDir` first (the rest as the environment had it).
std::string pythonPathWithHook(const std::map<std::string, std::string>& env, const std::string& hookDir);

}  // namespace muster::launcher
