// The cost model and planning step of re-planning from measured times
// (plan/replan.h).
#include "plan/replan.h"

#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/manifest_validation.h"
#include "plan/planner.h"
#include "tests/server/test_specs.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::muon::testing::MakeSpec;
using ::testing::ElementsAre;

// A report of `rank`'s step `step` with one orthogonalize of `flops` FLOPs
// taking `seconds`.
v1::StepReport Report(int rank, int64_t step, double flops, double seconds) {
  v1::StepReport r;
  r.set_rank(rank);
  r.set_step(step);
  v1::OpTiming* op = r.add_ops();
  op->set_op(v1::OP_KIND_ORTHOGONALIZE);
  op->set_start_s(100.0);
  op->set_end_s(100.0 + seconds);
  op->set_flops(flops);
  v1::OpTiming* gather = r.add_ops();  // not Newton-Schulz: ignored
  gather->set_op(v1::OP_KIND_GATHER);
  gather->set_start_s(0);
  gather->set_end_s(50);
  return r;
}

TEST(ReplanTest, MeasuredSecondsPerFlop_RatioPerRank_MedianForUnmeasured) {
  std::vector<std::vector<v1::StepReport>> reports(4);
  reports[0] = {Report(0, 1, 1e9, 1.0), Report(0, 2, 1e9, 3.0)};  // 2e-9
  reports[1] = {Report(1, 2, 2e9, 2.0)};                          // 1e-9
  reports[2] = {Report(2, 2, 1e9, 8.0)};                          // 8e-9
  // Rank 3 measured only before the window: the median (of 1, 2, 8: 2).
  reports[3] = {Report(3, 0, 1e9, 100.0)};
  const std::vector<const std::vector<v1::StepReport>*> rings = {
      &reports[0], &reports[1], &reports[2], &reports[3]};
  const std::vector<double> m = MeasuredSecondsPerFlop(rings, 0);
  ASSERT_EQ(m.size(), 4u);
  EXPECT_DOUBLE_EQ(m[0], 2e-9);
  EXPECT_DOUBLE_EQ(m[1], 1e-9);
  EXPECT_DOUBLE_EQ(m[2], 8e-9);
  EXPECT_DOUBLE_EQ(m[3], 2e-9);
  EXPECT_TRUE(MeasuredSecondsPerFlop(rings, 5).empty());  // nothing after
  EXPECT_TRUE(MeasuredSecondsPerFlop({nullptr, nullptr}, 0).empty());
}

// A rank report with end_s = inf made its seconds per FLOP inf (and flops
// = inf made it 0), which MakePlan refuses: every re-plan of the job
// failed. Such operations are skipped; only finite ratios > 0 count.
TEST(ReplanTest, MeasuredSecondsPerFlop_NonFiniteValues_Skipped) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  constexpr double kHuge = std::numeric_limits<double>::max();
  std::vector<std::vector<v1::StepReport>> reports(4);
  reports[0] = {Report(0, 1, 1e9, 2.0)};                           // 2e-9
  reports[1] = {Report(1, 1, 1e9, 1.0), Report(1, 2, 1e9, kInf)};  // 1e-9
  // Only non-finite or overflowing values: unmeasured, the median.
  reports[2] = {Report(2, 1, kInf, 1.0), Report(2, 2, kNaN, 1.0),
                Report(2, 3, 1e9, kNaN)};
  reports[3] = {Report(3, 1, kHuge, 1.0), Report(3, 2, kHuge, 1.0)};
  v1::StepReport start_inf = Report(3, 3, 1e9, 1.0);
  start_inf.mutable_ops(0)->set_start_s(-kInf);
  reports[3].push_back(start_inf);
  const std::vector<const std::vector<v1::StepReport>*> rings = {
      &reports[0], &reports[1], &reports[2], &reports[3]};
  const std::vector<double> m = MeasuredSecondsPerFlop(rings, 0);
  ASSERT_EQ(m.size(), 4u);
  EXPECT_DOUBLE_EQ(m[0], 2e-9);
  EXPECT_DOUBLE_EQ(m[1], 1e-9);
  EXPECT_DOUBLE_EQ(m[2], 2e-9);  // median of 1e-9 and 2e-9: the upper one
  EXPECT_DOUBLE_EQ(m[3], 2e-9);
  // Nothing usable at all: no measurement.
  std::vector<v1::StepReport> bad = {Report(0, 1, 1e9, kInf)};
  EXPECT_TRUE(MeasuredSecondsPerFlop({&bad}, 0).empty());
}

class ReplanPlanTest : public ::testing::Test {
 protected:
  // Eight equal 64x64 matrices over four ranks, every rank a holder.
  ReplanPlanTest() {
    std::vector<::muon::testing::TestParam> params;
    for (int i = 0; i < 8; ++i) {
      params.push_back({"w" + std::to_string(i), 64, 64, {"Shard(0)"}});
    }
    absl::StatusOr<JobLayout> layout =
        LayoutFromSpec(MakeSpec({{"dp_shard", 4}}, params));
    EXPECT_THAT(layout, IsOk());
    layout_ = *layout;
    absl::StatusOr<v1::Plan> plan = MakePlan(layout_, PlannerOptions());
    EXPECT_THAT(plan, IsOk());
    first_ = *plan;
  }

  int Owned(const v1::Plan& plan, int rank) {
    int n = 0;
    for (const v1::MatrixPlan& m : plan.matrices()) n += m.owner() == rank;
    return n;
  }

  JobLayout layout_;
  v1::Plan first_;
};

TEST_F(ReplanPlanTest, SlowRank_GetsFewerMatrices_NewVersionValid) {
  ASSERT_EQ(Owned(first_, 2), 2);
  absl::StatusOr<v1::Plan> plan = ReplanWithMeasuredCosts(
      layout_, PlannerOptions(), first_, {1e-9, 1e-9, 8e-9, 1e-9}, 10);
  ASSERT_THAT(plan, IsOk());
  EXPECT_LT(Owned(*plan, 2), 2);
  EXPECT_EQ(plan->version(), 1);
  EXPECT_EQ(plan->first_step(), 11);
  EXPECT_NE(plan->hash(), first_.hash());
  EXPECT_EQ(plan->hash(), PlanHash(*plan));
  EXPECT_THAT(ValidatePlan(*plan, layout_), IsOk());
  EXPECT_DOUBLE_EQ(plan->loads(2).seconds_per_flop(), 8e-9);
  EXPECT_DOUBLE_EQ(plan->loads(2).predicted_seconds(),
                   plan->loads(2).ns_flops() * 8e-9);
  // Predicted seconds: the slow rank no longer dominates the makespan
  // it would have had with two matrices.
  double makespan = 0;
  for (const v1::RankLoad& l : plan->loads()) {
    makespan = std::max(makespan, l.predicted_seconds());
  }
  EXPECT_LT(makespan, 2 * first_.matrices(0).ns_flops() * 8e-9);
}

TEST_F(ReplanPlanTest, EqualSpeeds_KeepTheCurrentPlan) {
  absl::StatusOr<v1::Plan> plan = ReplanWithMeasuredCosts(
      layout_, PlannerOptions(), first_, {3e-9, 3e-9, 3e-9, 3e-9}, 10);
  ASSERT_THAT(plan, IsOk());
  EXPECT_EQ(plan->hash(), first_.hash());
  EXPECT_EQ(plan->version(), 0);
}

TEST_F(ReplanPlanTest, NonFiniteReport_ReplanStillSucceeds) {
  std::vector<std::vector<v1::StepReport>> reports(4);
  for (int r = 0; r < 4; ++r) reports[r] = {Report(r, 1, 1e9, 1.0)};
  reports[2].push_back(
      Report(2, 2, 1e9, std::numeric_limits<double>::infinity()));
  const std::vector<const std::vector<v1::StepReport>*> rings = {
      &reports[0], &reports[1], &reports[2], &reports[3]};
  EXPECT_THAT(ReplanWithMeasuredCosts(layout_, PlannerOptions(), first_,
                                      MeasuredSecondsPerFlop(rings, 0), 10),
              IsOk());
}

TEST_F(ReplanPlanTest, BadCostModel_RefusedNamingTheRank) {
  EXPECT_THAT(ReplanWithMeasuredCosts(layout_, PlannerOptions(), first_,
                                      {1e-9, 0.0, 1e-9, 1e-9}, 10),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("rank_seconds_per_flop[1]")));
}

}  // namespace
}  // namespace muon
