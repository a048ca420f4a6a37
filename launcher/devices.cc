// The host's devices as launch counts them (devices.h).
#include "launcher/devices.h"

#include <dirent.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "launcher/option_values.h"

namespace muster::launcher {

int countCpus() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

int countGpus(const std::map<std::string, std::string>& env) {
  auto it = env.find("CUDA_VISIBLE_DEVICES");
  if (it != env.end()) {
    int n = 0;
    for (absl::string_view part : absl::StrSplit(it->second, ',')) {
      // CUDA stops at the first invalid entry; "-1" hides every device.
      if (part.empty() || part == "-1") break;
      ++n;
    }
    return n;
  }
  int n = 0;
  if (DIR* dir = opendir("/dev")) {
    while (dirent* entry = readdir(dir)) {
      std::string name = entry->d_name;
      if (name.size() > 6 && name.rfind("nvidia", 0) == 0 &&
          name.find_first_not_of("0123456789", 6) == std::string::npos) {
        ++n;
      }
    }
    closedir(dir);
  }
  return n;
}

int countXpus(const std::map<std::string, std::string>& env) {
  int n = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/sys/class/drm", ec)) {
    std::string name = entry.path().filename().string();
    if (name.rfind("renderD", 0) != 0) continue;
    std::ifstream vendor(entry.path() / "device" / "vendor");
    std::string id;
    vendor >> id;
    auto driver = std::filesystem::read_symlink(entry.path() / "device" / "driver", ec).filename().string();
    if (id == "0x8086" && (driver == "i915" || driver == "xe")) ++n;
  }
  if (auto it = env.find("ZE_AFFINITY_MASK"); it != env.end()) {
    std::vector<std::string> listed = absl::StrSplit(it->second, ',', absl::SkipEmpty());
    n = std::min(n, static_cast<int>(listed.size()));
  }
  return n;
}

absl::StatusOr<int> resolveNproc(const std::string& value,
                                 const std::map<std::string, std::string>& env) {
  if (value == "cpu") return countCpus();
  if (value == "gpu") {
    int gpus = countGpus(env);
    if (gpus == 0) {
      return absl::InvalidArgumentError(
          "--nproc_per_node=gpu: this host has no usable GPU (no /dev/nvidiaN device, or "
          "CUDA_VISIBLE_DEVICES is empty); use a number or cpu");
    }
    return gpus;
  }
  if (value == "xpu") {
    int xpus = countXpus(env);
    if (xpus == 0) {
      return absl::InvalidArgumentError(
          "--nproc_per_node=xpu: this host has no usable Intel GPU (no /dev/dri render node of "
          "an Intel device with the i915 or xe driver, or ZE_AFFINITY_MASK is empty); use a "
          "number, cpu or gpu");
    }
    return xpus;
  }
  if (value == "auto") {
    int gpus = countGpus(env);
    return gpus > 0 ? gpus : countCpus();
  }
  auto n = flags::toInt("--nproc_per_node", value, 1, "an integer >= 1, gpu, xpu, cpu or auto");
  if (!n.ok()) return n.status();
  return *n;
}

}  // namespace muster::launcher
