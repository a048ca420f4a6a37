// NcclComm: unique id through the store, non-blocking init and collectives with deadlines,
// abort on timeout (never a hang).
#include "worker/nccl_comm.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include <cstring>
#include <thread>

namespace muster::worker {

struct NcclComm::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int device = 0;
};

namespace {

// NCCL's non-blocking calls report progress through ncclCommGetAsyncError: ask until the
// operation is done, failed, or the deadline passes. A short sleep between questions keeps
// the CPU free for NCCL's own threads.
absl::Status waitForComm(ncclComm_t comm, Deadline deadline, const std::string& what) {
  while (true) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t rc = ncclCommGetAsyncError(comm, &state);
    if (rc != ncclSuccess) {
      return absl::InternalError(fmt::format("{}: {}", what, ncclGetErrorString(rc)));
    }
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) {
      return absl::InternalError(fmt::format("{}: {} ({})", what, ncclGetErrorString(state),
                                             ncclGetLastError(comm)));
    }
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError(fmt::format("{}: not done before the deadline", what));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace

int NcclComm::deviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

std::string NcclComm::version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  // NCCL_VERSION(X,Y,Z): X*10000 + Y*100 + Z since 2.9 (X*1000 + Y*100 + Z before).
  if (v >= 10000) return fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100);
  return fmt::format("{}.{}.{}", v / 1000, v / 100 % 10, v % 100);
}

absl::StatusOr<std::unique_ptr<NcclComm>> NcclComm::create(rendezvous::Store& store,
                                                            const std::string& key, int rank,
                                                            int size, int device,
                                                            Millis timeout) {
  Deadline deadline = deadlineAfter(timeout);
  std::string who = fmt::format("NCCL init of rank {} of {} on GPU {}", rank, size, device);
  if (cudaSetDevice(device) != cudaSuccess) {
    return absl::FailedPreconditionError(fmt::format("{}: cudaSetDevice: {}", who,
                                                     cudaGetErrorString(cudaGetLastError())));
  }
  ncclUniqueId id;
  std::string idKey = "muster/nccl/" + key + "/unique_id";
  if (rank == 0) {
    if (ncclResult_t rc = ncclGetUniqueId(&id); rc != ncclSuccess) {
      return absl::InternalError(fmt::format("{}: ncclGetUniqueId: {}", who, ncclGetErrorString(rc)));
    }
    auto s = store.set(idKey, std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
    if (!s.ok()) return s;
  } else {
    auto value = store.get(idKey, deadline);
    if (!value.ok()) {
      return absl::Status(value.status().code(),
                          fmt::format("{}: waiting for rank 0's unique id: {}", who,
                                      std::string(value.status().message())));
    }
    if (value->size() != sizeof(id)) {
      return absl::DataLossError(fmt::format("{}: the unique id in the store has {} bytes, not {}",
                                             who, value->size(), sizeof(id)));
    }
    std::memcpy(&id, value->data(), sizeof(id));
  }
  std::unique_ptr<NcclComm> comm(new NcclComm());
  comm->impl_ = std::make_unique<Impl>();
  comm->impl_->device = device;
  comm->rank_ = rank;
  comm->size_ = size;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t rc = ncclCommInitRankConfig(&comm->impl_->comm, size, id, rank, &config);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    return absl::InternalError(fmt::format("{}: {}", who, ncclGetErrorString(rc)));
  }
  auto ready = waitForComm(comm->impl_->comm, deadline, who);
  if (!ready.ok()) {
    ncclCommAbort(comm->impl_->comm);
    comm->impl_->comm = nullptr;
    comm->aborted_ = true;
    return ready;
  }
  if (cudaStreamCreateWithFlags(&comm->impl_->stream, cudaStreamNonBlocking) != cudaSuccess) {
    return absl::InternalError(fmt::format("{}: cudaStreamCreate failed", who));
  }
  return comm;
}

NcclComm::~NcclComm() {
  if (!impl_) return;
  if (impl_->comm != nullptr) {
    if (aborted_) {
      ncclCommAbort(impl_->comm);
    } else {
      ncclCommFinalize(impl_->comm);
      waitForComm(impl_->comm, deadlineAfter(Millis(10000)), "finalize").IgnoreError();
      ncclCommDestroy(impl_->comm);
    }
  }
  if (impl_->stream != nullptr) cudaStreamDestroy(impl_->stream);
}

absl::Status NcclComm::waitStream(Millis timeout, const char* what) {
  Deadline deadline = deadlineAfter(timeout);
  std::string label = fmt::format("NCCL {} on rank {} of {}", what, rank_, size_);
  auto queued = waitForComm(impl_->comm, deadline, label);
  while (queued.ok()) {
    cudaError_t e = cudaStreamQuery(impl_->stream);
    if (e == cudaSuccess) return absl::OkStatus();
    if (e != cudaErrorNotReady) {
      queued = absl::InternalError(fmt::format("{}: {}", label, cudaGetErrorString(e)));
      break;
    }
    // A peer that died shows up as an async error; a peer that hangs, as the deadline.
    queued = waitForComm(impl_->comm, deadline, label);
    if (queued.ok() && Clock::now() >= deadline) {
      queued = absl::DeadlineExceededError(fmt::format("{}: not done before the deadline", label));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  ncclCommAbort(impl_->comm);
  impl_->comm = nullptr;
  aborted_ = true;
  return queued;
}

absl::Status NcclComm::allReduceSum(float* buffer, size_t count, Millis timeout) {
  if (aborted_) return absl::FailedPreconditionError("the NCCL communicator was aborted");
  ncclResult_t rc = ncclAllReduce(buffer, buffer, count, ncclFloat, ncclSum, impl_->comm,
                                  impl_->stream);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    return absl::InternalError(fmt::format("ncclAllReduce: {}", ncclGetErrorString(rc)));
  }
  return waitStream(timeout, "all_reduce");
}

absl::Status NcclComm::broadcast(float* buffer, size_t count, int root, Millis timeout) {
  if (aborted_) return absl::FailedPreconditionError("the NCCL communicator was aborted");
  ncclResult_t rc = ncclBroadcast(buffer, buffer, count, ncclFloat, root, impl_->comm,
                                  impl_->stream);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    return absl::InternalError(fmt::format("ncclBroadcast: {}", ncclGetErrorString(rc)));
  }
  return waitStream(timeout, "broadcast");
}

}  // namespace muster::worker
