// What this host offers launch's workers: its CPUs, NVIDIA GPUs and Intel GPUs, and
// --nproc_per_node's gpu / xpu / cpu / auto resolved from them.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "launcher/nvml.h"

namespace muster::launcher {

// Cores this process may run on (at least 1).
int countCpus();

// This host's NVIDIA GPUs before CUDA_VISIBLE_DEVICES: how many (its /dev/nvidiaN nodes) and,
// where asked for and the driver's NVML answers, their UUIDs and their MIG instances'.
struct NvidiaHost {
  int devices = 0;
  std::optional<GpuUuids> uuids;
};
NvidiaHost probeNvidiaHost(bool wantUuids);

// What CUDA_VISIBLE_DEVICES (nullopt: unset) leaves of a host's GPUs, counted twice, as torchrun
// asks twice. `cuda`: as the CUDA runtime counts (cudaGetDeviceCount): entries in order, each
// read as C's strtoul cut to 32 bits or as a unique prefix of a GPU-/MIG- UUID, up to the first
// that names no device; a device named twice leaves none. `torch`: as torch.cuda.device_count()
// counts (its own parse, then NVML): a repeat anywhere before the list ends leaves none, an index
// is not cut to 32 bits. The two differ only on malformed lists (measured on an H100 with torch
// 2.11, tests/gpu/visible_devices.py). `why`: one clause saying what hid a listed device, empty
// when none was hidden.
struct VisibleGpus {
  int cuda = 0;
  int torch = 0;
  std::string why;
};
VisibleGpus visibleGpus(const std::optional<std::string>& cudaVisibleDevices, const NvidiaHost& host);

// GPUs this process may use, as torch counts them on this host.
int countGpus(const std::map<std::string, std::string>& env);

// Intel GPUs (torch's "xpu"): DRM render nodes whose device is Intel's with the i915 or xe
// driver; ZE_AFFINITY_MASK, when set, narrows them.
int countXpus(const std::map<std::string, std::string>& env);

// --nproc_per_node's value as a count: N, gpu, xpu, cpu or auto (GPUs, else CPUs), as torchrun
// resolves it: gpu and auto ask CUDA whether it shows a GPU, then torch how many. Errors:
// INVALID_ARGUMENT, one line (no GPU for gpu, none left by torch's count, no Intel GPU for xpu,
// not a number). The second form takes the host instead of probing this one.
absl::StatusOr<int> resolveNproc(const std::string& value,
                                 const std::map<std::string, std::string>& env);
absl::StatusOr<int> resolveNproc(const std::string& value,
                                 const std::map<std::string, std::string>& env,
                                 const NvidiaHost& host);

}  // namespace muster::launcher
