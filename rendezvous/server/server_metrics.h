// What rendezvousd's `--metrics-port` serves: the server's state in the Prometheus text format
// (version 0.0.4), checked by `promtool check metrics` in the tests. Nothing secret is in it.
#pragma once

#include <string>

namespace muster::rendezvous {

class RendezvousServer;

std::string renderMetrics(RendezvousServer& server);

}  // namespace muster::rendezvous
