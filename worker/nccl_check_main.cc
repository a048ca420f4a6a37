// nccl_check: the NCCL path alone, without LibTorch, for a GPU host that has only NCCL and the
// CUDA runtime. Under launch, each rank takes GPU LOCAL_RANK % GPUs, builds an NcclComm through
// muster's store, and checks exact all-reduce and broadcast results.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <vector>

#include "common/files.h"
#include "rendezvous/store/local_store.h"
#include "rendezvous/client/store_client.h"
#include "worker/nccl_comm.h"
#include "worker/store_options.h"
#include "worker/worker_env.h"

using muster::Millis;

namespace {

// Sum in double of `count` floats on the host: the same figure torch's counterpart
// (tests/gpu/torch_nccl_check.py) prints for its all-reduce of the same values.
double checksum(const std::vector<float>& values) {
  double sum = 0;
  for (float v : values) sum += v;
  return sum;
}

}  // namespace

int main(int argc, char** argv) {
  // nccl_check [ELEMENTS [ITERATIONS]]: exact results for ELEMENTS floats, then, with
  // ITERATIONS, the bandwidth of that many all-reduces of them after two warm-up ones.
  size_t elements = 1u << 24;
  int iterations = 0;
  try {
    if (argc > 1) elements = std::stoul(argv[1]);
    if (argc > 2) iterations = std::stoi(argv[2]);
  } catch (const std::exception&) {
    std::fprintf(stderr, "nccl_check: usage: nccl_check [ELEMENTS [ITERATIONS]] (whole numbers)\n");
    return 2;
  }
  if (elements == 0 || iterations < 0 || argc > 3) {
    std::fprintf(stderr, "nccl_check: usage: nccl_check [ELEMENTS [ITERATIONS]] (ELEMENTS > 0)\n");
    return 2;
  }
  Millis timeout(60'000);
  auto env = muster::worker::WorkerEnv::fromProcess();
  if (!env.ok()) {
    std::fprintf(stderr, "nccl_check: %s\n", std::string(env.status().message()).c_str());
    return 2;
  }
  int gpus = muster::worker::NcclComm::deviceCount();
  if (gpus == 0) {
    std::fprintf(stderr, "nccl_check: no GPU visible to this process\n");
    return 77;  // "skipped"
  }
  if (env->localWorldSize > gpus) {
    // NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU detected").
    std::fprintf(stderr,
                 "nccl_check %s: %d ranks on this node but %d GPU(s): NCCL needs a GPU per rank; "
                 "use --nproc_per_node=%d or fewer\n",
                 env->describe().c_str(), env->localWorldSize, gpus, gpus);
    return 2;
  }
  if (env->storeAddr.empty() && env->worldSize > 1) {
    std::fprintf(stderr, "nccl_check: MUSTER_STORE_ADDR is not set; run it under launch\n");
    return 2;
  }
  std::unique_ptr<muster::rendezvous::Store> store;
  std::shared_ptr<muster::rendezvous::MemoryStore> memory;
  if (!env->storeAddr.empty()) {
    auto options = muster::worker::storeClientOptions(*env);
    if (!options.ok()) {
      std::fprintf(stderr, "nccl_check: %s\n", std::string(options.status().message()).c_str());
      return 2;
    }
    auto client = muster::rendezvous::StoreClient::connect(*options, muster::deadlineAfter(timeout));
    if (!client.ok()) {
      std::fprintf(stderr, "nccl_check: %s\n", std::string(client.status().message()).c_str());
      return 1;
    }
    store = std::move(*client);
  } else {
    memory = std::make_shared<muster::rendezvous::MemoryStore>();
    store = std::make_unique<muster::rendezvous::LocalStore>(memory, "single");
  }
  int device = env->localRank % gpus;
  auto start = std::chrono::steady_clock::now();
  auto comm = muster::worker::NcclComm::create(*store, env->runId, env->rank, env->worldSize,
                                               device, timeout);
  if (!comm.ok()) {
    std::fprintf(stderr, "nccl_check %s: %s\n", env->describe().c_str(),
                 std::string(comm.status().message()).c_str());
    return 1;
  }
  auto initMs = std::chrono::duration_cast<std::chrono::milliseconds>(
                    std::chrono::steady_clock::now() - start).count();
  float* buffer = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&buffer), elements * sizeof(float)) != cudaSuccess) {
    std::fprintf(stderr, "nccl_check: cudaMalloc of %zu floats failed\n", elements);
    return 1;
  }
  // Rank r gives (i % 1000) * (r + 1): every rank must end with (i % 1000) * n(n+1)/2, exactly.
  std::vector<float> host(elements);
  for (size_t i = 0; i < elements; ++i) host[i] = static_cast<float>(i % 1000) * (env->rank + 1);
  cudaMemcpy(buffer, host.data(), elements * sizeof(float), cudaMemcpyHostToDevice);
  auto s = (*comm)->allReduceSum(buffer, elements, timeout);
  if (!s.ok()) {
    std::fprintf(stderr, "nccl_check %s: %s\n", env->describe().c_str(), std::string(s.message()).c_str());
    return 1;
  }
  cudaMemcpy(host.data(), buffer, elements * sizeof(float), cudaMemcpyDeviceToHost);
  float factor = static_cast<float>(env->worldSize * (env->worldSize + 1) / 2);
  size_t wrong = 0;
  for (size_t i = 0; i < elements; ++i) wrong += host[i] != static_cast<float>(i % 1000) * factor;
  double sum = checksum(host);
  if (env->rank == 0) {
    for (size_t i = 0; i < elements; ++i) host[i] = static_cast<float>(i % 1000);
    cudaMemcpy(buffer, host.data(), elements * sizeof(float), cudaMemcpyHostToDevice);
  }
  s = (*comm)->broadcast(buffer, elements, 0, timeout);
  cudaMemcpy(host.data(), buffer, elements * sizeof(float), cudaMemcpyDeviceToHost);
  size_t wrongB = 0;
  for (size_t i = 0; i < elements; ++i) wrongB += host[i] != static_cast<float>(i % 1000);
  bool ok = wrong == 0 && wrongB == 0 && s.ok();
  std::printf("nccl_check %s on GPU %d of %d, NCCL %s: init %lld ms; all_reduce of %zu floats %s "
              "(checksum %.17g); broadcast %s\n",
              env->describe().c_str(), device, gpus, muster::worker::NcclComm::version().c_str(),
              static_cast<long long>(initMs), elements,
              wrong == 0 ? "exact" : fmt::format("WRONG in {} places", wrong).c_str(), sum,
              s.ok() && wrongB == 0 ? "exact" : "WRONG");
  if (ok && iterations > 0) {
    // Zeros stay zeros however often they are summed; the speed does not depend on the values.
    cudaMemset(buffer, 0, elements * sizeof(float));
    for (int i = 0; i < 2 && s.ok(); ++i) s = (*comm)->allReduceSum(buffer, elements, timeout);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations && s.ok(); ++i) s = (*comm)->allReduceSum(buffer, elements, timeout);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!s.ok()) {
      std::fprintf(stderr, "nccl_check %s: %s\n", env->describe().c_str(), std::string(s.message()).c_str());
      ok = false;
    } else {
      // nccl-tests' figures: algorithm bandwidth = bytes / time; bus bandwidth scales it by
      // 2(n-1)/n, what each link carries in a ring (0 for one rank: nothing leaves the GPU).
      double bytes = static_cast<double>(elements) * sizeof(float);
      double algbw = bytes * iterations / secs / 1e9;
      int n = env->worldSize;
      std::printf("nccl_check %s: all_reduce of %.3f GiB x %d: %.3f ms each, algbw %.1f GB/s, "
                  "busbw %.1f GB/s\n",
                  env->describe().c_str(), bytes / (1u << 30), iterations, secs * 1e3 / iterations,
                  algbw, algbw * 2.0 * (n - 1) / n);
    }
  }
  cudaFree(buffer);
  return ok ? 0 : 1;
}
