// Tests of server/manifest_validation.h: every cross-rank check.
#include "server/manifest_validation.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "tests/server/test_specs.h"

namespace muon {
namespace {

using ::muon::testing::FourRankSpec;
using ::muon::testing::Manifests;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

TEST(ManifestValidationTest, ValidateManifests_Consistent_ReturnsLayout) {
  absl::StatusOr<JobLayout> layout =
      ValidateManifests(Manifests(FourRankSpec()));
  ASSERT_THAT(layout, IsOk());
  EXPECT_EQ(layout->world_size, 4);
  EXPECT_EQ(layout->mesh.ToString(), "dp_shard=4");
  ASSERT_EQ(layout->params.size(), 3u);
  const ParamLayout& fc2 = layout->params[1];
  EXPECT_EQ(fc2.name, "fc2.weight");
  EXPECT_EQ(fc2.rows, 3);
  EXPECT_EQ(fc2.cols, 5);
  ASSERT_EQ(fc2.boxes.size(), 4u);
  EXPECT_TRUE(fc2.boxes[3].empty());
  EXPECT_EQ(fc2.boxes[2].rows.begin, 2);
  EXPECT_EQ(fc2.requested_owner, -1);
}

TEST(ManifestValidationTest, ValidateManifests_Empty_ReturnsInvalidArgument) {
  EXPECT_THAT(ValidateManifests({}), StatusIs(kInvalid, HasSubstr("no rank")));
}

TEST(ManifestValidationTest,
     ValidateManifests_WrongRankField_ReturnsInvalidArgument) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  m[2].set_rank(3);
  EXPECT_THAT(ValidateManifests(m),
              StatusIs(kInvalid, HasSubstr("manifest 2 reports rank 3")));
}

TEST(ManifestValidationTest,
     ValidateManifests_WorldSizeDisagrees_ReturnsInvalidArgument) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  m[1].set_world_size(8);
  EXPECT_THAT(ValidateManifests(m),
              StatusIs(kInvalid, HasSubstr("rank 1 reports world size 8")));
}

TEST(ManifestValidationTest,
     ValidateManifests_MeshWorldMismatch_ReturnsInvalidArgument) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  m.pop_back();
  for (auto& mm : m) mm.set_world_size(3);
  EXPECT_THAT(ValidateManifests(m),
              StatusIs(kInvalid, AllOf(HasSubstr("dp_shard=4"),
                                       HasSubstr("world size is 3"))));
}

TEST(ManifestValidationTest,
     ValidateManifests_MeshDisagrees_ReturnsInvalidArgument) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  m[3].mutable_mesh()->mutable_dims(0)->set_name("tp");
  EXPECT_THAT(ValidateManifests(m),
              StatusIs(kInvalid, HasSubstr("rank 3 reports mesh tp=4 but rank "
                                           "0 reports dp_shard=4")));
}

TEST(ManifestValidationTest,
     ValidateManifests_GlobalShapeDisagrees_NamesParamRanksAndShapes) {
  v1::JobSpec spec = testing::MakeSpec(
      {{"dp_shard", 4}}, {{"fc1.weight", 32, 64, {"Replicate()"}}});
  std::vector<v1::RankManifest> m = Manifests(spec);
  auto* p = m[2].mutable_params(0);
  p->set_global_shape(0, 64);
  p->set_global_shape(1, 32);
  p->set_local_shape(0, 64);
  p->set_local_shape(1, 32);
  EXPECT_THAT(
      ValidateManifests(m),
      StatusIs(kInvalid, HasSubstr("parameter \"fc1.weight\": rank 2 reports "
                                   "global shape [64, 32] but rank 0 reports "
                                   "[32, 64]")));
}

TEST(ManifestValidationTest,
     ValidateManifests_PlacementsDisagree_ReturnsInvalidArgument) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  m[1].mutable_params(2)->set_placements(0, "Shard(1)");
  EXPECT_THAT(
      ValidateManifests(m),
      StatusIs(kInvalid,
               AllOf(HasSubstr("\"fc3.weight\""), HasSubstr("rank 1"),
                     HasSubstr("[Shard(1)]"), HasSubstr("[Replicate()]"))));
}

TEST(ManifestValidationTest,
     ValidateManifests_EquivalentPlacementSpelling_Accepted) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  m[1].mutable_params(2)->set_placements(0, "R");
  EXPECT_THAT(ValidateManifests(m), IsOk());
}

TEST(ManifestValidationTest,
     ValidateManifests_ParamOrderDiffers_ReturnsInvalidArgument) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  m[3].mutable_params()->SwapElements(0, 1);
  EXPECT_THAT(
      ValidateManifests(m),
      StatusIs(kInvalid, AllOf(HasSubstr("rank 3 reports \"fc2.weight\""),
                               HasSubstr("rank 0 reports \"fc1.weight\""))));
}

TEST(ManifestValidationTest,
     ValidateManifests_ExtraParamOnOneRank_ReturnsInvalidArgument) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  v1::ParamManifest* extra = m[2].add_params();
  extra->set_name("head.weight");
  EXPECT_THAT(ValidateManifests(m),
              StatusIs(kInvalid, AllOf(HasSubstr("\"head.weight\""),
                                       HasSubstr("only on rank 2"))));
}

TEST(ManifestValidationTest,
     ValidateManifests_DtypeDisagrees_ReturnsInvalidArgument) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  m[1].mutable_params(0)->set_dtype("bfloat16");
  EXPECT_THAT(ValidateManifests(m),
              StatusIs(kInvalid, AllOf(HasSubstr("\"fc1.weight\""),
                                       HasSubstr("dtype \"bfloat16\""))));
}

TEST(ManifestValidationTest, ValidateManifests_NotTwoDim_NamesParamAndShape) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  for (auto& mm : m) mm.mutable_params(2)->add_global_shape(4);
  EXPECT_THAT(
      ValidateManifests(m),
      StatusIs(kInvalid, AllOf(HasSubstr("\"fc3.weight\""),
                               HasSubstr("[6, 8, 4]"), HasSubstr("2-D"))));
}

TEST(ManifestValidationTest, ValidateManifests_Partial_ReturnsInvalidArgument) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  for (auto& mm : m) mm.mutable_params(2)->set_placements(0, "Partial()");
  EXPECT_THAT(ValidateManifests(m),
              StatusIs(kInvalid, AllOf(HasSubstr("\"fc3.weight\""),
                                       HasSubstr("Partial()"))));
}

TEST(ManifestValidationTest,
     ValidateManifests_UnparsablePlacement_ReturnsInvalidArgument) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  for (auto& mm : m) mm.mutable_params(0)->set_placements(0, "Sharded");
  EXPECT_THAT(ValidateManifests(m),
              StatusIs(kInvalid, AllOf(HasSubstr("\"fc1.weight\""),
                                       HasSubstr("Sharded"))));
}

TEST(ManifestValidationTest,
     ValidateManifests_WrongLocalShape_NamesExpectedShape) {
  std::vector<v1::RankManifest> m = Manifests(
      testing::MakeSpec({{"dp_shard", 4}}, {{"w", 10, 7, {"Shard(0)"}}}));
  m[3].mutable_params(0)->set_local_shape(0, 2);
  EXPECT_THAT(
      ValidateManifests(m),
      StatusIs(kInvalid, HasSubstr("parameter \"w\": rank 3 local shape [2, 7] "
                                   "does not match Shard(0) of [10, 7] over "
                                   "dp_shard=4: expected [1, 7]")));
}

TEST(ManifestValidationTest,
     ValidateManifests_EmptyShardReportedNonEmpty_ReturnsInvalidArgument) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  m[3].mutable_params(1)->set_local_shape(0, 1);  // must be [0, 5]
  EXPECT_THAT(ValidateManifests(m),
              StatusIs(kInvalid, AllOf(HasSubstr("\"fc2.weight\": rank 3"),
                                       HasSubstr("expected [0, 5]"))));
}

TEST(ManifestValidationTest,
     ValidateManifests_DuplicateName_ReturnsInvalidArgument) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  for (auto& mm : m) mm.mutable_params(1)->set_name("fc1.weight");
  EXPECT_THAT(
      ValidateManifests(m),
      StatusIs(kInvalid, HasSubstr("\"fc1.weight\" is listed more than once")));
}

TEST(ManifestValidationTest, ValidateManifests_RequestedOwners_Kept) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  for (auto& mm : m) {
    mm.add_requested_owners(3);
    mm.add_requested_owners(2);
    mm.add_requested_owners(0);
  }
  absl::StatusOr<JobLayout> layout = ValidateManifests(m);
  ASSERT_THAT(layout, IsOk());
  EXPECT_EQ(layout->params[0].requested_owner, 3);
  EXPECT_EQ(layout->params[1].requested_owner, 2);
  EXPECT_EQ(layout->params[2].requested_owner, 0);
}

TEST(ManifestValidationTest,
     ValidateManifests_RequestedOwnersDisagree_ReturnsInvalidArgument) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  for (int r = 0; r < 4; ++r) {
    m[r].add_requested_owners(r == 1 ? 1 : 0);
    m[r].add_requested_owners(0);
    m[r].add_requested_owners(0);
  }
  EXPECT_THAT(
      ValidateManifests(m),
      StatusIs(kInvalid, AllOf(HasSubstr("rank 1 requests owners [1, 0, 0]"),
                               HasSubstr("rank 0 requests owners [0, 0, 0]"))));
}

TEST(ManifestValidationTest,
     ValidateManifests_RequestedOwnersOnSomeRanks_ReturnsInvalidArgument) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  for (int i = 0; i < 3; ++i) m[0].add_requested_owners(0);
  EXPECT_THAT(ValidateManifests(m),
              StatusIs(kInvalid, HasSubstr("rank 1 requests owners []")));
}

TEST(ManifestValidationTest,
     ValidateManifests_RequestedOwnersWrongCount_ReturnsInvalidArgument) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  for (auto& mm : m) mm.add_requested_owners(0);
  EXPECT_THAT(ValidateManifests(m),
              StatusIs(kInvalid, HasSubstr("requested_owners has 1 entries")));
}

TEST(ManifestValidationTest,
     ValidateManifests_RequestedOwnerOutOfRange_ReturnsInvalidArgument) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  for (auto& mm : m) {
    mm.add_requested_owners(0);
    mm.add_requested_owners(7);
    mm.add_requested_owners(0);
  }
  EXPECT_THAT(
      ValidateManifests(m),
      StatusIs(kInvalid, AllOf(HasSubstr("\"fc2.weight\""), HasSubstr("rank 7"),
                               HasSubstr("[0, 4)"))));
}

TEST(ManifestValidationTest,
     ValidateManifests_RequestedOwnerHoldsNothing_ReturnsInvalidArgument) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  for (auto& mm : m) {
    mm.add_requested_owners(0);
    mm.add_requested_owners(3);  // fc2 [3, 5]: rank 3's shard is empty
    mm.add_requested_owners(0);
  }
  EXPECT_THAT(
      ValidateManifests(m),
      StatusIs(kInvalid, AllOf(HasSubstr("\"fc2.weight\""),
                               HasSubstr("rank 3 holds an empty shard"))));
}

TEST(ManifestValidationTest,
     ValidateManifests_PolicyDisagrees_ReturnsInvalidArgument) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  m[2].mutable_execution()->set_assignment_policy("round_robin");
  EXPECT_THAT(ValidateManifests(m),
              StatusIs(kInvalid, HasSubstr("rank 2 reports assignment_policy "
                                           "\"round_robin\"")));
}

TEST(ManifestValidationTest,
     ValidateManifests_BucketSizeDisagrees_ReturnsInvalidArgument) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  m[1].mutable_execution()->set_bucket_size_bytes(4096);
  EXPECT_THAT(
      ValidateManifests(m),
      StatusIs(kInvalid, HasSubstr("rank 1 reports bucket_size_bytes 4096")));
}

}  // namespace
}  // namespace muon
