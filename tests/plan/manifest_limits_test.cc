// Size limits in ValidateManifests (common/checked_math.h): a mesh whose
// product overflows, a huge expert count, a shape whose product overflows:
// each is an InvalidArgument naming the field and its value, returned
// before any per-rank table is sized by it.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
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

TEST(ManifestLimitsTest, ValidateManifests_WithinLimits_IsOk) {
  EXPECT_THAT(ValidateManifests(Manifests(2, {2}, {8, 4, 4})), IsOk());
}

}  // namespace
}  // namespace muon
