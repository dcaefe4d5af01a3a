// tools/launcher.h with SIGCHLD ignored in this process: the kernel reaps
// the children itself, so their exit statuses are lost (waitpid says
// ECHILD). WaitAll and LaunchRanks must report that as a failure at once,
// not as a success or after the whole timeout. Every process started here
// is reaped here (by the kernel while SIGCHLD is ignored).
#include "tools/launcher.h"

#include <signal.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Sets SIGCHLD to SIG_IGN for its lifetime, then restores the old action.
class ScopedIgnoreSigchld {
 public:
  ScopedIgnoreSigchld() {
    struct sigaction ignore;
    std::memset(&ignore, 0, sizeof(ignore));
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    ok_ = sigaction(SIGCHLD, &ignore, &old_) == 0;
  }
  ~ScopedIgnoreSigchld() {
    if (ok_) sigaction(SIGCHLD, &old_, nullptr);
  }
  bool ok() const { return ok_; }

 private:
  struct sigaction old_;
  bool ok_ = false;
};

TEST(WaitAllTest, ExitCodes_ReportedInExitOrder) {
  absl::StatusOr<pid_t> late = SpawnProcess({"/bin/sh", "-c", "sleep 0.3"});
  absl::StatusOr<pid_t> early = SpawnProcess({"/bin/sh", "-c", "exit 3"});
  ASSERT_THAT(late, IsOk());
  ASSERT_THAT(early, IsOk());
  std::vector<int> order;
  EXPECT_THAT(
      WaitAll({*late, *early}, absl::Seconds(20), absl::Seconds(20), &order),
      ElementsAre(0, 3));
  EXPECT_THAT(order, ElementsAre(1, 0));
}

TEST(WaitAllTest, SigchldIgnored_UnknownStatusWithoutWaitingOutTimeout) {
  ScopedIgnoreSigchld ignore;
  ASSERT_TRUE(ignore.ok());
  absl::StatusOr<pid_t> pid = SpawnProcess({"/bin/sh", "-c", "exit 3"});
  ASSERT_THAT(pid, IsOk());
  const absl::Time start = absl::Now();
  EXPECT_THAT(WaitAll({*pid}, absl::Seconds(20)),
              ElementsAre(kExitStatusUnknown));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(LaunchRanksTest, SigchldIgnored_AbortedNamingUnknownStatus) {
  ScopedIgnoreSigchld ignore;
  ASSERT_TRUE(ignore.ok());
  RankLaunchOptions o;
  o.world_size = 2;
  // A coordinator given: no port file to wait for. LaunchRanks appends
  // "--coordinator=...", which sh -c takes as $0.
  o.coordinator = "127.0.0.1:1";
  o.argv = [](int) {
    return std::vector<std::string>{"/bin/sh", "-c", "exit 3"};
  };
  o.timeout = absl::Seconds(20);
  o.grace = absl::Seconds(20);
  const absl::Time start = absl::Now();
  EXPECT_THAT(LaunchRanks(o), StatusIs(absl::StatusCode::kAborted,
                                       HasSubstr("exit status is unknown")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

}  // namespace
}  // namespace muon
