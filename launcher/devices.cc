// The host's devices as launch counts them (devices.h).
#include "launcher/devices.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_split.h"
#include "fmt/format.h"
#include "launcher/option_values.h"

namespace muster::launcher {

int countCpus() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

using Env = std::map<std::string, std::string>;

namespace {

std::optional<std::string> visibleDevices(const Env& env) {
  auto it = env.find("CUDA_VISIBLE_DEVICES");
  if (it == env.end()) return std::nullopt;
  return it->second;
}

// gpu and auto: CUDA must show a GPU (else gpu is refused and auto takes the CPUs), and torch's
// count is the answer, as torchrun's determine_local_world_size.
absl::StatusOr<int> resolveGpus(const std::string& nproc, const Env& env, const NvidiaHost& host) {
  auto listed = visibleDevices(env);
  VisibleGpus gpus = visibleGpus(listed, host);
  std::string shown =
      listed && !listed->empty() ? "CUDA_VISIBLE_DEVICES=" + absl::CHexEscape(*listed) + ": " : "";
  auto refused = [&](const std::string& what, const std::string& instead) {
    return absl::InvalidArgumentError(
        fmt::format("--nproc_per_node={}: {} ({}{}); {}", nproc, what, shown, gpus.why, instead));
  };
  const std::string correct = "correct CUDA_VISIBLE_DEVICES or use a number";
  if (gpus.cuda < 0 || gpus.needsNvml) return refused("launch cannot tell which GPUs CUDA shows", "use a number");
  // is_available(): CUDA's count, or torch's own with PYTORCH_NVML_BASED_CUDA_CHECK=1.
  auto check = env.find("PYTORCH_NVML_BASED_CUDA_CHECK");
  bool nvmlCheck = check != env.end() && check->second == "1";
  if (gpus.torch < 0 && nvmlCheck) return refused("torch cannot count the GPUs", correct);
  if ((nvmlCheck ? gpus.torch : gpus.cuda) == 0) {
    if (nproc == "auto") return countCpus();
    return refused("CUDA shows no GPU here", "use a number or cpu");
  }
  if (gpus.torch < 0) return refused("torch cannot count the GPUs", correct);
  if (gpus.torch == 0) return refused("CUDA shows a GPU but torch counts none, and torchrun refuses that", correct);
  return gpus.torch;
}

}  // namespace

int countGpus(const Env& env) {
  auto listed = visibleDevices(env);
  return std::max(0, visibleGpus(listed, probeNvidiaHost(listed)).torch);
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

absl::StatusOr<int> resolveNproc(const std::string& value, const Env& env) {
  bool gpus = value == "gpu" || value == "auto";
  return resolveNproc(value, env, gpus ? probeNvidiaHost(visibleDevices(env)) : NvidiaHost{});
}

absl::StatusOr<int> resolveNproc(const std::string& value, const Env& env, const NvidiaHost& host) {
  if (value == "cpu") return countCpus();
  if (value == "gpu" || value == "auto") return resolveGpus(value, env, host);
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
  auto n = flags::toInt("--nproc_per_node", value, 1, "an integer >= 1, gpu, xpu, cpu or auto");
  if (!n.ok()) return n.status();
  return *n;
}

}  // namespace muster::launcher
