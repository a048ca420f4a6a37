// What a program says to --version: muster's version, the git commit it was built from, and
// whether the NCCL path was built in.
#pragma once

#include <string>
#include <string_view>

namespace muster::build {

// "PROGRAM (muster) 0.1.0\ncommit 1a2b3c4d5e6f\nNCCL 2.28.3 built (muster::nccl, nccl_check)"
// (no final newline).
std::string versionText(std::string_view program);
// "0.1.0 (commit 1a2b3c4d5e6f)": the version and commit alone.
std::string versionAndCommit();

}  // namespace muster::build
