// Size limits in ValidateManifests (common/checked_math.h): a mesh whose
// product overflows, a huge expert count, a shape whose product overflows,
// a name over kMaxTensorNameBytes: each is an InvalidArgument naming the
// field and its value, returned before any per-rank table is sized by it
// (also where compact manifests apply the chunk rule).
#include <cstdint>
#include <string>
#include <vector>

#include "common/checked_math.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/compact_manifest.h"
#include "plan/manifest_validation.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

// `world` manifests of a mesh with `sizes`, each listing one parameter of
// `shape` replicated (local shape = global shape).
std::vector<v1::RankManifest> Manifests(int world, std::vector<int> sizes,
                                        std::vector<int64_t> shape) {
  std::vector<v1::RankManifest> out(world);
  for (int r = 0; r < world; ++r) {
    v1::RankManifest& m = out[r];
    m.set_rank(r);
    m.set_world_size(world);
    for (size_t d = 0; d < sizes.size(); ++d) {
      v1::MeshDim* dim = m.mutable_mesh()->add_dims();
      dim->set_name(absl::StrCat("d", d));
      dim->set_size(sizes[d]);
    }
    v1::ParamManifest* p = m.add_params();
    p->set_name("w");
    p->set_dtype("float32");
    for (int64_t n : shape) {
      p->add_global_shape(n);
      p->add_local_shape(n);
    }
    for (size_t d = 0; d < sizes.size(); ++d) p->add_placements("Replicate()");
  }
  return out;
}

TEST(ManifestLimitsTest,
     ValidateManifests_MeshProductWrapsToWorld_ReturnsInvalidArgument) {
  // 3 x 1431655766 = 2^32 + 2: in int arithmetic it wrapped to 2 ranks and
  // two joined ranks got a plan.
  EXPECT_THAT(ValidateManifests(Manifests(2, {3, 1431655766}, {4, 4})),
              StatusIs(kInvalid, AllOf(HasSubstr("mesh d0=3 x d1=1431655766"),
                                       HasSubstr("4294967298"))));
}

TEST(ManifestLimitsTest,
     ValidateManifests_HugeExpertCount_ReturnsInvalidArgument) {
  EXPECT_THAT(ValidateManifests(Manifests(2, {2}, {int64_t{1} << 31, 4, 4})),
              StatusIs(kInvalid, AllOf(HasSubstr("parameter \"w\""),
                                       HasSubstr("2147483648 experts"))));
}

TEST(ManifestLimitsTest,
     ValidateManifests_ShapeProductOverflows_ReturnsInvalidArgument) {
  EXPECT_THAT(ValidateManifests(Manifests(1, {1}, {int64_t{1} << 62, 4})),
              StatusIs(kInvalid, AllOf(HasSubstr("parameter \"w\""),
                                       HasSubstr("[4611686018427387904, 4]"))));
}

// A rank's parameter name longer than kMaxTensorNameBytes is refused in the
// union, before it is copied (into the union's index, then into every
// matrix of the plan), naming the rank, its first 64 bytes and its size.
TEST(ManifestLimitsTest,
     ValidateManifests_NameOverLimit_ReturnsInvalidArgumentNamingRank) {
  std::vector<v1::RankManifest> m = Manifests(2, {2}, {65536, 1, 1});
  const std::string name(size_t{1} << 20, 'n');
  for (v1::RankManifest& rank : m) rank.mutable_params(0)->set_name(name);
  EXPECT_THAT(
      ValidateManifests(m),
      StatusIs(kInvalid,
               AllOf(HasSubstr("rank 0: parameter \"" + std::string(64, 'n') +
                               "...\" has a name of 1048576 bytes"),
                     HasSubstr("at most 4096"))));
  // Only rank 1's copy is too long: rank 1 is named.
  m[0].mutable_params(0)->set_name("w");
  m[1].mutable_params(0)->set_name(std::string(kMaxTensorNameBytes + 1, 'n'));
  EXPECT_THAT(ValidateManifests(m),
              StatusIs(kInvalid, HasSubstr("rank 1: parameter \"")));
}

// Four stacks of 2^16 slices named in 4 KiB each: every name is within
// its limit, but the plan would copy over 1 GiB of "name[e]" strings.
// Refused with the job's size, before any matrix is named.
TEST(ManifestLimitsTest,
     ValidateManifests_ManyLongSliceNames_ReturnsInvalidArgument) {
  std::vector<v1::RankManifest> m = Manifests(1, {1}, {kMaxExperts, 1, 1});
  m[0].mutable_params(0)->set_name(std::string(kMaxTensorNameBytes, 'a'));
  for (char c : {'b', 'c', 'd'}) {
    v1::ParamManifest* p = m[0].add_params();
    *p = m[0].params(0);
    p->set_name(std::string(kMaxTensorNameBytes, c));
  }
  EXPECT_THAT(ValidateManifests(m),
              StatusIs(kInvalid, AllOf(HasSubstr("matrix names"),
                                       HasSubstr("1073741824 bytes"))));
}

// [INT64_MAX, 1] Shard(0) over 2 ranks: ChunkRange computed INT64_MAX + 1
// (signed overflow) from a shape nothing had checked yet. Now the shape is
// checked first: a clear InvalidArgument everywhere the chunk rule runs.
TEST(ManifestLimitsTest, HugeShardedDim_ReturnsInvalidArgumentWithoutOverflow) {
  std::vector<v1::RankManifest> m = Manifests(2, {2}, {INT64_MAX, 1});
  for (v1::RankManifest& rank : m) {
    v1::ParamManifest* p = rank.mutable_params(0);
    p->set_placements(0, "Shard(0)");
    p->set_local_shape(0, rank.rank() == 0 ? int64_t{1} << 62
                                           : INT64_MAX - (int64_t{1} << 62));
  }
  const auto names_shape = AllOf(HasSubstr("parameter \"w\""),
                                 HasSubstr("[9223372036854775807, 1]"));
  EXPECT_THAT(ManifestForRank(m[0], 1), StatusIs(kInvalid, names_shape));
  // Not compact: the rank sends its full manifest, whose checks refuse it.
  EXPECT_THAT(CheckManifestFollowsLayout(m[1]),
              StatusIs(absl::StatusCode::kFailedPrecondition, names_shape));
  EXPECT_THAT(ValidateManifests(m), StatusIs(kInvalid, names_shape));
}

TEST(ManifestLimitsTest, ValidateManifests_WithinLimits_IsOk) {
  EXPECT_THAT(ValidateManifests(Manifests(2, {2}, {8, 4, 4})), IsOk());
}

}  // namespace
}  // namespace muon
