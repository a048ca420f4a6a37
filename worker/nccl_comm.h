// An NCCL communicator bootstrapped through muster's store: rank 0 creates the unique id and
// puts it in the store, the others read it. No LibTorch: it runs on a GPU host with only its
// own shared libraries (NCCL, CUDA runtime, gRPC).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/deadline.h"
#include "rendezvous/store/store.h"

namespace muster::worker {

// Thread-safety: one thread at a time per communicator (as NCCL's own). Lifetime: the
// destructor finalizes and destroys the communicator; after a failed or timed-out operation
// the communicator is aborted and every later call fails at once.
class NcclComm {
 public:
  // Number of CUDA devices this process sees (0 when there is no driver or no GPU).
  static int deviceCount();
  // The NCCL this process loaded, as "2.28.9" (the library's, not the headers').
  static std::string version();

  // Collective over `size` ranks on `device`. The init is non-blocking and bounded by
  // `timeout`: on failure or timeout the communicator is aborted and the error names the rank,
  // the size and NCCL's reason. `key` tells communicators of one round apart.
  static absl::StatusOr<std::unique_ptr<NcclComm>> create(rendezvous::Store& store,
                                                          const std::string& key, int rank,
                                                          int size, int device, Millis timeout);
  ~NcclComm();

  // In-place sum over every rank of `count` floats at `deviceBuffer`, waited for.
  absl::Status allReduceSum(float* deviceBuffer, size_t count, Millis timeout);
  // In place: every rank ends with root's `count` floats.
  absl::Status broadcast(float* deviceBuffer, size_t count, int root, Millis timeout);

  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  NcclComm() = default;
  absl::Status waitStream(Millis timeout, const char* what);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, size_ = 1;
  bool aborted_ = false;
};

}  // namespace muster::worker
