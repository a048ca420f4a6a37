#include "launcher/torchrun_version.h"

#include <fmt/format.h>

#include <regex>

namespace muster::launcher {

absl::StatusOr<TorchrunVersion> TorchrunVersion::parse(const std::string& text) {
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
