#include "launcher/torchrun_version.h"

#include <fmt/format.h>

#include <regex>

namespace muster::launcher {

absl::StatusOr<TorchrunVersion> TorchrunVersion::parse(const std::string& text) {
  // torch's versions are short ("2.6.0a0+git1a2b3c4", "2.11.0+cu130"). libstdc++'s regex
  // recurses once per character: a 100 KB MUSTER_TORCHRUN_VERSION overflowed launch's stack
  // (SIGSEGV) before this cap.
  constexpr size_t kLongest = 128;
  if (text.size() > kLongest) {
    return absl::InvalidArgumentError(fmt::format(
        "--torchrun_version={}...: {} characters; a torch version is at most {}", text.substr(0, 32), text.size(),
        kLongest));
  }
  static const std::regex kVersion(R"((\d{1,3})\.(\d{1,3})(\.\d+)?([a-z+][0-9A-Za-z.+]*)?)");
  std::smatch m;
  if (!std::regex_match(text, m, kVersion)) {
    return absl::InvalidArgumentError(fmt::format(
        "--torchrun_version={}: expected a torch version such as 1.13, 2.6 or 2.6.0+cu124", text));
  }
  TorchrunVersion v{std::stoi(m[1]), std::stoi(m[2])};
  if (!v.atLeast(1, 9)) {
    return absl::InvalidArgumentError(
        fmt::format("--torchrun_version={}: torchrun began with torch 1.9", text));
  }
  return v;
}

std::string TorchrunVersion::str() const { return fmt::format("{}.{}", major, minor); }

}  // namespace muster::launcher
