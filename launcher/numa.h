// --numa_binding: the CPUs near each worker's GPU, from the kernel's topology in /sys, as
// torch.numa.binding chooses them (node, socket, exclusive, core-complex).
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"

namespace muster::launcher {

struct NumaQuery {
  std::string mode;  // node, socket, exclusive, core-complex
  int gpu = 0;       // the worker's GPU: its index among the GPUs this process sees
  std::string sysRoot = "/sys";
  // CPUs this process may run on; unset: sched_getaffinity's.
  std::optional<std::set<int>> allowed;
};

// The CPUs as numactl's --physcpubind takes them ("0-3,8-11"). GPUs are the NVIDIA PCI
// display/3D devices in PCI address order (CUDA_DEVICE_ORDER=PCI_BUS_ID), narrowed by numeric
// CUDA_VISIBLE_DEVICES. Errors (FAILED_PRECONDITION, one line): no such GPU, a
// CUDA_VISIBLE_DEVICES of UUIDs, no CPU left, fewer cores than GPUs on a node (exclusive).
absl::StatusOr<std::string> numaCpusForGpu(const NumaQuery& query,
                                           const std::map<std::string, std::string>& env);

// "0-3,8" <-> {0,1,2,3,8}.
std::set<int> parseCpuList(const std::string& text);
std::string formatCpuList(const std::set<int>& cpus);

}  // namespace muster::launcher
