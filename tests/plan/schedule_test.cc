// The stream schedule: sequential and async layouts, and ValidateSchedule
// catching schedules that could deadlock or overrun their buffer slots.
#include "plan/schedule.h"

#include <cstdint>
#include <string>
#include <vector>

#include "common/wire_names.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::testing::HasSubstr;

// A plan of `buckets` buckets over `world` ranks; bucket b holds one matrix
// owned by rank b % world.
v1::Plan MakeTestPlan(int world, int buckets) {
  v1::Plan plan;
  plan.set_world_size(world);
  for (int b = 0; b < buckets; ++b) {
    v1::MatrixPlan* m = plan.add_matrices();
    m->set_index(b);
    m->set_param("w" + std::to_string(b));
    m->set_owner(b % world);
    m->set_bucket(b);
    v1::Bucket* bucket = plan.add_buckets();
    bucket->set_index(b);
    bucket->add_matrices(b);
  }
  return plan;
}

// "g0@1": first letter of the operation's wire name, bucket, slot.
std::vector<std::string> Ops(const v1::RankSchedule& rs,
                             v1::StreamKind stream) {
  std::vector<std::string> out;
  for (const v1::ScheduledOp& op : rs.ops()) {
    if (op.stream() == stream) {
      out.push_back(WireName(op.op()).substr(0, 1) +
                    std::to_string(op.bucket()) + "@" +
                    std::to_string(op.slot()));
    }
  }
  return out;
}

TEST(ScheduleTest, MakeSchedule_Sequential_OneStreamOneSlotOwnersOnly) {
  const v1::Plan plan = MakeTestPlan(2, 3);
  const v1::Schedule s = MakeSchedule(plan, /*async=*/false, 2);
  EXPECT_EQ(s.mode(), v1::SCHEDULE_MODE_SEQUENTIAL);
  EXPECT_EQ(s.slots(), 1);
  EXPECT_EQ(s.prefetch_count(), 0);
  EXPECT_THAT(
      Ops(s.ranks(0), v1::STREAM_KIND_MAIN),
      ::testing::ElementsAre("g0@0", "o0@0", "r0@0", "a0@0", "g1@0", "r1@0",
                             "a1@0", "g2@0", "o2@0", "r2@0", "a2@0"));
  EXPECT_THAT(ValidateSchedule(s, plan), IsOk());
}

TEST(ScheduleTest, MakeSchedule_AsyncPrefetchOne_GathersAheadInTwoSlots) {
  const v1::Plan plan = MakeTestPlan(2, 4);
  const v1::Schedule s = MakeSchedule(plan, /*async=*/true, 1);
  EXPECT_EQ(s.slots(), 2);
  EXPECT_THAT(
      Ops(s.ranks(1), v1::STREAM_KIND_COMM),
      ::testing::ElementsAre("g0@0", "g1@1", "r0@0", "a0@0", "g2@0", "r1@1",
                             "a1@1", "g3@1", "r2@0", "a2@0", "r3@1", "a3@1"));
  EXPECT_THAT(Ops(s.ranks(1), v1::STREAM_KIND_COMPUTE),
              ::testing::ElementsAre("o1@1", "o3@1"));
  EXPECT_THAT(ValidateSchedule(s, plan), IsOk());
}

TEST(ScheduleTest, MakeSchedule_PrefetchBeyondBuckets_IsCapped) {
  const v1::Plan plan = MakeTestPlan(2, 2);
  const v1::Schedule s = MakeSchedule(plan, /*async=*/true, 5);
  EXPECT_EQ(s.prefetch_count(), 1);
  EXPECT_EQ(s.slots(), 2);
  EXPECT_THAT(ValidateSchedule(s, plan), IsOk());
}

TEST(ScheduleTest,
     ValidateSchedule_CollectivesInAnotherOrder_ReturnsInvalidArgument) {
  const v1::Plan plan = MakeTestPlan(2, 3);
  v1::Schedule s = MakeSchedule(plan, /*async=*/true, 1);
  // Rank 1 redistributes bucket 0 before gathering bucket 1: a deadlock.
  auto* ops = s.mutable_ranks(1)->mutable_ops();
  ops->SwapElements(1, 2);
  EXPECT_THAT(
      ValidateSchedule(s, plan),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 1")));
}

TEST(ScheduleTest,
     ValidateSchedule_SlotReusedBeforeRedistribute_ReturnsInvalidArgument) {
  const v1::Plan plan = MakeTestPlan(2, 3);
  v1::Schedule s = MakeSchedule(plan, /*async=*/true, 1);
  for (int r = 0; r < 2; ++r) {
    // Gather bucket 1 into slot 0, still held by bucket 0.
    s.mutable_ranks(r)->mutable_ops(1)->set_slot(0);
  }
  EXPECT_THAT(ValidateSchedule(s, plan),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("slot 0 still holds bucket 0")));
}

TEST(ScheduleTest,
     ValidateSchedule_OrthogonalizeOnNonOwner_ReturnsInvalidArgument) {
  const v1::Plan plan = MakeTestPlan(2, 2);
  v1::Schedule s = MakeSchedule(plan, /*async=*/false, 0);
  v1::ScheduledOp* op = s.mutable_ranks(1)->add_ops();
  op->set_bucket(0);
  op->set_op(v1::OP_KIND_ORTHOGONALIZE);
  op->set_stream(v1::STREAM_KIND_MAIN);
  EXPECT_THAT(ValidateSchedule(s, plan),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("owns no matrix of this bucket")));
}

TEST(ScheduleTest, ValidateSchedule_MissingApply_ReturnsInvalidArgument) {
  const v1::Plan plan = MakeTestPlan(1, 2);
  v1::Schedule s = MakeSchedule(plan, /*async=*/false, 0);
  s.mutable_ranks(0)->mutable_ops()->RemoveLast();  // bucket 1's apply
  EXPECT_THAT(ValidateSchedule(s, plan),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("apply scheduled 0 times")));
}

TEST(ScheduleTest, ValidateSchedule_WrongSlotCount_ReturnsInvalidArgument) {
  const v1::Plan plan = MakeTestPlan(2, 3);
  v1::Schedule s = MakeSchedule(plan, /*async=*/true, 1);
  s.set_slots(1);
  EXPECT_THAT(ValidateSchedule(s, plan),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("slots")));
}

// A plan with the compact schedule MakePlan puts in it.
v1::Plan WithHeader(v1::Plan plan, bool async, int prefetch) {
  *plan.mutable_schedule() = MakeScheduleHeader(plan, async, prefetch);
  return plan;
}

TEST(ScheduleTest, MakeScheduleHeader_HasNoRankListsAndNamesTheDerivation) {
  const v1::Plan plan = WithHeader(MakeTestPlan(4, 6), /*async=*/true, 2);
  EXPECT_EQ(plan.schedule().ranks_size(), 0);
  EXPECT_EQ(plan.schedule().derivation(), kScheduleDerivation);
  EXPECT_EQ(plan.schedule().prefetch_count(), 2);
  EXPECT_EQ(plan.schedule().slots(), 3);
  EXPECT_THAT(ValidateSchedule(plan.schedule(), plan), IsOk());
}

TEST(ScheduleTest, MakeRankSchedule_EqualsTheExplicitListOfEveryRank) {
  for (bool async : {false, true}) {
    const v1::Plan plan = WithHeader(MakeTestPlan(3, 7), async, 2);
    const v1::Schedule explicit_form = MakeSchedule(plan, async, 2);
    ASSERT_EQ(explicit_form.ranks_size(), 3);
    for (int r = 0; r < 3; ++r) {
      const v1::RankSchedule derived = MakeRankSchedule(plan, r);
      EXPECT_EQ(derived.SerializeAsString(),
                explicit_form.ranks(r).SerializeAsString())
          << "rank " << r << " async " << async;
      EXPECT_THAT(ValidateRankSchedule(derived, plan.schedule(), plan), IsOk());
    }
  }
}

TEST(ScheduleTest, CompactSchedule_SizeDoesNotGrowWithRanks) {
  // 16 buckets over 4 and over 4096 ranks: the explicit form grows with the
  // ranks, the compact one does not.
  const v1::Plan small = WithHeader(MakeTestPlan(4, 16), true, 1);
  const v1::Plan large = WithHeader(MakeTestPlan(4096, 16), true, 1);
  EXPECT_EQ(small.schedule().ByteSizeLong(), large.schedule().ByteSizeLong());
  EXPECT_GT(MakeSchedule(large, true, 1).ByteSizeLong(),
            100 * MakeSchedule(small, true, 1).ByteSizeLong());
}

TEST(ScheduleTest, ValidateSchedule_CompactWithOtherDerivation_IsRefused) {
  v1::Plan plan = WithHeader(MakeTestPlan(2, 3), /*async=*/true, 1);
  plan.mutable_schedule()->set_derivation("muon-schedule-v0");
  EXPECT_THAT(ValidateSchedule(plan.schedule(), plan),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("derivation \"muon-schedule-v0\"")));
}

TEST(ScheduleTest, ValidateSchedule_CompactWithTooFewSlots_IsRefused) {
  v1::Plan plan = WithHeader(MakeTestPlan(2, 3), /*async=*/true, 1);
  plan.mutable_schedule()->set_slots(1);
  EXPECT_THAT(ValidateSchedule(plan.schedule(), plan),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("slots")));
}

// ValidateRankSchedule (each rank's own check of the plan it was sent)
// never checked the header, yet its walk allocates slots() ints: a header
// of 2^20 slots (or one inconsistent with its prefetch depth) passed.
TEST(ScheduleTest, ValidateRankSchedule_BadHeader_RefusedBeforeTheWalk) {
  const v1::Plan plan = WithHeader(MakeTestPlan(2, 3), /*async=*/true, 1);
  const v1::RankSchedule rs = MakeRankSchedule(plan, 0);
  ASSERT_THAT(ValidateRankSchedule(rs, plan.schedule(), plan), IsOk());
  v1::Schedule huge = plan.schedule();
  huge.set_prefetch_count((1 << 20) - 1);
  huge.set_slots(1 << 20);
  EXPECT_THAT(ValidateRankSchedule(rs, huge, plan),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("1048576 slots (prefetch 1048575) for a plan "
                                 "of 3 buckets; at most 3")));
  v1::Schedule inconsistent = plan.schedule();
  inconsistent.set_slots(3);  // prefetch 1: 2 slots
  EXPECT_THAT(ValidateRankSchedule(rs, inconsistent, plan),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("3 slots for prefetch 1")));
}

// prefetch_count + 1 was computed in int32: INT32_MAX + 1 overflowed
// (undefined behaviour) in the header check, the derivation and the walk.
TEST(ScheduleTest, ValidateSchedule_PrefetchInt32Max_RefusedWithoutOverflow) {
  v1::Plan plan = WithHeader(MakeTestPlan(2, 3), /*async=*/true, 1);
  plan.mutable_schedule()->set_prefetch_count(INT32_MAX);
  plan.mutable_schedule()->set_slots(INT32_MAX);
  EXPECT_THAT(ValidateSchedule(plan.schedule(), plan),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("expected 2147483648")));
  // The derivation (each rank runs it before its check) stays in range.
  const v1::RankSchedule rs = MakeRankSchedule(plan, 0);
  for (const v1::ScheduledOp& op : rs.ops()) {
    EXPECT_EQ(op.slot(), op.bucket());
  }
  EXPECT_THAT(ValidateRankSchedule(rs, plan.schedule(), plan),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("expected 2147483648")));
}

TEST(ScheduleTest, ValidateRankSchedule_OrthogonalizeOnNonOwner_NamesTheRank) {
  const v1::Plan plan = WithHeader(MakeTestPlan(2, 2), /*async=*/true, 1);
  v1::RankSchedule rs = MakeRankSchedule(plan, 1);
  v1::ScheduledOp* op = rs.add_ops();  // bucket 0 is rank 0's
  op->set_bucket(0);
  op->set_op(v1::OP_KIND_ORTHOGONALIZE);
  op->set_stream(v1::STREAM_KIND_COMPUTE);
  EXPECT_THAT(ValidateRankSchedule(rs, plan.schedule(), plan),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank 1, bucket 0, orthogonalize")));
}

}  // namespace
}  // namespace muon
