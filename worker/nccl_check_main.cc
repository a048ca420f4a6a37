// nccl_check: the NCCL path alone, without LibTorch, for a GPU host that has only NCCL and the
// CUDA runtime. Under launch, each rank takes GPU LOCAL_RANK % GPUs, builds an NcclComm through
// muster's store, and checks exact all-reduce and broadcast results.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <cstdio>
#include <vector>

#include "common/files.h"
#include "rendezvous/store/local_store.h"
#include "rendezvous/client/store_client.h"
#include "worker/nccl_comm.h"
#include "worker/store_options.h"
#include "worker/worker_env.h"

using muster::Millis;

int main(int argc, char** argv) {
  size_t elements = argc > 1 ? std::stoul(argv[1]) : (1u << 24);
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
  std::vector<float> host(elements, static_cast<float>(env->rank + 1));
  cudaMemcpy(buffer, host.data(), elements * sizeof(float), cudaMemcpyHostToDevice);
  auto t0 = std::chrono::steady_clock::now();
  auto s = (*comm)->allReduceSum(buffer, elements, timeout);
  auto t1 = std::chrono::steady_clock::now();
  if (!s.ok()) {
    std::fprintf(stderr, "nccl_check %s: %s\n", env->describe().c_str(), std::string(s.message()).c_str());
    return 1;
  }
  cudaMemcpy(host.data(), buffer, elements * sizeof(float), cudaMemcpyDeviceToHost);
  float expected = static_cast<float>(env->worldSize * (env->worldSize + 1) / 2);
  size_t wrong = 0;
  for (float v : host) wrong += v != expected;
  if (env->rank == 0) {
    for (size_t i = 0; i < elements; ++i) host[i] = static_cast<float>(i % 1000);
    cudaMemcpy(buffer, host.data(), elements * sizeof(float), cudaMemcpyHostToDevice);
  }
  s = (*comm)->broadcast(buffer, elements, 0, timeout);
  cudaMemcpy(host.data(), buffer, elements * sizeof(float), cudaMemcpyDeviceToHost);
  size_t wrongB = 0;
  for (size_t i = 0; i < elements; ++i) wrongB += host[i] != static_cast<float>(i % 1000);
  double secs = std::chrono::duration<double>(t1 - t0).count();
  double gbps = elements * sizeof(float) / secs / 1e9;
  std::printf("nccl_check %s on GPU %d: init %lld ms; all_reduce of %zu floats %s (%.2f GB/s "
              "algorithm bandwidth); broadcast %s\n",
              env->describe().c_str(), device, static_cast<long long>(initMs), elements,
              wrong == 0 ? "exact" : fmt::format("WRONG in {} places", wrong).c_str(), gbps,
              s.ok() && wrongB == 0 ? "exact" : "WRONG");
  cudaFree(buffer);
  return wrong == 0 && wrongB == 0 && s.ok() ? 0 : 1;
}
