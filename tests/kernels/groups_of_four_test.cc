// The host side of the CUDA kernels' groups of four
// (kernels/cuda/groups_of_four.h): which pointers the vector path takes,
// that the split covers every element exactly once, and the overlap test
// the kernels' argument checks use.
#include "kernels/cuda/groups_of_four.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace muon {
namespace kernels {
namespace cuda {
namespace {

TEST(GroupsOfFourTest, AlignedForFour_Fp32Every16BytesBf16Every8) {
  alignas(16) float f[8] = {};
  for (int k = 0; k < 8; ++k) {
    EXPECT_EQ(AlignedForFour<float>(f + k), k % 4 == 0) << "float offset " << k;
  }
  alignas(16) uint16_t h[16] = {};
  for (int k = 0; k < 16; ++k) {
    EXPECT_EQ(AlignedForFour<uint16_t>(h + k), k % 4 == 0)
        << "bf16 offset " << k;
  }
}

// Every n from 0 to 13, aligned or not: the groups (aligned only) cover
// [0, 4 (n / 4)) and the rest [done, n), each element once, and no call
// is made for no elements.
TEST(GroupsOfFourTest, InGroupsOfFour_CoversEachElementOnceGroupsOnlyAligned) {
  for (bool aligned : {true, false}) {
    for (int64_t n = 0; n <= 13; ++n) {
      std::vector<int> covered(static_cast<size_t>(n), 0);
      int group_calls = 0, rest_calls = 0;
      InGroupsOfFour(
          aligned, n,
          [&](int64_t groups) {
            ++group_calls;
            EXPECT_GT(groups, 0);
            for (int64_t i = 0; i < 4 * groups; ++i) ++covered[i];
          },
          [&](int64_t done, int64_t count) {
            ++rest_calls;
            EXPECT_GT(count, 0);
            for (int64_t i = done; i < done + count; ++i) ++covered[i];
          });
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_EQ(covered[i], 1) << "n " << n << " element " << i;
      }
      EXPECT_EQ(group_calls, aligned && n >= 4 ? 1 : 0) << "n " << n;
      EXPECT_EQ(rest_calls, (aligned ? n % 4 : n) > 0 ? 1 : 0) << "n " << n;
    }
  }
}

TEST(GroupsOfFourTest, BytesOverlap_SharedByteOnlyAndEmptyRangesNever) {
  alignas(16) unsigned char b[64] = {};
  EXPECT_TRUE(BytesOverlap(b, 16, b, 16));
  EXPECT_TRUE(BytesOverlap(b, 16, b + 15, 1));  // the last byte
  EXPECT_TRUE(BytesOverlap(b + 15, 8, b, 16));
  EXPECT_FALSE(BytesOverlap(b, 16, b + 16, 16));  // adjacent
  EXPECT_FALSE(BytesOverlap(b + 16, 16, b, 16));
  EXPECT_TRUE(BytesOverlap(b, 64, b + 20, 4));  // one inside the other
  EXPECT_FALSE(BytesOverlap(b, 0, b, 16));      // empty
  EXPECT_FALSE(BytesOverlap(b + 4, 16, b + 8, 0));
}

}  // namespace
}  // namespace cuda
}  // namespace kernels
}  // namespace muon
