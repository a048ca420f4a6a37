// NUMA binding from /sys: GPU -> PCI address -> NUMA node -> CPUs, per torch.numa's modes.
#include "launcher/numa.h"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/files.h"

namespace muster::launcher {
namespace fs = std::filesystem;
namespace {

// A /sys attribute without surrounding whitespace; "" when it cannot be read.
std::string readText(const fs::path& p) {
  auto text = readFile(p.string(), "sysfs attribute");
  return text.ok() ? std::string(absl::StripAsciiWhitespace(*text)) : std::string();
}

int readInt(const fs::path& p, int fallback) {
  int v = 0;
  return absl::SimpleAtoi(readText(p), &v) ? v : fallback;
}

absl::Status fail(const std::string& why) { return absl::FailedPreconditionError(why); }

}  // namespace

std::set<int> parseCpuList(const std::string& text) {
  std::set<int> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::vector<std::string> range = absl::StrSplit(absl::StripAsciiWhitespace(part), '-');
    int lo = 0, hi = 0;
    if (!absl::SimpleAtoi(range[0], &lo)) continue;
    if (range.size() == 1) {
      hi = lo;
    } else if (!absl::SimpleAtoi(range[1], &hi)) {
      continue;
    }
    for (int c = lo; c <= hi; ++c) out.insert(c);
  }
  return out;
}

std::string formatCpuList(const std::set<int>& cpus) {
  std::string out;
  for (auto it = cpus.begin(); it != cpus.end();) {
    int lo = *it, hi = lo;
    for (++it; it != cpus.end() && *it == hi + 1; ++it) hi = *it;
    out += (out.empty() ? "" : ",") + (lo == hi ? std::to_string(lo) : fmt::format("{}-{}", lo, hi));
  }
  return out;
}

absl::StatusOr<std::string> numaCpusForGpu(const NumaQuery& q,
                                           const std::map<std::string, std::string>& env) {
  fs::path sys(q.sysRoot);
  // Every NVIDIA display or 3D controller, in PCI order.
  std::vector<std::string> all;
  std::error_code ec;
  for (const auto& dev : fs::directory_iterator(sys / "bus/pci/devices", ec)) {
    std::string vendor = readText(dev.path() / "vendor"), cls = readText(dev.path() / "class");
    if (vendor == "0x10de" && (cls.rfind("0x0300", 0) == 0 || cls.rfind("0x0302", 0) == 0)) {
      all.push_back(dev.path().filename().string());
    }
  }
  std::sort(all.begin(), all.end());
  std::vector<std::string> visible = all;
  if (auto it = env.find("CUDA_VISIBLE_DEVICES"); it != env.end()) {
    visible.clear();
    for (absl::string_view part : absl::StrSplit(it->second, ',')) {
      std::string id(absl::StripAsciiWhitespace(part));
      if (id.empty() || id == "-1") break;
      if (id.find_first_not_of("0123456789") != std::string::npos) {
        return fail(fmt::format(
            "--numa_binding: CUDA_VISIBLE_DEVICES={} names devices by UUID; give indices, or "
            "bind the workers yourself", it->second));
      }
      size_t index = std::stoul(id);
      if (index >= all.size()) {
        return fail(fmt::format("--numa_binding: CUDA_VISIBLE_DEVICES={} names GPU {}, but /sys "
                                "shows {} NVIDIA GPU(s)", it->second, index, all.size()));
      }
      visible.push_back(all[index]);
    }
  }
  if (q.gpu < 0 || q.gpu >= static_cast<int>(visible.size())) {
    return fail(fmt::format("--numa_binding: local rank {} has no GPU ({} visible)", q.gpu,
                            visible.size()));
  }
  auto nodeOf = [&](const std::string& pci) {
    return std::max(readInt(sys / "bus/pci/devices" / pci / "numa_node", 0), 0);
  };
  std::set<int> allowed;
  if (q.allowed) {
    allowed = *q.allowed;
  } else {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
      for (int c = 0; c < CPU_SETSIZE; ++c) {
        if (CPU_ISSET(c, &set)) allowed.insert(c);
      }
    }
  }
  auto nodeCpus = [&](int node) {
    std::set<int> out;
    for (int c : parseCpuList(readText(sys / fmt::format("devices/system/node/node{}/cpulist", node)))) {
      if (allowed.count(c)) out.insert(c);
    }
    return out;
  };
  int node = nodeOf(visible[q.gpu]);
  std::set<int> cpus = nodeCpus(node);
  if (cpus.empty()) {
    return fail(fmt::format("--numa_binding={}: NUMA node {} of GPU {} ({}) has no CPU this "
                            "process may use", q.mode, node, q.gpu, visible[q.gpu]));
  }
  auto cpuPath = [&](int c, const std::string& rest) {
    return sys / fmt::format("devices/system/cpu/cpu{}", c) / rest;
  };
  if (q.mode == "node") return formatCpuList(cpus);
  if (q.mode == "socket") {
    int package = readInt(cpuPath(*cpus.begin(), "topology/physical_package_id"), 0);
    std::set<int> out;
    for (int n : parseCpuList(readText(sys / "devices/system/node/possible"))) {
      auto others = nodeCpus(n);
      if (!others.empty() && readInt(cpuPath(*others.begin(), "topology/physical_package_id"), 0) == package) {
        out.insert(others.begin(), others.end());
      }
    }
    return formatCpuList(out);
  }
  // exclusive and core-complex share the node's CPUs among the node's GPUs.
  std::vector<std::string> nodeGpus;
  for (const auto& pci : visible) {
    if (nodeOf(pci) == node) nodeGpus.push_back(pci);
  }
  size_t rel = static_cast<size_t>(
      std::find(nodeGpus.begin(), nodeGpus.end(), visible[q.gpu]) - nodeGpus.begin());
  if (q.mode == "exclusive") {
    std::map<int, std::set<int>> cores;  // first sibling -> logical CPUs
    for (int c : cpus) {
      auto siblings = parseCpuList(readText(cpuPath(c, "topology/thread_siblings_list")));
      cores[siblings.empty() ? c : *siblings.begin()].insert(c);
    }
    size_t ncores = cores.size(), ngpus = nodeGpus.size();
    size_t per = ncores / ngpus, extra = ncores % ngpus;
    if (per < 1) {
      return fail(fmt::format("--numa_binding=exclusive: NUMA node {} has {} physical core(s) "
                              "for {} GPUs", node, ncores, ngpus));
    }
    size_t start = rel * per + std::min(rel, extra), count = per + (rel < extra ? 1 : 0);
    std::set<int> out;
    size_t i = 0;
    for (const auto& [first, logical] : cores) {
      if (i >= start && i < start + count) out.insert(logical.begin(), logical.end());
      ++i;
    }
    return formatCpuList(out);
  }
  if (q.mode == "core-complex") {
    // Group by the highest-level cache each CPU shares (an L3 complex).
    std::map<std::string, std::set<int>> groups;
    for (int c : cpus) {
      int best = -1;
      std::string shared;
      for (const auto& index : fs::directory_iterator(cpuPath(c, "cache"), ec)) {
        if (index.path().filename().string().rfind("index", 0) != 0) continue;
        std::string type = readText(index.path() / "type");
        if (type != "Unified" && type != "Data") continue;
        int level = readInt(index.path() / "level", -1);
        if (level > best) {
          best = level;
          shared = readText(index.path() / "shared_cpu_list");
        }
      }
      groups[shared.empty() ? std::to_string(c) : formatCpuList(parseCpuList(shared))].insert(c);
    }
    std::vector<std::pair<std::string, std::set<int>>> ordered(groups.begin(), groups.end());
    std::stable_sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) {
      return a.second.size() > b.second.size();
    });
    return formatCpuList(ordered[rel % ordered.size()].second);
  }
  return absl::InvalidArgumentError("--numa_binding: unknown mode " + q.mode);
}

}  // namespace muster::launcher
