// What this host offers launch's workers: its CPUs, NVIDIA GPUs and Intel GPUs, and
// --nproc_per_node's gpu / xpu / cpu / auto resolved from them.
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace muster::launcher {

// Cores this process may run on (at least 1).
int countCpus();

// GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else NVIDIA device nodes.
int countGpus(const std::map<std::string, std::string>& env);

// Intel GPUs (torch's "xpu"): DRM render nodes whose device is Intel's with the i915 or xe
// driver; ZE_AFFINITY_MASK, when set, narrows them.
int countXpus(const std::map<std::string, std::string>& env);

// --nproc_per_node's value as a count: N, gpu, xpu, cpu or auto (GPUs, else CPUs). Errors:
// INVALID_ARGUMENT, one line (no GPU for gpu, no Intel GPU for xpu, not a number).
absl::StatusOr<int> resolveNproc(const std::string& value,
                                 const std::map<std::string, std::string>& env);

}  // namespace muster::launcher
