// Tests of plan/plan_job.h: the one planning entry point (manifest checks,
// options from the manifests, plan, ValidatePlan, hash).
#include "plan/plan_job.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/planner.h"
#include "tests/server/test_specs.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::muon::testing::FourRankSpec;
using ::muon::testing::Manifests;
using ::testing::HasSubstr;

constexpr auto kLpt = PlannerOptions::Policy::kLongestProcessingTimeFirst;
constexpr auto kRoundRobin = PlannerOptions::Policy::kRoundRobin;

// FourRankSpec's manifests with RankManifest.ns_steps = k on every rank.
std::vector<v1::RankManifest> WithNsSteps(std::vector<v1::RankManifest> m,
                                          int k) {
  for (v1::RankManifest& r : m) r.set_ns_steps(k);
  return m;
}

TEST(PlanJobTest, PlanJob_ValidManifests_ReturnsValidatedHashedPlan) {
  absl::StatusOr<JobPlan> job = PlanJob(Manifests(FourRankSpec()), "job-a");
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->plan.job_id(), "job-a");
  EXPECT_EQ(job->plan.world_size(), 4);
  EXPECT_EQ(job->plan.matrices_size(), 3);
  EXPECT_EQ(job->layout.matrices.size(), 3u);
  EXPECT_EQ(job->layout.ns_steps, 5);
  EXPECT_EQ(job->plan.hash(), PlanHash(job->plan));
  EXPECT_THAT(ValidatePlan(job->plan, job->layout), IsOk());
  EXPECT_TRUE(job->plan.has_schedule());
}

TEST(PlanJobTest, PlanJob_SameManifestsTwice_SameHash) {
  absl::StatusOr<JobPlan> a = PlanJob(Manifests(FourRankSpec()), "job");
  absl::StatusOr<JobPlan> b = PlanJob(Manifests(FourRankSpec()), "job");
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ(a->plan.hash(), b->plan.hash());
}

TEST(PlanJobTest, PlanJob_OtherJobId_OtherHash) {
  absl::StatusOr<JobPlan> a = PlanJob(Manifests(FourRankSpec()), "job-a");
  absl::StatusOr<JobPlan> b = PlanJob(Manifests(FourRankSpec()), "job-b");
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  EXPECT_NE(a->plan.hash(), b->plan.hash());
}

TEST(PlanJobTest, PlanJob_NsStepsInManifests_CostsEveryMatrixWithIt) {
  const std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  absl::StatusOr<JobPlan> five = PlanJob(m, "job");
  absl::StatusOr<JobPlan> three = PlanJob(WithNsSteps(m, 3), "job");
  absl::StatusOr<JobPlan> explicit_five = PlanJob(WithNsSteps(m, 5), "job");
  ASSERT_THAT(five, IsOk());
  ASSERT_THAT(three, IsOk());
  ASSERT_THAT(explicit_five, IsOk());
  EXPECT_EQ(three->layout.ns_steps, 3);
  for (const v1::MatrixPlan& mp : three->plan.matrices()) {
    EXPECT_DOUBLE_EQ(mp.ns_flops(), NewtonSchulzFlops(mp.rows(), mp.cols(), 3))
        << mp.param();
  }
  double total = 0;
  for (const v1::RankLoad& l : three->plan.loads()) total += l.ns_flops();
  double expected = 0;
  for (const v1::MatrixPlan& mp : five->plan.matrices()) {
    expected += mp.ns_flops() * 3 / 5;
  }
  EXPECT_DOUBLE_EQ(total, expected);
  EXPECT_NE(three->plan.hash(), five->plan.hash());
  // Unset is torch's default, 5.
  EXPECT_EQ(explicit_five->plan.hash(), five->plan.hash());
}

TEST(PlanJobTest, PlanJob_ZeroNsSteps_CostedAsOneIteration) {
  const std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  absl::StatusOr<JobPlan> zero = PlanJob(WithNsSteps(m, 0), "job");
  absl::StatusOr<JobPlan> one = PlanJob(WithNsSteps(m, 1), "job");
  ASSERT_THAT(zero, IsOk());
  ASSERT_THAT(one, IsOk());
  EXPECT_EQ(zero->layout.ns_steps, 0);
  EXPECT_EQ(zero->plan.hash(), one->plan.hash());
}

TEST(PlanJobTest, PlanJob_RanksDisagreeOnNsSteps_ReturnsInvalidArgument) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  m[2].set_ns_steps(7);
  EXPECT_THAT(PlanJob(m, "job"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank 2 reports ns_steps 7 but rank 0 "
                                 "reports 5")));
}

TEST(PlanJobTest, PlanJob_NsStepsOutOfRange_ReturnsInvalidArgument) {
  const std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  EXPECT_THAT(PlanJob(WithNsSteps(m, -1), "job"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank 0 reports ns_steps -1")));
  EXPECT_THAT(PlanJob(WithNsSteps(m, 100), "job"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("must be in [0, 100)")));
}

TEST(PlanJobTest, PlanJob_InvalidManifests_ReturnsValidationError) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  m[1].mutable_params(0)->set_global_shape(0, 11);
  EXPECT_THAT(PlanJob(m, "job"), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("fc1.weight")));
}

TEST(PlanJobTest, PlanJob_UnknownPolicy_ReturnsInvalidArgument) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  for (v1::RankManifest& r : m) {
    r.mutable_execution()->set_assignment_policy("fastest");
  }
  EXPECT_THAT(PlanJob(m, "job"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("execution.assignment_policy")));
}

TEST(PlanJobTest, PlanJob_ManifestsLeavePolicyAndBucketUnset_UsesDefaults) {
  PlanDefaults defaults;
  defaults.policy = kRoundRobin;
  defaults.bucket_size_bytes = 1 << 20;
  absl::StatusOr<JobPlan> job =
      PlanJob(Manifests(FourRankSpec()), "job", defaults);
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->plan.policy(), "round_robin");
  // Every matrix fits one 1 MiB bucket.
  EXPECT_EQ(job->plan.buckets_size(), 1);
}

TEST(PlanJobTest, PlanJob_ManifestsSetPolicyAndBucket_OverrideDefaults) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  for (v1::RankManifest& r : m) {
    r.mutable_execution()->set_assignment_policy("lpt");
    r.mutable_execution()->set_bucket_size_bytes(4);
  }
  PlanDefaults defaults;
  defaults.policy = kRoundRobin;
  defaults.bucket_size_bytes = 1 << 20;
  absl::StatusOr<JobPlan> job = PlanJob(m, "job", defaults);
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->plan.policy(), "lpt");
  // Every matrix exceeds 4 bytes: one bucket each.
  EXPECT_EQ(job->plan.buckets_size(), 3);
}

TEST(PlanJobTest, PlanJob_AsyncExecution_PlansAsyncSchedule) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  for (v1::RankManifest& r : m) {
    r.mutable_execution()->set_async_gpu_parallelism(true);
    r.mutable_execution()->set_prefetch_count(1);
    // One matrix per bucket: 3 buckets, so prefetch 1 is not capped.
    r.mutable_execution()->set_bucket_size_bytes(4);
  }
  absl::StatusOr<JobPlan> job = PlanJob(m, "job");
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->plan.schedule().mode(), v1::SCHEDULE_MODE_ASYNC);
  EXPECT_EQ(job->plan.schedule().prefetch_count(), 1);
}

TEST(PlanJobTest, PlannerOptionsForJob_FromLayout_CopiesEveryField) {
  JobLayout layout;
  layout.ns_steps = 7;
  layout.execution.set_async_gpu_parallelism(true);
  layout.execution.set_prefetch_count(2);
  layout.execution.set_bucket_size_bytes(64);
  PlanDefaults defaults;
  defaults.policy = kRoundRobin;
  defaults.bucket_size_bytes = 128;
  absl::StatusOr<PlannerOptions> o =
      PlannerOptionsForJob(layout, "job-x", defaults);
  ASSERT_THAT(o, IsOk());
  EXPECT_EQ(o->job_id, "job-x");
  EXPECT_EQ(o->policy, kRoundRobin);
  EXPECT_EQ(o->bucket_size_bytes, 64);
  EXPECT_TRUE(o->async);
  EXPECT_EQ(o->prefetch_count, 2);
  EXPECT_EQ(o->ns_steps, 7);

  layout.execution.set_assignment_policy("lpt");
  layout.execution.set_bucket_size_bytes(0);
  o = PlannerOptionsForJob(layout, "job-x", defaults);
  ASSERT_THAT(o, IsOk());
  EXPECT_EQ(o->policy, kLpt);
  EXPECT_EQ(o->bucket_size_bytes, 128);
}

}  // namespace
}  // namespace muon

namespace muon {
namespace {

using ::muon::testing::MakeSpec;

// PlanJobFromSpec (no manifests, shared boxes) must give exactly the plan
// PlanJob gives for the manifests the spec implies: same layout order,
// same owners, same hash.
void ExpectSamePlanBothWays(const v1::JobSpec& spec) {
  absl::StatusOr<JobPlan> from_spec = PlanJobFromSpec(spec);
  ASSERT_THAT(from_spec, IsOk());
  absl::StatusOr<JobPlan> from_manifests =
      PlanJob(Manifests(spec), spec.job_id());
  ASSERT_THAT(from_manifests, IsOk());
  EXPECT_EQ(from_spec->plan.hash(), from_manifests->plan.hash());
  EXPECT_EQ(from_spec->plan.SerializeAsString(),
            from_manifests->plan.SerializeAsString());
  const JobLayout& a = from_spec->layout;
  const JobLayout& b = from_manifests->layout;
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) {
    EXPECT_EQ(a.params[i].name, b.params[i].name) << i;
    EXPECT_EQ(a.params[i].first_matrix, b.params[i].first_matrix) << i;
  }
  ASSERT_EQ(a.matrices.size(), b.matrices.size());
  for (size_t i = 0; i < a.matrices.size(); ++i) {
    EXPECT_EQ(a.matrices[i].name, b.matrices[i].name) << i;
    EXPECT_EQ(a.matrices[i].boxes.vec(), b.matrices[i].boxes.vec()) << i;
  }
}

TEST(PlanJobFromSpecTest, FsdpTpAndStacks_SamePlanAsManifestPath) {
  ExpectSamePlanBothWays(::muon::testing::FourRankSpec());
  v1::JobSpec tp = MakeSpec({{"dp_shard", 2}, {"tp", 4}},
                            {{"wq", 64, 64, {"Shard(0)", "Shard(0)"}},
                             {"wo", 64, 64, {"Shard(0)", "Shard(1)"}},
                             {"w1", 128, 64, {"Shard(0)", "Shard(0)"}},
                             {"norm", 8, 8, {"Replicate()", "Replicate()"}}});
  ExpectSamePlanBothWays(tp);
  v1::JobSpec moe =
      MakeSpec({{"dp_shard", 2}, {"ep", 4}},
               {{"experts", 16, 32, {"Shard(1)", "Shard(0)"}, {}, 8},
                {"router", 16, 32, {"Shard(0)", "Replicate()"}}});
  ExpectSamePlanBothWays(moe);
}

TEST(PlanJobFromSpecTest, PipelineStagesListedOutOfOrder_SameUnionOrder) {
  // Stage 1's parameter is listed first in the spec, but rank 0 (stage 0)
  // lists its own first: the union order puts stage 0 first.
  v1::JobSpec pp =
      MakeSpec({{"pp", 2}, {"tp", 2}},
               {{"s1.w", 32, 16, {"Replicate()", "Shard(0)"}, {{"pp", 1}}},
                {"s0.w", 16, 32, {"Replicate()", "Shard(1)"}, {{"pp", 0}}},
                {"s1.v", 8, 8, {"Replicate()", "Shard(0)"}, {{"pp", 1}}}});
  ExpectSamePlanBothWays(pp);
  absl::StatusOr<JobPlan> plan = PlanJobFromSpec(pp);
  ASSERT_THAT(plan, IsOk());
  EXPECT_EQ(plan->layout.params[0].name, "s0.w");
  ExpectSamePlanBothWays(::muon::testing::PipelineSpec());
}

TEST(PlanJobFromSpecTest, SameLayoutMatrices_ShareOneBoxList) {
  std::vector<::muon::testing::TestParam> params;
  for (int i = 0; i < 6; ++i) {
    params.push_back({absl::StrCat("w", i), 64, 32, {"Shard(0)"}});
  }
  absl::StatusOr<JobPlan> plan =
      PlanJobFromSpec(MakeSpec({{"dp_shard", 8}}, params));
  ASSERT_THAT(plan, IsOk());
  for (const MatrixLayout& m : plan->layout.matrices) {
    EXPECT_EQ(m.boxes.id(), plan->layout.matrices[0].boxes.id());
  }
}

TEST(PlanJobFromSpecTest, ManyMatricesOverManyRanks_PlansPastPerRankBoxLimit) {
  // 4,096 ranks x 1,024 matrices = 2^22 matrix x rank pairs: above the
  // per-rank box limit of the manifest path, fine with shared boxes.
  std::vector<::muon::testing::TestParam> params;
  const int64_t shapes[4][2] = {{256, 256}, {256, 512}, {512, 256}, {64, 256}};
  for (int i = 0; i < 1024; ++i) {
    params.push_back({absl::StrCat("w", i),
                      shapes[i % 4][0],
                      shapes[i % 4][1],
                      {"Shard(0)"}});
  }
  v1::JobSpec spec = MakeSpec({{"dp_shard", 4096}}, params);
  EXPECT_THAT(ManifestsFromSpec(spec).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("matrices x world size")));
  absl::StatusOr<JobPlan> plan = PlanJobFromSpec(spec);
  ASSERT_THAT(plan, IsOk());
  EXPECT_EQ(plan->plan.matrices_size(), 1024);
  EXPECT_EQ(plan->plan.world_size(), 4096);
}

}  // namespace
}  // namespace muon
