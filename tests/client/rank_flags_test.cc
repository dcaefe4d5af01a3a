#include "client/rank_flags.h"

#include <vector>

#include "gtest/gtest.h"
#include "tests/client/rank_threads.h"
#include "tests/client/thread_world.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::muon::testing::RunOnRanks;
using ::muon::testing::ThreadWorld;

TEST(RankFlagsTest, WithoutControlGroup_OnlyThisRanksFlagIsKnown) {
  RankFlags flags(/*rank=*/1, /*world_size=*/3, /*control=*/nullptr);
  EXPECT_FALSE(flags.collective());
  EXPECT_EQ(flags.FirstRaised(), -1);
  ASSERT_THAT(flags.Gather(7.0f), IsOk());
  EXPECT_EQ(flags.flag(0), 0.0f);
  EXPECT_EQ(flags.flag(1), 7.0f);
  EXPECT_EQ(flags.FirstRaised(), 1);
  ASSERT_THAT(flags.Gather(0.0f), IsOk());
  EXPECT_EQ(flags.FirstRaised(), -1);
}

// Over a Gloo group of 3 ranks: every rank sees every rank's flag, and the
// first raised one in rank order, whichever rank raised it.
TEST(RankFlagsTest, OverGloo_EveryRankSeesEveryFlagAndTheSameFirstRaised) {
  ThreadWorld world(3);
  ASSERT_TRUE(world.Connect());
  std::vector<std::vector<float>> seen(3);
  std::vector<int> first(3, -2);
  const std::vector<absl::Status> done =
      RunOnRanks(3, [&](int rank) -> absl::Status {
        RankFlags flags(rank, 3, world.comm(rank));
        if (!flags.collective()) return absl::InternalError("not collective");
        const float mine = rank == 0 ? 0.0f : static_cast<float>(10 + rank);
        if (absl::Status s = flags.Gather(mine); !s.ok()) return s;
        for (int r = 0; r < 3; ++r) seen[rank].push_back(flags.flag(r));
        first[rank] = flags.FirstRaised();
        return absl::OkStatus();
      });
  for (int r = 0; r < 3; ++r) {
    ASSERT_THAT(done[r], IsOk()) << "rank " << r;
    EXPECT_EQ(seen[r], (std::vector<float>{0.0f, 11.0f, 12.0f})) << r;
    EXPECT_EQ(first[r], 1) << r;
  }
}

}  // namespace
}  // namespace muon
