// launch: parse torchrun's flags, take what Slurm says, validate, run the agent, map errors to
// exit codes.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "common/build_info.h"
#include "common/log.h"
#include "launcher/agent.h"
#include "launcher/options.h"
#include "launcher/worker_command.h"
#include "launcher/slurm.h"

extern char** environ;

int main(int argc, char** argv) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    auto eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  std::vector<std::string> args(argv + 1, argv + argc);
  auto usageError = [](const absl::Status& s) {
    std::fprintf(stderr, "launch: %s\n", std::string(s.message()).c_str());
    return 2;
  };
  auto options = muster::launcher::parseLaunchFlags(args, env);
  if (!options.ok()) {
    if (options.status().code() == absl::StatusCode::kNotFound) {  // --help
      std::fputs(std::string(options.status().message()).c_str(), stdout);
      return 0;
    }
    return usageError(options.status());
  }
  if (options->showVersion) {
    std::puts(muster::build::versionText("launch").c_str());
    return 0;
  }
  if (auto s = muster::launcher::takeFromSlurm(*options, env); !s.ok()) return usageError(s);
  if (auto s = muster::launcher::validateLaunchOptions(*options, env); !s.ok()) return usageError(s);
  if (!options->logLevel.empty() && !muster::log::setLevel(options->logLevel)) {
    std::fprintf(stderr, "launch: --log_level=%s is invalid; expected trace, debug, info, warn, "
                 "error or off\n", options->logLevel.c_str());
    return 2;
  }
  // Only valid options touch the machine (scontrol, the shared directory).
  if (!options->slurmJob.empty()) muster::launcher::settleSlurmStep(*options);
  auto command = muster::launcher::workerCommand(*options, env);
  if (!command.ok()) {
    return usageError(command.status());
  }
  muster::launcher::Agent agent(*options, env, *command);
  return agent.run();
}
