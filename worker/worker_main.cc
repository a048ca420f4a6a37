// worker: muster's example programs. No subcommand: the self-check.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "common/build_info.h"
#include "worker/programs/programs.h"
#include "worker/programs/sst_data.h"
#include "worker/self_check.h"
#include "worker/worker_env.h"

int main(int argc, char** argv) {
  CLI::App app{"worker: muster's example programs (no subcommand: the self-check)"};
  app.set_version_flag("--version", muster::build::versionText("worker"));
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
  std::string trainConfig, decodeConfig, dataDir;
  int trainN = 4000, devN = 500, testN = 500, seed = 1;
  auto* train = app.add_subcommand("train", "distributed DocNN training (PyText-style JSON config)");
  train->add_option("--config", trainConfig, "e.g. configs/distributed_docnn.json")->required();
  std::string trainBackend = "auto";
  train->add_option("--backend", trainBackend,
                    "gloo (CPU), nccl (local rank r's GPU) or auto (the GPU and NCCL when the config's "
                    "use_cuda_if_available holds and this build has them)")
      ->capture_default_str()
      ->check(CLI::IsMember({"gloo", "nccl", "auto"}));
  auto* decode = app.add_subcommand("decode", "distributed decoding with a trained checkpoint");
  decode->add_option("--config", decodeConfig, "e.g. configs/decode_docnn.json")->required();
  auto* gen = app.add_subcommand("gen-data", "write a small SST-2-format dataset with a learnable signal");
  gen->add_option("--out", dataDir, "directory for train.tsv, dev.tsv, test.tsv")->required();
  gen->add_option("--train", trainN)->capture_default_str();
  gen->add_option("--dev", devN)->capture_default_str();
  gen->add_option("--test", testN)->capture_default_str();
  gen->add_option("--seed", seed)->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "worker: %s (see --help)\n", e.what());
    return 2;
  }
  if (*gen) {
    auto s = muster::programs::generateDataset(dataDir, trainN, devN, testN, static_cast<uint64_t>(seed));
    if (!s.ok()) {
      std::fprintf(stderr, "worker gen-data: %s\n", std::string(s.message()).c_str());
      return 1;
    }
    std::printf("wrote %d/%d/%d examples to %s/{train,dev,test}.tsv\n", trainN, devN, testN, dataDir.c_str());
    return 0;
  }
  auto env = muster::worker::WorkerEnv::fromProcess();
  if (!env.ok()) {
    std::fprintf(stderr, "worker: %s\n", std::string(env.status().message()).c_str());
    return 2;
  }
  if (*train) return muster::programs::runTrain(*env, trainConfig, trainBackend);
  if (*decode) return muster::programs::runDecode(*env, decodeConfig);
  check.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeoutS * 1000));
  return muster::worker::runSelfCheck(*env, check);
}
