// The step's bucket layout (client/bucket_layout.h) and per-stream
// operations (client/stream_ops.h), compiled from hand-written plans:
// slot offsets in the documented order, Newton-Schulz batches, buffer
// sizes, and the refusals of plans and schedules that do not fit the rank.
#include "client/bucket_layout.h"

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/stream_ops.h"
#include "common/layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/schedule.h"

namespace muon {
namespace {

using ::testing::HasSubstr;

Box Rows(int64_t b, int64_t e, int64_t cols) {
  return Box{Range{b, e}, Range{0, cols}};
}

MatrixGeometry Matrix(const std::string& name, int index, int64_t rows,
                      int64_t cols, std::vector<Box> boxes) {
  MatrixGeometry g;
  g.param = name;
  g.param_index = index;
  g.rows = rows;
  g.cols = cols;
  g.boxes = std::move(boxes);
  return g;
}

// World of 2: A and B 4x3 split by rows (2 + 2), C 2x5 split by rows
// (1 + 1), D 3x3 replicated.
std::vector<MatrixGeometry> FourMatrices() {
  return {Matrix("A", 0, 4, 3, {Rows(0, 2, 3), Rows(2, 4, 3)}),
          Matrix("B", 1, 4, 3, {Rows(0, 2, 3), Rows(2, 4, 3)}),
          Matrix("C", 2, 2, 5, {Rows(0, 1, 5), Rows(1, 2, 5)}),
          Matrix("D", 3, 3, 3, {Rows(0, 3, 3), Rows(0, 3, 3)})};
}

void AddMatrix(v1::Plan* plan, const std::string& param, int64_t rows,
               int64_t cols, int owner) {
  v1::MatrixPlan* mp = plan->add_matrices();
  mp->set_param(param);
  mp->set_rows(rows);
  mp->set_cols(cols);
  mp->set_owner(owner);
}

void AddBucket(v1::Plan* plan, const std::vector<int>& matrices) {
  v1::Bucket* b = plan->add_buckets();
  b->set_index(plan->buckets_size() - 1);
  for (int m : matrices) b->add_matrices(m);
}

// Plan matrices 0..3 = A, B, C, D (owners 0, 0, 1, 0), one bucket in the
// order A, C, D, B.
v1::Plan OneBucketPlan() {
  v1::Plan plan;
  plan.set_world_size(2);
  AddMatrix(&plan, "A", 4, 3, 0);
  AddMatrix(&plan, "B", 4, 3, 0);
  AddMatrix(&plan, "C", 2, 5, 1);
  AddMatrix(&plan, "D", 3, 3, 0);
  AddBucket(&plan, {0, 2, 3, 1});
  return plan;
}

// `rank`'s layout of `plan` over FourMatrices().
absl::StatusOr<BucketLayout> LayoutOf(
    int rank, const BucketLayoutOptions& options = BucketLayoutOptions(),
    const v1::Plan& plan = OneBucketPlan()) {
  return BucketLayout::Compile(rank, 2, plan, FourMatrices(), options);
}

// One offset of every local matrix, in the order A, B, C, D.
using Offsets = std::vector<int64_t>;
Offsets OffsetsOf(const BucketLayout& layout,
                  int64_t (BucketLayout::*offset)(int) const) {
  Offsets out;
  for (int m = 0; m < 4; ++m) out.push_back((layout.*offset)(m));
  return out;
}

// Every offset of the slot of OneBucketPlan's bucket, for each set of
// options the executor can ask for (ResolveOptions refuses the bf16
// exchange and a custom gather with row state), in the order the header
// documents: this rank's boxes (U when formed, then O) in plan order
// A, C, D, B; a whole owned matrix's U (custom gather or bf16 exchange);
// the group of A and B (U, U, O, O); then their row state.
TEST(BucketLayoutTest, SlotOffsets_EachOptionSet_InDocumentedOrder) {
  struct Case {
    std::string name;
    int rank;
    BucketLayoutOptions options;
    Offsets local_u, local_o, full_u, full_o, row_state;
    int64_t slot_elems;
  };
  BucketLayoutOptions formed_rows, formed_bf16, custom;
  formed_rows.form_update = formed_rows.row_state = true;
  formed_bf16.form_update = formed_bf16.bf16_exchange = true;
  custom.custom_gather = true;
  const Offsets none = {-1, -1, -1, -1};
  const std::vector<Case> cases = {
      // Boxes of O: A 6, C 5, D 9, B 6 (local U is local O when not
      // formed). D is held whole, so no full U or O; C is rank 1's.
      {"owner",
       0,
       BucketLayoutOptions(),
       {0, 20, 6, 11},
       {0, 20, 6, 11},
       {26, 38, -1, -1},
       {50, 62, -1, -1},
       none,
       74},
      // Boxes of U then O: A 0/6, C 12/17, D 22/31, B 40/46; the group's
      // row state, 4 rows each (rank 0 holds 2); D's own rows serve.
      {"owner, formed U and row state",
       0,
       formed_rows,
       {0, 40, 12, 22},
       {6, 46, 17, 31},
       {52, 64, -1, -1},
       {76, 88, -1, -1},
       {100, 104, -1, -1},
       108},
      // The owner rounds D's full U in the slot, though D is whole.
      {"owner, formed U and bf16 exchange",
       0,
       formed_bf16,
       {0, 40, 12, 22},
       {6, 46, 17, 31},
       {61, 73, -1, 52},
       {85, 97, -1, -1},
       none,
       109},
      // A custom gather writes D's full U into the slot too.
      {"owner, custom gather",
       0,
       custom,
       {0, 20, 6, 11},
       {0, 20, 6, 11},
       {35, 47, -1, 26},
       {59, 71, -1, -1},
       none,
       83},
      // Rank 1 holds A's and B's rows 2-3, C's row 1 and D; it owns C.
      {"non-owner of the group",
       1,
       BucketLayoutOptions(),
       {0, 20, 6, 11},
       {0, 20, 6, 11},
       {-1, -1, 26, -1},
       {-1, -1, 36, -1},
       none,
       46},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<BucketLayout> layout = LayoutOf(c.rank, c.options);
    ASSERT_TRUE(layout.ok()) << layout.status();
    EXPECT_EQ(OffsetsOf(*layout, &BucketLayout::local_u_offset), c.local_u);
    EXPECT_EQ(OffsetsOf(*layout, &BucketLayout::local_o_offset), c.local_o);
    EXPECT_EQ(OffsetsOf(*layout, &BucketLayout::full_u_offset), c.full_u);
    EXPECT_EQ(OffsetsOf(*layout, &BucketLayout::full_o_offset), c.full_o);
    EXPECT_EQ(OffsetsOf(*layout, &BucketLayout::row_state_offset), c.row_state);
    EXPECT_EQ(layout->slot_elems(), c.slot_elems);
  }
}

TEST(BucketLayoutTest, Owner_GroupsSameShapeIntoOneBatchAndSizesExchanges) {
  absl::StatusOr<BucketLayout> layout = LayoutOf(0);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->buckets().size(), 1u);
  const LocalBucket& b = layout->buckets()[0];
  EXPECT_EQ(b.matrices, (std::vector<int>{0, 2, 3, 1}));
  EXPECT_EQ(b.owners, (std::vector<int>{0, 1, 0, 0}));
  EXPECT_EQ(b.owned, (std::vector<int>{0, 3, 1}));
  ASSERT_EQ(b.ns_batches.size(), 2u);
  EXPECT_EQ(b.ns_batches[0].first, 3);
  EXPECT_EQ(b.ns_batches[0].count, 1);
  EXPECT_FALSE(b.ns_batches[0].in_slot);
  EXPECT_EQ(b.ns_batches[1].first, 0);
  EXPECT_EQ(b.ns_batches[1].count, 2);
  EXPECT_TRUE(b.ns_batches[1].in_slot);
  EXPECT_EQ(b.ns_batches[1].members, (std::vector<int>{0, 1}));
  const BufferSizes& sizes = layout->sizes();
  EXPECT_EQ(sizes.owned_shapes, (std::map<std::pair<int64_t, int64_t>, int64_t>{
                                    {{3, 3}, 1}, {{4, 3}, 2}}));
  // Gather: rank 0 sends C's row 0 (5) and receives A's and B's rows 2-3
  // (12); redistribute: it sends those back and D to its replica (21) and
  // receives C's row 0 (5).
  EXPECT_EQ(sizes.max_send, 21);
  EXPECT_EQ(sizes.max_recv, 12);
  for (int m = 0; m < 4; ++m) EXPECT_EQ(layout->bucket_of(m), 0);
  // Rank 1 owns C alone.
  absl::StatusOr<BucketLayout> rank1 = LayoutOf(1);
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  EXPECT_EQ(rank1->buckets()[0].owned, (std::vector<int>{2}));
}

// Without batching (CUDA's fp32 mode) the same owned matrices take one
// Newton-Schulz call each, as on one device, at the same slot offsets;
// the scratch is sized for one matrix per shape.
TEST(BucketLayoutTest, BatchSameShapeOff_OneCallPerMatrixSameOffsets) {
  BucketLayoutOptions options;
  options.batch_same_shape = false;
  absl::StatusOr<BucketLayout> one = LayoutOf(0, options);
  absl::StatusOr<BucketLayout> batched = LayoutOf(0);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(batched.ok()) << batched.status();
  const LocalBucket& b = one->buckets()[0];
  ASSERT_EQ(b.ns_batches.size(), 3u);
  EXPECT_EQ(b.ns_batches[0].first, 3);
  EXPECT_FALSE(b.ns_batches[0].in_slot);
  for (int i : {1, 2}) {
    EXPECT_EQ(b.ns_batches[i].count, 1);
    EXPECT_TRUE(b.ns_batches[i].in_slot);
    EXPECT_EQ(b.ns_batches[i].members,
              (std::vector<int>{b.ns_batches[i].first}));
  }
  EXPECT_EQ(b.ns_batches[1].first, 0);
  EXPECT_EQ(b.ns_batches[2].first, 1);
  EXPECT_EQ(one->sizes().owned_shapes,
            (std::map<std::pair<int64_t, int64_t>, int64_t>{{{3, 3}, 1},
                                                            {{4, 3}, 1}}));
  for (int m = 0; m < 4; ++m) {
    EXPECT_EQ(one->full_u_offset(m), batched->full_u_offset(m)) << m;
    EXPECT_EQ(one->full_o_offset(m), batched->full_o_offset(m)) << m;
  }
  EXPECT_EQ(one->slot_elems(), batched->slot_elems());
}

TEST(BucketLayoutTest, Bf16Exchange_SizesInWords) {
  BucketLayoutOptions options;
  options.form_update = true;
  options.bf16_exchange = true;
  absl::StatusOr<BucketLayout> layout = LayoutOf(0, options);
  ASSERT_TRUE(layout.ok()) << layout.status();
  // Two values per word, each peer's part from a word: the redistribute
  // sends rank 1 21 values (11 words), the gather receives 12 (6 words).
  EXPECT_EQ(layout->sizes().max_send, 11);
  EXPECT_EQ(layout->sizes().max_recv, 6);
}

TEST(BucketLayoutTest, RowState_OwnerHoldingAllRowsUsesItsOwn) {
  // E 4x6 split by columns: rank 0 holds every row, not the whole matrix.
  const std::vector<MatrixGeometry> geometry = {
      Matrix("E", 0, 4, 6,
             {Box{Range{0, 4}, Range{0, 3}}, Box{Range{0, 4}, Range{3, 6}}})};
  v1::Plan plan;
  plan.set_world_size(2);
  AddMatrix(&plan, "E", 4, 6, 0);
  AddBucket(&plan, {0});
  BucketLayoutOptions options;
  options.row_state = true;
  absl::StatusOr<BucketLayout> layout =
      BucketLayout::Compile(0, 2, plan, geometry, options);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->full_u_offset(0), 12);
  EXPECT_EQ(layout->full_o_offset(0), 36);
  EXPECT_EQ(layout->row_state_offset(0), -1);
  EXPECT_EQ(layout->slot_elems(), 60);
}

TEST(BucketLayoutTest, MatrixOfAnotherStage_SkippedWithZeroSizes) {
  v1::Plan plan = OneBucketPlan();
  AddMatrix(&plan, "other_stage", 8, 8, 1);
  AddBucket(&plan, {4});
  absl::StatusOr<BucketLayout> layout =
      LayoutOf(0, BucketLayoutOptions(), plan);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->buckets().size(), 2u);
  const LocalBucket& b = layout->buckets()[1];
  EXPECT_EQ(b.index, 1);
  EXPECT_TRUE(b.matrices.empty());
  EXPECT_EQ(b.gather.send_total, 0);
  EXPECT_EQ(b.redistribute.recv_total, 0);
}

TEST(BucketLayoutTest, PlanNotFittingTheRank_RefusedNamingBucketOrMatrix) {
  struct Case {
    std::string name;
    std::function<void(v1::Plan*, std::vector<MatrixGeometry>*)> change;
    std::string error;
  };
  const std::vector<Case> cases = {
      {"B in no bucket",
       [](v1::Plan* plan, std::vector<MatrixGeometry>*) {
         plan->mutable_buckets(0)->mutable_matrices()->RemoveLast();
       },
       "covers matrix \"B\" slice 0 0 times"},
      {"B in two buckets",
       [](v1::Plan* plan, std::vector<MatrixGeometry>*) {
         AddBucket(plan, {1});
       },
       "covers matrix \"B\" slice 0 2 times"},
      {"an index other than its position",
       [](v1::Plan* plan, std::vector<MatrixGeometry>*) {
         plan->mutable_buckets(0)->set_index(1);
       },
       "plan bucket 0 has index 1 (rank 0)"},
      {"a matrix outside the plan",
       [](v1::Plan* plan, std::vector<MatrixGeometry>*) {
         plan->mutable_buckets(0)->add_matrices(7);
       },
       "plan bucket 0 names matrix 7 of 4"},
      {"another shape",
       [](v1::Plan* plan, std::vector<MatrixGeometry>*) {
         plan->mutable_matrices(2)->set_rows(3);
       },
       "is [3, 5] but rank 0 has it as [2, 5]"},
      {"owner out of range",
       [](v1::Plan* plan, std::vector<MatrixGeometry>*) {
         plan->mutable_matrices(1)->set_owner(2);
       },
       "owner 2 out of range for world size 2"},
      {"owner without a shard",
       [](v1::Plan* plan, std::vector<MatrixGeometry>* geometry) {
         (*geometry)[0].boxes = {Rows(0, 4, 3), Box{Range{0, 0}, Range{0, 0}}};
         plan->mutable_matrices(0)->set_owner(1);
       },
       "owner rank 1 holds no shard of it"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    v1::Plan plan = OneBucketPlan();
    std::vector<MatrixGeometry> geometry = FourMatrices();
    c.change(&plan, &geometry);
    absl::StatusOr<BucketLayout> layout =
        BucketLayout::Compile(0, 2, plan, geometry, BucketLayoutOptions());
    EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(layout.status().message()), HasSubstr(c.error));
  }
}

// Three buckets: A (owner 0), C (owner 1), then B and D (owner 0).
v1::Plan ThreeBucketPlan(bool async, int prefetch_count) {
  v1::Plan plan;
  plan.set_world_size(2);
  AddMatrix(&plan, "A", 4, 3, 0);
  AddMatrix(&plan, "B", 4, 3, 0);
  AddMatrix(&plan, "C", 2, 5, 1);
  AddMatrix(&plan, "D", 3, 3, 0);
  AddBucket(&plan, {0});
  AddBucket(&plan, {2});
  AddBucket(&plan, {1, 3});
  *plan.mutable_schedule() = MakeScheduleHeader(plan, async, prefetch_count);
  return plan;
}

std::vector<v1::OpKind> Kinds(const std::vector<StreamOp>& ops) {
  std::vector<v1::OpKind> kinds;
  for (const StreamOp& op : ops) kinds.push_back(op.kind);
  return kinds;
}

// `rank`'s StreamOps of `plan` over FourMatrices().
absl::StatusOr<StreamOps> OpsOf(int rank, const v1::Plan& plan) {
  absl::StatusOr<BucketLayout> layout =
      LayoutOf(rank, BucketLayoutOptions(), plan);
  if (!layout.ok()) return layout.status();
  return CompileStreamOps(rank, plan, layout->buckets());
}

TEST(StreamOpsTest, SequentialCompactPlan_AllOnMainOrthogonalizingOwned) {
  const v1::Plan plan = ThreeBucketPlan(/*async=*/false, 0);
  absl::StatusOr<StreamOps> ops = OpsOf(0, plan);
  ASSERT_TRUE(ops.ok()) << ops.status();
  EXPECT_FALSE(ops->async);
  EXPECT_EQ(ops->slots, 1);
  EXPECT_TRUE(ops->comm.empty());
  EXPECT_TRUE(ops->compute.empty());
  EXPECT_EQ(ops->slot_of_bucket, (std::vector<int>{0, 0, 0}));
  int orthogonalized = 0;
  for (const StreamOp& op : ops->main) {
    if (op.kind != v1::OP_KIND_ORTHOGONALIZE) continue;
    ++orthogonalized;
    EXPECT_NE(op.bucket, 1) << "bucket 1 is rank 1's";
  }
  EXPECT_EQ(orthogonalized, 2);
  EXPECT_EQ(ops->main.size(), 3u * 3u + 2u);
}

TEST(StreamOpsTest, AsyncPrefetchOne_CommAndComputeListsTwoSlots) {
  const v1::Plan plan = ThreeBucketPlan(/*async=*/true, 1);
  absl::StatusOr<StreamOps> ops = OpsOf(1, plan);
  ASSERT_TRUE(ops.ok()) << ops.status();
  EXPECT_TRUE(ops->async);
  EXPECT_EQ(ops->prefetch_count, 1);
  EXPECT_EQ(ops->slots, 2);
  EXPECT_TRUE(ops->main.empty());
  EXPECT_EQ(Kinds(ops->compute),
            (std::vector<v1::OpKind>{v1::OP_KIND_ORTHOGONALIZE}));
  EXPECT_EQ(ops->compute[0].bucket, 1);
  EXPECT_EQ(ops->comm.size(), 9u);
  EXPECT_EQ(ops->slot_of_bucket, (std::vector<int>{0, 1, 0}));
}

TEST(StreamOpsTest, ScheduleNotForThisBinaryOrRank_Refused) {
  v1::Plan plan = ThreeBucketPlan(/*async=*/false, 0);
  plan.mutable_schedule()->set_derivation("muon-schedule-v0");
  EXPECT_EQ(OpsOf(0, plan).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(OpsOf(0, plan).status().message()),
              HasSubstr("schedule derivation \"muon-schedule-v0\" is not "
                        "this binary's"));
  // An explicit schedule that lists rank 1 only.
  plan = ThreeBucketPlan(/*async=*/false, 0);
  *plan.mutable_schedule()->add_ranks() = MakeRankSchedule(plan, 1);
  EXPECT_EQ(OpsOf(0, plan).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(OpsOf(0, plan).status().message()),
              HasSubstr("rank 0: the plan carries no stream schedule"));
}

TEST(StreamOpsTest, AsyncComputeOrderNotRedistributeOrder_Refused) {
  const v1::Plan compact = ThreeBucketPlan(/*async=*/true, 1);
  v1::Plan plan = compact;
  v1::RankSchedule mine = MakeRankSchedule(compact, 0);
  // Rank 0 owns buckets 0 and 2: swap their orthogonalize operations.
  std::vector<int> at;
  for (int i = 0; i < mine.ops_size(); ++i) {
    if (mine.ops(i).op() == v1::OP_KIND_ORTHOGONALIZE) at.push_back(i);
  }
  ASSERT_EQ(at.size(), 2u);
  mine.mutable_ops()->SwapElements(at[0], at[1]);
  *plan.mutable_schedule()->add_ranks() = mine;
  absl::StatusOr<StreamOps> ops = OpsOf(0, plan);
  EXPECT_EQ(ops.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ops.status().message(),
              HasSubstr("rank 0: the schedule's compute stream orthogonalizes "
                        "buckets [2, 0] but its comm stream redistributes the "
                        "owned ones in the order [0, 2]"));
}

// A schedule that orthogonalizes a bucket of another stage's matrix on a
// rank that owns none of it is refused: the executor would run
// Newton-Schulz on nothing while its peers wait.
TEST(StreamOpsTest, OrthogonalizeOfBucketNotOwned_Refused) {
  v1::Plan plan = ThreeBucketPlan(/*async=*/false, 0);
  AddMatrix(&plan, "other_stage", 8, 8, 0);
  AddBucket(&plan, {4});
  *plan.mutable_schedule() = MakeScheduleHeader(plan, false, 0);
  // The plan says rank 0 owns "other_stage", which this rank does not have.
  absl::StatusOr<StreamOps> ops = OpsOf(0, plan);
  EXPECT_EQ(ops.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ops.status().message()),
              HasSubstr("rank 0: the schedule orthogonalizes bucket 3 1 times "
                        "but this rank owns 0 of its matrices"));
}

TEST(StreamOpsTest, OperationOnBucketOrSlotOutsideThePlan_Refused) {
  for (const bool bad_slot : {false, true}) {
    SCOPED_TRACE(bad_slot ? "slot 5" : "bucket 9");
    v1::Plan plan = ThreeBucketPlan(/*async=*/false, 0);
    v1::RankSchedule mine = MakeRankSchedule(plan, 0);
    if (bad_slot) {
      mine.mutable_ops(0)->set_slot(5);
    } else {
      mine.mutable_ops(0)->set_bucket(9);
    }
    *plan.mutable_schedule()->add_ranks() = mine;
    absl::StatusOr<StreamOps> ops = OpsOf(0, plan);
    EXPECT_EQ(ops.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(
        std::string(ops.status().message()),
        HasSubstr(bad_slot ? "rank 0, bucket 0, gather: slot 5 out of "
                             "range [0, 1)"
                           : "rank 0, bucket 9, gather: no such bucket"));
  }
}

}  // namespace
}  // namespace muon
