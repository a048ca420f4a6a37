// joinHostPort and splitHostPort: the two directions of "host:port", IPv6 literals in brackets.
#include "common/net.h"

#include <gtest/gtest.h>

namespace muster::net {
namespace {

TEST(HostPort, JoinPutsAnIpv6LiteralInBrackets) {
  EXPECT_EQ(joinHostPort("node0", 29400), "node0:29400");
  EXPECT_EQ(joinHostPort("10.0.0.1", 0), "10.0.0.1:0");
  EXPECT_EQ(joinHostPort("::1", 29400), "[::1]:29400");
  EXPECT_EQ(joinHostPort("[::1]", 29400), "[::1]:29400");
}

TEST(HostPort, SplitReadsHostsPortsAndBracketedIpv6) {
  struct Case {
    std::string_view text;
    std::string host;
    std::optional<int> port;
  };
  for (const Case& c : {Case{"node0:29400", "node0", 29400}, Case{"node0", "node0", std::nullopt},
                        Case{"[fe80::1%eth0]:0", "fe80::1%eth0", 0}, Case{"[::1]", "::1", std::nullopt},
                        Case{"[::1]:65535", "::1", 65535}, Case{"h:65535", "h", 65535}}) {
    auto split = splitHostPort(c.text);
    ASSERT_TRUE(split) << c.text;
    EXPECT_EQ(split->host, c.host) << c.text;
    EXPECT_EQ(split->port, c.port) << c.text;
  }
}

TEST(HostPort, SplitRefusesWhatIsNotOne) {
  for (std::string_view text : {"", ":29400", "::1:29400", "h:", "h:port", "h:65536", "h:-1",
                                   "h:12x", "h: 1", "[::1", "[::1]x", "[::1]:", "[]:1", "ipv4:1.2.3.4:5"}) {
    EXPECT_FALSE(splitHostPort(text)) << "'" << text << "'";
  }
}

}  // namespace
}  // namespace muster::net
