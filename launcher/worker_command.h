// The worker's command line, from launch's options: which program, under which Python.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/options.h"

namespace muster::launcher {

// The worker's command: argv with "${local_rank}" left for the worker group to fill in (as
// torchrun's macros). A .py script, or an executable Python script, runs under PYTHON_EXEC (or
// python3 on PATH) with -u, as torchrun does; -m runs a module; other executables run
// directly. Errors (INVALID_ARGUMENT, one line): program missing, not executable, no Python.
absl::StatusOr<std::vector<std::string>> workerCommand(
    const LaunchOptions& options, const std::map<std::string, std::string>& env);

// The executable for `name`: itself when it holds a '/', else the first match on PATH.
std::string findExecutable(const std::string& name, const std::string& path);

}  // namespace muster::launcher
