// What CUDA_VISIBLE_DEVICES leaves of this host's NVIDIA GPUs, counted twice, as torchrun asks
// twice: whether CUDA shows a GPU (torch.cuda.is_available(), the CUDA runtime's
// cudaGetDeviceCount) and how many torch counts (torch.cuda.device_count(): torch's own parse of
// the list, then NVML). The two differ only on malformed lists. The rules were measured on an
// H100 with torch 2.11 (tests/gpu/visible_devices.py; devices_test.cc holds the table).
#pragma once

#include <optional>
#include <string>

#include "launcher/nvml.h"

namespace muster::launcher {

enum class NvmlState { kNotRead, kUnreadable, kRead };

// This host's GPUs before CUDA_VISIBLE_DEVICES: its /dev/nvidiaN nodes, and the driver's NVML
// (the UUIDs) where it was read.
struct NvidiaHost {
  int devices = 0;
  NvmlState nvml = NvmlState::kNotRead;
  GpuUuids uuids;  // when nvml is kRead
};

// This host, for `value` of CUDA_VISIBLE_DEVICES: the device nodes, and NVML only where the
// counts depend on it (a UUID list, or torch cutting an index list where CUDA does not).
NvidiaHost probeNvidiaHost(const std::optional<std::string>& value);

struct VisibleGpus {
  int cuda = 0;           // what cudaGetDeviceCount gives; -1: launch cannot tell (see why)
  int torch = 0;          // what torch.cuda.device_count() gives; -1: it raises (see why)
  bool needsNvml = false; // the counts depend on NVML, which the host was not read for (the
                          // counts are then not to be used)
  std::string why;        // one line: what hid a listed device; empty when none was hidden
};

// CUDA's rules: entries in order, each an index as C's strtoul reads it cut to 32 bits, or a
// unique prefix of a GPU-/MIG- UUID (the list's first entry says which), up to the first that
// names no device; a device named twice leaves none. torch's: entries stripped and read as
// Python's int() of their leading sign and digits (a sign alone raises), a repeat anywhere before
// the list's end leaves none, then NVML's count cuts the list (without NVML, torch takes CUDA's
// count). `value` nullopt: unset.
VisibleGpus visibleGpus(const std::optional<std::string>& value, const NvidiaHost& host);

}  // namespace muster::launcher
