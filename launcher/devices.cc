// The host's devices as launch counts them (devices.h).
#include "launcher/devices.h"

#include <dirent.h>

#include <algorithm>
#include <string_view>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "fmt/format.h"
#include "launcher/option_values.h"

namespace muster::launcher {

int countCpus() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

namespace {

using Env = std::map<std::string, std::string>;

bool isUuidList(const std::string& v) { return v.rfind("GPU-", 0) == 0 || v.rfind("MIG-", 0) == 0; }

int deviceNodes() {
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

bool isDigit(char c) { return c >= '0' && c <= '9'; }

// An entry as CUDA reads it: C's strtoul (leading blanks, a sign, digits, anything after them
// ignored; past 2^64 saturates, a minus wraps), cut to 32 bits. nullopt without digits.
std::optional<uint32_t> cudaIndex(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || (s[i] >= '\t' && s[i] <= '\r'))) ++i;
  bool minus = i < s.size() && s[i] == '-';
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
  if (i >= s.size() || !isDigit(s[i])) return std::nullopt;
  uint64_t v = 0;
  bool over = false;
  for (; i < s.size() && isDigit(s[i]); ++i) {
    uint64_t d = static_cast<uint64_t>(s[i] - '0');
    if (v > (UINT64_MAX - d) / 10) over = true;
    v = v * 10 + d;
  }
  if (over) v = UINT64_MAX;
  else if (minus) v = 0 - v;
  return static_cast<uint32_t>(v);
}

// An entry as torch's _parse_visible_devices reads it: blanks stripped, a sign, digits, the
// rest ignored; -1 without digits (a negative one ends the list too).
int64_t torchIndex(std::string_view s) {
  auto blank = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f'); };
  while (!s.empty() && blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && blank(s.back())) s.remove_suffix(1);
  size_t i = 0;
  bool minus = !s.empty() && s[0] == '-';
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) i = 1;
  if (i >= s.size() || !isDigit(s[i])) return -1;
  int64_t v = 0;
  for (; i < s.size() && isDigit(s[i]); ++i) v = v > (INT64_MAX - 9) / 10 ? INT64_MAX : v * 10 + (s[i] - '0');
  return minus ? -v : v;
}

// The one GPU (or MIG instance) whose UUID starts with `entry`; -1 for none or several.
int uuidIndex(const std::string& entry, const std::vector<std::string>& uuids) {
  int found = -1;
  for (size_t i = 0; i < uuids.size(); ++i) {
    if (uuids[i].rfind(entry, 0) != 0) continue;
    if (found >= 0) return -1;
    found = static_cast<int>(i);
  }
  return found;
}

// CUDA's count; `why` names the first entry that ended the list or the repeat.
int cudaCount(const std::vector<std::string>& entries, bool uuids, const NvidiaHost& host, std::string& why) {
  std::vector<int64_t> seen;
  std::string prefix = uuids ? entries[0].substr(0, 4) : "";
  const std::vector<std::string>* known = nullptr;
  if (uuids && host.uuids) known = prefix == "GPU-" ? &host.uuids->gpus : &host.uuids->migs;
  for (const std::string& entry : entries) {
    int64_t index = -1;
    if (uuids && entry.rfind(prefix, 0) == 0) {
      // Without NVML a UUID cannot be checked: taken while the host has devices for it.
      index = known ? uuidIndex(entry, *known)
                    : (prefix == "MIG-" || static_cast<int>(seen.size()) < host.devices
                           ? static_cast<int64_t>(seen.size()) : -1);
    } else if (!uuids) {
      auto i = cudaIndex(entry);
      if (i && static_cast<int64_t>(*i) < host.devices) index = *i;
    }
    if (index < 0) {
      why = fmt::format("its entry \"{}\" names no device of this host's {} GPU{}", entry,
                        host.devices, host.devices == 1 ? "" : "s");
      break;
    }
    if (std::find(seen.begin(), seen.end(), index) != seen.end()) {
      why = fmt::format("it names one device twice (\"{}\")", entry);
      return 0;
    }
    seen.push_back(index);
  }
  return static_cast<int>(seen.size());
}

// torch.cuda.device_count()'s count; `why` as above, where torch's rules alone hid devices.
int torchCount(const std::vector<std::string>& entries, bool uuids, int cuda, const NvidiaHost& host,
               std::string& why) {
  if (uuids) {
    std::string prefix = entries[0].substr(0, 4);
    std::vector<std::string> listed;
    for (const std::string& entry : entries) {
      if (std::find(listed.begin(), listed.end(), entry) != listed.end()) {
        why = fmt::format("it names one device twice (\"{}\")", entry);
        return 0;
      }
      if (entry.rfind(prefix, 0) != 0) break;
      listed.push_back(entry);
    }
    if (prefix == "MIG-" || !host.uuids) return cuda;  // torch asks CUDA for these
    std::vector<int> seen;
    for (const std::string& entry : listed) {
      int index = uuidIndex(entry, host.uuids->gpus);
      if (index < 0) break;
      if (std::find(seen.begin(), seen.end(), index) != seen.end()) return 0;
      seen.push_back(index);
    }
    return static_cast<int>(seen.size());
  }
  std::vector<int64_t> listed;
  for (const std::string& entry : entries) {
    int64_t index = torchIndex(entry);
    if (std::find(listed.begin(), listed.end(), index) != listed.end()) {
      why = fmt::format("it names device {} twice", index);
      return 0;
    }
    if (index < 0) {
      why = fmt::format("its entry \"{}\" is no device index", entry);
      break;
    }
    listed.push_back(index);
  }
  for (size_t i = 0; i < listed.size(); ++i) {
    if (listed[i] >= host.devices) {
      if (why.empty()) {
        why = fmt::format("its entry {} names no device of this host's {} GPU{}", listed[i], host.devices,
                          host.devices == 1 ? "" : "s");
      }
      return static_cast<int>(i);
    }
  }
  return static_cast<int>(listed.size());
}

}  // namespace

NvidiaHost probeNvidiaHost(bool wantUuids) {
  NvidiaHost host;
  host.devices = deviceNodes();
  if (wantUuids && host.devices > 0) host.uuids = readGpuUuids();
  return host;
}

VisibleGpus visibleGpus(const std::optional<std::string>& value, const NvidiaHost& host) {
  VisibleGpus v;
  if (!value) {
    v.cuda = v.torch = host.devices;
    if (host.devices == 0) v.why = "this host has no /dev/nvidiaN device";
    return v;
  }
  if (value->empty()) {
    v.why = "CUDA_VISIBLE_DEVICES is empty";
    return v;
  }
  std::vector<std::string> entries = absl::StrSplit(*value, ',');
  bool uuids = isUuidList(*value);
  v.cuda = cudaCount(entries, uuids, host, v.why);
  std::string torchWhy;
  v.torch = torchCount(entries, uuids, v.cuda, host, torchWhy);
  if (v.why.empty() || (v.torch < v.cuda && !torchWhy.empty())) v.why = torchWhy;
  return v;
}

int countGpus(const Env& env) {
  auto it = env.find("CUDA_VISIBLE_DEVICES");
  std::optional<std::string> value;
  if (it != env.end()) value = it->second;
  return visibleGpus(value, probeNvidiaHost(value && isUuidList(*value))).torch;
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
  if (value != "gpu" && value != "auto") return resolveNproc(value, env, NvidiaHost{});
  auto it = env.find("CUDA_VISIBLE_DEVICES");
  return resolveNproc(value, env, probeNvidiaHost(it != env.end() && isUuidList(it->second)));
}

absl::StatusOr<int> resolveNproc(const std::string& value, const Env& env, const NvidiaHost& host) {
  if (value == "cpu") return countCpus();
  if (value == "gpu" || value == "auto") {
    auto it = env.find("CUDA_VISIBLE_DEVICES");
    std::optional<std::string> listed;
    if (it != env.end()) listed = it->second;
    VisibleGpus gpus = visibleGpus(listed, host);
    std::string shown = listed && !listed->empty() ? fmt::format("CUDA_VISIBLE_DEVICES={}: ", *listed) : "";
    if (gpus.cuda == 0 && value == "auto") return countCpus();
    if (gpus.cuda == 0) {
      return absl::InvalidArgumentError(fmt::format(
          "--nproc_per_node=gpu: CUDA shows no GPU here ({}{}); use a number or cpu", shown, gpus.why));
    }
    if (gpus.torch == 0) {  // torchrun's assertion: CUDA shows a device, torch counts none
      return absl::InvalidArgumentError(fmt::format(
          "--nproc_per_node={}: CUDA shows a GPU but torch counts none ({}{}), as torchrun refuses it; "
          "correct CUDA_VISIBLE_DEVICES or use a number",
          value, shown, gpus.why));
    }
    return gpus.torch;
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
  auto n = flags::toInt("--nproc_per_node", value, 1, "an integer >= 1, gpu, xpu, cpu or auto");
  if (!n.ok()) return n.status();
  return *n;
}

}  // namespace muster::launcher
