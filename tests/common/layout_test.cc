// Tests of common/layout.h: torch.chunk shard ranges, DTensor placement
// spellings, the row-major device mesh, and the box / ranges a rank holds
// under a list of placements. Every expected value is written out by hand
// (tables below, each with the arithmetic in a comment), never recomputed
// with the formula under test.
#include "common/layout.h"

#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace muon {

// gtest printers (found by argument-dependent lookup, so in namespace muon).
void PrintTo(const Range& r, std::ostream* os) {
  *os << "[" << r.begin << ", " << r.end << ")";
}
void PrintTo(const Box& b, std::ostream* os) {
  *os << "rows ";
  PrintTo(b.rows, os);
  *os << " x cols ";
  PrintTo(b.cols, os);
}
void PrintTo(const Placement& p, std::ostream* os) { *os << p.ToString(); }

namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr absl::StatusCode kInvalidArgument =
    absl::StatusCode::kInvalidArgument;

Box MakeBox(int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  return Box{Range{r0, r1}, Range{c0, c1}};
}

Mesh MakeMesh(std::vector<std::string> names, std::vector<int> sizes) {
  Mesh m;
  m.names = std::move(names);
  m.sizes = std::move(sizes);
  return m;
}

// ===================== ChunkRange =====================

struct ChunkCase {
  int64_t n;
  int64_t parts;
  std::vector<Range> want;  // one per index
};

// chunk = ceil(n / parts); chunk i = [min(i*chunk, n), min((i+1)*chunk, n)).
// Worked out by hand per row.
const std::vector<ChunkCase>& ChunkCases() {
  static const auto* cases = new std::vector<ChunkCase>{
      // Even: chunk 3.
      {12, 4, {{0, 3}, {3, 6}, {6, 9}, {9, 12}}},
      // Uneven, torch.chunk sizes 3,3,3,1 (chunk 3).
      {10, 4, {{0, 3}, {3, 6}, {6, 9}, {9, 10}}},
      // Trailing empty chunk: 3,3,3,0 (torch.chunk returns 3 chunks, DTensor
      // gives the 4th rank an empty shard).
      {9, 4, {{0, 3}, {3, 6}, {6, 9}, {9, 9}}},
      // 2,2,1,0 (chunk 2).
      {5, 4, {{0, 2}, {2, 4}, {4, 5}, {5, 5}}},
      // Fewer elements than parts: 1,1,0,0 (chunk 1).
      {2, 4, {{0, 1}, {1, 2}, {2, 2}, {2, 2}}},
      // 3,3,1 (chunk 3).
      {7, 3, {{0, 3}, {3, 6}, {6, 7}}},
      // One part holds everything.
      {7, 1, {{0, 7}}},
      // Nothing to split.
      {0, 2, {{0, 0}, {0, 0}}},
  };
  return *cases;
}

TEST(ChunkRangeTest, ChunkRange_TableOfSizes_FollowsTorchChunk) {
  for (const ChunkCase& c : ChunkCases()) {
    SCOPED_TRACE(absl::StrCat("n=", c.n, " parts=", c.parts));
    std::vector<Range> got;
    for (int64_t i = 0; i < c.parts; ++i)
      got.push_back(ChunkRange(c.n, c.parts, i));
    EXPECT_THAT(got, ElementsAreArray(c.want));
  }
}

TEST(ChunkRangeTest, ChunkRange_UnevenTenOverFour_SizesThreeThreeThreeOne) {
  EXPECT_EQ(ChunkRange(10, 4, 0).size(), 3);
  EXPECT_EQ(ChunkRange(10, 4, 1).size(), 3);
  EXPECT_EQ(ChunkRange(10, 4, 2).size(), 3);
  EXPECT_EQ(ChunkRange(10, 4, 3).size(), 1);
}

TEST(ChunkRangeTest, ChunkRange_FiveOverFour_LastChunkEmpty) {
  EXPECT_EQ(ChunkRange(5, 4, 2), (Range{4, 5}));
  EXPECT_EQ(ChunkRange(5, 4, 3).size(), 0);
}

TEST(ChunkRangeTest, ChunkRange_TwoOverFour_TwoEmptyChunksAtTheEnd) {
  EXPECT_EQ(ChunkRange(2, 4, 1), (Range{1, 2}));
  EXPECT_EQ(ChunkRange(2, 4, 2).size(), 0);
  EXPECT_EQ(ChunkRange(2, 4, 3).size(), 0);
}

// n near INT64_MAX: ceil(n / parts) used n + parts - 1 and the last
// chunk's end (i + 1) x chunk, both past INT64_MAX (signed overflow, UB:
// a negative chunk in practice). Exact now, by hand: INT64_MAX = 2^63 - 1
// over 2 is chunk 2^62, [0, 2^62) and [2^62, 2^63 - 1); over 3 chunk
// 3074457345618258603 (= ceil((2^63 - 1) / 3)).
TEST(ChunkRangeTest, ChunkRange_NearInt64Max_ExactWithoutOverflow) {
  constexpr int64_t kMax = INT64_MAX;
  constexpr int64_t kHalf = int64_t{1} << 62;
  EXPECT_EQ(ChunkRange(kMax, 2, 0), (Range{0, kHalf}));
  EXPECT_EQ(ChunkRange(kMax, 2, 1), (Range{kHalf, kMax}));
  constexpr int64_t kThird = 3074457345618258603;
  EXPECT_EQ(ChunkRange(kMax, 3, 0), (Range{0, kThird}));
  EXPECT_EQ(ChunkRange(kMax, 3, 1), (Range{kThird, 2 * kThird}));
  EXPECT_EQ(ChunkRange(kMax, 3, 2), (Range{2 * kThird, kMax}));
  // Many parts: the last chunks are empty, at n.
  EXPECT_EQ(ChunkRange(kMax - 1, kMax, kMax - 1), (Range{kMax - 1, kMax - 1}));
  EXPECT_EQ(ChunkRange(kMax, kMax, kMax - 1), (Range{kMax - 1, kMax}));
  // Through LocalRanges, [INT64_MAX, 1] Shard(0) over 2 ranks.
  const Mesh mesh = Mesh::OneDim(2);
  absl::StatusOr<std::vector<Range>> ranges =
      LocalRanges({kMax, 1}, {Placement::Shard(0)}, mesh, {1});
  ASSERT_THAT(ranges, IsOk());
  EXPECT_THAT(*ranges, ElementsAre(Range{kHalf, kMax}, Range{0, 1}));
}

// ===================== Placement =====================

struct SpellingCase {
  std::string text;
  Placement want;
};

TEST(PlacementTest, Parse_EveryDocumentedSpelling_GivesPlacement) {
  const std::vector<SpellingCase> cases = {
      {"Replicate()", Placement::Replicate()},
      {"Replicate", Placement::Replicate()},
      {"R", Placement::Replicate()},
      {"Partial()", Placement::Partial()},
      {"Partial", Placement::Partial()},
      {"P", Placement::Partial()},
      {"Shard(0)", Placement::Shard(0)},
      {"Shard(1)", Placement::Shard(1)},
      {"Shard(12)", Placement::Shard(12)},
      {"S(0)", Placement::Shard(0)},
      {"S(2)", Placement::Shard(2)},
      // Surrounding whitespace is ignored.
      {"  Shard(1) ", Placement::Shard(1)},
      {"\tReplicate()\n", Placement::Replicate()},
  };
  for (const SpellingCase& c : cases) {
    SCOPED_TRACE(absl::StrCat("\"", c.text, "\""));
    absl::StatusOr<Placement> p = Placement::Parse(c.text);
    ASSERT_THAT(p, IsOk());
    EXPECT_EQ(*p, c.want);
  }
}

TEST(PlacementTest, Parse_MalformedText_ReturnsInvalidArgumentNamingIt) {
  for (const std::string text :
       {"", "Shard", "Shard()", "Shard(-1)", "Shard(x)", "S(1", "Shard(1)x",
        "shard(0)", "replicate()", "Replicated()", "Shard(0, 1)"}) {
    SCOPED_TRACE(absl::StrCat("\"", text, "\""));
    EXPECT_THAT(Placement::Parse(text),
                StatusIs(kInvalidArgument,
                         AllOf(HasSubstr(absl::StrCat("\"", text, "\"")),
                               HasSubstr("Replicate(), Shard(d), "
                                         "_StridedShard(dim=d, sf=k) or "
                                         "Partial()"))));
  }
}

TEST(PlacementTest, ToString_EachKind_GivesDTensorSpelling) {
  EXPECT_EQ(Placement::Replicate().ToString(), "Replicate()");
  EXPECT_EQ(Placement::Partial().ToString(), "Partial()");
  EXPECT_EQ(Placement::Shard(0).ToString(), "Shard(0)");
  EXPECT_EQ(Placement::Shard(1).ToString(), "Shard(1)");
  EXPECT_EQ(Placement::Shard(12).ToString(), "Shard(12)");
}

TEST(PlacementTest, Parse_ShortSpellings_CanonicalToString) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"R", "Replicate()"}, {"Replicate", "Replicate()"},
      {"P", "Partial()"},   {"Partial", "Partial()"},
      {"S(3)", "Shard(3)"},
  };
  for (const auto& [text, canonical] : cases) {
    absl::StatusOr<Placement> p = Placement::Parse(text);
    ASSERT_THAT(p, IsOk()) << text;
    EXPECT_EQ(p->ToString(), canonical) << text;
  }
}

TEST(PlacementTest, Equality_ShardComparesDimOthersIgnoreIt) {
  EXPECT_EQ(Placement::Shard(1), Placement::Shard(1));
  EXPECT_NE(Placement::Shard(0), Placement::Shard(1));
  EXPECT_NE(Placement::Shard(0), Placement::Replicate());
  EXPECT_NE(Placement::Replicate(), Placement::Partial());
  // dim means nothing for Replicate/Partial.
  EXPECT_EQ((Placement{Placement::Kind::kReplicate, 3}),
            Placement::Replicate());
  EXPECT_TRUE(Placement::Shard(0).is_shard());
  EXPECT_FALSE(Placement::Shard(0).is_replicate());
  EXPECT_TRUE(Placement::Replicate().is_replicate());
  EXPECT_FALSE(Placement::Partial().is_shard());
  EXPECT_FALSE(Placement::Partial().is_replicate());
}

// ===================== Mesh =====================

// pp=2 x dp=3 x tp=2: 12 ranks, tp varies fastest.
Mesh ThreeDimMesh() { return MakeMesh({"pp", "dp", "tp"}, {2, 3, 2}); }

TEST(MeshTest, Coord_ThreeDimMesh_RowMajorLastDimFastest) {
  const Mesh mesh = ThreeDimMesh();
  // rank = (pp * 3 + dp) * 2 + tp.
  const std::vector<std::pair<int, std::vector<int>>> table = {
      {0, {0, 0, 0}}, {1, {0, 0, 1}}, {2, {0, 1, 0}},  {3, {0, 1, 1}},
      {4, {0, 2, 0}}, {5, {0, 2, 1}}, {6, {1, 0, 0}},  {7, {1, 0, 1}},
      {8, {1, 1, 0}}, {9, {1, 1, 1}}, {10, {1, 2, 0}}, {11, {1, 2, 1}},
  };
  for (const auto& [rank, coord] : table) {
    EXPECT_EQ(mesh.Coord(rank), coord) << "rank " << rank;
    EXPECT_EQ(mesh.RankOf(coord), rank) << "rank " << rank;
  }
}

TEST(MeshTest, CoordAndRankOf_EveryRank_RoundTrip) {
  for (const Mesh& mesh :
       {ThreeDimMesh(), MakeMesh({"a", "b"}, {3, 4}), Mesh::OneDim(5),
        MakeMesh({"x", "y", "z"}, {1, 4, 1})}) {
    SCOPED_TRACE(mesh.ToString());
    for (int r = 0; r < mesh.world_size(); ++r) {
      EXPECT_EQ(mesh.RankOf(mesh.Coord(r)), r);
    }
  }
}

TEST(MeshTest, Coord_TwoByTwo_RankOneIsSecondColumn) {
  const Mesh mesh = MakeMesh({"dp_shard", "tp"}, {2, 2});
  EXPECT_THAT(mesh.Coord(1), ElementsAre(0, 1));
  EXPECT_THAT(mesh.Coord(2), ElementsAre(1, 0));
}

TEST(MeshTest, OneDim_DefaultName_IsDpShard) {
  const Mesh mesh = Mesh::OneDim(4);
  EXPECT_THAT(mesh.names, ElementsAre("dp_shard"));
  EXPECT_THAT(mesh.sizes, ElementsAre(4));
  EXPECT_EQ(mesh.ndim(), 1);
  EXPECT_EQ(mesh.world_size(), 4);
  EXPECT_THAT(Mesh::OneDim(3, "ep").names, ElementsAre("ep"));
}

TEST(MeshTest, WorldSize_ThreeDimAndEmpty_ProductOrOne) {
  EXPECT_EQ(ThreeDimMesh().world_size(), 12);
  EXPECT_EQ(Mesh{}.world_size(), 1);
  EXPECT_EQ(Mesh{}.ndim(), 0);
}

TEST(MeshTest, DimIndex_KnownAndUnknownName_IndexOrMinusOne) {
  const Mesh mesh = ThreeDimMesh();
  EXPECT_EQ(mesh.DimIndex("pp"), 0);
  EXPECT_EQ(mesh.DimIndex("tp"), 2);
  EXPECT_EQ(mesh.DimIndex("ep"), -1);
}

TEST(MeshTest, ToString_OneTwoAndZeroDims_NamesAndSizes) {
  EXPECT_EQ(Mesh::OneDim(4).ToString(), "dp_shard=4");
  EXPECT_EQ(ThreeDimMesh().ToString(), "pp=2 x dp=3 x tp=2");
  EXPECT_EQ(Mesh{}.ToString(), "(single device)");
}

TEST(MeshTest, Validate_GoodMeshes_ReturnsOk) {
  EXPECT_THAT(ThreeDimMesh().Validate(), IsOk());
  EXPECT_THAT(Mesh::OneDim(1).Validate(), IsOk());
  EXPECT_THAT(Mesh{}.Validate(), IsOk());
}

TEST(MeshTest, Validate_NamesAndSizesCountsDiffer_ReturnsInvalidArgument) {
  EXPECT_THAT(MakeMesh({"a", "b"}, {2}).Validate(),
              StatusIs(kInvalidArgument, HasSubstr("2 names but 1 sizes")));
}

TEST(MeshTest, Validate_EmptyName_ReturnsInvalidArgumentNamingDim) {
  EXPECT_THAT(
      MakeMesh({"a", ""}, {2, 2}).Validate(),
      StatusIs(kInvalidArgument, HasSubstr("mesh dim 1 has an empty name")));
}

TEST(MeshTest, Validate_RepeatedName_ReturnsInvalidArgumentNamingIt) {
  EXPECT_THAT(MakeMesh({"tp", "dp", "tp"}, {2, 2, 2}).Validate(),
              StatusIs(kInvalidArgument, HasSubstr("\"tp\" appears twice")));
}

TEST(MeshTest, Validate_SizeBelowOne_ReturnsInvalidArgumentNamingDimAndSize) {
  EXPECT_THAT(MakeMesh({"dp", "tp"}, {2, 0}).Validate(),
              StatusIs(kInvalidArgument,
                       AllOf(HasSubstr("\"tp\""), HasSubstr("size 0"))));
  EXPECT_THAT(MakeMesh({"dp"}, {-3}).Validate(),
              StatusIs(kInvalidArgument,
                       AllOf(HasSubstr("\"dp\""), HasSubstr("size -3"))));
}

TEST(MeshTest, Equality_SameNamesAndSizes_Equal) {
  EXPECT_EQ(Mesh::OneDim(4), MakeMesh({"dp_shard"}, {4}));
  EXPECT_NE(Mesh::OneDim(4), Mesh::OneDim(2));
  EXPECT_NE(Mesh::OneDim(4), Mesh::OneDim(4, "tp"));
}

// ===================== LocalBox / AllBoxes =====================

TEST(LocalBoxTest, AllBoxes_Shard0TenBySevenOverFour_RowChunks3331) {
  absl::StatusOr<std::vector<Box>> boxes =
      AllBoxes(10, 7, {Placement::Shard(0)}, Mesh::OneDim(4));
  ASSERT_THAT(boxes, IsOk());
  EXPECT_THAT(*boxes, ElementsAre(MakeBox(0, 3, 0, 7), MakeBox(3, 6, 0, 7),
                                  MakeBox(6, 9, 0, 7), MakeBox(9, 10, 0, 7)));
}

TEST(LocalBoxTest, AllBoxes_Shard1TenBySevenOverFour_ColChunks2221) {
  absl::StatusOr<std::vector<Box>> boxes =
      AllBoxes(10, 7, {Placement::Shard(1)}, Mesh::OneDim(4));
  ASSERT_THAT(boxes, IsOk());
  EXPECT_THAT(*boxes, ElementsAre(MakeBox(0, 10, 0, 2), MakeBox(0, 10, 2, 4),
                                  MakeBox(0, 10, 4, 6), MakeBox(0, 10, 6, 7)));
}

TEST(LocalBoxTest, LocalBox_Shard0ThreeRowsOverFour_LastRankEmpty) {
  absl::StatusOr<Box> box =
      LocalBox(3, 5, {Placement::Shard(0)}, Mesh::OneDim(4), {3});
  ASSERT_THAT(box, IsOk());
  EXPECT_EQ(box->rows.size(), 0);
  EXPECT_EQ(box->cols, (Range{0, 5}));
  EXPECT_TRUE(box->empty());
  EXPECT_EQ(box->numel(), 0);
}

TEST(LocalBoxTest, AllBoxes_Replicate_EveryRankHoldsWholeMatrix) {
  absl::StatusOr<std::vector<Box>> boxes =
      AllBoxes(10, 7, {Placement::Replicate()}, Mesh::OneDim(3));
  ASSERT_THAT(boxes, IsOk());
  EXPECT_THAT(*boxes, ElementsAre(MakeBox(0, 10, 0, 7), MakeBox(0, 10, 0, 7),
                                  MakeBox(0, 10, 0, 7)));
  EXPECT_EQ((*boxes)[0].numel(), 70);
}

// dp_shard=2 x tp=2, both Shard(0) of 10 rows: dp_shard splits 10 into 5,5
// ([0,5), [5,10)); tp then splits each 5 into 3,2 inside it.
TEST(LocalBoxTest, AllBoxes_TwoMeshDimsShardRows_NestLeftToRight) {
  const Mesh mesh = MakeMesh({"dp_shard", "tp"}, {2, 2});
  absl::StatusOr<std::vector<Box>> boxes =
      AllBoxes(10, 7, {Placement::Shard(0), Placement::Shard(0)}, mesh);
  ASSERT_THAT(boxes, IsOk());
  EXPECT_THAT(*boxes, ElementsAre(MakeBox(0, 3, 0, 7), MakeBox(3, 5, 0, 7),
                                  MakeBox(5, 8, 0, 7), MakeBox(8, 10, 0, 7)));
}

// 3 rows nested twice: dp_shard gives 2,1 ([0,2), [2,3)); tp splits 2 into
// 1,1 and 1 into 1,0.
TEST(LocalBoxTest, AllBoxes_NestedShardsOfThreeRows_LastRankEmpty) {
  const Mesh mesh = MakeMesh({"dp_shard", "tp"}, {2, 2});
  absl::StatusOr<std::vector<Box>> boxes =
      AllBoxes(3, 5, {Placement::Shard(0), Placement::Shard(0)}, mesh);
  ASSERT_THAT(boxes, IsOk());
  EXPECT_EQ((*boxes)[0], MakeBox(0, 1, 0, 5));
  EXPECT_EQ((*boxes)[1], MakeBox(1, 2, 0, 5));
  EXPECT_EQ((*boxes)[2], MakeBox(2, 3, 0, 5));
  EXPECT_EQ((*boxes)[3].rows.size(), 0);
  EXPECT_TRUE((*boxes)[3].empty());
}

// [Shard(0), Shard(1)] on dp_shard=2 x tp=2: rows 5,5 by dp_shard, cols
// 4,3 by tp (chunk ceil(7/2) = 4).
TEST(LocalBoxTest, AllBoxes_ShardRowsThenCols_TwoByTwoTiles) {
  const Mesh mesh = MakeMesh({"dp_shard", "tp"}, {2, 2});
  absl::StatusOr<std::vector<Box>> boxes =
      AllBoxes(10, 7, {Placement::Shard(0), Placement::Shard(1)}, mesh);
  ASSERT_THAT(boxes, IsOk());
  EXPECT_THAT(*boxes, ElementsAre(MakeBox(0, 5, 0, 4), MakeBox(0, 5, 4, 7),
                                  MakeBox(5, 10, 0, 4), MakeBox(5, 10, 4, 7)));
}

// HSDP [Replicate(), Shard(1)]: the two dp_replicate rows hold the same
// column shards.
TEST(LocalBoxTest, AllBoxes_ReplicateThenShard1_ReplicasHoldSameColumns) {
  const Mesh mesh = MakeMesh({"dp_replicate", "dp_shard"}, {2, 2});
  absl::StatusOr<std::vector<Box>> boxes =
      AllBoxes(10, 7, {Placement::Replicate(), Placement::Shard(1)}, mesh);
  ASSERT_THAT(boxes, IsOk());
  EXPECT_THAT(*boxes, ElementsAre(MakeBox(0, 10, 0, 4), MakeBox(0, 10, 4, 7),
                                  MakeBox(0, 10, 0, 4), MakeBox(0, 10, 4, 7)));
}

TEST(LocalBoxTest, LocalBox_Partial_ReturnsInvalidArgumentNamingMeshDim) {
  const Mesh mesh = MakeMesh({"dp_shard", "tp"}, {2, 2});
  EXPECT_THAT(LocalBox(10, 7, {Placement::Shard(0), Placement::Partial()}, mesh,
                       {0, 1}),
              StatusIs(kInvalidArgument,
                       AllOf(HasSubstr("Partial()"), HasSubstr("\"tp\""))));
  EXPECT_THAT(AllBoxes(10, 7, {Placement::Partial()}, Mesh::OneDim(2)),
              StatusIs(kInvalidArgument, HasSubstr("Partial()")));
}

TEST(LocalBoxTest, LocalBox_PlacementsCountNotMeshDims_ReturnsInvalidArgument) {
  const Mesh mesh = MakeMesh({"dp_shard", "tp"}, {2, 2});
  EXPECT_THAT(
      LocalBox(10, 7, {Placement::Shard(0)}, mesh, {0, 0}),
      StatusIs(kInvalidArgument,
               AllOf(HasSubstr("got 1 placements"), HasSubstr("2-D mesh"),
                     HasSubstr("dp_shard=2 x tp=2"))));
  EXPECT_THAT(AllBoxes(10, 7, {Placement::Shard(0), Placement::Shard(1)},
                       Mesh::OneDim(4)),
              StatusIs(kInvalidArgument, HasSubstr("got 2 placements")));
}

TEST(LocalBoxTest, LocalBox_ShardDimTwoOfMatrix_ReturnsInvalidArgument) {
  EXPECT_THAT(LocalBox(10, 7, {Placement::Shard(2)}, Mesh::OneDim(2), {0}),
              StatusIs(kInvalidArgument,
                       AllOf(HasSubstr("Shard(2)"), HasSubstr("2-D tensor"))));
}

// ===================== LocalRanges =====================

// [8, 6, 4] expert stack, Shard(0) over ep=4: 2 experts per rank.
TEST(LocalRangesTest, LocalRanges_StackShard0OverFour_TwoExpertsEach) {
  const Mesh mesh = Mesh::OneDim(4, "ep");
  const std::vector<std::vector<Range>> want = {
      {{0, 2}, {0, 6}, {0, 4}},
      {{2, 4}, {0, 6}, {0, 4}},
      {{4, 6}, {0, 6}, {0, 4}},
      {{6, 8}, {0, 6}, {0, 4}},
  };
  for (int r = 0; r < 4; ++r) {
    absl::StatusOr<std::vector<Range>> got =
        LocalRanges({8, 6, 4}, {Placement::Shard(0)}, mesh, {r});
    ASSERT_THAT(got, IsOk());
    EXPECT_THAT(*got, ElementsAreArray(want[r])) << "rank " << r;
  }
}

TEST(LocalRangesTest, LocalRanges_OneDimTensorShard0_TorchChunk) {
  const std::vector<Range> want = {{0, 3}, {3, 6}, {6, 9}, {9, 10}};
  for (int r = 0; r < 4; ++r) {
    absl::StatusOr<std::vector<Range>> got =
        LocalRanges({10}, {Placement::Shard(0)}, Mesh::OneDim(4), {r});
    ASSERT_THAT(got, IsOk());
    EXPECT_THAT(*got, ElementsAre(want[r])) << "rank " << r;
  }
}

// FSDP2 over tensor parallelism on dp=2 x tp=2: ColwiseParallel shards
// the 130 rows over tp (65, 65), FSDP2 then chunks each TP-local shard over
// dp (33, 32), which DTensor spells [_StridedShard(dim=0, sf=2),
// Shard(0)]: rank (d, t) holds chunk d of chunk t.
TEST(LocalRangesTest, LocalRanges_StridedShardOverTp_ChunksTheTpShard) {
  const Mesh mesh = MakeMesh({"dp", "tp"}, {2, 2});
  const std::vector<Placement> placements = {Placement::StridedShard(0, 2),
                                             Placement::Shard(0)};
  const std::vector<Range> want = {{0, 33}, {65, 98}, {33, 65}, {98, 130}};
  for (int r = 0; r < 4; ++r) {
    absl::StatusOr<std::vector<Range>> got =
        LocalRanges({130, 48}, placements, mesh, mesh.Coord(r));
    ASSERT_THAT(got, IsOk());
    EXPECT_THAT(*got, ElementsAre(want[r], Range{0, 48})) << "rank " << r;
  }
  // Plain (Shard(0), Shard(0)) chunks over dp first: another layout.
  absl::StatusOr<std::vector<Range>> plain = LocalRanges(
      {130, 48}, {Placement::Shard(0), Placement::Shard(0)}, mesh, {0, 1});
  ASSERT_THAT(plain, IsOk());
  EXPECT_EQ((*plain)[0], (Range{33, 65}));
}

TEST(LocalRangesTest,
     LocalRanges_StridedShardWrongSplitFactor_InvalidArgument) {
  const Mesh mesh = MakeMesh({"dp", "tp"}, {2, 2});
  EXPECT_THAT(LocalRanges({130, 48},
                          {Placement::StridedShard(0, 4), Placement::Shard(0)},
                          mesh, {0, 0}),
              StatusIs(kInvalidArgument,
                       AllOf(HasSubstr("_StridedShard(dim=0, sf=4)"),
                             HasSubstr("\"dp\""), HasSubstr("(2 here)"))));
}

TEST(PlacementTest, StridedShard_ParseAndToStringRoundTrip) {
  for (const char* text : {"_StridedShard(dim=0, sf=2)", "_StridedShard(0, 2)",
                           "_StridedShard(dim=1, split_factor=4)"}) {
    absl::StatusOr<Placement> p = Placement::Parse(text);
    ASSERT_THAT(p, IsOk()) << text;
    EXPECT_TRUE(p->is_strided());
    absl::StatusOr<Placement> again = Placement::Parse(p->ToString());
    ASSERT_THAT(again, IsOk());
    EXPECT_EQ(*again, *p);
  }
  EXPECT_NE(Placement::StridedShard(0, 2), Placement::Shard(0));
  EXPECT_THAT(Placement::Parse("_StridedShard(dim=0)"),
              StatusIs(kInvalidArgument, HasSubstr("_StridedShard")));
}

// pp=2 x dp_shard=2, [Replicate(), Shard(0)] on [10, 7], living on pp
// stage 1 only: ranks 0 and 1 (stage 0) hold nothing; ranks 2 and 3 split
// the rows 5,5.
TEST(LocalRangesTest, LocalRanges_OutsideSubMesh_AllRangesEmpty) {
  const Mesh mesh = MakeMesh({"pp", "dp_shard"}, {2, 2});
  const SubMesh stage1{{0}, {1}};
  const std::vector<std::vector<Range>> want = {
      {{0, 0}, {0, 0}},
      {{0, 0}, {0, 0}},
      {{0, 5}, {0, 7}},
      {{5, 10}, {0, 7}},
  };
  for (int r = 0; r < 4; ++r) {
    absl::StatusOr<std::vector<Range>> got =
        LocalRanges({10, 7}, {Placement::Replicate(), Placement::Shard(0)},
                    mesh, mesh.Coord(r), stage1);
    ASSERT_THAT(got, IsOk());
    EXPECT_THAT(*got, ElementsAreArray(want[r])) << "rank " << r;
  }
}

TEST(LocalRangesTest,
     LocalRanges_ShardDimPastTensorRank_ReturnsInvalidArgument) {
  EXPECT_THAT(
      LocalRanges({8, 6, 4}, {Placement::Shard(3)}, Mesh::OneDim(2, "ep"), {0}),
      StatusIs(kInvalidArgument,
               AllOf(HasSubstr("Shard(3)"), HasSubstr("\"ep\""),
                     HasSubstr("3-D tensor"))));
}

TEST(LocalRangesTest, LocalRanges_PartialOrWrongCount_ReturnsInvalidArgument) {
  EXPECT_THAT(
      LocalRanges({8, 6, 4}, {Placement::Partial()}, Mesh::OneDim(2), {0}),
      StatusIs(kInvalidArgument, HasSubstr("Partial()")));
  EXPECT_THAT(LocalRanges({8, 6, 4}, {}, Mesh::OneDim(2), {0}),
              StatusIs(kInvalidArgument, HasSubstr("got 0 placements")));
}

TEST(SubMeshTest, Contains_EmptyAndRestricted_MatchesCoordinateOnDims) {
  EXPECT_TRUE(SubMesh{}.Contains({1, 0}));
  EXPECT_TRUE(SubMesh{}.empty());
  const SubMesh pp1{{0}, {1}};
  EXPECT_FALSE(pp1.empty());
  EXPECT_TRUE(pp1.Contains({1, 0}));
  EXPECT_TRUE(pp1.Contains({1, 1}));
  EXPECT_FALSE(pp1.Contains({0, 1}));
  const SubMesh two{{0, 2}, {1, 0}};
  EXPECT_TRUE(two.Contains({1, 1, 0}));
  EXPECT_FALSE(two.Contains({1, 1, 1}));
}

// ===================== ParamMatrices =====================

TEST(ParamMatricesTest, ParamMatrices_TwoDimShard0_OneMatrixWithRankBoxes) {
  absl::StatusOr<std::vector<MatrixBoxes>> m =
      ParamMatrices({10, 7}, {Placement::Shard(0)}, Mesh::OneDim(4));
  ASSERT_THAT(m, IsOk());
  ASSERT_EQ(m->size(), 1u);
  EXPECT_EQ((*m)[0].slice, 0);
  EXPECT_EQ((*m)[0].rows, 10);
  EXPECT_EQ((*m)[0].cols, 7);
  EXPECT_THAT((*m)[0].boxes,
              ElementsAre(MakeBox(0, 3, 0, 7), MakeBox(3, 6, 0, 7),
                          MakeBox(6, 9, 0, 7), MakeBox(9, 10, 0, 7)));
}

// Row blocks {4, 2, 4} of a [10, 7] Shard(0) over 4 (rows 0-3, 3-6, 6-9,
// 9-10): each block is a matrix, each rank's box the part of its rows in
// the block, in the block's coordinates (block 0: ranks 0 and 1 share it;
// block 1 lives on rank 1 only; block 2 on ranks 2 and 3).
TEST(ParamMatricesTest, ParamMatrices_RowSplitsShard0_BlockBoxesInBlockRows) {
  absl::StatusOr<std::vector<MatrixBoxes>> m = ParamMatrices(
      {10, 7}, {Placement::Shard(0)}, Mesh::OneDim(4), {}, {4, 2, 4});
  ASSERT_THAT(m, IsOk());
  ASSERT_EQ(m->size(), 3u);
  EXPECT_EQ((*m)[1].slice, 1);
  EXPECT_EQ((*m)[1].rows, 2);
  EXPECT_EQ((*m)[1].cols, 7);
  EXPECT_THAT((*m)[0].boxes, ElementsAre(MakeBox(0, 3, 0, 7),
                                         MakeBox(3, 4, 0, 7), Box{}, Box{}));
  EXPECT_THAT((*m)[1].boxes,
              ElementsAre(Box{}, MakeBox(0, 2, 0, 7), Box{}, Box{}));
  EXPECT_THAT((*m)[2].boxes, ElementsAre(Box{}, Box{}, MakeBox(0, 3, 0, 7),
                                         MakeBox(3, 4, 0, 7)));
  // Shard(1): every rank holds every row of every block, its columns.
  m = ParamMatrices({10, 7}, {Placement::Shard(1)}, Mesh::OneDim(4), {},
                    {5, 5});
  ASSERT_THAT(m, IsOk());
  EXPECT_THAT((*m)[1].boxes,
              ElementsAre(MakeBox(0, 5, 0, 2), MakeBox(0, 5, 2, 4),
                          MakeBox(0, 5, 4, 6), MakeBox(0, 5, 6, 7)));
}

TEST(ParamMatricesTest, ParamMatrices_BadRowSplits_InvalidArgumentNamingThem) {
  EXPECT_THAT(ParamMatrices({10, 7}, {Placement::Shard(0)}, Mesh::OneDim(4), {},
                            {4, 4}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("row splits [4, 4] sum to 8 rows but the "
                                 "parameter has 10")));
  EXPECT_THAT(ParamMatrices({10, 7}, {Placement::Shard(0)}, Mesh::OneDim(4), {},
                            {10, 0}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("hold a block of 0 rows")));
  EXPECT_THAT(ParamMatrices({2, 10, 7}, {Placement::Shard(0)}, Mesh::OneDim(2),
                            {}, {5, 5}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("need a 2-D parameter")));
}

// [4, 6, 4] stack, Shard(0) over ep=2: experts 0, 1 live whole on rank 0,
// experts 2, 3 whole on rank 1; the other rank's box is empty.
TEST(ParamMatricesTest, ParamMatrices_StackShard0_EachSliceWholeOnItsEpRank) {
  absl::StatusOr<std::vector<MatrixBoxes>> m =
      ParamMatrices({4, 6, 4}, {Placement::Shard(0)}, Mesh::OneDim(2, "ep"));
  ASSERT_THAT(m, IsOk());
  ASSERT_EQ(m->size(), 4u);
  for (int e = 0; e < 4; ++e) {
    SCOPED_TRACE(absl::StrCat("expert ", e));
    const MatrixBoxes& s = (*m)[e];
    EXPECT_EQ(s.slice, e);
    EXPECT_EQ(s.rows, 6);
    EXPECT_EQ(s.cols, 4);
    ASSERT_EQ(s.boxes.size(), 2u);
    const int owner = e < 2 ? 0 : 1;
    EXPECT_EQ(s.boxes[owner], MakeBox(0, 6, 0, 4));
    EXPECT_TRUE(s.boxes[1 - owner].empty());
  }
}

// ep=2 x tp=2, [Shard(0), Shard(2)] on [4, 6, 4]: ep gives experts [0,2)
// to ranks 0, 1 and [2,4) to ranks 2, 3; tp splits the 4 cols 2,2.
TEST(ParamMatricesTest, ParamMatrices_StackEpAndTpCols_SliceSplitOnItsEpRow) {
  const Mesh mesh = MakeMesh({"ep", "tp"}, {2, 2});
  absl::StatusOr<std::vector<MatrixBoxes>> m = ParamMatrices(
      {4, 6, 4}, {Placement::Shard(0), Placement::Shard(2)}, mesh);
  ASSERT_THAT(m, IsOk());
  ASSERT_EQ(m->size(), 4u);
  // Expert 0 (and 1): ranks 0, 1.
  for (int e : {0, 1}) {
    SCOPED_TRACE(absl::StrCat("expert ", e));
    EXPECT_EQ((*m)[e].boxes[0], MakeBox(0, 6, 0, 2));
    EXPECT_EQ((*m)[e].boxes[1], MakeBox(0, 6, 2, 4));
    EXPECT_TRUE((*m)[e].boxes[2].empty());
    EXPECT_TRUE((*m)[e].boxes[3].empty());
  }
  // Expert 3 (and 2): ranks 2, 3.
  for (int e : {2, 3}) {
    SCOPED_TRACE(absl::StrCat("expert ", e));
    EXPECT_TRUE((*m)[e].boxes[0].empty());
    EXPECT_TRUE((*m)[e].boxes[1].empty());
    EXPECT_EQ((*m)[e].boxes[2], MakeBox(0, 6, 0, 2));
    EXPECT_EQ((*m)[e].boxes[3], MakeBox(0, 6, 2, 4));
  }
}

// Shard(1) of a stack splits each slice's rows (6 over 2: 3,3); every rank
// holds part of every expert.
TEST(ParamMatricesTest, ParamMatrices_StackShard1_EverySliceSplitByRows) {
  absl::StatusOr<std::vector<MatrixBoxes>> m =
      ParamMatrices({3, 6, 4}, {Placement::Shard(1)}, Mesh::OneDim(2));
  ASSERT_THAT(m, IsOk());
  ASSERT_EQ(m->size(), 3u);
  for (const MatrixBoxes& s : *m) {
    SCOPED_TRACE(absl::StrCat("expert ", s.slice));
    EXPECT_THAT(s.boxes, ElementsAre(MakeBox(0, 3, 0, 4), MakeBox(3, 6, 0, 4)));
  }
}

TEST(ParamMatricesTest, ParamMatrices_TwoDimOnSubMesh_EmptyOutsideIt) {
  const Mesh mesh = Mesh::OneDim(2, "pp");
  absl::StatusOr<std::vector<MatrixBoxes>> m =
      ParamMatrices({10, 7}, {Placement::Replicate()}, mesh, SubMesh{{0}, {1}});
  ASSERT_THAT(m, IsOk());
  ASSERT_EQ(m->size(), 1u);
  EXPECT_TRUE((*m)[0].boxes[0].empty());
  EXPECT_EQ((*m)[0].boxes[1], MakeBox(0, 10, 0, 7));
}

TEST(ParamMatricesTest, ParamMatrices_OneOrFourDims_ReturnsInvalidArgument) {
  EXPECT_THAT(ParamMatrices({10}, {Placement::Replicate()}, Mesh::OneDim(2)),
              StatusIs(kInvalidArgument, HasSubstr("1-D tensor")));
  EXPECT_THAT(
      ParamMatrices({2, 3, 4, 5}, {Placement::Replicate()}, Mesh::OneDim(2)),
      StatusIs(kInvalidArgument, HasSubstr("4-D tensor")));
}

TEST(ParamMatricesTest, ParamMatrices_Partial_ReturnsInvalidArgument) {
  EXPECT_THAT(ParamMatrices({4, 6, 4}, {Placement::Partial()}, Mesh::OneDim(2)),
              StatusIs(kInvalidArgument, HasSubstr("Partial()")));
}

// ===================== CopyRegion =====================

// A 4x5 matrix with element (i, j) = 10*i + j, so every copied value names
// the global element it came from.
const std::vector<float> kFull = {
    0,  1,  2,  3,  4,   //
    10, 11, 12, 13, 14,  //
    20, 21, 22, 23, 24,  //
    30, 31, 32, 33, 34,  //
};
const Box kFullBox = MakeBox(0, 4, 0, 5);

struct CopyCase {
  std::string name;
  std::vector<float> src;
  Box src_holds;
  Box dst_holds;
  Box region;
  std::vector<float> want_dst;  // dst starts all -1
};

const std::vector<CopyCase>& CopyCases() {
  static const auto* cases = new std::vector<CopyCase>{
      {"full to shard rows [1,3) cols [2,5)",
       kFull,
       kFullBox,
       MakeBox(1, 3, 2, 5),
       MakeBox(1, 3, 2, 5),
       {12, 13, 14,  //
        22, 23, 24}},
      {"shard rows [1,3) cols [2,5) to full",
       {12, 13, 14,  //
        22, 23, 24},
       MakeBox(1, 3, 2, 5),
       kFullBox,
       MakeBox(1, 3, 2, 5),
       {-1, -1, -1, -1, -1,  //
        -1, -1, 12, 13, 14,  //
        -1, -1, 22, 23, 24,  //
        -1, -1, -1, -1, -1}},
      // src holds rows [0,3) x cols [1,5); dst holds rows [1,4) x cols [0,3);
      // they overlap in rows [1,3) x cols [1,3).
      {"sub-box to sub-box, overlap only",
       {1, 2, 3, 4,      //
        11, 12, 13, 14,  //
        21, 22, 23, 24},
       MakeBox(0, 3, 1, 5),
       MakeBox(1, 4, 0, 3),
       MakeBox(1, 3, 1, 3),
       {-1, 11, 12,  //
        -1, 21, 22,  //
        -1, -1, -1}},
      // A single element (row 2, col 4) inside a shard of rows [2,4).
      {"one element into a row shard",
       kFull,
       kFullBox,
       MakeBox(2, 4, 0, 5),
       MakeBox(2, 3, 4, 5),
       {-1, -1, -1, -1, 24,  //
        -1, -1, -1, -1, -1}},
      {"empty rows: nothing copied",
       kFull,
       kFullBox,
       MakeBox(1, 3, 2, 5),
       MakeBox(2, 2, 2, 5),
       {-1, -1, -1,  //
        -1, -1, -1}},
      {"empty cols: nothing copied",
       kFull,
       kFullBox,
       MakeBox(1, 3, 2, 5),
       MakeBox(1, 3, 3, 3),
       {-1, -1, -1,  //
        -1, -1, -1}},
  };
  return *cases;
}

TEST(CopyRegionTest, CopyRegion_TableOfBoxes_CopiesExactlyTheRegion) {
  for (const CopyCase& c : CopyCases()) {
    SCOPED_TRACE(c.name);
    ASSERT_EQ(static_cast<int64_t>(c.src.size()), c.src_holds.numel());
    ASSERT_EQ(static_cast<int64_t>(c.want_dst.size()), c.dst_holds.numel());
    std::vector<float> dst(c.dst_holds.numel(), -1.0f);
    CopyRegion(c.src.data(), c.src_holds, dst.data(), c.dst_holds, c.region);
    EXPECT_THAT(dst, ElementsAreArray(c.want_dst));
  }
}

}  // namespace
}  // namespace muon
