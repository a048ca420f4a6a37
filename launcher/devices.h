// What this host offers launch's workers: its CPUs, NVIDIA GPUs and Intel GPUs, and
// --nproc_per_node's gpu / xpu / cpu / auto resolved from them.
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "launcher/visible_gpus.h"

namespace muster::launcher {

// Cores this process may run on (at least 1).
int countCpus();

// GPUs this process may use, as torch counts them on this host (0 where it raises).
int countGpus(const std::map<std::string, std::string>& env);

// Intel GPUs (torch's "xpu"): DRM render nodes whose device is Intel's with the i915 or xe
// driver; ZE_AFFINITY_MASK, when set, narrows them.
int countXpus(const std::map<std::string, std::string>& env);

// --nproc_per_node's value as a count: N, gpu, xpu, cpu or auto (GPUs, else CPUs), as torchrun
// resolves it: gpu and auto ask CUDA whether it shows a GPU (torch's count instead with
// PYTORCH_NVML_BASED_CUDA_CHECK=1, as torch), then torch how many (visible_gpus.h). Errors:
// INVALID_ARGUMENT, one line (no GPU for gpu, none left by torch's count, no Intel GPU for xpu,
// not a number). The second form takes the host instead of probing this one.
absl::StatusOr<int> resolveNproc(const std::string& value,
                                 const std::map<std::string, std::string>& env);
absl::StatusOr<int> resolveNproc(const std::string& value,
                                 const std::map<std::string, std::string>& env,
                                 const NvidiaHost& host);

}  // namespace muster::launcher
