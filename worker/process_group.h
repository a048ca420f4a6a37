// Process groups built from the job's store: Gloo (LibTorch's ProcessGroupGloo), or NCCL
// (ProcessGroupNCCL, where LibTorch has CUDA and the build defines USE_C10D_NCCL) on muster's
// store, after an arrival check that names the ranks that never came.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/version.h>
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

#include <chrono>
#include <string>

#include "absl/status/statusor.h"
#include "worker/worker_env.h"

namespace muster::worker {

// What runs the collectives: LibTorch 1.x's ProcessGroupGloo is a c10d::ProcessGroup; from 2.0
// Gloo and NCCL are c10d::Backends (a ProcessGroup dispatches to them by device), with the same
// calls (allreduce, broadcast, barrier, ...).
#if TORCH_VERSION_MAJOR >= 2
using Collectives = c10d::Backend;
#else
using Collectives = c10d::ProcessGroup;
#endif

// Whether this node has a GPU for each of its ranks (NCCL wants one rank a GPU).
bool gpuForEveryLocalRank(const WorkerEnv& env);

// Whether this build has ProcessGroupNCCL (LibTorch with CUDA, built with USE_C10D_NCCL).
constexpr bool kHaveTorchNccl =
#ifdef USE_C10D_NCCL
    true;
#else
    false;
#endif

struct GroupOptions {
  // "gloo", "nccl" (a c10d NCCL group needs a LibTorch built with CUDA; else use NcclComm),
  // or "auto" (NCCL when this build has it and the node has a GPU for each of its ranks, else
  // Gloo). With NCCL, local rank r uses GPU r (made the current device): one rank a GPU.
  std::string backend = "auto";
  std::chrono::milliseconds timeout{300'000};
};

struct Group {
  std::string backend;
  c10::intrusive_ptr<c10d::Store> store;  // the job's store, this round's namespace
  c10::intrusive_ptr<Collectives> pg;
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
// (backend), FAILED_PRECONDITION (nccl without a GPU for this local rank), DEADLINE_EXCEEDED (missing ranks), UNAVAILABLE (store), INTERNAL (LibTorch's
// message).
absl::StatusOr<Group> createProcessGroup(const WorkerEnv& env, const GroupOptions& options);

// Ends the group before the program does, as Python's destroy_process_group(): an NCCL group's
// communicators and watchdog threads are shut down (a process that exits with them alive can
// crash in its exit handlers); the group is empty after. Safe to call twice; Gloo needs none.
void closeGroup(Group& group);

// Where the group's tensors live: local rank r's GPU for NCCL (made current when the group was
// built), else the CPU.
c10::Device groupDevice(const Group& group, const WorkerEnv& env);

// closeGroup at the end of a scope, whichever way it is left.
class GroupCloser {
 public:
  explicit GroupCloser(Group& group) : group_(group) {}
  GroupCloser(const GroupCloser&) = delete;
  GroupCloser& operator=(const GroupCloser&) = delete;
  ~GroupCloser() { closeGroup(group_); }

 private:
  Group& group_;
};

}  // namespace muster::worker
