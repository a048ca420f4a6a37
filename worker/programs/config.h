// The programs' JSON configs, PyText-style: distributed_world_size, use_cuda_if_available,
// train/eval/test paths, model, optimizer, trainer, shared_dir, save_path.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace muster::programs {

struct ModelConfig {
  int embedDim = 64;
  int kernelNum = 64;
  std::vector<int> kernelSizes{3, 4, 5};
  double dropout = 0.4;
  int maxVocab = 20000;
  int minFreq = 1;
  int maxSeqLen = 32;  // every sentence is padded or cut to this many tokens
  int numClasses = 2;
};

struct OptimizerConfig {
  std::string type = "adam";  // adam or sgd
  double lr = 0.002;
  double weightDecay = 0;
  double momentum = 0;  // sgd
};

struct TrainerConfig {
  int epochs = 5;
  int batchSize = 32;  // per rank
  int updateCycle = 1;  // micro-batches per optimizer step
  uint64_t seed = 0;
  int reportInterval = 20;  // optimizer steps between progress lines
  double bucketMiB = 25;    // gradient all-reduce bucket size
};

struct TrainConfig {
  std::string path;  // the config file itself
  int distributedWorldSize = 0;  // 0: whatever launch started
  bool useCudaIfAvailable = false;
  std::string trainPath, evalPath, testPath;
  std::string sharedDir;  // "" : MUSTER_SHARED_DIR
  std::string savePath;   // checkpoint; "" for none
  bool resume = true;
  int numThreads = 0;  // intra-op threads; 0 leaves LibTorch's default (OMP_NUM_THREADS)
  ModelConfig model;
  OptimizerConfig optimizer;
  TrainerConfig trainer;
};

struct DecodeConfig {
  std::string path;
  int distributedWorldSize = 0;
  std::string checkpoint, inputPath, outputPath, sharedDir;
  int batchSize = 64;
};

// Errors name the file and the field: "configs/x.json: trainer.batch_size must be an integer
// >= 1 (got \"a\")", unknown fields, missing required ones, unreadable or malformed JSON.
// Relative paths are taken from the config file's directory.
absl::StatusOr<TrainConfig> loadTrainConfig(const std::string& path);
absl::StatusOr<DecodeConfig> loadDecodeConfig(const std::string& path);

}  // namespace muster::programs
