// Test support: where the build puts muster's programs. Every test that runs one asks here, so
// that a program that moves in the build tree moves in one place.
#pragma once

#include <string>

#include "tests/support/child.h"

namespace muster::testing {

inline std::string launchPath() { return buildDir() + "/launcher/launch"; }
inline std::string rendezvousdPath() { return buildDir() + "/rendezvous/rendezvousd"; }
inline std::string ctlPath() { return buildDir() + "/rendezvous/rendezvousctl"; }
inline std::string workerPath() { return buildDir() + "/worker/worker"; }

}  // namespace muster::testing
