// CUDA_VISIBLE_DEVICES read as the CUDA runtime and as torch read it (visible_gpus.h).
#include "launcher/visible_gpus.h"

#include <dirent.h>

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_split.h"
#include "fmt/format.h"

namespace muster::launcher {
namespace {

using Entries = std::vector<std::string>;

bool isDigit(char c) { return c >= '0' && c <= '9'; }
bool isCSpace(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
// Python's str.isspace() within ASCII: C's spaces and the separators \x1c-\x1f.
bool isPythonSpace(char c) { return isCSpace(c) || (c >= '\x1c' && c <= '\x1f'); }

template <typename T>
bool contains(const std::vector<T>& v, const T& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// An entry in a message: quoted, with what would break the line escaped.
std::string quoted(std::string_view s) { return "\"" + absl::CHexEscape(absl::string_view(s.data(), s.size())) + "\""; }

std::string noDevice(std::string_view entry, int devices) {
  return fmt::format("its entry {} names no device of this host's {} GPU{}", quoted(entry), devices,
                     devices == 1 ? "" : "s");
}

// "GPU-" or "MIG-" for a list of UUIDs (its first entry decides), else "".
std::string uuidPrefix(const std::string& value) {
  for (const char* prefix : {"GPU-", "MIG-"}) {
    if (value.rfind(prefix, 0) == 0) return prefix;
  }
  return "";
}

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

// An entry as CUDA reads it: C's strtoul (blanks, a sign, decimal digits, the rest ignored; past
// 2^64 it saturates, a minus wraps), cut to 32 bits. nullopt without digits.
std::optional<uint32_t> cudaIndex(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && isCSpace(s[i])) ++i;
  bool minus = i < s.size() && s[i] == '-';
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
  if (i >= s.size() || !isDigit(s[i])) return std::nullopt;
  uint64_t v = 0;
  bool saturated = false;
  for (; i < s.size() && isDigit(s[i]); ++i) {
    auto d = static_cast<uint64_t>(s[i] - '0');
    saturated = saturated || v > (UINT64_MAX - d) / 10;
    v = v * 10 + d;  // unsigned: wraps, and is replaced below when it did
  }
  if (saturated) v = UINT64_MAX;
  if (minus && !saturated) v = 0 - v;
  return static_cast<uint32_t>(v);
}

// An entry as torch's _parse_visible_devices reads it: stripped, then its leading sign and
// digits as Python's int() reads them.
struct TorchEntry {
  enum Kind { kIndex, kEnd, kRaises } kind;
  std::string digits;  // kIndex: the number without leading zeros ("0" for zero), exact
};

TorchEntry torchEntry(std::string_view s) {
  while (!s.empty() && isPythonSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && isPythonSpace(s.back())) s.remove_suffix(1);
  size_t from = !s.empty() && (s[0] == '+' || s[0] == '-') ? 1 : 0;
  size_t to = from;
  while (to < s.size() && isDigit(s[to])) ++to;
  if (to == 0) return {TorchEntry::kEnd, ""};          // nothing it reads: -1, the list's end
  if (to == from) return {TorchEntry::kRaises, ""};    // a sign alone: int("+") raises
  std::string_view digits = s.substr(from, to - from);
  while (digits.size() > 1 && digits[0] == '0') digits.remove_prefix(1);
  if (s[0] == '-' && digits != "0") return {TorchEntry::kEnd, ""};  // negative: the list's end
  return {TorchEntry::kIndex, std::string(digits)};
}

// Why a list that names one device twice leaves none (CUDA and torch alike).
std::string namedTwice(const std::string& entry) {
  return fmt::format("it names one device twice ({})", quoted(entry));
}

bool below(const std::string& digits, int devices) {
  return digits.size() < 10 && std::stoll(digits) < devices;
}

// cudaGetDeviceCount's count; -1 where the list names UUIDs and NVML could not be read.
int cudaCount(const Entries& entries, const std::string& prefix, const NvidiaHost& host, VisibleGpus& v) {
  const std::vector<std::string>& uuids = prefix == "MIG-" ? host.uuids.migs : host.uuids.gpus;
  std::vector<int64_t> seen;
  for (const std::string& entry : entries) {
    int64_t index = -1;
    if (prefix.empty()) {
      auto i = cudaIndex(entry);
      if (i && *i < static_cast<uint32_t>(host.devices)) index = *i;
    } else if (entry.rfind(prefix, 0) == 0) {
      if (host.nvml == NvmlState::kNotRead) {
        v.needsNvml = true;
        return 0;
      }
      if (host.nvml == NvmlState::kUnreadable) {
        v.why = "it names devices by UUID, which launch reads from the driver's NVML "
                "(libnvidia-ml.so.1), and NVML could not be read";
        return -1;
      }
      index = uuidIndex(entry, uuids);
    }
    if (index < 0) {
      v.why = noDevice(entry, host.devices);
      break;
    }
    if (contains(seen, index)) {
      v.why = namedTwice(entry);
      return 0;
    }
    seen.push_back(index);
  }
  return static_cast<int>(seen.size());
}

// torch's count of a UUID list: a repeated entry leaves none; GPU UUIDs are looked up in NVML,
// MIG names (and everything, without NVML) counted by CUDA.
int torchUuidCount(const Entries& entries, const std::string& prefix, int cuda, const NvidiaHost& host,
                   std::string& why) {
  Entries listed;
  for (const std::string& entry : entries) {
    if (contains(listed, entry)) {
      why = namedTwice(entry);
      return 0;
    }
    if (entry.rfind(prefix, 0) != 0) break;
    listed.push_back(entry);
  }
  if (prefix == "MIG-" || host.nvml != NvmlState::kRead) return cuda;
  std::vector<int> seen;
  for (const std::string& entry : listed) {
    int index = uuidIndex(entry, host.uuids.gpus);
    if (index < 0) break;
    if (contains(seen, index)) {
      why = namedTwice(entry);
      return 0;
    }
    seen.push_back(index);
  }
  return static_cast<int>(seen.size());
}

// torch's count of a list of indices: read whole first (a repeat leaves none, a sign alone
// raises), then cut by NVML's count of GPUs; without NVML, torch takes CUDA's count.
int torchIndexCount(const Entries& entries, int cuda, const NvidiaHost& host, VisibleGpus& v,
                    std::string& why) {
  std::vector<std::string> listed;
  for (const std::string& entry : entries) {
    TorchEntry t = torchEntry(entry);
    if (t.kind == TorchEntry::kRaises) {
      why = fmt::format("torch cannot read its entry {} (a sign without digits: ValueError)", quoted(entry));
      return -1;
    }
    if (t.kind == TorchEntry::kEnd) {
      why = fmt::format("torch ends the list at its entry {} (no index, or a negative one)", quoted(entry));
      break;
    }
    if (contains(listed, t.digits)) {
      why = fmt::format("it names device {} twice", t.digits);
      return 0;
    }
    listed.push_back(t.digits);
  }
  size_t n = 0;
  while (n < listed.size() && below(listed[n], host.devices)) ++n;
  if (n < listed.size() && why.empty()) why = noDevice(listed[n], host.devices);
  if (host.nvml == NvmlState::kNotRead && static_cast<int>(n) != cuda) v.needsNvml = true;
  if (host.nvml == NvmlState::kUnreadable) return cuda;
  return static_cast<int>(n);
}

bool ascii(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

}  // namespace

VisibleGpus visibleGpus(const std::optional<std::string>& value, const NvidiaHost& host) {
  VisibleGpus v;
  if (value && value->empty()) {
    v.why = "CUDA_VISIBLE_DEVICES is empty";
    return v;
  }
  if (host.devices == 0) {
    v.why = "this host has no /dev/nvidiaN device";
    return v;
  }
  if (!value) {
    v.cuda = v.torch = host.devices;
    return v;
  }
  Entries entries = absl::StrSplit(*value, ',');
  std::string prefix = uuidPrefix(*value);
  v.cuda = cudaCount(entries, prefix, host, v);
  if (v.needsNvml || v.cuda < 0) return v;
  std::string torchWhy;
  if (!prefix.empty()) {
    v.torch = torchUuidCount(entries, prefix, v.cuda, host, torchWhy);
  } else if (!ascii(*value)) {  // torch strips and reads digits by Unicode's rules
    v.torch = -1;
    torchWhy = "it holds characters that are not ASCII, which torch reads by Unicode's rules";
  } else {
    v.torch = torchIndexCount(entries, v.cuda, host, v, torchWhy);
  }
  if (!torchWhy.empty() && (v.why.empty() || v.torch < v.cuda)) v.why = torchWhy;
  return v;
}

NvidiaHost probeNvidiaHost(const std::optional<std::string>& value) {
  NvidiaHost host;
  host.devices = deviceNodes();
  if (host.devices == 0 || !visibleGpus(value, host).needsNvml) return host;
  auto uuids = readGpuUuids();
  host.nvml = uuids ? NvmlState::kRead : NvmlState::kUnreadable;
  if (uuids) host.uuids = std::move(*uuids);
  return host;
}

}  // namespace muster::launcher
