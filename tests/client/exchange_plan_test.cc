// Split sizes and region copies of a bucket's two exchanges
// (client/exchange_plan.h), checked against hand-written tables for FSDP,
// DDP, HSDP and empty shards.
#include "client/exchange_plan.h"

#include <vector>

#include "common/layout.h"
#include "gtest/gtest.h"

namespace muon {
namespace {

Box Rows(int64_t b, int64_t e, int64_t cols) {
  return Box{Range{b, e}, Range{0, cols}};
}

std::vector<Box> Boxes(int64_t rows, int64_t cols, const Mesh& mesh,
                       const std::vector<Placement>& placements) {
  absl::StatusOr<std::vector<Box>> b = AllBoxes(rows, cols, placements, mesh);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? *b : std::vector<Box>{};
}

struct Side {
  Exchange gather, redistribute;
};

// Both exchanges of matrix 0 as `rank` sees them.
Side Compile(int rank, int owner, const std::vector<Box>& boxes,
             const Box& full) {
  const int world = static_cast<int>(boxes.size());
  Side s{Exchange(world), Exchange(world)};
  AddToGather(rank, 0, owner, boxes, full, &s.gather);
  AddToRedistribute(rank, 0, owner, boxes, full, &s.redistribute);
  s.gather.Finish();
  s.redistribute.Finish();
  return s;
}

using Counts = std::vector<int64_t>;
using Copies = std::vector<RegionCopy>;

TEST(ExchangePlanTest,
     FsdpUnevenOver4_OwnerGathersEachShardOnceAndSendsEachBack) {
  const Box full = Rows(0, 10, 7);
  const std::vector<Box> boxes =
      Boxes(10, 7, Mesh::OneDim(4), {Placement::Shard(0)});
  // torch.chunk(10, 4): 3, 3, 3, 1 rows.
  ASSERT_EQ(boxes, (std::vector<Box>{Rows(0, 3, 7), Rows(3, 6, 7),
                                     Rows(6, 9, 7), Rows(9, 10, 7)}));
  const int owner = 1;
  const Side r0 = Compile(0, owner, boxes, full);
  EXPECT_EQ(r0.gather.send_counts, (Counts{0, 21, 0, 0}));
  EXPECT_EQ(r0.gather.recv_counts, (Counts{0, 0, 0, 0}));
  EXPECT_EQ(r0.gather.send[1], (Copies{{0, Rows(0, 3, 7)}}));
  EXPECT_TRUE(r0.gather.self.empty());
  EXPECT_EQ(r0.redistribute.recv_counts, (Counts{0, 21, 0, 0}));
  EXPECT_EQ(r0.redistribute.recv[1], (Copies{{0, Rows(0, 3, 7)}}));
  EXPECT_EQ(r0.redistribute.send_total, 0);

  const Side r1 = Compile(1, owner, boxes, full);
  EXPECT_EQ(r1.gather.send_total, 0);
  EXPECT_EQ(r1.gather.recv_counts, (Counts{21, 0, 21, 7}));
  EXPECT_EQ(r1.gather.recv_total, 49);
  EXPECT_EQ(r1.gather.self, (Copies{{0, Rows(3, 6, 7)}}));
  EXPECT_EQ(r1.redistribute.send_counts, (Counts{21, 0, 21, 7}));
  EXPECT_EQ(r1.redistribute.self, (Copies{{0, Rows(3, 6, 7)}}));
  EXPECT_EQ(r1.redistribute.recv_total, 0);

  const Side r3 = Compile(3, owner, boxes, full);
  EXPECT_EQ(r3.gather.send_counts, (Counts{0, 7, 0, 0}));
  EXPECT_EQ(r3.redistribute.recv_counts, (Counts{0, 7, 0, 0}));
}

TEST(ExchangePlanTest, DdpOver2_NoGatherAndOwnerSendsWholeMatrixToReplica) {
  const Box full = Rows(0, 10, 7);
  const std::vector<Box> boxes =
      Boxes(10, 7, Mesh::OneDim(2, "dp_replicate"), {Placement::Replicate()});
  const Side r0 = Compile(0, 0, boxes, full);
  EXPECT_EQ(r0.gather.send_total + r0.gather.recv_total, 0);
  EXPECT_TRUE(r0.gather.self.empty());
  EXPECT_EQ(r0.redistribute.send_counts, (Counts{0, 70}));
  EXPECT_TRUE(r0.redistribute.self.empty());  // O is written in place
  const Side r1 = Compile(1, 0, boxes, full);
  EXPECT_EQ(r1.gather.send_total + r1.gather.recv_total, 0);
  EXPECT_EQ(r1.redistribute.recv_counts, (Counts{70, 0}));
  EXPECT_EQ(r1.redistribute.recv[0], (Copies{{0, full}}));
}

TEST(ExchangePlanTest, Hsdp2x2_ReplicatedShardTravelsOnceFromLowestHolder) {
  const Box full = Rows(0, 10, 7);
  const Mesh mesh{{"dp_replicate", "dp_shard"}, {2, 2}};
  const std::vector<Box> boxes =
      Boxes(10, 7, mesh, {Placement::Replicate(), Placement::Shard(0)});
  ASSERT_EQ(boxes, (std::vector<Box>{Rows(0, 5, 7), Rows(5, 10, 7),
                                     Rows(0, 5, 7), Rows(5, 10, 7)}));
  const int owner = 2;
  // Rows 0:5 are the owner's own; rows 5:10 come from rank 1, not rank 3.
  EXPECT_EQ(Compile(2, owner, boxes, full).gather.recv_counts,
            (Counts{0, 35, 0, 0}));
  EXPECT_EQ(Compile(2, owner, boxes, full).gather.self,
            (Copies{{0, Rows(0, 5, 7)}}));
  EXPECT_EQ(Compile(1, owner, boxes, full).gather.send_counts,
            (Counts{0, 0, 35, 0}));
  EXPECT_EQ(Compile(3, owner, boxes, full).gather.send_total, 0);
  EXPECT_EQ(Compile(0, owner, boxes, full).gather.send_total, 0);
  // Every replica gets its box of O back.
  EXPECT_EQ(Compile(2, owner, boxes, full).redistribute.send_counts,
            (Counts{35, 35, 0, 35}));
  EXPECT_EQ(Compile(3, owner, boxes, full).redistribute.recv[2],
            (Copies{{0, Rows(5, 10, 7)}}));
}

TEST(ExchangePlanTest, EmptyShards_SendAndReceiveNothing) {
  const Box full = Rows(0, 2, 3);
  const std::vector<Box> boxes =
      Boxes(2, 3, Mesh::OneDim(4), {Placement::Shard(0)});
  ASSERT_TRUE(boxes[2].empty() && boxes[3].empty());
  const Side owner = Compile(0, 0, boxes, full);
  EXPECT_EQ(owner.gather.recv_counts, (Counts{0, 3, 0, 0}));
  EXPECT_EQ(owner.redistribute.send_counts, (Counts{0, 3, 0, 0}));
  for (int r : {2, 3}) {
    const Side s = Compile(r, 0, boxes, full);
    EXPECT_EQ(s.gather.send_total + s.gather.recv_total, 0) << "rank " << r;
    EXPECT_EQ(s.redistribute.send_total + s.redistribute.recv_total, 0)
        << "rank " << r;
  }
}

TEST(ExchangePlanTest, ColumnShards_RegionsAreColumnBoxes) {
  const Box full = Rows(0, 4, 6);
  const std::vector<Box> boxes =
      Boxes(4, 6, Mesh::OneDim(2, "tp"), {Placement::Shard(1)});
  const Side owner = Compile(1, 1, boxes, full);
  EXPECT_EQ(owner.gather.recv[0], (Copies{{0, Box{Range{0, 4}, Range{0, 3}}}}));
  EXPECT_EQ(owner.gather.recv_counts, (Counts{12, 0}));
}

// The bf16 exchange's words: each peer's values two per 4-byte word,
// rounded up per peer (so that every peer's part starts on a word).
TEST(ExchangeTest, Finish_Bf16WordsAreHalfTheCountsRoundedUpPerPeer) {
  Exchange x(4);
  x.send_counts = {0, 1, 6, 7};
  x.recv_counts = {3, 0, 2, 9};
  x.Finish();
  EXPECT_EQ(x.send_total, 14);
  EXPECT_EQ(x.send_words_bf16, (std::vector<int64_t>{0, 1, 3, 4}));
  EXPECT_EQ(x.send_words_bf16_total, 8);
  EXPECT_EQ(x.recv_words_bf16, (std::vector<int64_t>{2, 0, 1, 5}));
  EXPECT_EQ(x.recv_words_bf16_total, 8);
}

}  // namespace
}  // namespace muon
