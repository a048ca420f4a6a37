// Small file helpers with errors that name the file.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"

namespace muster {

inline absl::StatusOr<std::string> readFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(fmt::format("cannot read {} '{}'", what, path));
  }
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// A shared token: the file's content without surrounding whitespace; empty is an error.
inline absl::StatusOr<std::string> readToken(const std::string& path) {
  auto text = readFile(path, "token file");
  if (!text.ok()) return text.status();
  std::string token(absl::StripAsciiWhitespace(*text));
  if (token.empty()) {
    return absl::InvalidArgumentError(fmt::format("token file '{}' is empty", path));
  }
  return token;
}

}  // namespace muster
