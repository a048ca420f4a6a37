// Addresses: which local address other hosts reach this one at.
#pragma once

#include <string>

namespace muster::net {

// The local address on the route to host:port (a UDP connect sends nothing), e.g. "10.0.0.2"
// on the way to the master; "" when the host does not resolve or has no route.
std::string routeAddress(const std::string& host, int port);

// True for 127.0.0.0/8, ::1 and "localhost".
bool isLoopback(const std::string& address);

}  // namespace muster::net
