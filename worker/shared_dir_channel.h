// Moves tensors and bytes between ranks through files in a directory every rank can read
// (local on one node, NFS across nodes): the sender writes a file and announces it through
// the store; receivers wait on the store key, map the file and check it.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <map>
#include <optional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/deadline.h"
#include "worker/worker_env.h"

namespace muster::worker {

struct ChannelOptions {
  std::string dir;          // "" takes MUSTER_SHARED_DIR (a private one for a world of one)
  Millis timeout{300'000};  // for each receive
  // For create()'s collective probe: every rank must have started. 0: the same as timeout.
  Millis startTimeout{0};
};

// Files live under <dir>/<job id>/<round>/, are written under a temporary name and renamed
// into place (a reader never sees half a file), and carry a header (magic, version, dtype,
// shape, byte length, XXH3 checksum, a per-transfer nonce that the store announcement
// repeats). Receivers map the file and build the tensor on the mapping: no copy. The last
// receiver deletes the file.
//
// Transfers are matched by order, as MPI's: the n-th send from A to B with tag T is the n-th
// recv on B from A with tag T; collectives likewise per tag. Every rank must call a
// collective.
//
// Errors (each names the file and the sending rank): DEADLINE_EXCEEDED (nothing announced in
// time), DATA_LOSS (truncated, corrupted or foreign file), RESOURCE_EXHAUSTED (disk full, also
// reported to the receivers), FAILED_PRECONDITION (the directory is not shared).
// Thread-safety: one thread at a time. Lifetime: tensors returned by recv stay valid after the
// channel is gone (they own their mapping).
class SharedDirChannel {
 public:
  // Collective: every rank checks that it sees a probe file rank 0 writes; ranks that cannot
  // are named in the error every rank gets.
  static absl::StatusOr<std::unique_ptr<SharedDirChannel>> create(
      const WorkerEnv& env, c10::intrusive_ptr<c10d::Store> store, ChannelOptions options = {});

  absl::Status send(const at::Tensor& tensor, int dst, int tag = 0);
  absl::StatusOr<at::Tensor> recv(int src, int tag = 0);
  // Root passes its tensor; the others' argument is ignored. Every rank gets root's tensor.
  absl::StatusOr<at::Tensor> broadcast(const at::Tensor& tensor, int root, int tag = 0);
  // Root gets every rank's tensor in rank order; the others get an empty vector.
  absl::StatusOr<std::vector<at::Tensor>> gather(const at::Tensor& tensor, int root, int tag = 0);
  absl::StatusOr<std::vector<at::Tensor>> allGather(const at::Tensor& tensor, int tag = 0);

  absl::Status sendBytes(std::string_view bytes, int dst, int tag = 0);
  absl::StatusOr<std::string> recvBytes(int src, int tag = 0);
  absl::StatusOr<std::string> broadcastBytes(std::string_view bytes, int root, int tag = 0);
  absl::StatusOr<std::vector<std::string>> gatherBytes(std::string_view bytes, int root,
                                                       int tag = 0);
  absl::StatusOr<std::vector<std::string>> allGatherBytes(std::string_view bytes, int tag = 0);

  ~SharedDirChannel();

  const std::string& roundDir() const { return roundDir_; }
  int rank() const { return env_.rank; }
  int worldSize() const { return env_.worldSize; }

  struct Payload;
  struct Received;

 private:
  SharedDirChannel(WorkerEnv env, c10::intrusive_ptr<c10d::Store> store, ChannelOptions options,
                   std::string roundDir);
  absl::Status probe();
  // The next transfer's name on `stream`; `direction` 's', 'r' or 'c' (collective).
  std::string nextName(const std::string& stream, char direction = 'c');
  absl::Status publish(const std::string& name, const Payload& payload, int receivers);
  absl::StatusOr<Received> fetch(const std::string& name, int src);
  absl::Status sendPayload(const Payload& p, int dst, int tag, const char* stream);
  absl::StatusOr<Received> recvPayload(int src, int tag, const char* stream);
  // The root gets an empty optional (it keeps its own); the others root's payload.
  absl::StatusOr<std::optional<Received>> broadcastPayload(const Payload& p, int root, int tag, const char* stream);
  // Slots in rank order; the caller's own slot is empty. gather: empty vector off the root.
  absl::StatusOr<std::vector<std::optional<Received>>> gatherPayload(const Payload& p, int root, int tag,
                                                                     const char* stream);
  absl::StatusOr<std::vector<std::optional<Received>>> allGatherPayload(const Payload& p, int tag,
                                                                        const char* stream);

  WorkerEnv env_;
  c10::intrusive_ptr<c10d::Store> store_;
  ChannelOptions options_;
  std::string roundDir_;
  std::map<std::string, uint64_t> sequence_;
  std::string ownedDir_;  // a world of one's private directory, removed with the channel
};

}  // namespace muster::worker
