// The torch a test compares launch with, as tests/compat/with_torch.sh names it: the host's
// (Debian's PyTorch 1.13 under /usr/bin/python3) when the test runs alone, or a Debian root's
// (torch 2.6, 2.14). One place for the variables MUSTER_TEST_PYTHON, MUSTER_TEST_TORCHRUN,
// MUSTER_TEST_LEGACY, MUSTER_TEST_TORCH and MUSTER_TEST_LAUNCH_FLAGS.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/child.h"

namespace muster::testing {

struct TorchUnderTest {
  std::string python;                          // PYTHON_EXEC for the ranks
  std::vector<std::string> torchrun, legacy;   // its torchrun, its torch.distributed.launch
  std::string version;                         // torch.__version__
  std::vector<std::string> launchFlags;        // what launch needs to follow that torchrun
  bool major1 = true;
};

// A command line's words (the variables hold command lines split on spaces).
inline std::vector<std::string> words(const std::string& line) {
  std::vector<std::string> out;
  std::istringstream in(line);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

inline const TorchUnderTest& torchUnderTest() {
  static const TorchUnderTest t = [] {
    TorchUnderTest t;
    auto env = [](const char* name, const std::string& otherwise) {
      const char* v = std::getenv(name);
      return v != nullptr && *v != '\0' ? std::string(v) : otherwise;
    };
    std::string hostTorchrun =
        "/usr/bin/python3 " + (std::filesystem::path(sourceDir()) / "tests/compat/torchrun_py311.py").string();
    t.python = env("MUSTER_TEST_PYTHON", "/usr/bin/python3");
    t.torchrun = words(env("MUSTER_TEST_TORCHRUN", hostTorchrun));
    t.legacy = words(env("MUSTER_TEST_LEGACY", hostTorchrun + " --legacy"));
    t.version = env("MUSTER_TEST_TORCH", "1.13");
    // with_torch.sh says it (--torchrun_version for a torch older than launch's default); run
    // alone, the test's torch is the host's 1.13.
    const char* flags = std::getenv("MUSTER_TEST_LAUNCH_FLAGS");
    t.launchFlags = words(flags != nullptr ? flags : "--torchrun_version=" + t.version);
    int major = 0;
    std::sscanf(t.version.c_str(), "%d", &major);
    t.major1 = major < 2;
    return t;
  }();
  return t;
}

// That torch's torchrun (legacy: torch.distributed.launch) with these arguments.
inline std::vector<std::string> torchrunArgv(std::vector<std::string> args, bool legacy = false) {
  std::vector<std::string> argv = legacy ? torchUnderTest().legacy : torchUnderTest().torchrun;
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

}  // namespace muster::testing
