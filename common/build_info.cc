#include "common/build_info.h"

#include <fmt/format.h>

#include "muster_build_info.h"

namespace muster::build {

std::string versionText(std::string_view program) {
  // help2man takes the first line as the program's name and version.
  return fmt::format("{} (muster) {}\ncommit {}\nNCCL {}", program, MUSTER_BUILD_VERSION,
                     MUSTER_BUILD_COMMIT, MUSTER_BUILD_NCCL);
}

std::string versionAndCommit() { return fmt::format("{} (commit {})", MUSTER_BUILD_VERSION, MUSTER_BUILD_COMMIT); }

}  // namespace muster::build
