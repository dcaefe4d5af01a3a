// Tests of common/checked_math.h and of the size limits it documents, as
// Mesh::Validate, CheckParamShape, CheckJobSize and ValidateJobSpec apply
// them (no product of sizes may wrap).
#include "common/checked_math.h"

#include <string>
#include <vector>

#include "common/layout.h"
#include "common/spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

TEST(CheckedMathTest, CheckedMul_Overflow_ReturnsNullopt) {
  EXPECT_EQ(CheckedMul(3, 1431655766), int64_t{4294967298});
  EXPECT_FALSE(CheckedMul(INT64_MAX, 2).has_value());
  EXPECT_FALSE(CheckedMul(int64_t{1} << 32, int64_t{1} << 31).has_value());
  EXPECT_EQ(CheckedMul(-4, 5), -20);
}

TEST(CheckedMathTest, CheckedAdd_Overflow_ReturnsNullopt) {
  EXPECT_EQ(CheckedAdd(1, 2), 3);
  EXPECT_FALSE(CheckedAdd(INT64_MAX, 1).has_value());
}

TEST(CheckedMathTest, CheckedProduct_LimitAndOverflow_ReturnsNullopt) {
  EXPECT_EQ(CheckedProduct(std::vector<int>{}), 1);
  EXPECT_EQ(CheckedProduct(std::vector<int>{2, 3, 4}), 24);
  EXPECT_EQ(CheckedProduct(std::vector<int>{2, 3, 4}, 24), 24);
  EXPECT_FALSE(CheckedProduct(std::vector<int>{2, 3, 4}, 23).has_value());
  EXPECT_FALSE(
      CheckedProduct({int64_t{1} << 40, int64_t{1} << 40}).has_value());
  EXPECT_EQ(CheckedProduct({0, INT64_MAX}), 0);
}

TEST(CheckedMathTest, MeshValidate_ProductOverflowsInt_ReturnsInvalidArgument) {
  // 3 x 1431655766 = 2^32 + 2 wrapped to a 2-rank world before.
  Mesh mesh{{"dp", "tp"}, {3, 1431655766}};
  EXPECT_EQ(mesh.world_size(), -1);
  EXPECT_THAT(
      mesh.Validate(),
      StatusIs(kInvalid, AllOf(HasSubstr("dp=3 x tp=1431655766"),
                               HasSubstr("4294967298"), HasSubstr("262144"))));
}

TEST(CheckedMathTest,
     MeshValidate_ProductOverflowsInt64_ReturnsInvalidArgument) {
  Mesh mesh{{"a", "b", "c"}, {2147483647, 2147483647, 2147483647}};
  EXPECT_THAT(mesh.Validate(),
              StatusIs(kInvalid, AllOf(HasSubstr("a=2147483647"),
                                       HasSubstr("beyond int64"))));
}

TEST(CheckedMathTest, MeshValidate_AtWorldSizeLimit_IsOk) {
  Mesh mesh{{"dp", "tp"}, {1 << 9, 1 << 9}};
  EXPECT_EQ(mesh.world_size(), kMaxWorldSize);
  EXPECT_THAT(mesh.Validate(), IsOk());
  mesh.sizes[1] += 1;
  EXPECT_THAT(mesh.Validate(), StatusIs(kInvalid, HasSubstr("tp=513")));
  // A million ranks: refused by name and value.
  EXPECT_THAT((Mesh{{"dp", "tp"}, {1000, 1000}}).Validate(),
              StatusIs(kInvalid, AllOf(HasSubstr("dp=1000 x tp=1000"),
                                       HasSubstr("1000000"))));
}

TEST(CheckedMathTest, MeshValidate_TooManyDims_ReturnsInvalidArgument) {
  Mesh mesh;
  for (int d = 0; d <= kMaxMeshDims; ++d) {
    mesh.names.push_back(absl::StrCat("d", d));
    mesh.sizes.push_back(1);
  }
  EXPECT_THAT(mesh.Validate(),
              StatusIs(kInvalid, HasSubstr("has 9 dims; at most 8")));
}

v1::JobSpec OneParamSpec(std::vector<int64_t> shape,
                         std::vector<std::string> placements) {
  v1::JobSpec spec;
  v1::MeshDim* dim = spec.mutable_mesh()->add_dims();
  dim->set_name("dp_shard");
  dim->set_size(4);
  v1::ParamSpec* p = spec.add_params();
  p->set_name("w");
  for (int64_t n : shape) p->add_shape(n);
  for (const std::string& t : placements) p->add_placements(t);
  return spec;
}

TEST(CheckedMathTest,
     ValidateJobSpec_HugeMesh_ReturnsInvalidArgumentNamingMesh) {
  v1::JobSpec spec;
  v1::MeshDim* a = spec.mutable_mesh()->add_dims();
  a->set_name("dp");
  a->set_size(3);
  v1::MeshDim* b = spec.mutable_mesh()->add_dims();
  b->set_name("tp");
  b->set_size(1431655766);
  EXPECT_THAT(ValidateJobSpec(spec),
              StatusIs(kInvalid, AllOf(HasSubstr("mesh"),
                                       HasSubstr("dp=3 x tp=1431655766"),
                                       HasSubstr("4294967298"))));
  EXPECT_THAT(ManifestsFromSpec(spec), StatusIs(kInvalid, ::testing::_));
}

TEST(CheckedMathTest,
     ValidateJobSpec_HugeExpertCount_ReturnsInvalidArgumentNamingParam) {
  v1::JobSpec spec = OneParamSpec({int64_t{1} << 40, 2, 2}, {"Shard(1)"});
  EXPECT_THAT(ValidateJobSpec(spec),
              StatusIs(kInvalid, AllOf(HasSubstr("parameter \"w\""),
                                       HasSubstr("1099511627776 experts"),
                                       HasSubstr("65536"))));
  EXPECT_THAT(ManifestsFromSpec(spec), StatusIs(kInvalid, ::testing::_));
}

TEST(CheckedMathTest,
     ValidateJobSpec_ShapeProductOverflows_ReturnsInvalidArgumentNamingParam) {
  v1::JobSpec spec =
      OneParamSpec({int64_t{1} << 32, int64_t{1} << 32}, {"Shard(0)"});
  EXPECT_THAT(ValidateJobSpec(spec),
              StatusIs(kInvalid, AllOf(HasSubstr("parameter \"w\""),
                                       HasSubstr("[4294967296, 4294967296]"),
                                       HasSubstr("1099511627776 elements"))));
  spec = OneParamSpec({100000000, 100000000}, {"Shard(0)"});
  EXPECT_THAT(ValidateJobSpec(spec), StatusIs(kInvalid, ::testing::_));
  spec = OneParamSpec({1 << 20, 1 << 20}, {"Shard(0)"});
  EXPECT_THAT(ValidateJobSpec(spec), IsOk());
}

TEST(CheckedMathTest,
     ValidateJobSpec_TooManyMatrixRankBoxes_ReturnsInvalidArgument) {
  v1::JobSpec spec = OneParamSpec({60000, 4, 4}, {"Shard(1)", "Shard(2)"});
  spec.mutable_mesh()->mutable_dims(0)->set_size(1024);
  v1::MeshDim* tp = spec.mutable_mesh()->add_dims();
  tp->set_name("tp");
  tp->set_size(64);
  EXPECT_THAT(ValidateJobSpec(spec),
              StatusIs(kInvalid,
                       AllOf(HasSubstr("60000 matrices"),
                             HasSubstr("65536 ranks"), HasSubstr("2097152"))));
}

TEST(CheckedMathTest, ParamMatrices_HugeExpertCount_ReturnsInvalidArgument) {
  // Before: std::vector<MatrixBoxes>(2^40) threw bad_alloc (SIGABRT).
  EXPECT_THAT(ParamMatrices({int64_t{1} << 40, 2, 2}, {Placement::Shard(0)},
                            Mesh::OneDim(4)),
              StatusIs(kInvalid, AllOf(HasSubstr("[1099511627776, 2, 2]"),
                                       HasSubstr("65536 experts"))));
  EXPECT_THAT(
      ParamMatrices({60000, 2, 2}, {Placement::Shard(1)}, Mesh::OneDim(1024)),
      StatusIs(kInvalid, HasSubstr("dp_shard=1024")));
  EXPECT_THAT(ParamMatrices({-1, 2}, {Placement::Shard(0)}, Mesh::OneDim(4)),
              StatusIs(kInvalid, HasSubstr("negative")));
  EXPECT_THAT(ParamMatrices({8, 2, 2}, {Placement::Shard(0)}, Mesh::OneDim(4)),
              IsOk());
}

TEST(CheckedMathTest, AllBoxes_OverflowingMesh_ReturnsInvalidArgument) {
  // Before: reserve(wrapped world size) or a wrong, small table.
  EXPECT_THAT(AllBoxes(4, 4, {Placement::Shard(0), Placement::Shard(1)},
                       Mesh{{"dp", "tp"}, {3, 1431655766}}),
              StatusIs(kInvalid, HasSubstr("dp=3 x tp=1431655766")));
}

// A name is copied into every matrix of the plan ("name[e]" per slice of a
// stack): a 1 MiB name on a [65536, 1, 1] stack made 64 GiB. Refused before
// anything copies it, naming its first 64 bytes and its size.
TEST(CheckedMathTest,
     ValidateJobSpec_NameOverLimit_ReturnsInvalidArgumentNamingPrefixAndSize) {
  v1::JobSpec spec = OneParamSpec({65536, 1, 1}, {"Shard(0)"});
  spec.mutable_params(0)->set_name(std::string(size_t{1} << 20, 'n'));
  const std::string prefix = "parameter \"" + std::string(64, 'n') + "...\"";
  EXPECT_THAT(ValidateJobSpec(spec),
              StatusIs(kInvalid, AllOf(HasSubstr(prefix),
                                       HasSubstr("name of 1048576 bytes"),
                                       HasSubstr("at most 4096"))));
  EXPECT_THAT(ManifestsFromSpec(spec), StatusIs(kInvalid, HasSubstr(prefix)));
  spec.mutable_params(0)->set_name(std::string(kMaxTensorNameBytes + 1, 'n'));
  EXPECT_THAT(ValidateJobSpec(spec),
              StatusIs(kInvalid, HasSubstr("name of 4097 bytes")));
  spec.mutable_params(0)->set_name(std::string(kMaxTensorNameBytes, 'n'));
  EXPECT_THAT(ValidateJobSpec(spec), IsOk());
}

TEST(CheckedMathTest, CheckParamNameSize_CutsThePrefixAtACharacterBoundary) {
  // 63 ASCII bytes then 2-byte characters: byte 64 is inside one, so the
  // prefix stops before it instead of splitting it.
  std::string name(63, 'a');
  while (name.size() <= kMaxTensorNameBytes) name += "\xc3\xa9";  // é
  EXPECT_THAT(CheckParamNameSize(name, "rank 3: "),
              StatusIs(kInvalid, HasSubstr("rank 3: parameter \"" +
                                           std::string(63, 'a') + "...\"")));
}

TEST(CheckedMathTest, CheckJobSize_TooManyParams_ReturnsInvalidArgument) {
  EXPECT_THAT(CheckJobSize(Mesh::OneDim(2), kMaxParams + 1, kMaxParams + 1, 0),
              StatusIs(kInvalid, HasSubstr("1048577 parameters")));
  EXPECT_THAT(CheckJobSize(Mesh::OneDim(2), 10, 10, 0), IsOk());
}

TEST(CheckedMathTest,
     CheckJobSize_NameBytesOverLimit_ReturnsInvalidArgumentNamingLimit) {
  EXPECT_THAT(CheckJobSize(Mesh::OneDim(2), 1, 1, kMaxJobNameBytes), IsOk());
  EXPECT_THAT(CheckJobSize(Mesh::OneDim(2), 1, 1, kMaxJobNameBytes + 1),
              StatusIs(kInvalid, AllOf(HasSubstr("matrix names"),
                                       HasSubstr("1073741824 bytes"))));
}

TEST(CheckedMathTest, AddMatrixNameBytes_CountsEachMatrixAndSaturates) {
  int64_t total = 0;
  AddMatrixNameBytes(10, 3, &total);
  EXPECT_EQ(total, 3 * (10 + kMatrixNameSuffixBytes));
  AddMatrixNameBytes(0, 0, &total);
  EXPECT_EQ(total, 3 * (10 + kMatrixNameSuffixBytes));
  // A product past int64 and sums past the limit stay one over the limit.
  AddMatrixNameBytes(kMaxTensorNameBytes, kMaxParamElements, &total);
  EXPECT_EQ(total, kMaxJobNameBytes + 1);
  AddMatrixNameBytes(size_t{1} << 62, int64_t{1} << 40, &total);
  EXPECT_EQ(total, kMaxJobNameBytes + 1);
}

// 2^16 expert slices of 4 KiB names, four times: each name is within its
// own limit but the plan would hold over 1 GiB of "name[e]" strings (the
// shared-box planner of `muonctl plan` allows 2^24 matrices, which would
// be 64 GiB). Refused by the spec's validation, in both planner paths.
TEST(CheckedMathTest,
     ValidateJobSpec_ManyLongSliceNames_ReturnsInvalidArgumentBeforePlanning) {
  v1::JobSpec spec = OneParamSpec({kMaxExperts, 1, 1}, {"Shard(0)"});
  spec.mutable_params(0)->set_name(std::string(kMaxTensorNameBytes, 'a'));
  for (char c : {'b', 'c'}) {
    *spec.add_params() = spec.params(0);
    spec.mutable_params(spec.params_size() - 1)
        ->set_name(std::string(kMaxTensorNameBytes, c));
  }
  // 3 x 2^16 x (4096 + 15) bytes: about 808 MB, allowed.
  EXPECT_THAT(ValidateJobSpec(spec, /*per_rank_boxes=*/false), IsOk());
  *spec.add_params() = spec.params(0);
  spec.mutable_params(3)->set_name(std::string(kMaxTensorNameBytes, 'd'));
  const auto names_limit =
      StatusIs(kInvalid,
               AllOf(HasSubstr("matrix names"), HasSubstr("1073741824 bytes")));
  EXPECT_THAT(ValidateJobSpec(spec, /*per_rank_boxes=*/false), names_limit);
  EXPECT_THAT(ValidateJobSpec(spec, /*per_rank_boxes=*/true), names_limit);
}

}  // namespace
}  // namespace muon
