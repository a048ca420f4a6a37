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
  auto plain = splitHostPort("node0:29400");
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->host, "node0");
  EXPECT_EQ(plain->port, 29400);
  auto bare = splitHostPort("node0");
  ASSERT_TRUE(bare);
  EXPECT_EQ(bare->host, "node0");
  EXPECT_FALSE(bare->port);
  auto v6 = splitHostPort("[fe80::1%eth0]:0");
  ASSERT_TRUE(v6);
  EXPECT_EQ(v6->host, "fe80::1%eth0");
  EXPECT_EQ(v6->port, 0);
  auto v6bare = splitHostPort("[::1]");
  ASSERT_TRUE(v6bare);
  EXPECT_EQ(v6bare->host, "::1");
  EXPECT_FALSE(v6bare->port);
  for (std::string_view text : {"[::1]:65535", "h:65535"}) {
    auto split = splitHostPort(text);
    ASSERT_TRUE(split) << text;
    EXPECT_EQ(split->port, 65535);
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
