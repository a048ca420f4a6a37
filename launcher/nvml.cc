// GPU and MIG UUIDs from the driver's NVML (nvml.h): the few entry points it needs, declared by
// their documented C signatures and looked up in libnvidia-ml.so.1.
#include "launcher/nvml.h"

#include <dlfcn.h>

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
void find(void* lib, const char* name, F& out) {
  out = reinterpret_cast<F>(dlsym(lib, name));
}

std::optional<std::string> uuidOf(const Nvml& nvml, Device d) {
  char text[kUuidBuffer] = {};
  if (nvml.uuid(d, text, kUuidBuffer) != 0) return std::nullopt;
  return std::string(text);
}

}  // namespace

std::optional<GpuUuids> readGpuUuids() {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return std::nullopt;
  Nvml nvml{};
  find(lib, "nvmlInit_v2", nvml.init);
  find(lib, "nvmlShutdown", nvml.shutdown);
  find(lib, "nvmlDeviceGetCount_v2", nvml.count);
  find(lib, "nvmlDeviceGetHandleByIndex_v2", nvml.byIndex);
  find(lib, "nvmlDeviceGetUUID", nvml.uuid);
  find(lib, "nvmlDeviceGetMaxMigDeviceCount", nvml.maxMigs);
  find(lib, "nvmlDeviceGetMigDeviceHandleByIndex", nvml.migByIndex);
  std::optional<GpuUuids> out;
  if (nvml.init && nvml.shutdown && nvml.count && nvml.byIndex && nvml.uuid && nvml.init() == 0) {
    unsigned n = 0;
    if (nvml.count(&n) == 0) {
      out.emplace();
      for (unsigned i = 0; i < n; ++i) {
        Device d = nullptr;
        if (nvml.byIndex(i, &d) != 0) break;
        auto id = uuidOf(nvml, d);
        if (!id) break;
        out->gpus.push_back(*id);
        unsigned migs = 0;
        if (!nvml.maxMigs || !nvml.migByIndex || nvml.maxMigs(d, &migs) != 0) continue;
        for (unsigned m = 0; m < migs; ++m) {
          Device mig = nullptr;
          if (nvml.migByIndex(d, m, &mig) != 0) continue;  // an empty slot
          if (auto migId = uuidOf(nvml, mig)) out->migs.push_back(*migId);
        }
      }
    }
    nvml.shutdown();
  }
  dlclose(lib);
  return out;
}

}  // namespace muster::launcher
