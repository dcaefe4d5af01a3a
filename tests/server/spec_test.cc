// Tests of common/spec.h: job spec JSON, validation, rank manifests.
#include "common/spec.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/test_specs.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::muon::testing::ExpertSpec;
using ::muon::testing::MakeSpec;
using ::muon::testing::PipelineSpec;
using ::muon::testing::TestParam;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kGoodSpec[] = R"json({
  "job_id": "mlp",
  "mesh": {"dims": [{"name": "dp_shard", "size": 4}]},
  "params": [
    {"name": "fc1.weight", "shape": [10, 7], "placements": ["Shard(0)"]},
    {"name": "fc2.weight", "shape": [3, 5], "placements": ["Shard(0)"]},
    {"name": "fc3.weight", "shape": [6, 8], "placements": ["Replicate()"]}
  ],
  "optimizer": {"lr": 0.02, "ns_steps": 5},
  "execution": {"assignment_policy": "lpt", "bucket_size_bytes": "1024"}
})json";

v1::JobSpec GoodSpec() {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(kGoodSpec);
  EXPECT_THAT(spec, IsOk());
  return spec.ok() ? *spec : v1::JobSpec();
}

std::vector<int64_t> LocalShape(const v1::RankManifest& m, int param) {
  return {m.params(param).local_shape().begin(),
          m.params(param).local_shape().end()};
}

TEST(SpecTest, ParseJobSpecJson_GoodSpec_ReadsEveryField) {
  v1::JobSpec spec = GoodSpec();
  EXPECT_EQ(spec.job_id(), "mlp");
  ASSERT_EQ(spec.mesh().dims_size(), 1);
  EXPECT_EQ(spec.mesh().dims(0).size(), 4);
  ASSERT_EQ(spec.params_size(), 3);
  EXPECT_EQ(spec.params(0).name(), "fc1.weight");
  EXPECT_THAT(spec.params(0).shape(), ElementsAre(10, 7));
  EXPECT_DOUBLE_EQ(spec.optimizer().lr(), 0.02);
  EXPECT_FALSE(spec.optimizer().has_momentum());
  EXPECT_EQ(spec.execution().bucket_size_bytes(), 1024);
  EXPECT_THAT(ValidateJobSpec(spec), IsOk());
}

TEST(SpecTest, ParseJobSpecJson_CamelCaseNames_Accepted) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(
      R"({"jobId": "x", "execution": {"assignmentPolicy": "round_robin"}})");
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->job_id(), "x");
  EXPECT_EQ(spec->execution().assignment_policy(), "round_robin");
}

TEST(SpecTest, ParseJobSpecJson_UnknownField_ReturnsInvalidArgument) {
  EXPECT_THAT(
      ParseJobSpecJson(R"({"job_id": "x", "paramz": []})"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("paramz")));
}

TEST(SpecTest, ParseJobSpecJson_NestedTypo_NamesFieldAndClosestName) {
  EXPECT_THAT(
      ParseJobSpecJson(
          R"({"job_id": "x", "params": [{"name": "w", "placement": []}]})"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               ::testing::AllOf(HasSubstr("unknown field \"placement\""),
                                HasSubstr("did you mean \"placements\"?"))));
}

TEST(SpecTest, ParseJobSpecJson_NotJson_ReturnsInvalidArgument) {
  EXPECT_THAT(ParseJobSpecJson("{not json"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("muon.v1.JobSpec")));
}

TEST(SpecTest, LoadJobSpec_MissingFile_ReturnsNotFoundNamingPath) {
  EXPECT_THAT(LoadJobSpec("/nonexistent/spec.json"),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("/nonexistent/spec.json")));
}

TEST(SpecTest, LoadJobSpec_BadFile_ReturnsInvalidArgumentNamingPath) {
  const std::string path =
      std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR")
                                             : "/tmp") +
      "/bad_spec.json";
  {
    std::ofstream out(path);
    out << R"({"mesh": {"dims": [{"name": "tp", "size": "two"}]}})";
  }
  EXPECT_THAT(LoadJobSpec(path),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(path)));
  std::remove(path.c_str());
}

TEST(SpecTest, LoadJobSpec_GoodFile_RoundTripsThroughJson) {
  const std::string path =
      std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR")
                                             : "/tmp") +
      "/good_spec.json";
  const v1::JobSpec spec = GoodSpec();
  {
    std::ofstream out(path);
    out << JobSpecToJson(spec);
  }
  absl::StatusOr<v1::JobSpec> loaded = LoadJobSpec(path);
  ASSERT_THAT(loaded, IsOk());
  EXPECT_EQ(loaded->SerializeAsString(), spec.SerializeAsString());
  EXPECT_THAT(JobSpecToJson(spec), HasSubstr("\"job_id\""));
  std::remove(path.c_str());
}

TEST(SpecTest, JobSpecToJson_WritesShapesAndBytesAsNumbersAndRoundTrips) {
  v1::JobSpec spec = GoodSpec();
  spec.mutable_params(0)->clear_shape();
  spec.mutable_params(0)->add_shape(48);
  spec.mutable_params(0)->add_shape(int64_t{1} << 40);
  spec.mutable_execution()->set_bucket_size_bytes(int64_t{1} << 54);
  const std::string json = JobSpecToJson(spec);
  // Numbers where a JSON number is exact, like a hand-written spec; a
  // value above 2^53 - 1 keeps protobuf's string form.
  EXPECT_THAT(json, HasSubstr("48,"));
  EXPECT_THAT(json, HasSubstr("1099511627776"));
  EXPECT_THAT(json, Not(HasSubstr("\"48\"")));
  EXPECT_THAT(json, HasSubstr("\"18014398509481984\""));
  absl::StatusOr<v1::JobSpec> parsed = ParseJobSpecJson(json);
  ASSERT_THAT(parsed, IsOk());
  EXPECT_EQ(parsed->SerializeAsString(), spec.SerializeAsString());
}

TEST(SpecTest, ValidateJobSpec_FourDimParam_ReturnsInvalidArgumentNamingIt) {
  v1::JobSpec spec = GoodSpec();
  spec.mutable_params(1)->add_shape(2);
  spec.mutable_params(1)->add_shape(4);
  EXPECT_THAT(ValidateJobSpec(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("\"fc2.weight\""),
                                        HasSubstr("[3, 5, 2, 4]"),
                                        HasSubstr("3-D expert stacks"))));
}

TEST(SpecTest, ValidateJobSpec_ThreeDimExpertStack_Accepted) {
  v1::JobSpec spec = ExpertSpec();
  EXPECT_THAT(ValidateJobSpec(spec), IsOk());
  // Shard(2) is a valid tensor dim of a stack.
  spec.mutable_params(2)->set_placements(0, "Shard(2)");
  EXPECT_THAT(ValidateJobSpec(spec), IsOk());
}

TEST(SpecTest, ValidateJobSpec_StackShardDimThree_ReturnsInvalidArgument) {
  v1::JobSpec spec = ExpertSpec();
  spec.mutable_params(1)->set_placements(1, "Shard(3)");
  EXPECT_THAT(ValidateJobSpec(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(
                           HasSubstr("\"experts.w1\""), HasSubstr("Shard(3)"),
                           HasSubstr("mesh dim \"ep\""), HasSubstr("3-D"))));
}

TEST(SpecTest, ValidateJobSpec_PpStageOutOfRange_NamesParamStageAndMesh) {
  v1::JobSpec spec = MakeSpec(
      {{"pp", 4}, {"tp", 2}},
      {{"layers.7.mlp.w1", 16, 8, {"Replicate()", "Shard(0)"}, {{"pp", 4}}}});
  EXPECT_THAT(ValidateJobSpec(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("parameter \"layers.7.mlp.w1\": pp stage 4 "
                                 "is out of range: mesh dim \"pp\" has 4 "
                                 "stages (0..3)")));
  EXPECT_THAT(ManifestsFromSpec(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("pp stage 4 is out of range")));
}

TEST(SpecTest, ValidateJobSpec_NegativeEpCoordinate_ReturnsInvalidArgument) {
  v1::JobSpec spec = MakeSpec(
      {{"dp_shard", 2}, {"ep", 4}},
      {{"experts.3.w1", 16, 8, {"Shard(0)", "Replicate()"}, {{"ep", -1}}}});
  EXPECT_THAT(ValidateJobSpec(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("parameter \"experts.3.w1\": ep coordinate "
                                 "-1 is out of range: mesh dim \"ep\" has 4 "
                                 "coordinates (0..3)")));
}

TEST(SpecTest, ValidateJobSpec_SubMeshUnknownDim_ReturnsInvalidArgument) {
  v1::JobSpec spec = GoodSpec();
  (*spec.mutable_params(0)->mutable_sub_mesh())["pp"] = 0;
  EXPECT_THAT(
      ValidateJobSpec(spec),
      StatusIs(absl::StatusCode::kInvalidArgument,
               ::testing::AllOf(
                   HasSubstr("\"fc1.weight\""), HasSubstr("mesh dim \"pp\""),
                   HasSubstr("dp_shard=4"), HasSubstr("no such dim"))));
}

TEST(SpecTest, ValidateJobSpec_ShardedOnSubMeshDim_ReturnsInvalidArgument) {
  v1::JobSpec spec =
      MakeSpec({{"pp", 2}, {"tp", 2}},
               {{"layers.1.wq", 8, 8, {"Shard(0)", "Shard(0)"}, {{"pp", 1}}}});
  EXPECT_THAT(
      ValidateJobSpec(spec),
      StatusIs(absl::StatusCode::kInvalidArgument,
               ::testing::AllOf(HasSubstr("\"layers.1.wq\""),
                                HasSubstr("Shard(0) on mesh dim \"pp\""),
                                HasSubstr("must be Replicate()"),
                                HasSubstr("{pp=1}"))));
}

TEST(SpecTest, ManifestsFromSpec_Pipeline_RanksListOnlyTheirStage) {
  absl::StatusOr<std::vector<v1::RankManifest>> manifests =
      ManifestsFromSpec(PipelineSpec());
  ASSERT_THAT(manifests, IsOk());
  ASSERT_EQ(manifests->size(), 8u);
  for (int r = 0; r < 8; ++r) {
    const v1::RankManifest& m = (*manifests)[r];
    const int stage = r / 4;
    ASSERT_EQ(m.params_size(), 4) << "rank " << r;
    std::vector<std::string> names;
    for (const v1::ParamManifest& p : m.params()) {
      names.push_back(p.name());
      ASSERT_EQ(p.sub_mesh().size(), 1u);
      EXPECT_EQ(p.sub_mesh().at("pp"), stage);
    }
    const std::string l0 = std::to_string(2 * stage);
    const std::string l1 = std::to_string(2 * stage + 1);
    EXPECT_THAT(
        names,
        ElementsAre("layers." + l0 + ".attn.wq", "layers." + l0 + ".attn.wo",
                    "layers." + l1 + ".attn.wq", "layers." + l1 + ".attn.wo"));
    // wq [8, 8] Shard(0) over tp=4; wo [8, 6] Shard(1) over tp=4 (chunk 2).
    EXPECT_THAT(LocalShape(m, 0), ElementsAre(2, 8));
    EXPECT_THAT(LocalShape(m, 1), ElementsAre(8, r % 4 == 3 ? 0 : 2));
  }
}

TEST(SpecTest, ManifestsFromSpec_ExpertStack_LocalExpertRanges) {
  absl::StatusOr<std::vector<v1::RankManifest>> manifests =
      ManifestsFromSpec(ExpertSpec());
  ASSERT_THAT(manifests, IsOk());
  ASSERT_EQ(manifests->size(), 8u);
  for (int r = 0; r < 8; ++r) {
    const v1::RankManifest& m = (*manifests)[r];
    ASSERT_EQ(m.params_size(), 3);
    EXPECT_THAT(m.params(1).global_shape(), ElementsAre(8, 6, 4));
    EXPECT_THAT(LocalShape(m, 0), ElementsAre(4, 8));     // attn
    EXPECT_THAT(LocalShape(m, 1), ElementsAre(2, 6, 4));  // 2 whole experts
    EXPECT_THAT(LocalShape(m, 2), ElementsAre(2, 2, 6));  // rows over dp
    EXPECT_EQ(m.params(1).placements(1), "Shard(0)");
  }
  // Uneven: 6 experts over ep=4 (chunk 2): ep rank 3 holds none.
  v1::JobSpec spec = ExpertSpec();
  spec.mutable_params(1)->set_shape(0, 6);
  manifests = ManifestsFromSpec(spec);
  ASSERT_THAT(manifests, IsOk());
  EXPECT_THAT(LocalShape((*manifests)[2], 1), ElementsAre(2, 6, 4));
  EXPECT_THAT(LocalShape((*manifests)[7], 1), ElementsAre(0, 6, 4));
}

TEST(SpecTest, ManifestsFromSpec_PerExpertTwoDim_ListedOnItsEpRanksOnly) {
  std::vector<TestParam> params = {{"attn", 8, 8, {"Shard(0)", "Replicate()"}}};
  for (int e = 0; e < 4; ++e) {
    params.push_back({"experts." + std::to_string(e) + ".w1",
                      6,
                      4,
                      {"Shard(0)", "Replicate()"},
                      {{"ep", e}}});
  }
  absl::StatusOr<std::vector<v1::RankManifest>> manifests =
      ManifestsFromSpec(MakeSpec({{"dp_shard", 2}, {"ep", 4}}, params));
  ASSERT_THAT(manifests, IsOk());
  for (int r = 0; r < 8; ++r) {
    const v1::RankManifest& m = (*manifests)[r];
    ASSERT_EQ(m.params_size(), 2) << "rank " << r;
    EXPECT_EQ(m.params(0).name(), "attn");
    EXPECT_EQ(m.params(1).name(), "experts." + std::to_string(r % 4) + ".w1");
    EXPECT_THAT(LocalShape(m, 1), ElementsAre(3, 4));
  }
}

TEST(SpecTest, ValidateJobSpec_OneDimParam_ReturnsInvalidArgument) {
  v1::JobSpec spec = GoodSpec();
  v1::ParamSpec* bias = spec.add_params();
  bias->set_name("fc1.bias");
  bias->add_shape(10);
  bias->add_placements("Replicate()");
  EXPECT_THAT(
      ValidateJobSpec(spec),
      StatusIs(absl::StatusCode::kInvalidArgument,
               ::testing::AllOf(HasSubstr("\"fc1.bias\""), HasSubstr("[10]"))));
}

TEST(SpecTest, ValidateJobSpec_Partial_ReturnsInvalidArgument) {
  v1::JobSpec spec = GoodSpec();
  spec.mutable_params(0)->set_placements(0, "Partial()");
  EXPECT_THAT(ValidateJobSpec(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("\"fc1.weight\""),
                                        HasSubstr("Partial()"),
                                        HasSubstr("not supported"))));
}

TEST(SpecTest, ValidateJobSpec_ShardDimTwo_ReturnsInvalidArgument) {
  v1::JobSpec spec = GoodSpec();
  spec.mutable_params(2)->set_placements(0, "Shard(2)");
  EXPECT_THAT(ValidateJobSpec(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("\"fc3.weight\""),
                                        HasSubstr("Shard(2)"))));
}

TEST(SpecTest, ValidateJobSpec_BadPlacementText_ReturnsInvalidArgument) {
  v1::JobSpec spec = GoodSpec();
  spec.mutable_params(0)->set_placements(0, "Shrd(0)");
  EXPECT_THAT(ValidateJobSpec(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("\"fc1.weight\""),
                                        HasSubstr("Shrd(0)"))));
}

// "Shard(O)" (a letter O): one message, saying what is accepted (not
// Partial(), which parameters cannot have).
TEST(SpecTest, ValidateJobSpec_ShardLetterO_SaysWhatIsAccepted) {
  v1::JobSpec spec = GoodSpec();
  spec.mutable_params(0)->set_placements(0, "Shard(O)");
  absl::Status s = ValidateJobSpec(spec);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          ::testing::AllOf(
                              HasSubstr("placement \"Shard(O)\" is not one"),
                              HasSubstr("tensor dim d (0, 1, ...)"))));
  EXPECT_EQ(s.message().find("Partial"), std::string::npos) << s;
}

TEST(SpecTest, ValidateJobSpec_WrongPlacementCount_ReturnsInvalidArgument) {
  v1::JobSpec spec = GoodSpec();
  spec.mutable_params(0)->add_placements("Replicate()");
  EXPECT_THAT(ValidateJobSpec(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("\"fc1.weight\""),
                                        HasSubstr("2 placements"))));
}

TEST(SpecTest, ValidateJobSpec_DuplicateName_ReturnsInvalidArgument) {
  v1::JobSpec spec = GoodSpec();
  spec.mutable_params(1)->set_name("fc1.weight");
  EXPECT_THAT(ValidateJobSpec(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("\"fc1.weight\" is listed more than once")));
}

TEST(SpecTest, ValidateJobSpec_EmptyName_ReturnsInvalidArgument) {
  v1::JobSpec spec = GoodSpec();
  spec.mutable_params(1)->clear_name();
  EXPECT_THAT(ValidateJobSpec(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("index 1 has an empty name")));
}

TEST(SpecTest, ValidateJobSpec_ZeroMeshSize_ReturnsInvalidArgument) {
  v1::JobSpec spec = GoodSpec();
  spec.mutable_mesh()->mutable_dims(0)->set_size(0);
  EXPECT_THAT(ValidateJobSpec(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("\"dp_shard\" has size 0")));
}

TEST(SpecTest, ValidateJobSpec_DuplicateMeshName_ReturnsInvalidArgument) {
  v1::JobSpec spec = GoodSpec();
  v1::MeshDim* dim = spec.mutable_mesh()->add_dims();
  dim->set_name("dp_shard");
  dim->set_size(1);
  EXPECT_THAT(
      ValidateJobSpec(spec),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dp_shard")));
}

TEST(SpecTest, ValidateJobSpec_ZeroDim_ReturnsInvalidArgument) {
  v1::JobSpec spec = GoodSpec();
  spec.mutable_params(0)->set_shape(1, 0);
  EXPECT_THAT(ValidateJobSpec(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("\"fc1.weight\""),
                                        HasSubstr("[10, 0]"))));
}

TEST(SpecTest, ManifestsFromSpec_UnevenShards_FollowTorchChunk) {
  absl::StatusOr<std::vector<v1::RankManifest>> manifests =
      ManifestsFromSpec(GoodSpec());
  ASSERT_THAT(manifests, IsOk());
  ASSERT_EQ(manifests->size(), 4u);
  // 10 x 7 over 4 ranks, Shard(0): chunk = ceil(10/4) = 3.
  EXPECT_THAT(LocalShape((*manifests)[0], 0), ElementsAre(3, 7));
  EXPECT_THAT(LocalShape((*manifests)[1], 0), ElementsAre(3, 7));
  EXPECT_THAT(LocalShape((*manifests)[2], 0), ElementsAre(3, 7));
  EXPECT_THAT(LocalShape((*manifests)[3], 0), ElementsAre(1, 7));
  // 3 x 5 over 4 ranks, Shard(0): the last rank holds nothing.
  EXPECT_THAT(LocalShape((*manifests)[0], 1), ElementsAre(1, 5));
  EXPECT_THAT(LocalShape((*manifests)[1], 1), ElementsAre(1, 5));
  EXPECT_THAT(LocalShape((*manifests)[2], 1), ElementsAre(1, 5));
  EXPECT_THAT(LocalShape((*manifests)[3], 1), ElementsAre(0, 5));
  // Replicated: every rank holds everything.
  EXPECT_THAT(LocalShape((*manifests)[3], 2), ElementsAre(6, 8));
  for (int r = 0; r < 4; ++r) {
    const v1::RankManifest& m = (*manifests)[r];
    EXPECT_EQ(m.rank(), r);
    EXPECT_EQ(m.world_size(), 4);
    EXPECT_EQ(m.params(0).dtype(), "float32");
    EXPECT_THAT(m.params(0).global_shape(), ElementsAre(10, 7));
    EXPECT_EQ(m.execution().assignment_policy(), "lpt");
  }
}

TEST(SpecTest, ManifestsFromSpec_TwoDimMesh_NestsShards) {
  v1::JobSpec spec;
  v1::MeshDim* tp = spec.mutable_mesh()->add_dims();
  tp->set_name("dp_shard");
  tp->set_size(2);
  v1::MeshDim* dp = spec.mutable_mesh()->add_dims();
  dp->set_name("tp");
  dp->set_size(2);
  v1::ParamSpec* w = spec.add_params();
  w->set_name("w");
  w->add_shape(8);
  w->add_shape(6);
  w->add_placements("Shard(0)");
  w->add_placements("Shard(1)");
  absl::StatusOr<std::vector<v1::RankManifest>> manifests =
      ManifestsFromSpec(spec);
  ASSERT_THAT(manifests, IsOk());
  ASSERT_EQ(manifests->size(), 4u);
  for (int r = 0; r < 4; ++r) {
    EXPECT_THAT(LocalShape((*manifests)[r], 0), ElementsAre(4, 3));
  }
}

TEST(SpecTest, ManifestsFromSpec_InvalidSpec_ReturnsInvalidArgument) {
  v1::JobSpec spec = GoodSpec();
  spec.mutable_params(0)->set_placements(0, "Partial()");
  EXPECT_THAT(
      ManifestsFromSpec(spec),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("fc1.weight")));
}

}  // namespace
}  // namespace muon
