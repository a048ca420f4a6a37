// The worker's command line from launch's options (worker_command.h).
#include "launcher/worker_command.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

#include "absl/strings/str_split.h"

namespace muster::launcher {
namespace {

bool isExecutableFile(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

// A file Python should run: *.py, or a "#!...python..." script.
bool looksLikePython(const std::string& path) {
  if (path.size() > 3 && path.compare(path.size() - 3, 3, ".py") == 0) return true;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  char head[128] = {};
  size_t n = std::fread(head, 1, sizeof(head) - 1, f);
  std::fclose(f);
  std::string first(head, n);
  first = first.substr(0, first.find('\n'));
  return first.rfind("#!", 0) == 0 && first.find("python") != std::string::npos;
}

}  // namespace

std::string findExecutable(const std::string& name, const std::string& path) {
  if (name.find('/') != std::string::npos) return isExecutableFile(name) ? name : "";
  for (absl::string_view dir : absl::StrSplit(path, ':')) {
    std::string candidate = (dir.empty() ? std::string(".") : std::string(dir)) + "/" + name;
    if (isExecutableFile(candidate)) return candidate;
  }
  return "";
}

absl::StatusOr<std::vector<std::string>> workerCommand(
    const LaunchOptions& o, const std::map<std::string, std::string>& env) {
  std::string path = env.count("PATH") ? env.at("PATH") : "/usr/local/bin:/usr/bin:/bin";
  auto python = [&]() -> absl::StatusOr<std::string> {
    std::string wanted = env.count("PYTHON_EXEC") ? env.at("PYTHON_EXEC") : "python3";
    std::string found = findExecutable(wanted, path);
    if (found.empty()) {
      return absl::InvalidArgumentError(fmt::format(
          "Python interpreter '{}' not found; set PYTHON_EXEC to the Python that has your "
          "packages (e.g. PYTHON_EXEC=/usr/bin/python3)",
          wanted));
    }
    return found;
  };
  std::vector<std::string> argv;
  if (o.module) {
    auto py = python();
    if (!py.ok()) return py.status();
    argv = {*py, "-u", "-m", o.program};
  } else {
    // A bare name is a file in the working folder (torchrun's `train.py`), else a program on
    // PATH, as exec finds it; a folder of that name here (a source tree's worker/) does not hide
    // the program on PATH.
    struct stat st {};
    bool exists = stat(o.program.c_str(), &st) == 0;
    std::string file = o.program;
    if (o.program.find('/') == std::string::npos && (!exists || S_ISDIR(st.st_mode))) {
      if (std::string onPath = findExecutable(o.program, path); !onPath.empty()) {
        file = onPath;
        exists = true;
      }
    }
    if (!exists) {
      return absl::InvalidArgumentError(fmt::format("program '{}' not found", o.program));
    }
    if (stat(file.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(fmt::format("program '{}' is a directory", o.program));
    }
    if (o.noPython) {
      if (!isExecutableFile(file)) {
        return absl::InvalidArgumentError(fmt::format(
            "program '{}' is not executable (--no_python runs it directly; chmod +x it)",
            o.program));
      }
      argv = {file};
    } else if (o.runPath || looksLikePython(file) || !isExecutableFile(file)) {
      auto py = python();
      if (!py.ok()) return py.status();
      argv = {*py, "-u", file};  // the script found: here, or on PATH
    } else {
      argv = {file};
    }
  }
  if (!o.legacyLaunch.empty() && !o.useEnv) {
    argv.push_back(o.legacyLaunch == "2" ? "--local-rank=${local_rank}"
                                         : "--local_rank=${local_rank}");
  }
  argv.insert(argv.end(), o.programArgs.begin(), o.programArgs.end());
  return argv;
}

}  // namespace muster::launcher
