// The UUIDs of this host's NVIDIA GPUs and of their MIG instances, read from the driver's own
// NVML (libnvidia-ml.so.1, loaded at run time: the build needs no CUDA, and a host without the
// driver answers nothing). Read only for a CUDA_VISIBLE_DEVICES that names devices by UUID.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace muster::launcher {

struct GpuUuids {
  std::vector<std::string> gpus;  // GPU-..., in NVML's order (PCI bus order)
  std::vector<std::string> migs;  // MIG-..., of every GPU in MIG mode
};

// nullopt when the library cannot be loaded or NVML does not start.
std::optional<GpuUuids> readGpuUuids();

}  // namespace muster::launcher
