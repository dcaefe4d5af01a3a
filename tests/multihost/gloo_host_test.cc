// How a rank picks the address Gloo binds (SelectGlooHost and its parts,
// control/process_group.h): gloo_host, else GLOO_SOCKET_IFNAME's IPv4
// address, else the local address on the route to the coordinator; and that
// InitProcessGroup passes the choice to Gloo.
#include <stdlib.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/time/time.h"
#include "control/process_group.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/embedded_coordinator.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Pair;

TEST(LocalAddressTowardTest, Loopback_Returns127001) {
  absl::StatusOr<std::string> lo = LocalAddressToward("127.0.0.1");
  ASSERT_THAT(lo, IsOk());
  EXPECT_EQ(*lo, "127.0.0.1");
  absl::StatusOr<std::string> local = LocalAddressToward("localhost");
  ASSERT_THAT(local, IsOk());
  EXPECT_THAT(*local, AnyOf("127.0.0.1", "::1"));
}

TEST(LocalAddressTowardTest, EmptyHost_ReturnsInvalidArgument) {
  EXPECT_THAT(LocalAddressToward(""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
}

TEST(LocalAddressTowardTest, UnresolvableHost_ReturnsUnavailableNamingIt) {
  EXPECT_THAT(LocalAddressToward("no-such-host.invalid"),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("no-such-host.invalid")));
}

TEST(InterfaceIPv4AddressTest, Lo_Returns127001) {
  absl::StatusOr<std::string> a = InterfaceIPv4Address("lo");
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(*a, "127.0.0.1");
}

TEST(InterfaceIPv4AddressTest, UnknownInterface_InvalidArgumentNamingIt) {
  EXPECT_THAT(InterfaceIPv4Address("nosuchif0"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("\"nosuchif0\""),
                             HasSubstr("GLOO_SOCKET_IFNAME"),
                             HasSubstr("interfaces: "), HasSubstr("lo"))));
}

TEST(SelectGlooHostTest, ExplicitGlooHost_WinsOverEverything) {
  absl::StatusOr<std::string> h =
      SelectGlooHost("10.9.9.9", "nosuchif0", "192.0.2.1");
  ASSERT_THAT(h, IsOk());
  EXPECT_EQ(*h, "10.9.9.9");
}

TEST(SelectGlooHostTest, SocketIfnameLo_Returns127001) {
  // GLOO_SOCKET_IFNAME beats the route (192.0.2.1 need not be reachable).
  absl::StatusOr<std::string> h = SelectGlooHost("", "lo", "192.0.2.1");
  ASSERT_THAT(h, IsOk());
  EXPECT_EQ(*h, "127.0.0.1");
  absl::StatusOr<std::string> list = SelectGlooHost("", "lo,eth9", "x");
  ASSERT_THAT(list, IsOk());
  EXPECT_EQ(*list, "127.0.0.1");
}

TEST(SelectGlooHostTest, UnknownSocketIfname_InvalidArgumentNamingIt) {
  EXPECT_THAT(
      SelectGlooHost("", "nosuchif0", "127.0.0.1"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("nosuchif0")));
}

TEST(SelectGlooHostTest, CoordinatorOnLoopback_Returns127001) {
  absl::StatusOr<std::string> h = SelectGlooHost("", "", "127.0.0.1");
  ASSERT_THAT(h, IsOk());
  EXPECT_EQ(*h, "127.0.0.1");
}

TEST(SplitHostPortTest, Forms) {
  absl::StatusOr<std::pair<std::string, int>> v4 =
      SplitHostPort("192.0.2.1:29501");
  ASSERT_THAT(v4, IsOk());
  EXPECT_THAT(*v4, Pair("192.0.2.1", 29501));
  absl::StatusOr<std::pair<std::string, int>> v6 = SplitHostPort("[::1]:80");
  ASSERT_THAT(v6, IsOk());
  EXPECT_THAT(*v6, Pair("::1", 80));
  absl::StatusOr<std::pair<std::string, int>> name =
      SplitHostPort("node-a:7777");
  ASSERT_THAT(name, IsOk());
  EXPECT_THAT(*name, Pair("node-a", 7777));
  for (const char* bad :
       {"host", "::1:80", "host:0", "host:x", ":80", "[::1]80", "host:70000"}) {
    EXPECT_THAT(SplitHostPort(bad),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(bad)))
        << bad;
  }
}

// Rank 0 of two embedding the coordinator: Gloo's device is made (and
// fails) before any peer is needed.
ProcessGroupOptions RankZeroOfTwo() {
  ProcessGroupOptions o;
  o.rank = 0;
  o.world_size = 2;
  o.embed_coordinator = true;
  o.start_embedded_coordinator = StartEmbeddedCoordinator;
  o.embedded_host = "127.0.0.1";
  o.embedded_port = 0;
  o.timeout = absl::Seconds(5);
  return o;
}

TEST(InitProcessGroupTest, GlooHostNotOnThisHost_ErrorNamesIt) {
  ProcessGroupOptions o = RankZeroOfTwo();
  o.gloo_host = "192.0.2.77";  // TEST-NET-1, on no interface here
  EXPECT_THAT(InitProcessGroup(o),
              StatusIs(absl::StatusCode::kInternal,
                       AllOf(HasSubstr("binding options.hostname"),
                             HasSubstr("192.0.2.77"))));
}

TEST(InitProcessGroupTest, UnknownGlooSocketIfname_InvalidArgument) {
  ASSERT_EQ(setenv("GLOO_SOCKET_IFNAME", "nosuchif0", 1), 0);
  absl::StatusOr<std::unique_ptr<ProcessGroup>> pg =
      InitProcessGroup(RankZeroOfTwo());
  unsetenv("GLOO_SOCKET_IFNAME");
  EXPECT_THAT(pg, StatusIs(absl::StatusCode::kInvalidArgument,
                           AllOf(HasSubstr("rank 0"), HasSubstr("nosuchif0"))));
}

TEST(InitProcessGroupTest, CoordinatorNeverListens_DeadlineExceededNamingIt) {
  ProcessGroupOptions o;
  o.rank = 1;
  o.world_size = 2;
  o.coordinator_address = "127.0.0.1:1";  // nothing listens on port 1
  o.timeout = absl::Milliseconds(300);
  EXPECT_THAT(InitProcessGroup(o),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr("rank 1"), HasSubstr("127.0.0.1:1"))));
}

}  // namespace
}  // namespace muon
