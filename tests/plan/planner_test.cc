// Tests of plan/planner.h: owners, buckets, loads, hash, validation and
// assign_fn results.
#include "plan/planner.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/manifest_validation.h"
#include "tests/server/test_specs.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::muon::testing::MakeSpec;
using ::muon::testing::Manifests;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

JobLayout Layout(const v1::JobSpec& spec) {
  absl::StatusOr<JobLayout> layout = ValidateManifests(Manifests(spec));
  EXPECT_THAT(layout, IsOk());
  return layout.ok() ? *layout : JobLayout();
}

PlannerOptions Options(PlannerOptions::Policy policy,
                       int64_t bucket_size_bytes = 0) {
  PlannerOptions options;
  options.policy = policy;
  options.bucket_size_bytes = bucket_size_bytes;
  return options;
}

constexpr auto kLpt = PlannerOptions::Policy::kLongestProcessingTimeFirst;
constexpr auto kRoundRobin = PlannerOptions::Policy::kRoundRobin;

// Four replicated matrices over 2 ranks; NS costs (k = 5):
//   a [4, 4]: 1920, b [8, 8]: 15360, c [2, 8]: 720, d [8, 4]: 3200.
v1::JobSpec SmallSpec() {
  return MakeSpec({{"dp_replicate", 2}}, {{"a", 4, 4, {"Replicate()"}},
                                          {"b", 8, 8, {"Replicate()"}},
                                          {"c", 2, 8, {"Replicate()"}},
                                          {"d", 8, 4, {"Replicate()"}}});
}

std::vector<int> Owners(const v1::Plan& plan) {
  std::vector<int> owners;
  for (const v1::MatrixPlan& m : plan.matrices()) owners.push_back(m.owner());
  return owners;
}

std::vector<std::vector<int>> Buckets(const v1::Plan& plan) {
  std::vector<std::vector<int>> out;
  for (const v1::Bucket& b : plan.buckets()) {
    out.emplace_back(b.matrices().begin(), b.matrices().end());
  }
  return out;
}

TEST(PlannerTest, NewtonSchulzFlops_UsesMinAndMaxDim) {
  EXPECT_DOUBLE_EQ(NewtonSchulzFlops(4, 4, 5), 1920.0);
  EXPECT_DOUBLE_EQ(NewtonSchulzFlops(2, 8, 5), 720.0);
  EXPECT_DOUBLE_EQ(NewtonSchulzFlops(8, 2, 5), 720.0);
  EXPECT_DOUBLE_EQ(NewtonSchulzFlops(8, 4, 1), 640.0);
}

v1::Plan PlanWithCosts(int world_size, const std::vector<double>& costs) {
  v1::Plan plan;
  plan.set_world_size(world_size);
  for (double c : costs) plan.add_matrices()->set_ns_flops(c);
  return plan;
}

TEST(PlannerTest, LoadLowerBound_MeanLargestOrPairOfWthLargest) {
  // Mean wins: 8 equal matrices over 4 ranks.
  EXPECT_DOUBLE_EQ(
      LoadLowerBoundFlops(PlanWithCosts(4, std::vector<double>(8, 10.0))),
      20.0);
  // The largest matrix wins.
  EXPECT_DOUBLE_EQ(LoadLowerBoundFlops(PlanWithCosts(4, {100, 1, 1, 1})),
                   100.0);
  // 3 large matrices over 2 ranks: two share a rank (6 + 6 > mean 6.5).
  EXPECT_DOUBLE_EQ(LoadLowerBoundFlops(PlanWithCosts(2, {6, 6, 6, 1})), 12.0);
  EXPECT_DOUBLE_EQ(LoadLowerBoundFlops(PlanWithCosts(4, {})), 0.0);
}

TEST(PlannerTest, LoadLowerBound_NeverAboveLptMaxLoad) {
  JobLayout layout =
      Layout(MakeSpec({{"dp_shard", 3}}, {{"a", 64, 64, {"Shard(0)"}},
                                          {"b", 64, 64, {"Shard(0)"}},
                                          {"c", 64, 64, {"Shard(0)"}},
                                          {"d", 64, 64, {"Shard(0)"}},
                                          {"e", 16, 64, {"Shard(0)"}}}));
  absl::StatusOr<v1::Plan> plan = MakePlan(layout, PlannerOptions());
  ASSERT_THAT(plan, IsOk());
  const double bound = LoadLowerBoundFlops(*plan);
  EXPECT_LE(bound, plan->max_load_flops());
  // 4 equal matrices on 3 ranks: two share one, the bound is exact.
  EXPECT_DOUBLE_EQ(bound, plan->max_load_flops());
}

TEST(PlannerTest, MakePlan_Lpt_ExpectedOwnersOnSmallExample) {
  absl::StatusOr<v1::Plan> plan = MakePlan(Layout(SmallSpec()), Options(kLpt));
  ASSERT_THAT(plan, IsOk());
  // Order b, d, a, c: b -> 0; d -> 1; a -> 1 (3200 < 15360); c -> 1.
  EXPECT_THAT(Owners(*plan), ElementsAre(1, 0, 1, 1));
  EXPECT_EQ(plan->policy(), "lpt");
  EXPECT_DOUBLE_EQ(plan->loads(0).ns_flops(), 15360.0);
  EXPECT_DOUBLE_EQ(plan->loads(1).ns_flops(), 1920.0 + 720.0 + 3200.0);
  EXPECT_EQ(plan->loads(0).matrices(), 1);
  EXPECT_EQ(plan->loads(1).matrices(), 3);
  EXPECT_DOUBLE_EQ(plan->max_load_flops(), 15360.0);
  EXPECT_DOUBLE_EQ(plan->mean_load_flops(), (15360.0 + 5840.0) / 2);
  for (const v1::MatrixPlan& m : plan->matrices()) {
    EXPECT_EQ(m.gather_bytes(), 0) << m.param() << " is replicated";
  }
  EXPECT_THAT(ValidatePlan(*plan, Layout(SmallSpec())), IsOk());
}

TEST(PlannerTest, MakePlan_RoundRobin_CyclesOverRanks) {
  absl::StatusOr<v1::Plan> plan =
      MakePlan(Layout(SmallSpec()), Options(kRoundRobin));
  ASSERT_THAT(plan, IsOk());
  EXPECT_THAT(Owners(*plan), ElementsAre(0, 1, 0, 1));
  EXPECT_EQ(plan->policy(), "round_robin");
}

TEST(PlannerTest, MakePlan_SkewedSizes_LptMaxLoadAtMostRoundRobin) {
  // Big and small matrices alternate: round-robin puts every big one on
  // rank 0.
  std::vector<testing::TestParam> params;
  for (int i = 0; i < 8; ++i) {
    const int64_t n = i % 2 == 0 ? 64 : 8;
    params.push_back({"w" + std::to_string(i), n, n, {"Replicate()"}});
  }
  const JobLayout layout = Layout(MakeSpec({{"dp_replicate", 2}}, params));
  absl::StatusOr<v1::Plan> lpt = MakePlan(layout, Options(kLpt));
  absl::StatusOr<v1::Plan> rr = MakePlan(layout, Options(kRoundRobin));
  ASSERT_THAT(lpt, IsOk());
  ASSERT_THAT(rr, IsOk());
  EXPECT_LE(lpt->max_load_flops(), rr->max_load_flops());
  EXPECT_LT(lpt->max_load_flops(), 0.6 * rr->max_load_flops());
  EXPECT_DOUBLE_EQ(lpt->mean_load_flops(), rr->mean_load_flops());
}

TEST(PlannerTest, MakePlan_ShardedUneven_EveryMatrixOwnedOnceByAHolder) {
  // fc2 [3, 5] over 4 ranks: rank 3 holds nothing and must not own it.
  const v1::JobSpec spec =
      MakeSpec({{"dp_shard", 4}}, {{"fc1", 10, 7, {"Shard(0)"}},
                                   {"fc2", 3, 5, {"Shard(0)"}},
                                   {"fc3", 6, 8, {"Shard(1)"}},
                                   {"fc4", 3, 5, {"Shard(0)"}},
                                   {"fc5", 1, 9, {"Shard(0)"}}});
  const JobLayout layout = Layout(spec);
  for (auto policy : {kLpt, kRoundRobin}) {
    absl::StatusOr<v1::Plan> plan = MakePlan(layout, Options(policy));
    ASSERT_THAT(plan, IsOk());
    ASSERT_EQ(plan->matrices_size(), 5);
    std::set<int> seen;
    for (const v1::MatrixPlan& m : plan->matrices()) {
      EXPECT_TRUE(seen.insert(m.index()).second);
      ASSERT_GE(m.owner(), 0);
      ASSERT_LT(m.owner(), 4);
      EXPECT_FALSE(layout.matrices[m.index()].boxes[m.owner()].empty())
          << m.param() << " owned by rank " << m.owner();
    }
    EXPECT_THAT(ValidatePlan(*plan, layout), IsOk());
  }
  absl::StatusOr<v1::Plan> rr = MakePlan(layout, Options(kRoundRobin));
  ASSERT_THAT(rr, IsOk());
  // fc4 (index 3): eligible [0, 1, 2] -> 3 % 3 = 0; fc5 only on rank 0.
  EXPECT_THAT(Owners(*rr), ElementsAre(0, 1, 2, 0, 0));
  // fc1 [10, 7] on rank 0 holds 3 x 7 = 21 elements: gathers 49 of 70.
  EXPECT_EQ(rr->matrices(0).gather_bytes(), 4 * 49);
}

TEST(PlannerTest, MakePlan_RequestedOwners_Override) {
  std::vector<v1::RankManifest> m = Manifests(SmallSpec());
  for (auto& mm : m) {
    for (int owner : {0, 0, 0, 1}) mm.add_requested_owners(owner);
  }
  absl::StatusOr<JobLayout> layout = ValidateManifests(m);
  ASSERT_THAT(layout, IsOk());
  absl::StatusOr<v1::Plan> plan = MakePlan(*layout, Options(kLpt));
  ASSERT_THAT(plan, IsOk());
  EXPECT_THAT(Owners(*plan), ElementsAre(0, 0, 0, 1));
  EXPECT_THAT(ValidatePlan(*plan, *layout), IsOk());
}

TEST(PlannerTest, MakePlan_ZeroBucketSize_OneMatrixPerOwnerPerBucket) {
  absl::StatusOr<v1::Plan> plan = MakePlan(Layout(SmallSpec()), Options(kLpt));
  ASSERT_THAT(plan, IsOk());
  // Owners (1, 0, 1, 1): rank 0 owns [b]; rank 1 owns [a, c, d].
  EXPECT_THAT(Buckets(*plan),
              ElementsAre(ElementsAre(0, 1), ElementsAre(2), ElementsAre(3)));
  EXPECT_EQ(plan->buckets(0).bytes(), 4 * (16 + 64));
  for (const v1::MatrixPlan& m : plan->matrices()) {
    EXPECT_THAT(plan->buckets(m.bucket()).matrices(),
                ::testing::Contains(m.index()));
  }
}

TEST(PlannerTest, MakePlan_BucketSizeLimit_PacksGreedilyInIndexOrder) {
  // fp32 bytes: a 64, b 256, c 64, d 128.
  absl::StatusOr<v1::Plan> plan =
      MakePlan(Layout(SmallSpec()), Options(kLpt, /*bucket_size_bytes=*/192));
  ASSERT_THAT(plan, IsOk());
  EXPECT_THAT(Buckets(*plan),
              ElementsAre(ElementsAre(0), ElementsAre(1), ElementsAre(2, 3)));
  EXPECT_EQ(plan->buckets(2).bytes(), 192);
  EXPECT_THAT(ValidatePlan(*plan, Layout(SmallSpec())), IsOk());
}

TEST(PlannerTest, MakePlan_MatrixLargerThanBucket_GetsOwnBucket) {
  absl::StatusOr<v1::Plan> plan =
      MakePlan(Layout(SmallSpec()), Options(kLpt, /*bucket_size_bytes=*/100));
  ASSERT_THAT(plan, IsOk());
  EXPECT_THAT(Buckets(*plan), ElementsAre(ElementsAre(0), ElementsAre(1),
                                          ElementsAre(2), ElementsAre(3)));
}

TEST(PlannerTest, MakePlan_BadOptions_ReturnsInvalidArgument) {
  PlannerOptions options;
  options.ns_steps = 0;
  EXPECT_THAT(MakePlan(Layout(SmallSpec()), options),
              StatusIs(kInvalid, HasSubstr("ns_steps")));
  options.ns_steps = 5;
  options.bucket_size_bytes = -1;
  EXPECT_THAT(MakePlan(Layout(SmallSpec()), options),
              StatusIs(kInvalid, HasSubstr("bucket_size_bytes")));
}

TEST(PlannerTest, PlanHash_TwoCalls_Equal) {
  const JobLayout layout = Layout(SmallSpec());
  absl::StatusOr<v1::Plan> a = MakePlan(layout, Options(kLpt));
  absl::StatusOr<v1::Plan> b = MakePlan(layout, Options(kLpt));
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ(a->hash().size(), 16u);
  EXPECT_EQ(a->hash(), b->hash());
  EXPECT_EQ(PlanHash(*a), a->hash());  // the hash field is excluded
}

TEST(PlannerTest, PlanHash_Golden_StableAcrossProcesses) {
  // FNV-1a 64 of the serialized plan: a constant, unlike absl::Hash. If the
  // Plan message or the planner changes on purpose, update this value.
  absl::StatusOr<v1::Plan> plan = MakePlan(Layout(SmallSpec()), Options(kLpt));
  ASSERT_THAT(plan, IsOk());
  // The plan carries the compact schedule (header and derivation); its
  // mode is an enum (ScheduleMode).
  EXPECT_EQ(plan->hash(), "a73133a80ddc1e5b");
}

TEST(PlannerTest, PlanHash_OwnerChanged_Differs) {
  absl::StatusOr<v1::Plan> plan = MakePlan(Layout(SmallSpec()), Options(kLpt));
  ASSERT_THAT(plan, IsOk());
  v1::Plan changed = *plan;
  changed.mutable_matrices(0)->set_owner(0);
  EXPECT_NE(PlanHash(changed), plan->hash());
}

TEST(PlannerTest, PlanHash_JobIdCovered) {
  PlannerOptions options = Options(kLpt);
  absl::StatusOr<v1::Plan> a = MakePlan(Layout(SmallSpec()), options);
  options.job_id = "other";
  absl::StatusOr<v1::Plan> b = MakePlan(Layout(SmallSpec()), options);
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ(b->job_id(), "other");
  EXPECT_NE(a->hash(), b->hash());
}

class ValidatePlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    layout_ =
        Layout(MakeSpec({{"dp_shard", 4}}, {{"fc1", 10, 7, {"Shard(0)"}},
                                            {"fc2", 3, 5, {"Shard(0)"}},
                                            {"fc3", 6, 8, {"Replicate()"}}}));
    absl::StatusOr<v1::Plan> plan = MakePlan(layout_, Options(kLpt));
    ASSERT_THAT(plan, IsOk());
    plan_ = *plan;
    plan_.clear_hash();  // corruptions below would otherwise trip the hash
    ASSERT_THAT(ValidatePlan(plan_, layout_), IsOk());
  }
  JobLayout layout_;
  v1::Plan plan_;
};

TEST_F(ValidatePlanTest,
       ValidatePlan_OwnerHoldsNothing_ReturnsInvalidArgument) {
  plan_.mutable_matrices(1)->set_owner(3);  // fc2's rank-3 shard is empty
  EXPECT_THAT(
      ValidatePlan(plan_, layout_),
      StatusIs(kInvalid, AllOf(HasSubstr("\"fc2\""),
                               HasSubstr("rank 3 which holds no shard"))));
}

TEST_F(ValidatePlanTest, ValidatePlan_OwnerOutOfRange_ReturnsInvalidArgument) {
  plan_.mutable_matrices(0)->set_owner(4);
  EXPECT_THAT(ValidatePlan(plan_, layout_),
              StatusIs(kInvalid, HasSubstr("owner rank 4 outside [0, 4)")));
}

TEST_F(ValidatePlanTest,
       ValidatePlan_MatrixInTwoBuckets_ReturnsInvalidArgument) {
  v1::Bucket* extra = plan_.add_buckets();
  extra->set_index(plan_.buckets_size() - 1);
  extra->add_matrices(0);
  extra->set_bytes(4 * 70);
  EXPECT_THAT(ValidatePlan(plan_, layout_),
              StatusIs(kInvalid, HasSubstr("is in buckets")));
}

TEST_F(ValidatePlanTest, ValidatePlan_MatrixInNoBucket_ReturnsInvalidArgument) {
  v1::Bucket* b = plan_.mutable_buckets(plan_.matrices(2).bucket());
  std::vector<int> kept;
  for (int i : b->matrices()) {
    if (i != 2) kept.push_back(i);
  }
  b->clear_matrices();
  for (int i : kept) b->add_matrices(i);
  b->set_bytes(b->bytes() - 4 * 48);
  EXPECT_THAT(ValidatePlan(plan_, layout_),
              StatusIs(kInvalid, HasSubstr("\"fc3\") is in no bucket")));
}

TEST_F(ValidatePlanTest, ValidatePlan_BadBucketIndex_ReturnsInvalidArgument) {
  plan_.mutable_buckets(0)->add_matrices(9);
  EXPECT_THAT(ValidatePlan(plan_, layout_),
              StatusIs(kInvalid, HasSubstr("lists matrix 9")));
}

TEST_F(ValidatePlanTest,
       ValidatePlan_LoadsInconsistent_ReturnsInvalidArgument) {
  // Move fc3 (replicated, no gather either way) to another rank without
  // fixing the loads.
  v1::MatrixPlan* m = plan_.mutable_matrices(2);
  m->set_owner((m->owner() + 1) % 4);
  EXPECT_THAT(ValidatePlan(plan_, layout_),
              StatusIs(kInvalid, HasSubstr("plan load of rank")));
}

TEST_F(ValidatePlanTest, ValidatePlan_MissingMatrix_ReturnsInvalidArgument) {
  plan_.mutable_matrices()->RemoveLast();
  EXPECT_THAT(ValidatePlan(plan_, layout_),
              StatusIs(kInvalid, HasSubstr("2 matrices but the job has 3")));
}

TEST_F(ValidatePlanTest, ValidatePlan_StaleHash_ReturnsInvalidArgument) {
  plan_.set_hash("0123456789abcdef");
  EXPECT_THAT(ValidatePlan(plan_, layout_),
              StatusIs(kInvalid, HasSubstr("does not match")));
}

TEST(PlannerTest, MakePlan_Pipeline_EveryMatrixOwnedInsideItsStage) {
  // Mesh pp=2 x tp=4 (rank = 4*pp + tp); layer l on stage l / 2.
  const JobLayout layout = Layout(testing::PipelineSpec());
  for (auto policy : {kLpt, kRoundRobin}) {
    absl::StatusOr<v1::Plan> plan = MakePlan(layout, Options(policy));
    ASSERT_THAT(plan, IsOk());
    ASSERT_EQ(plan->matrices_size(), 8);
    for (const v1::MatrixPlan& m : plan->matrices()) {
      const int stage = m.param_index() / 4;  // 2 params per layer
      EXPECT_EQ(m.owner() / 4, stage) << m.param() << " owned by rank "
                                      << m.owner() << " outside its stage";
      EXPECT_EQ(m.param(), layout.params[m.param_index()].name);
      EXPECT_EQ(m.slice(), 0);
      // Gathered within tp only: the owner holds a quarter (or, for wo
      // [8, 6] over tp=4, 2 of 6 columns).
      const int64_t held = layout.matrices[m.index()].boxes[m.owner()].numel();
      EXPECT_EQ(m.gather_bytes(), 4 * (m.rows() * m.cols() - held));
      EXPECT_GT(held, 0);
    }
    // Each stage's 4 ranks share its load; both stages carry the same.
    double stage_load[2] = {0, 0};
    for (const v1::RankLoad& l : plan->loads()) {
      stage_load[l.rank() / 4] += l.ns_flops();
    }
    EXPECT_DOUBLE_EQ(stage_load[0], stage_load[1]);
    EXPECT_THAT(ValidatePlan(*plan, layout), IsOk());
  }
}

TEST(PlannerTest, MakePlan_ExpertStack_SlicesNumberedAndOwnedInEpGroup) {
  // Mesh dp_shard=2 x ep=4 (rank = 4*dp_shard + ep): expert e of a stack
  // lives on ep rank e / 2.
  const JobLayout layout = Layout(testing::ExpertSpec());
  for (auto policy : {kLpt, kRoundRobin}) {
    absl::StatusOr<v1::Plan> plan = MakePlan(layout, Options(policy));
    ASSERT_THAT(plan, IsOk());
    ASSERT_EQ(plan->matrices_size(), 17);
    EXPECT_EQ(plan->matrices(0).param(), "attn");
    for (int i = 1; i < 17; ++i) {
      const v1::MatrixPlan& m = plan->matrices(i);
      const int e = (i - 1) % 8;
      EXPECT_EQ(m.index(), i);
      EXPECT_EQ(m.slice(), e);
      EXPECT_EQ(m.param_index(), i < 9 ? 1 : 2);
      EXPECT_EQ(m.param(), i < 9 ? "experts.w1" : "experts.w2");
      EXPECT_EQ(m.owner() % 4, e / 2)
          << m.param() << "[" << e << "] owned outside its ep group";
      if (i < 9) {
        // Whole slices on both dp ranks of the group: nothing to gather.
        EXPECT_EQ(m.gather_bytes(), 0) << "experts.w1[" << e << "]";
        EXPECT_EQ(m.rows(), 6);
        EXPECT_EQ(m.cols(), 4);
      } else {
        // Rows split over dp_shard only: half of [4, 6] travels.
        EXPECT_EQ(m.gather_bytes(), 4 * 12) << "experts.w2[" << e << "]";
      }
    }
    EXPECT_THAT(ValidatePlan(*plan, layout), IsOk());
  }
}

TEST(PlannerTest, MakePlan_ExpertStackRoundRobin_CyclesWithinHolders) {
  const JobLayout layout = Layout(testing::ExpertSpec());
  absl::StatusOr<v1::Plan> plan = MakePlan(layout, Options(kRoundRobin));
  ASSERT_THAT(plan, IsOk());
  // experts.w1[0] is matrix 1, held by ranks {0, 4}: 1 % 2 = 1 -> rank 4.
  EXPECT_EQ(plan->matrices(1).owner(), 4);
  // experts.w1[3] is matrix 4, held by ranks {1, 5}: 4 % 2 = 0 -> rank 1.
  EXPECT_EQ(plan->matrices(4).owner(), 1);
}

TEST(PlannerTest, MakePlan_RequestedOwnersPerSlice_Override) {
  std::vector<v1::RankManifest> m = Manifests(testing::ExpertSpec());
  std::vector<int> owners = {7};
  for (int e = 0; e < 8; ++e) owners.push_back(4 + e / 2);
  for (int e = 0; e < 8; ++e) owners.push_back(e / 2);
  for (auto& mm : m) {
    for (int o : owners) mm.add_requested_owners(o);
  }
  absl::StatusOr<JobLayout> layout = ValidateManifests(m);
  ASSERT_THAT(layout, IsOk());
  absl::StatusOr<v1::Plan> plan = MakePlan(*layout, Options(kLpt));
  ASSERT_THAT(plan, IsOk());
  EXPECT_EQ(Owners(*plan), owners);
  EXPECT_THAT(ValidatePlan(*plan, *layout), IsOk());
}

TEST(PlannerTest, ValidatePlan_SliceMismatch_ReturnsInvalidArgument) {
  const JobLayout layout = Layout(testing::ExpertSpec());
  absl::StatusOr<v1::Plan> plan = MakePlan(layout, Options(kLpt));
  ASSERT_THAT(plan, IsOk());
  v1::Plan bad = *plan;
  bad.clear_hash();
  bad.mutable_matrices(3)->set_slice(5);
  EXPECT_THAT(ValidatePlan(bad, layout),
              StatusIs(kInvalid, AllOf(HasSubstr("plan matrix 3"),
                                       HasSubstr("\"experts.w1[2]\""),
                                       HasSubstr("slice 5"))));
}

TEST(PlannerTest,
     ValidatePlan_SliceOwnedOutsideEpGroup_ReturnsInvalidArgument) {
  const JobLayout layout = Layout(testing::ExpertSpec());
  absl::StatusOr<v1::Plan> plan = MakePlan(layout, Options(kLpt));
  ASSERT_THAT(plan, IsOk());
  v1::Plan bad = *plan;
  bad.clear_hash();
  bad.mutable_matrices(8)->set_owner(0);  // experts.w1[7] lives on ep rank 3
  EXPECT_THAT(
      ValidatePlan(bad, layout),
      StatusIs(kInvalid, AllOf(HasSubstr("\"experts.w1[7]\""),
                               HasSubstr("rank 0 which holds no shard"),
                               HasSubstr("coordinate dp_shard=0, ep=0"))));
}

// The shipped real-model specs (examples/specs/models): both policies plan
// quickly, the plans validate, and LPT balances at least as well as
// round-robin.
struct ModelSpecCase {
  std::string file;
  int matrices;
  int world;
};

class ModelSpecTest : public ::testing::TestWithParam<ModelSpecCase> {};

TEST_P(ModelSpecTest, MakePlan_RealModelSpec_PlansAndLptNoWorseThanRoundRobin) {
  const ModelSpecCase& c = GetParam();
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::JobSpec> spec =
      LoadJobSpec("examples/specs/models/" + c.file);
  ASSERT_THAT(spec, IsOk());
  absl::StatusOr<std::vector<v1::RankManifest>> manifests =
      ManifestsFromSpec(*spec);
  ASSERT_THAT(manifests, IsOk());
  absl::StatusOr<JobLayout> layout = ValidateManifests(*manifests);
  ASSERT_THAT(layout, IsOk());
  EXPECT_EQ(layout->world_size, c.world);
  ASSERT_EQ(static_cast<int>(layout->matrices.size()), c.matrices);
  double ratio[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    absl::StatusOr<v1::Plan> plan =
        MakePlan(*layout, Options(k == 0 ? kLpt : kRoundRobin));
    ASSERT_THAT(plan, IsOk());
    EXPECT_THAT(ValidatePlan(*plan, *layout), IsOk());
    ASSERT_GT(plan->mean_load_flops(), 0);
    ratio[k] = plan->max_load_flops() / plan->mean_load_flops();
    // Owned inside the sub-mesh / ep group: the owner holds a box.
    for (const v1::MatrixPlan& m : plan->matrices()) {
      ASSERT_FALSE(layout->matrices[m.index()].boxes[m.owner()].empty());
    }
  }
  EXPECT_LE(ratio[0], ratio[1] + 1e-12) << c.file;
  EXPECT_LT(absl::ToDoubleSeconds(absl::Now() - start), 5.0) << c.file;
}

INSTANTIATE_TEST_SUITE_P(
    Models, ModelSpecTest,
    ::testing::Values(ModelSpecCase{"gpt2_124m.json", 48, 8},
                      ModelSpecCase{"llama3_8b_tp8_dp8.json", 224, 64},
                      ModelSpecCase{"moe_ep8.json", 8 * (4 + 3 * 8), 16},
                      ModelSpecCase{"pp4_tp2.json", 8 * 7, 8}),
    [](const ::testing::TestParamInfo<ModelSpecCase>& info) {
      std::string name = info.param.file.substr(0, info.param.file.find('.'));
      return name;
    });

TEST(PlannerTest, MakePlan_MoeSpec_ExpertSlicesNeverGatheredAcrossEp) {
  absl::StatusOr<v1::JobSpec> spec =
      LoadJobSpec("examples/specs/models/moe_ep8.json");
  ASSERT_THAT(spec, IsOk());
  const JobLayout layout = Layout(*spec);
  absl::StatusOr<v1::Plan> plan = MakePlan(layout, Options(kLpt));
  ASSERT_THAT(plan, IsOk());
  int slices = 0;
  for (const v1::MatrixPlan& m : plan->matrices()) {
    if (!layout.params[m.param_index()].is_stack()) continue;
    ++slices;
    // Mesh dp_shard=2 x ep=8: expert e on ep rank e; rows split over the
    // 2 dp_shard ranks of its group, so the owner gathers exactly half.
    EXPECT_EQ(m.owner() % 8, m.slice()) << m.param() << "[" << m.slice() << "]";
    EXPECT_EQ(m.gather_bytes(), 4 * m.rows() * m.cols() / 2);
  }
  EXPECT_EQ(slices, 8 * 3 * 8);
}

TEST(PlannerTest, MakePlan_PpSpec_LayersOwnedOnTheirStage) {
  absl::StatusOr<v1::JobSpec> spec =
      LoadJobSpec("examples/specs/models/pp4_tp2.json");
  ASSERT_THAT(spec, IsOk());
  const JobLayout layout = Layout(*spec);
  for (auto policy : {kLpt, kRoundRobin}) {
    absl::StatusOr<v1::Plan> plan = MakePlan(layout, Options(policy));
    ASSERT_THAT(plan, IsOk());
    for (const v1::MatrixPlan& m : plan->matrices()) {
      const int layer = m.param_index() / 7;
      EXPECT_EQ(m.owner() / 2, layer / 2) << m.param();  // rank = 2*pp + tp
    }
  }
}

TEST(PlannerTest, ParsePolicy_KnownAndUnknown) {
  EXPECT_THAT(ParsePolicy("lpt"), IsOk());
  EXPECT_EQ(*ParsePolicy("round_robin"), kRoundRobin);
  EXPECT_THAT(ParsePolicy("greedy"),
              StatusIs(kInvalid, HasSubstr("\"greedy\"")));
}

const std::vector<std::string> kNames = {"w0", "w1", "w2", "w3"};

TEST(OwnersFromAssignmentTest, OwnersFromAssignment_Complete_ReturnsOwners) {
  absl::StatusOr<std::vector<int>> owners =
      OwnersFromAssignment({{0, {0, 3}}, {2, {1}}, {3, {2}}}, 4, 4, kNames);
  ASSERT_THAT(owners, IsOk());
  EXPECT_THAT(*owners, ElementsAre(0, 2, 3, 0));
}

TEST(OwnersFromAssignmentTest,
     OwnersFromAssignment_Missing_ReturnsInvalidArgument) {
  EXPECT_THAT(OwnersFromAssignment({{0, {0, 1}}, {1, {3}}}, 4, 4, kNames),
              StatusIs(kInvalid, HasSubstr("parameter \"w2\" (index 2) is "
                                           "assigned to no rank")));
}

TEST(OwnersFromAssignmentTest,
     OwnersFromAssignment_Duplicate_ReturnsInvalidArgument) {
  EXPECT_THAT(
      OwnersFromAssignment({{0, {0, 1}}, {1, {2}}, {3, {0, 3}}}, 4, 4, kNames),
      StatusIs(kInvalid, HasSubstr("parameter \"w0\" (index 0) is assigned to "
                                   "ranks 0 and 3")));
}

TEST(OwnersFromAssignmentTest,
     OwnersFromAssignment_RankOutOfRange_ReturnsInvalidArgument) {
  EXPECT_THAT(OwnersFromAssignment({{0, {0, 2, 3}}, {7, {1}}}, 4, 4, kNames),
              StatusIs(kInvalid, HasSubstr("assign_fn returned rank 7 for "
                                           "parameter \"w1\" (index 1) but "
                                           "world size is 4")));
}

TEST(OwnersFromAssignmentTest,
     OwnersFromAssignment_IndexOutOfRange_ReturnsInvalidArgument) {
  EXPECT_THAT(OwnersFromAssignment({{0, {0, 1, 2, 3, 4}}}, 4, 4, kNames),
              StatusIs(kInvalid, HasSubstr("parameter index 4")));
}

}  // namespace
}  // namespace muon
