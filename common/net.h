// Addresses: this host's names, which local address other hosts reach it at, listening sockets.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace muster::net {

// "host:port", an IPv6 literal in brackets: "[::1]:29400" (one already in brackets stays so).
std::string joinHostPort(const std::string& host, int port);

// HOST, HOST:PORT, [IPV6] or [IPV6]:PORT: the host (brackets taken off) and the port when there
// is one. nullopt for anything else: an empty host, an IPv6 literal without brackets (":"
// twice), a port that is not 0-65535, text after "]" that is not ":PORT". torchrun's
// parse_rendezvous_endpoint reads the same forms, but splits "::1:29400" at its last colon,
// where this asks for brackets; it checks the host's characters, which this leaves to the
// resolver (a zone, "fe80::1%eth0", is kept).
struct HostPort {
  std::string host;
  std::optional<int> port;
};
std::optional<HostPort> splitHostPort(std::string_view text);

// The local address on the route to host:port (a UDP connect sends nothing), e.g. "10.0.0.2"
// on the way to the master; "" when the host does not resolve or has no route.
std::string routeAddress(const std::string& host, int port);

// True for 127.0.0.0/8, ::1 and "localhost".
bool isLoopback(const std::string& address);

// This host's name (gethostname).
std::string hostName();

// The fully qualified name as Python's socket.getfqdn() gives it (torchrun's MASTER_ADDR on
// one node): the entry of hostName()'s first address, its first name with a dot, else its
// name; hostName() when it does not resolve. Looked up once per process (not free).
const std::string& canonicalHostName();

// True when `host` names this host: a loopback address, "localhost", its name or its fully
// qualified name.
bool isLocalHost(const std::string& host);

// A TCP port free on every IPv4 address at this moment (0 when none could be bound). Another
// process may take it before it is used: hold a socket (listenTcp) where that matters.
int freeTcpPort();

// A TCP socket bound to host:port and listening (close-on-exec, SO_REUSEADDR): held from this
// moment, so no other process can take the port before the server that serves it starts.
// host "" or "0.0.0.0": every address, IPv6 too where the host has it; "::": the same; a name
// or a literal: that address. Port 0 picks a free port (boundPort says which). Returns the
// descriptor, or -1 with `why` set to one line ("127.0.0.1:29500: Address already in use").
// `backlog`: connections the kernel completes before they are accepted; the default asks for
// as many as it allows (net.core.somaxconn): thousands of ranks connect to one store at once,
// and a full queue makes the kernel drop handshakes (retried after a second or more) and, with
// SYN cookies, reset some.
int listenTcp(const std::string& host, int port, std::string& why, int backlog = 65535);

// The port a bound socket has, 0 on error.
int boundPort(int fd);

}  // namespace muster::net
