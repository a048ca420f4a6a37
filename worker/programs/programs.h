// The example programs behind `worker train`, `worker decode` and `worker gen-data`.
#pragma once

#include <string>

#include "worker/worker_env.h"

namespace muster::programs {

// Each returns the process's exit code (0 success, 1 runtime failure, 2 bad config) and
// prints one clear line on failure. `backend` of training: gloo, nccl (on local rank r's GPU),
// or auto (the GPU and NCCL when the config's use_cuda_if_available holds and this build has
// CUDA and NCCL, else the CPU and Gloo).
int runTrain(const worker::WorkerEnv& env, const std::string& configPath,
             const std::string& backend = "auto");
int runDecode(const worker::WorkerEnv& env, const std::string& configPath);

// Sample indices of one epoch for one rank, as torch's DistributedSampler: a permutation
// seeded by seed + epoch (or 0..n-1 without shuffle), padded by repetition to a multiple of
// the world size, every world-th element from `rank`.
std::vector<int64_t> shardIndices(int64_t n, int world, int rank, uint64_t seed, int epoch, bool shuffle);

}  // namespace muster::programs
