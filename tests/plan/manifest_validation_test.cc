// Tests of plan/manifest_validation.h: every cross-rank check.
#include "plan/manifest_validation.h"

#include <string>
#include <vector>

#include "common/spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/test_specs.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::muon::testing::ExpertSpec;
using ::muon::testing::FourRankSpec;
using ::muon::testing::Manifests;
using ::muon::testing::PipelineSpec;
using ::testing::AllOf;
using ::testing::ElementsAre;
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
  EXPECT_THAT(fc2.shape, ElementsAre(3, 5));
  const MatrixLayout& m = layout->matrices[fc2.first_matrix];
  EXPECT_EQ(m.rows, 3);
  EXPECT_EQ(m.cols, 5);
  ASSERT_EQ(m.boxes.size(), 4u);
  EXPECT_TRUE(m.boxes[3].empty());
  EXPECT_EQ(m.boxes[2].rows.begin, 2);
  EXPECT_EQ(m.requested_owner, -1);
}

// Every rank's manifest with `t` as its owner-side variant.
std::vector<v1::RankManifest> WithTransform(const v1::OwnerTransformSpec& t) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  for (v1::RankManifest& r : m) *r.mutable_owner_transform() = t;
  return m;
}

v1::OwnerTransformSpec Variant(const std::string& name, double beta) {
  v1::OwnerTransformSpec t;
  t.set_name(name);
  (*t.mutable_params())["beta"] = beta;
  t.add_row_state("state");
  return t;
}

// The same variant everywhere plans; any variant, not only NorMuon, is
// checked by its name, each hyperparameter and its row state.
TEST(ManifestValidationTest, ValidateManifests_SameOwnerTransform_Plans) {
  EXPECT_THAT(ValidateManifests(WithTransform(Variant("v", 0.5))), IsOk());
}

TEST(ManifestValidationTest,
     ValidateManifests_OwnerTransformNameDisagrees_NamesRankAndBoth) {
  std::vector<v1::RankManifest> m = WithTransform(Variant("v", 0.5));
  m[3].mutable_owner_transform()->set_name("w");
  EXPECT_THAT(ValidateManifests(m),
              StatusIs(kInvalid, HasSubstr("rank 3 reports w=true but rank 0 "
                                           "reports v=true")));
  m[3].clear_owner_transform();
  EXPECT_THAT(ValidateManifests(m),
              StatusIs(kInvalid, HasSubstr("rank 3 reports v=false but rank 0 "
                                           "reports v=true")));
}

TEST(ManifestValidationTest,
     ValidateManifests_OwnerTransformParamDisagrees_NamesParamAndValues) {
  std::vector<v1::RankManifest> m = WithTransform(Variant("v", 0.5));
  (*m[2].mutable_owner_transform()->mutable_params())["beta"] = 0.25;
  EXPECT_THAT(ValidateManifests(m),
              StatusIs(kInvalid, HasSubstr("rank 2 reports v_beta=0.25 but "
                                           "rank 0 reports v_beta=0.5")));
  m = WithTransform(Variant("v", 0.5));
  (*m[1].mutable_owner_transform()->mutable_params())["gamma"] = 1;
  EXPECT_THAT(ValidateManifests(m),
              StatusIs(kInvalid, HasSubstr("rank 1 reports v_gamma=1 but "
                                           "rank 0 reports v_gamma=(unset)")));
}

TEST(ManifestValidationTest,
     ValidateManifests_OwnerTransformRowStateDisagrees_NamesBoth) {
  std::vector<v1::RankManifest> m = WithTransform(Variant("v", 0.5));
  m[1].mutable_owner_transform()->set_row_state(0, "other");
  EXPECT_THAT(ValidateManifests(m),
              StatusIs(kInvalid, HasSubstr("rank 1 reports v row state [other] "
                                           "but rank 0 reports [state]")));
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
      StatusIs(kInvalid,
               HasSubstr("rank 3 lists parameter \"fc2.weight\" before "
                         "\"fc1.weight\" but rank 0 lists \"fc1.weight\" "
                         "before \"fc2.weight\"")));
}

TEST(ManifestValidationTest,
     ValidateManifests_ExtraParamOnOneRank_ReturnsInvalidArgument) {
  // A parameter without a sub-mesh must be on every rank.
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  v1::ParamManifest* extra = m[2].add_params();
  *extra = m[2].params(2);
  extra->set_name("head.weight");
  EXPECT_THAT(
      ValidateManifests(m),
      StatusIs(kInvalid,
               HasSubstr("parameter \"head.weight\" (no sub-mesh: every "
                         "rank) is missing on rank 0 (coordinate dp_shard=0); "
                         "it is listed on ranks [2]")));
}

// One rank's names carry a wrapper's prefix ("module." from DDP): the
// error names the near match on the other rank.
TEST(ManifestValidationTest,
     ValidateManifests_PrefixedNamesOnOneRank_SuggestsTheNearName) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  for (v1::ParamManifest& p : *m[1].mutable_params()) {
    p.set_name("module." + p.name());
  }
  EXPECT_THAT(ValidateManifests(m),
              StatusIs(kInvalid,
                       AllOf(HasSubstr("is missing on rank 1"),
                             HasSubstr("rank 1 has \"module.fc1.weight\""),
                             HasSubstr("pass the same parameter names on every "
                                       "rank"))));
}

TEST(ManifestValidationTest,
     ValidateManifests_DtypeDisagrees_ReturnsInvalidArgument) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  m[1].mutable_params(0)->set_dtype("bfloat16");
  EXPECT_THAT(ValidateManifests(m),
              StatusIs(kInvalid, AllOf(HasSubstr("\"fc1.weight\""),
                                       HasSubstr("dtype \"bfloat16\""))));
}

TEST(ManifestValidationTest,
     ValidateManifests_NotTwoOrThreeDim_NamesParamAndShape) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  for (auto& mm : m) {
    mm.mutable_params(2)->add_global_shape(4);
    mm.mutable_params(2)->add_global_shape(2);
  }
  EXPECT_THAT(
      ValidateManifests(m),
      StatusIs(kInvalid, AllOf(HasSubstr("\"fc3.weight\""),
                               HasSubstr("[6, 8, 4, 2]"), HasSubstr("2-D"))));
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
  EXPECT_EQ(layout->matrices[0].requested_owner, 3);
  EXPECT_EQ(layout->matrices[1].requested_owner, 2);
  EXPECT_EQ(layout->matrices[2].requested_owner, 0);
}

TEST(ManifestValidationTest,
     ValidateManifests_RequestedOwnersDisagree_ReturnsInvalidArgument) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  for (int r = 0; r < 4; ++r) {
    m[r].add_requested_owners(r == 1 ? 1 : 0);
    m[r].add_requested_owners(0);
    m[r].add_requested_owners(0);
  }
  EXPECT_THAT(ValidateManifests(m),
              StatusIs(kInvalid, HasSubstr("parameter \"fc1.weight\": rank 1 "
                                           "requests owner 1 but rank 0 "
                                           "requests owner 0")));
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

// An empty policy is lpt, the default: a rank that names it and one that
// leaves it out agree.
TEST(ManifestValidationTest, ValidateManifests_EmptyPolicyAndLpt_Agree) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  m[0].mutable_execution()->clear_assignment_policy();
  m[1].mutable_execution()->set_assignment_policy("lpt");
  EXPECT_THAT(ValidateManifests(m), IsOk());
}

TEST(ManifestValidationTest,
     ValidateManifests_BucketSizeDisagrees_ReturnsInvalidArgument) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  m[1].mutable_execution()->set_bucket_size_bytes(4096);
  EXPECT_THAT(
      ValidateManifests(m),
      StatusIs(kInvalid, HasSubstr("rank 1 reports bucket_size_bytes 4096")));
}

// "float32" and empty are the same exchange; "bfloat16" on one rank only
// would make the ranks' all-to-all sizes disagree.
TEST(ManifestValidationTest,
     ValidateManifests_ExchangeDtypeDisagrees_ReturnsInvalidArgument) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  m[1].mutable_execution()->set_exchange_dtype("float32");
  EXPECT_THAT(ValidateManifests(m), IsOk());
  m[3].mutable_execution()->set_exchange_dtype("bfloat16");
  EXPECT_THAT(ValidateManifests(m),
              StatusIs(kInvalid, HasSubstr("rank 3 exchanges bfloat16 but "
                                           "rank 0 exchanges float32")));
}

TEST(ManifestValidationTest, ValidateManifests_TwoDim_OneMatrixPerParam) {
  absl::StatusOr<JobLayout> layout =
      ValidateManifests(Manifests(FourRankSpec()));
  ASSERT_THAT(layout, IsOk());
  ASSERT_EQ(layout->matrices.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const MatrixLayout& m = layout->matrices[i];
    EXPECT_EQ(m.param_index, i);
    EXPECT_EQ(m.slice, 0);
    EXPECT_EQ(m.name, layout->params[i].name);
    EXPECT_EQ(layout->params[i].first_matrix, i);
    EXPECT_EQ(layout->params[i].num_matrices, 1);
  }
  EXPECT_THAT(layout->params[1].shape, ElementsAre(3, 5));
  EXPECT_TRUE(layout->params[1].sub_mesh.empty());
  EXPECT_TRUE(layout->matrices[1].boxes[3].empty());
}

TEST(ManifestValidationTest,
     ValidateManifests_Pipeline_UnionInRankOrderAndBoxesOnlyOnStage) {
  absl::StatusOr<JobLayout> layout =
      ValidateManifests(Manifests(PipelineSpec()));
  ASSERT_THAT(layout, IsOk());
  // Rank 0 (stage 0) lists layers 0-1, rank 4 (stage 1) layers 2-3.
  ASSERT_EQ(layout->params.size(), 8u);
  ASSERT_EQ(layout->matrices.size(), 8u);
  std::vector<std::string> names;
  for (const ParamLayout& p : layout->params) names.push_back(p.name);
  EXPECT_THAT(names, ElementsAre("layers.0.attn.wq", "layers.0.attn.wo",
                                 "layers.1.attn.wq", "layers.1.attn.wo",
                                 "layers.2.attn.wq", "layers.2.attn.wo",
                                 "layers.3.attn.wq", "layers.3.attn.wo"));
  const ParamLayout& wq3 = layout->params[6];
  ASSERT_EQ(wq3.sub_mesh.dims.size(), 1u);
  EXPECT_EQ(wq3.sub_mesh.dims[0], 0);  // mesh dim "pp"
  EXPECT_EQ(wq3.sub_mesh.coords[0], 1);
  const MatrixLayout& m = layout->matrices[6];
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(m.boxes[r].empty(), r < 4) << "rank " << r;
  }
  EXPECT_EQ(m.boxes[5].rows.begin, 2);  // tp coordinate 1 of Shard(0)
  EXPECT_EQ(m.boxes[5].rows.end, 4);
}

TEST(ManifestValidationTest,
     ValidateManifests_MissingOnSubMeshRank_NamesParamRankAndCoordinate) {
  std::vector<v1::RankManifest> m = Manifests(PipelineSpec());
  // Rank 5 is pp=1, tp=1; drop its layers.3.attn.wq (index 2 of its list).
  m[5].mutable_params()->DeleteSubrange(2, 1);
  EXPECT_THAT(
      ValidateManifests(m),
      StatusIs(kInvalid,
               HasSubstr("parameter \"layers.3.attn.wq\" (sub-mesh pp=1) is "
                         "missing on rank 5 (coordinate pp=1, tp=1)")));
}

TEST(ManifestValidationTest,
     ValidateManifests_ListedOutsideSubMesh_NamesParamRankAndCoordinate) {
  std::vector<v1::RankManifest> m = Manifests(PipelineSpec());
  // Rank 2 (pp=0, tp=2) also lists stage 1's layers.3.attn.wq.
  *m[2].add_params() = m[6].params(2);
  EXPECT_THAT(
      ValidateManifests(m),
      StatusIs(kInvalid,
               HasSubstr("parameter \"layers.3.attn.wq\" (sub-mesh pp=1) is "
                         "listed on rank 2 outside its sub-mesh (coordinate "
                         "pp=0, tp=2)")));
}

TEST(ManifestValidationTest,
     ValidateManifests_SubMeshDisagrees_NamesParamBothRanksAndValues) {
  std::vector<v1::RankManifest> m = Manifests(PipelineSpec());
  (*m[6].mutable_params(2)->mutable_sub_mesh())["pp"] = 0;
  EXPECT_THAT(
      ValidateManifests(m),
      StatusIs(kInvalid,
               HasSubstr("parameter \"layers.3.attn.wq\": rank 6 reports "
                         "sub_mesh {pp=0} but rank 4 reports {pp=1}")));
}

TEST(ManifestValidationTest,
     ValidateManifests_SubMeshStageOutOfRange_ReturnsInvalidArgument) {
  std::vector<v1::RankManifest> m = Manifests(PipelineSpec());
  for (int r = 4; r < 8; ++r) {
    (*m[r].mutable_params(2)->mutable_sub_mesh())["pp"] = 2;
  }
  EXPECT_THAT(
      ValidateManifests(m),
      StatusIs(kInvalid, HasSubstr("parameter \"layers.3.attn.wq\": pp stage "
                                   "2 is out of range: mesh dim \"pp\" has 2 "
                                   "stages (0..1)")));
}

TEST(ManifestValidationTest,
     ValidateManifests_ShapeDisagreesAcrossStageRanks_NamesBothRanks) {
  std::vector<v1::RankManifest> m = Manifests(PipelineSpec());
  m[7].mutable_params(0)->set_global_shape(0, 16);
  EXPECT_THAT(
      ValidateManifests(m),
      StatusIs(kInvalid, HasSubstr("parameter \"layers.2.attn.wq\": rank 7 "
                                   "reports global shape [16, 8] but rank 4 "
                                   "reports [8, 8]")));
}

TEST(ManifestValidationTest,
     ValidateManifests_ExpertStack_OneMatrixPerSliceOnItsEpGroup) {
  absl::StatusOr<JobLayout> layout = ValidateManifests(Manifests(ExpertSpec()));
  ASSERT_THAT(layout, IsOk());
  ASSERT_EQ(layout->params.size(), 3u);
  ASSERT_EQ(layout->matrices.size(), 1u + 8u + 8u);
  const ParamLayout& w1 = layout->params[1];
  EXPECT_TRUE(w1.is_stack());
  EXPECT_EQ(w1.first_matrix, 1);
  EXPECT_EQ(w1.num_matrices, 8);
  for (int e = 0; e < 8; ++e) {
    const MatrixLayout& m = layout->matrices[1 + e];
    EXPECT_EQ(m.param_index, 1);
    EXPECT_EQ(m.slice, e);
    EXPECT_EQ(m.name, "experts.w1[" + std::to_string(e) + "]");
    EXPECT_EQ(m.rows, 6);
    EXPECT_EQ(m.cols, 4);
    // Rank = 4 * dp_shard + ep; expert e lives whole on ep rank e / 2.
    for (int r = 0; r < 8; ++r) {
      const bool holds = r % 4 == e / 2;
      EXPECT_EQ(m.boxes[r].numel(), holds ? 24 : 0)
          << "slice " << e << " rank " << r;
    }
  }
  // w2 [8, 4, 6]: rows split over dp_shard inside the ep group.
  const MatrixLayout& w2_5 = layout->matrices[9 + 5];
  EXPECT_EQ(w2_5.name, "experts.w2[5]");
  EXPECT_EQ(w2_5.boxes[2].rows.size(), 2);  // dp 0, ep 2
  EXPECT_EQ(w2_5.boxes[6].rows.begin, 2);   // dp 1, ep 2
  EXPECT_TRUE(w2_5.boxes[1].empty());
}

TEST(ManifestValidationTest,
     ValidateManifests_ExpertStackWrongLocalShape_NamesExpected) {
  std::vector<v1::RankManifest> m = Manifests(ExpertSpec());
  m[3].mutable_params(1)->set_local_shape(0, 8);
  EXPECT_THAT(ValidateManifests(m),
              StatusIs(kInvalid,
                       HasSubstr("parameter \"experts.w1\": rank 3 local shape "
                                 "[8, 6, 4] does not match [Replicate(), "
                                 "Shard(0)] of [8, 6, 4] over dp_shard=2 x "
                                 "ep=4: expected [2, 6, 4]")));
}

// Requested owners, one per matrix of the rank's manifest: ExpertSpec has
// attn, experts.w1[0..7], experts.w2[0..7] on every rank.
std::vector<v1::RankManifest> ExpertManifestsWithOwners(
    const std::vector<int>& owners) {
  std::vector<v1::RankManifest> m = Manifests(ExpertSpec());
  for (auto& mm : m) {
    for (int o : owners) mm.add_requested_owners(o);
  }
  return m;
}

std::vector<int> ValidExpertOwners() {
  std::vector<int> owners = {5};                            // attn
  for (int e = 0; e < 8; ++e) owners.push_back(e / 2);      // w1: dp 0
  for (int e = 0; e < 8; ++e) owners.push_back(4 + e / 2);  // w2: dp 1
  return owners;
}

TEST(ManifestValidationTest,
     ValidateManifests_RequestedOwnersPerMatrix_KeptPerSlice) {
  absl::StatusOr<JobLayout> layout =
      ValidateManifests(ExpertManifestsWithOwners(ValidExpertOwners()));
  ASSERT_THAT(layout, IsOk());
  EXPECT_EQ(layout->matrices[0].requested_owner, 5);
  EXPECT_EQ(layout->matrices[1 + 7].requested_owner, 3);
  EXPECT_EQ(layout->matrices[9 + 2].requested_owner, 5);
}

TEST(ManifestValidationTest,
     ValidateManifests_RequestedOwnerPerParamCount_ReturnsInvalidArgument) {
  // One owner per parameter (3) instead of one per matrix (17).
  EXPECT_THAT(
      ValidateManifests(ExpertManifestsWithOwners({0, 0, 0})),
      StatusIs(kInvalid, HasSubstr("rank 0: requested_owners has 3 entries "
                                   "but the rank lists 17 matrices")));
}

TEST(ManifestValidationTest,
     ValidateManifests_RequestedOwnerOutsideEpGroup_NamesSliceAndRank) {
  std::vector<int> owners = ValidExpertOwners();
  owners[1 + 6] = 0;  // experts.w1[6] lives on ep rank 3, not on rank 0
  EXPECT_THAT(
      ValidateManifests(ExpertManifestsWithOwners(owners)),
      StatusIs(kInvalid,
               AllOf(HasSubstr("parameter \"experts.w1\" expert slice 6: "
                               "requested owner rank 0 holds an empty shard"),
                     HasSubstr("coordinate dp_shard=0, ep=0"))));
}

TEST(ManifestValidationTest,
     ValidateManifests_RequestedOwnerSliceDisagrees_NamesBothRanks) {
  std::vector<v1::RankManifest> m =
      ExpertManifestsWithOwners(ValidExpertOwners());
  m[6].set_requested_owners(9 + 4, 2);  // w2[4]: rank 2 (also holds it)
  EXPECT_THAT(
      ValidateManifests(m),
      StatusIs(kInvalid, HasSubstr("parameter \"experts.w2\" expert slice 4: "
                                   "rank 6 requests owner 2 but rank 0 "
                                   "requests owner 6")));
}

TEST(ManifestValidationTest,
     ValidateManifests_RequestedOwnersPipeline_PerRankListsMatch) {
  // Each stage's ranks give owners for their own 4 matrices only (wo [8, 6]
  // over tp=4 is empty on tp=3).
  std::vector<v1::RankManifest> m = Manifests(PipelineSpec());
  for (int r = 0; r < 8; ++r) {
    const int base = 4 * (r / 4);
    for (int o : {base, base + 1, base + 2, base + 1}) {
      m[r].add_requested_owners(o);
    }
  }
  absl::StatusOr<JobLayout> layout = ValidateManifests(m);
  ASSERT_THAT(layout, IsOk());
  EXPECT_EQ(layout->matrices[4].requested_owner, 4);
  EXPECT_EQ(layout->matrices[7].requested_owner, 5);
  // An owner on the other stage holds nothing of the matrix.
  m[4].set_requested_owners(0, 0);
  m[5].set_requested_owners(0, 0);
  m[6].set_requested_owners(0, 0);
  m[7].set_requested_owners(0, 0);
  EXPECT_THAT(
      ValidateManifests(m),
      StatusIs(kInvalid,
               HasSubstr("parameter \"layers.2.attn.wq\": requested owner "
                         "rank 0 (coordinate pp=0, tp=0) is outside its "
                         "sub-mesh pp=1")));
}

// _StridedShard(dim=0, sf=4) over dp_shard=2 x tp=2 where tp's Shard(0)
// makes the split factor 2: the spec check (muonctl spec, LoadSpec) used to
// pass it, and only each rank's LocalRanges refused it, without the
// parameter's name. Now ValidateJobSpec and ValidateManifests name both.
TEST(ManifestValidationTest,
     ValidateJobSpec_StridedShardWrongSplitFactor_NamesTheParameter) {
  v1::JobSpec spec = ::muon::testing::MakeSpec(
      {{"dp_shard", 2}, {"tp", 2}},
      {{"w", 8, 4, {"_StridedShard(dim=0, sf=2)", "Shard(0)"}}});
  ASSERT_THAT(ValidateJobSpec(spec), IsOk());
  std::vector<v1::RankManifest> m = Manifests(spec);
  ASSERT_THAT(ValidateManifests(m), IsOk());
  const auto names_it =
      AllOf(HasSubstr("parameter \"w\": _StridedShard(dim=0, sf=4) on mesh "
                      "dim \"dp_shard\""),
            HasSubstr("(2 here)"));
  spec.mutable_params(0)->set_placements(0, "_StridedShard(dim=0, sf=4)");
  EXPECT_THAT(ValidateJobSpec(spec), StatusIs(kInvalid, names_it));
  EXPECT_THAT(LayoutFromSpec(spec), StatusIs(kInvalid, names_it));
  for (v1::RankManifest& rank : m) {
    rank.mutable_params(0)->set_placements(0, "_StridedShard(dim=0, sf=4)");
  }
  EXPECT_THAT(ValidateManifests(m), StatusIs(kInvalid, names_it));
}

// Mesh dim names may hold any character. The layout cache keyed sub-meshes
// by their printed names, so {p: 0, q: 1} and {"p=0, q": 1} both printed
// "p=0, q=1" and the second parameter reused the first one's boxes. Each
// parameter's boxes must be non-empty exactly on its own sub-mesh.
TEST(ManifestValidationTest, Layout_SubMeshesPrintingAlike_KeepTheirOwnBoxes) {
  const v1::JobSpec spec = ::muon::testing::MakeSpec(
      {{"p", 2}, {"q", 2}, {"p=0, q", 2}},
      {{"a", 4, 4, {"R", "R", "R"}, {{"p", 0}, {"q", 1}}},
       {"b", 4, 4, {"R", "R", "R"}, {{"p=0, q", 1}}}});
  absl::StatusOr<JobLayout> from_spec = LayoutFromSpec(spec);
  ASSERT_THAT(from_spec, IsOk());
  absl::StatusOr<JobLayout> from_manifests = ValidateManifests(Manifests(spec));
  ASSERT_THAT(from_manifests, IsOk());
  for (const JobLayout* layout : {&*from_spec, &*from_manifests}) {
    ASSERT_EQ(layout->matrices.size(), 2u);
    for (const MatrixLayout& matrix : layout->matrices) {
      const ParamLayout& param = layout->params[matrix.param_index];
      for (int r = 0; r < 8; ++r) {
        EXPECT_EQ(!matrix.boxes[r].empty(),
                  param.sub_mesh.Contains(layout->mesh.Coord(r)))
            << matrix.name << " rank " << r;
      }
    }
  }
}

// JobSpecFromLayout is LayoutFromSpec's inverse: the spec it writes lays
// out the same parameters and every rank's boxes, sub-meshes and stacks
// included.
TEST(ManifestValidationTest, JobSpecFromLayout_RoundTripsEveryLayout) {
  for (const v1::JobSpec& spec :
       {FourRankSpec(), PipelineSpec(), ExpertSpec()}) {
    absl::StatusOr<JobLayout> layout = LayoutFromSpec(spec);
    ASSERT_THAT(layout, IsOk());
    const v1::JobSpec written = JobSpecFromLayout(*layout, "live");
    EXPECT_EQ(written.job_id(), "live");
    EXPECT_EQ(DescribeLayoutDifference(spec, written), "");
    absl::StatusOr<JobLayout> again = LayoutFromSpec(written);
    ASSERT_THAT(again, IsOk());
    EXPECT_EQ(again->mesh.ToString(), layout->mesh.ToString());
    ASSERT_EQ(again->params.size(), layout->params.size());
    ASSERT_EQ(again->matrices.size(), layout->matrices.size());
    for (size_t i = 0; i < layout->matrices.size(); ++i) {
      const MatrixLayout& a = layout->matrices[i];
      const MatrixLayout& b = again->matrices[i];
      EXPECT_EQ(a.name, b.name);
      for (int r = 0; r < layout->world_size; ++r) {
        EXPECT_TRUE(a.boxes[r] == b.boxes[r]) << a.name << " rank " << r;
      }
    }
  }
}

TEST(ManifestValidationTest,
     DescribeLayoutDifference_NamesMeshShapePlacementAndParameter) {
  const v1::JobSpec live = FourRankSpec();
  // Placement spellings compare in canonical form.
  v1::JobSpec same = live;
  same.mutable_params(0)->set_placements(0, "S(0)");
  EXPECT_EQ(DescribeLayoutDifference(same, live), "");

  v1::JobSpec mesh = live;
  mesh.mutable_mesh()->mutable_dims(0)->set_size(2);
  EXPECT_EQ(DescribeLayoutDifference(mesh, live),
            "mesh dp_shard=2 differs from the live job's dp_shard=4");

  v1::JobSpec shape = live;
  shape.mutable_params(1)->set_shape(0, 4);
  EXPECT_EQ(DescribeLayoutDifference(shape, live),
            "parameter \"fc2.weight\": global shape [4, 5] differs from "
            "the live job's [3, 5]");

  v1::JobSpec placement = live;
  placement.mutable_params(2)->set_placements(0, "Shard(1)");
  EXPECT_EQ(DescribeLayoutDifference(placement, live),
            "parameter \"fc3.weight\": placements [Shard(1)] differ from "
            "the live job's [Replicate()]");

  v1::JobSpec renamed = live;
  renamed.mutable_params(0)->set_name("module.fc1.weight");
  EXPECT_EQ(DescribeLayoutDifference(renamed, live),
            "parameter \"module.fc1.weight\" is not in the live job (did "
            "you mean \"fc1.weight\"?)");

  v1::JobSpec fewer = live;
  fewer.mutable_params()->RemoveLast();
  EXPECT_EQ(DescribeLayoutDifference(fewer, live),
            "the live job's parameter \"fc3.weight\" is not in the spec");
}

}  // namespace
}  // namespace muon
