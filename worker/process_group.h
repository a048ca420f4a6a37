// Process groups built from the job's store: Gloo (LibTorch's ProcessGroupGloo) on muster's
// store, after an arrival check that names the ranks that never came.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>

#include "absl/status/statusor.h"
#include "worker/worker_env.h"

namespace muster::worker {

struct GroupOptions {
  // "gloo", "nccl" (a c10d NCCL group needs a LibTorch built with CUDA; else use NcclComm),
  // or "auto" (NCCL when this LibTorch has it and a GPU is present, else Gloo).
  std::string backend = "auto";
  std::chrono::milliseconds timeout{300'000};
};

struct Group {
  std::string backend;
  c10::intrusive_ptr<c10d::Store> store;  // the job's store, this round's namespace
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  std::chrono::milliseconds initTime{0};
};

// The job's store as a c10d::Store: muster's (MUSTER_STORE_*) when set, else a TCPStore at
// MASTER_ADDR:MASTER_PORT that rank 0 hosts (a program started by torchrun). Errors name the
// address and the variable.
absl::StatusOr<c10::intrusive_ptr<c10d::Store>> connectStore(const WorkerEnv& env,
                                                             std::chrono::milliseconds timeout);

// Every rank announces itself and waits for all the others, up to `timeout`. Error
// DEADLINE_EXCEEDED: "ranks 2, 3 of 4 did not arrive within 30 s".
absl::Status awaitRanks(c10d::Store& store, const WorkerEnv& env, const std::string& tag,
                        std::chrono::milliseconds timeout);

// Connects to the store, waits for every rank, builds the group. Errors: INVALID_ARGUMENT
// (backend), DEADLINE_EXCEEDED (missing ranks), UNAVAILABLE (store), INTERNAL (LibTorch's
// message).
absl::StatusOr<Group> createProcessGroup(const WorkerEnv& env, const GroupOptions& options);

}  // namespace muster::worker
