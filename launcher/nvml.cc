// GPU and MIG UUIDs from the driver's NVML (nvml.h): the few entry points it needs, declared by
// their documented C signatures and looked up in libnvidia-ml.so.1.
#include "launcher/nvml.h"

#include <dlfcn.h>

#include <cstring>

namespace muster::launcher {
namespace {

using Return = int;  // nvmlReturn_t; NVML_SUCCESS is 0
using Device = struct nvmlDevice_st*;
constexpr unsigned kUuidBuffer = 96;  // NVML_DEVICE_UUID_V2_BUFFER_SIZE

struct Nvml {
  Return (*init)();
  Return (*shutdown)();
  Return (*count)(unsigned*);
  Return (*byIndex)(unsigned, Device*);
  Return (*uuid)(Device, char*, unsigned);
  Return (*maxMigs)(Device, unsigned*);       // absent before NVML 11
  Return (*migByIndex)(Device, unsigned, Device*);
};

template <typename F>
void symbol(void* lib, const char* name, F& out) {
  out = reinterpret_cast<F>(dlsym(lib, name));
}

std::optional<std::string> uuidOf(const Nvml& nvml, Device d) {
  char text[kUuidBuffer] = {};
  if (nvml.uuid(d, text, kUuidBuffer) != 0) return std::nullopt;
  return std::string(text, strnlen(text, kUuidBuffer));
}

// Every GPU's UUID and its MIG instances'; nullopt where NVML fails for any (torch then takes
// CUDA's count, and so does launch).
std::optional<GpuUuids> read(const Nvml& nvml) {
  unsigned n = 0;
  if (nvml.count(&n) != 0) return std::nullopt;
  GpuUuids out;
  for (unsigned i = 0; i < n; ++i) {
    Device d = nullptr;
    if (nvml.byIndex(i, &d) != 0) return std::nullopt;
    auto id = uuidOf(nvml, d);
    if (!id) return std::nullopt;
    out.gpus.push_back(*id);
    unsigned migs = 0;
    if (!nvml.maxMigs || !nvml.migByIndex || nvml.maxMigs(d, &migs) != 0) continue;  // no MIG mode
    for (unsigned m = 0; m < migs; ++m) {
      Device mig = nullptr;
      if (nvml.migByIndex(d, m, &mig) != 0) continue;  // an empty slot
      if (auto migId = uuidOf(nvml, mig)) out.migs.push_back(*migId);
    }
  }
  return out;
}

}  // namespace

std::optional<GpuUuids> readGpuUuids() {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return std::nullopt;
  Nvml nvml{};
  symbol(lib, "nvmlInit_v2", nvml.init);
  symbol(lib, "nvmlShutdown", nvml.shutdown);
  symbol(lib, "nvmlDeviceGetCount_v2", nvml.count);
  symbol(lib, "nvmlDeviceGetHandleByIndex_v2", nvml.byIndex);
  symbol(lib, "nvmlDeviceGetUUID", nvml.uuid);
  symbol(lib, "nvmlDeviceGetMaxMigDeviceCount", nvml.maxMigs);
  symbol(lib, "nvmlDeviceGetMigDeviceHandleByIndex", nvml.migByIndex);
  std::optional<GpuUuids> out;
  if (nvml.init && nvml.shutdown && nvml.count && nvml.byIndex && nvml.uuid && nvml.init() == 0) {
    out = read(nvml);
    nvml.shutdown();
  }
  dlclose(lib);
  return out;
}

}  // namespace muster::launcher
