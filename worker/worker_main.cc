// worker: muster's example programs. No subcommand: the self-check.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "worker/self_check.h"
#include "worker/worker_env.h"

int main(int argc, char** argv) {
  CLI::App app{"worker: muster's example programs (no subcommand: the self-check)"};
  muster::worker::SelfCheckOptions check;
  double timeoutS = 60;
  app.add_option("--backend", check.backend, "gloo, nccl or auto")->capture_default_str();
  app.add_option("--timeout", timeoutS, "seconds for the group and each collective")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--elements", check.elements, "floats per collective")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 28));
  app.add_option("--fail-rank", check.failRank, "for tests: this rank exits before the all-reduce");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "worker: %s (see --help)\n", e.what());
    return 2;
  }
  auto env = muster::worker::WorkerEnv::fromProcess();
  if (!env.ok()) {
    std::fprintf(stderr, "worker: %s\n", std::string(env.status().message()).c_str());
    return 2;
  }
  check.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeoutS * 1000));
  return muster::worker::runSelfCheck(*env, check);
}
