#include "common/edit_distance.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace muon {
namespace {

TEST(EditDistanceTest, KnownDistances) {
  EXPECT_EQ(EditDistance("", ""), 0);
  EXPECT_EQ(EditDistance("placement", "placements"), 1);
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3);
  EXPECT_EQ(EditDistance("abc", ""), 3);
}

TEST(NearestNameTest, DottedPrefixWinsThenClosestWithinBound) {
  const std::vector<std::string> names = {"fc1.weight", "fc2.weight",
                                          "placements"};
  EXPECT_EQ(NearestName("module.fc2.weight", names), "fc2.weight");
  EXPECT_EQ(NearestName("fc2.weight", {"_orig_mod.fc2.weight"}),
            "_orig_mod.fc2.weight");
  EXPECT_EQ(NearestName("placement", names), "placements");
  EXPECT_EQ(NearestName("completely_else", names), "");
}

}  // namespace
}  // namespace muon
