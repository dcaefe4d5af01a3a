// Tests of server/coordinator_service.h driven directly (no gRPC).
#include "server/coordinator_service.h"

#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/wire_names.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/planner.h"
#include "plan/schedule.h"
#include "tests/server/fake_clock.h"
#include "tests/server/host_join.h"
#include "tests/server/test_specs.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::muon::testing::FakeClock;
using ::muon::testing::FourRankSpec;
using ::muon::testing::HostJoin;
using ::muon::testing::MakeSpec;
using ::muon::testing::Manifests;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

v1::JoinRequest JoinRequestFor(const v1::RankManifest& manifest,
                               int64_t timeout_ms = 2000) {
  v1::JoinRequest request;
  request.set_job_id("job");
  *request.mutable_manifest() = manifest;
  request.set_incarnation(100 + manifest.rank());
  request.set_timeout_ms(timeout_ms);
  return request;
}

class CoordinatorServiceTest : public ::testing::Test {
 protected:
  CoordinatorService::Options DefaultOptions() {
    CoordinatorService::Options options;
    options.job_id = "job";
    options.default_join_timeout = absl::Seconds(2);
    options.heartbeat_timeout = absl::Seconds(30);
    options.now = [this] { return clock_.Now(); };
    return options;
  }

  // Joins every manifest from its own thread; results[r] is rank r's.
  std::vector<absl::StatusOr<v1::JoinResponse>> JoinAll(
      CoordinatorService& service,
      const std::vector<v1::RankManifest>& manifests,
      int64_t timeout_ms = 2000) {
    std::vector<absl::StatusOr<v1::JoinResponse>> results(
        manifests.size(), absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (size_t r = 0; r < manifests.size(); ++r) {
      threads.emplace_back([&, r] {
        results[r] = service.Join(JoinRequestFor(manifests[r], timeout_ms));
      });
    }
    for (std::thread& t : threads) t.join();
    return results;
  }

  FakeClock clock_;
};

TEST_F(CoordinatorServiceTest, Join_AllRanks_SamePlanToEveryRank) {
  CoordinatorService service(DefaultOptions());
  auto results = JoinAll(service, Manifests(FourRankSpec()));
  ASSERT_EQ(results.size(), 4u);
  for (const auto& r : results) ASSERT_THAT(r, IsOk());
  const v1::Plan& plan = results[0]->plan();
  EXPECT_EQ(plan.job_id(), "job");
  EXPECT_EQ(plan.world_size(), 4);
  EXPECT_EQ(plan.matrices_size(), 3);
  EXPECT_EQ(plan.policy(), "lpt");
  EXPECT_FALSE(plan.hash().empty());
  // Each rank gets the whole plan's matrices, buckets and hash with the
  // compact schedule (PlanForRank; each rank derives its own operations);
  // GetPlan has the whole plan.
  absl::StatusOr<v1::Plan> full = service.GetPlan(v1::GetPlanRequest());
  ASSERT_THAT(full, IsOk());
  EXPECT_EQ(full->hash(), plan.hash());
  EXPECT_EQ(full->loads_size(), 4);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(results[r]->plan().SerializeAsString(),
              PlanForRank(*full, r).SerializeAsString());
    EXPECT_EQ(results[r]->plan().schedule().ranks_size(), 0);
    EXPECT_EQ(results[r]->plan().schedule().derivation(), kScheduleDerivation);
  }
  absl::StatusOr<v1::JobInfo> job = service.GetJob(v1::GetJobRequest());
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->state(), v1::JOB_STATE_PLANNED);
  EXPECT_EQ(job->ranks_joined(), 4);
  EXPECT_EQ(job->plan_hash(), plan.hash());
  absl::StatusOr<v1::Plan> got = service.GetPlan(v1::GetPlanRequest());
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->hash(), plan.hash());
}

TEST_F(CoordinatorServiceTest,
       Join_DisagreeingManifests_SameInvalidArgumentToEveryRank) {
  CoordinatorService service(DefaultOptions());
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  m[2].mutable_params(0)->set_global_shape(1, 9);
  auto results = JoinAll(service, m);
  for (const auto& r : results) {
    EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument,
                            AllOf(HasSubstr("\"fc1.weight\""),
                                  HasSubstr("rank 2 reports global shape "
                                            "[10, 9] but rank 0 reports "
                                            "[10, 7]"))));
    EXPECT_EQ(r.status(), results[0].status());
  }
  absl::StatusOr<v1::JobInfo> job = service.GetJob(v1::GetJobRequest());
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job->error(), HasSubstr("fc1.weight"));
  EXPECT_THAT(service.GetPlan(v1::GetPlanRequest()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("planning failed")));
  absl::StatusOr<v1::ListRanksResponse> ranks =
      service.ListRanks(v1::ListRanksRequest());
  ASSERT_THAT(ranks, IsOk());
  for (const v1::RankStatus& s : ranks->ranks())
    EXPECT_EQ(s.state(), v1::RANK_STATE_FAILED);
  // A late retry sees the same error.
  EXPECT_EQ(service.Join(JoinRequestFor(m[0])).status(), results[0].status());
}

TEST_F(CoordinatorServiceTest,
       Join_PipelineRanksListDifferentParams_OnePlanToEveryRank) {
  CoordinatorService service(DefaultOptions());
  // Mesh pp=2 x tp=4: ranks 0-3 list layers 0-1, ranks 4-7 layers 2-3.
  const std::vector<v1::RankManifest> manifests =
      Manifests(testing::PipelineSpec());
  ASSERT_EQ(manifests.size(), 8u);
  ASSERT_NE(manifests[0].params(0).name(), manifests[4].params(0).name());
  auto results = JoinAll(service, manifests);
  for (const auto& r : results) ASSERT_THAT(r, IsOk());
  const v1::Plan& plan = results[0]->plan();
  EXPECT_EQ(plan.world_size(), 8);
  ASSERT_EQ(plan.matrices_size(), 8);  // the union of both stages
  for (const auto& r : results) {      // the same plan for every rank
    EXPECT_EQ(PlanForRank(r->plan(), -1).SerializeAsString(),
              PlanForRank(plan, -1).SerializeAsString());
  }
  for (const v1::MatrixPlan& m : plan.matrices()) {
    EXPECT_EQ(m.owner() / 4, m.param_index() / 4)
        << m.param() << " owned outside its stage";
  }
}

TEST_F(CoordinatorServiceTest,
       Join_PipelineRankMissingStageParam_SameErrorToEveryRank) {
  CoordinatorService service(DefaultOptions());
  std::vector<v1::RankManifest> manifests = Manifests(testing::PipelineSpec());
  manifests[5].mutable_params()->DeleteSubrange(2, 1);  // layers.3.attn.wq
  auto results = JoinAll(service, manifests);
  for (const auto& r : results) {
    EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument,
                            HasSubstr("parameter \"layers.3.attn.wq\" "
                                      "(sub-mesh pp=1) is missing on rank 5 "
                                      "(coordinate pp=1, tp=1)")));
    EXPECT_EQ(r.status(), results[0].status());
  }
}

TEST_F(CoordinatorServiceTest, GetAssignments_ExpertStack_NamesSlices) {
  CoordinatorService service(DefaultOptions());
  auto results = JoinAll(service, Manifests(testing::ExpertSpec()));
  for (const auto& r : results) ASSERT_THAT(r, IsOk());
  absl::StatusOr<v1::GetAssignmentsResponse> a =
      service.GetAssignments(v1::GetAssignmentsRequest());
  ASSERT_THAT(a, IsOk());
  std::vector<std::string> all;
  for (const v1::RankAssignment& r : a->ranks()) {
    for (const std::string& m : r.matrices()) {
      // Expert e of a stack lives on ep rank e / 2 (rank = 4*dp + ep).
      if (m.rfind("experts.w1[", 0) == 0) {
        const int e = m[11] - '0';
        EXPECT_EQ(r.rank() % 4, e / 2) << m;
      }
      all.push_back(m);
    }
  }
  EXPECT_EQ(all.size(), 17u);
  EXPECT_THAT(all, ::testing::Contains("experts.w2[7]"));
  EXPECT_THAT(all, ::testing::Contains("attn"));
}

TEST_F(CoordinatorServiceTest, Join_MissingRanks_DeadlineExceededNamingThem) {
  CoordinatorService service(DefaultOptions());
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  m.resize(2);  // ranks 0 and 1 of 4
  const absl::Time start = absl::Now();
  auto results = JoinAll(service, m, /*timeout_ms=*/200);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  for (const auto& r : results) {
    EXPECT_THAT(r, StatusIs(absl::StatusCode::kDeadlineExceeded,
                            AllOf(HasSubstr("ranks [2, 3]"),
                                  HasSubstr("2 of 4 joined"))));
  }
  absl::StatusOr<v1::JobInfo> job = service.GetJob(v1::GetJobRequest());
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->state(), v1::JOB_STATE_WAITING);
  EXPECT_THAT(service.GetPlan(v1::GetPlanRequest()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("2 of 4 ranks joined")));
}

TEST_F(CoordinatorServiceTest, Join_DefaultTimeout_UsedWhenRequestHasNone) {
  CoordinatorService::Options options = DefaultOptions();
  options.default_join_timeout = absl::Milliseconds(100);
  CoordinatorService service(options);
  EXPECT_THAT(service.Join(JoinRequestFor(Manifests(FourRankSpec())[1],
                                          /*timeout_ms=*/0)),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("ranks [0, 2, 3]")));
}

// A timeout in a large world names at most 64 missing ranks, then a count
// (the message and the log line stay small whatever the world size).
TEST_F(CoordinatorServiceTest, Join_TimeoutWithManyMissing_Names64AndCount) {
  CoordinatorService service(DefaultOptions());
  const std::vector<v1::RankManifest> m =
      Manifests(MakeSpec({{"dp_shard", 1000}}, {{"w", 4, 4, {"Replicate()"}}}));
  ASSERT_EQ(m.size(), 1000u);
  absl::StatusOr<v1::JoinResponse> r =
      service.Join(JoinRequestFor(m[0], /*timeout_ms=*/50));
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kDeadlineExceeded,
                          AllOf(HasSubstr("ranks [1, 2, 3, "),
                                HasSubstr(", 63, 64 and 935 more]"),
                                HasSubstr("1 of 1000 joined"))));
  EXPECT_THAT(r.status().message(), Not(HasSubstr(", 65")));
}

TEST_F(CoordinatorServiceTest, Join_RetryAfterTimeout_ThenSucceeds) {
  CoordinatorService service(DefaultOptions());
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  EXPECT_THAT(
      service.Join(JoinRequestFor(m[0], 50)),
      StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("[1, 2, 3]")));
  auto results = JoinAll(service, m);
  for (const auto& r : results) EXPECT_THAT(r, IsOk());
}

TEST_F(CoordinatorServiceTest, Join_DifferentIncarnation_ReturnsAborted) {
  CoordinatorService service(DefaultOptions());
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  EXPECT_THAT(service.Join(JoinRequestFor(m[1], 20)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("rank")));
  v1::JoinRequest again = JoinRequestFor(m[1], 20);
  again.set_incarnation(7);
  EXPECT_THAT(service.Join(again),
              StatusIs(absl::StatusCode::kAborted,
                       AllOf(HasSubstr("rank 1"), HasSubstr("incarnation 101"),
                             HasSubstr("incarnation 7"))));
}

TEST_F(CoordinatorServiceTest, Join_WrongJobId_ReturnsInvalidArgument) {
  CoordinatorService service(DefaultOptions());
  v1::JoinRequest request = JoinRequestFor(Manifests(FourRankSpec())[0]);
  request.set_job_id("other");
  EXPECT_THAT(service.Join(request),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("\"other\""), HasSubstr("\"job\""))));
  EXPECT_THAT(service.GetJob([] {
    v1::GetJobRequest r;
    r.set_job_id("other");
    return r;
  }()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("other")));
}

TEST_F(CoordinatorServiceTest,
       Join_WorldSizeDisagreesWithOptions_RejectedAloneJobKeepsWaiting) {
  CoordinatorService::Options options = DefaultOptions();
  options.world_size = 2;
  CoordinatorService service(options);
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  EXPECT_THAT(service.Join(JoinRequestFor(m[0])),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank 0 reports world size 4 but the job's "
                                 "world size is 2")));
  // A Join that cannot belong to the job does not fail it.
  EXPECT_EQ(service.GetJob(v1::GetJobRequest())->state(),
            v1::JOB_STATE_WAITING);
}

TEST_F(CoordinatorServiceTest,
       Join_RogueRankOutOfRange_RejectedAloneOthersStillPlan) {
  CoordinatorService service(DefaultOptions());
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  absl::StatusOr<v1::JoinResponse> waiting = absl::UnknownError("not run");
  std::thread t([&] { waiting = service.Join(JoinRequestFor(m[0], 2000)); });
  // Wait (bounded) until rank 0 is registered.
  for (int i = 0; i < 200; ++i) {
    if (service.GetJob(v1::GetJobRequest())->ranks_joined() == 1) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  v1::RankManifest bad = m[1];
  bad.set_rank(9);
  EXPECT_THAT(service.Join(JoinRequestFor(bad)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank 9 but ranks must be in [0, 4)")));
  EXPECT_EQ(service.GetJob(v1::GetJobRequest())->state(),
            v1::JOB_STATE_WAITING);
  // The real ranks still join and plan; the waiting rank gets the plan.
  std::vector<absl::StatusOr<v1::JoinResponse>> rest(3);
  std::vector<std::thread> joiners;
  for (int r = 1; r < 4; ++r) {
    joiners.emplace_back(
        [&, r] { rest[r - 1] = service.Join(JoinRequestFor(m[r], 2000)); });
  }
  for (std::thread& j : joiners) j.join();
  t.join();
  ASSERT_THAT(waiting, IsOk());
  for (const auto& r : rest) {
    ASSERT_THAT(r, IsOk());
    EXPECT_EQ(r->plan().hash(), waiting->plan().hash());
  }
}

TEST_F(CoordinatorServiceTest, Join_ManifestPolicyAndBucketSize_UsedByPlanner) {
  CoordinatorService service(DefaultOptions());
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  for (auto& mm : m) {
    mm.mutable_execution()->set_assignment_policy("round_robin");
    mm.mutable_execution()->set_bucket_size_bytes(1 << 20);
  }
  auto results = JoinAll(service, m);
  ASSERT_THAT(results[0], IsOk());
  EXPECT_EQ(results[0]->plan().policy(), "round_robin");
  EXPECT_EQ(results[0]->plan().buckets_size(), 1);
}

TEST_F(CoordinatorServiceTest, Join_UnknownManifestPolicy_FailsJob) {
  CoordinatorService service(DefaultOptions());
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  for (auto& mm : m) mm.mutable_execution()->set_assignment_policy("fastest");
  for (const auto& r : JoinAll(service, m)) {
    EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument,
                            HasSubstr("\"fastest\"")));
  }
}

// A rank that could not create its optimizer joins with its error: the
// ranks already waiting, and those joining later, fail at once with it
// naming that rank, instead of waiting out their timeouts; the erring
// rank gets it too. Its rank and world size are still checked first.
TEST_F(CoordinatorServiceTest,
       Join_RankWithCreationError_FailsEveryJoinAtOnce) {
  CoordinatorService service(DefaultOptions());
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  const std::string want =
      "rank 2 could not create its optimizer: rank 2: parameter \"w\" is "
      "int8";
  absl::StatusOr<v1::JoinResponse> waiting = absl::UnknownError("not run");
  const absl::Time start = absl::Now();
  std::thread t([&] { waiting = service.Join(JoinRequestFor(m[0], 60000)); });
  // Wait (bounded) until rank 0 is registered.
  for (int i = 0; i < 200; ++i) {
    if (service.GetJob(v1::GetJobRequest())->ranks_joined() == 1) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  v1::JoinRequest bad_world = JoinRequestFor(m[2]);
  bad_world.mutable_manifest()->set_world_size(0);
  bad_world.set_error("x");
  EXPECT_THAT(
      service.Join(bad_world),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("world size 0")));
  v1::JoinRequest failed;
  failed.set_job_id("job");
  failed.set_incarnation(102);
  failed.mutable_manifest()->set_rank(2);
  failed.mutable_manifest()->set_world_size(4);
  failed.set_error("rank 2: parameter \"w\" is int8");
  EXPECT_THAT(service.Join(failed),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(want)));
  t.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  EXPECT_THAT(waiting,
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(want)));
  EXPECT_THAT(service.Join(JoinRequestFor(m[1])),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(want)));
  absl::StatusOr<v1::JobInfo> job = service.GetJob(v1::GetJobRequest());
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->state(), v1::JOB_STATE_FAILED);
  // Once every rank it knows (the failed one too) has been silent for the
  // heartbeat timeout, the next job starts afresh: a Join waits again.
  clock_.Advance(absl::Seconds(31));
  EXPECT_THAT(service.Join(JoinRequestFor(m[0], 50)),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("1 of 4 joined")));
  EXPECT_GT(service.generation(), 0);
}

// In a planned job no rank waits in a Join: a rank's creation error (a
// second optimizer's) is returned to it, and the running job goes on.
TEST_F(CoordinatorServiceTest, Join_CreationErrorAfterPlanned_JobGoesOn) {
  CoordinatorService service(DefaultOptions());
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  auto results = JoinAll(service, m);
  ASSERT_THAT(results[1], IsOk());
  v1::JoinRequest failed = JoinRequestFor(m[1]);
  failed.set_error("bad second optimizer");
  EXPECT_THAT(service.Join(failed),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank 1 could not create its optimizer: bad "
                                 "second optimizer")));
  EXPECT_EQ(service.GetJob(v1::GetJobRequest())->state(),
            v1::JOB_STATE_PLANNED);
  EXPECT_THAT(service.Join(JoinRequestFor(m[1])), IsOk());
}

TEST_F(CoordinatorServiceTest, Join_AfterPlanned_SameIncarnationGetsPlan) {
  CoordinatorService service(DefaultOptions());
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  auto results = JoinAll(service, m);
  ASSERT_THAT(results[3], IsOk());
  absl::StatusOr<v1::JoinResponse> again = service.Join(JoinRequestFor(m[3]));
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(again->plan().hash(), results[3]->plan().hash());
}

// A second optimizer of a rank with other settings (here the step started
// during backward, which orders buckets otherwise) cannot take the plan
// made for the first: refused, naming the rank; the same manifest still
// gets the plan.
TEST_F(CoordinatorServiceTest,
       Join_AfterPlannedWithOtherManifest_FailedPreconditionNamingRank) {
  CoordinatorService service(DefaultOptions());
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  auto results = JoinAll(service, m);
  ASSERT_THAT(results[3], IsOk());
  v1::RankManifest other = m[3];
  other.mutable_execution()->set_overlap_backward(true);
  EXPECT_THAT(service.Join(JoinRequestFor(other)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("rank 3 joined job \"job\" again after it "
                                 "was planned, with another manifest")));
  EXPECT_THAT(service.Join(JoinRequestFor(m[3])), IsOk());
}

TEST_F(CoordinatorServiceTest, Shutdown_WakesBlockedJoin_WithUnavailable) {
  CoordinatorService service(DefaultOptions());
  absl::StatusOr<v1::JoinResponse> result = absl::UnknownError("not run");
  std::thread t([&] {
    result = service.Join(JoinRequestFor(Manifests(FourRankSpec())[0], 5000));
  });
  absl::SleepFor(absl::Milliseconds(50));
  const absl::Time start = absl::Now();
  service.Shutdown();
  t.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_THAT(result, StatusIs(absl::StatusCode::kUnavailable,
                               HasSubstr("shutting down")));
}

TEST_F(CoordinatorServiceTest, Heartbeat_UnknownRank_ReturnsNotFound) {
  CoordinatorService service(DefaultOptions());
  v1::HeartbeatRequest hb;
  hb.set_rank(3);
  EXPECT_THAT(service.Heartbeat(hb),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("rank 3")));
}

TEST_F(CoordinatorServiceTest, RankStates_JoinReportSilence_ReadyRunningLost) {
  CoordinatorService service(DefaultOptions());
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  for (const auto& r : JoinAll(service, m)) ASSERT_THAT(r, IsOk());

  auto states = [&] {
    std::vector<std::string> out;
    absl::StatusOr<v1::ListRanksResponse> ranks =
        service.ListRanks(v1::ListRanksRequest());
    EXPECT_THAT(ranks, IsOk());
    if (!ranks.ok()) return out;
    for (const v1::RankStatus& s : ranks->ranks())
      out.push_back(WireName(s.state()));
    return out;
  };
  EXPECT_THAT(states(), ::testing::Each("ready"));

  v1::StepReport report;
  report.set_rank(1);
  report.set_incarnation(101);
  report.set_step(7);
  report.set_step_time_s(0.25);
  report.set_matrices_orthogonalized(2);
  report.set_ns_flops(1e9);
  ASSERT_THAT(service.ReportStep(report), IsOk());
  EXPECT_THAT(states(),
              ::testing::ElementsAre("ready", "running", "ready", "ready"));
  absl::StatusOr<v1::ListRanksResponse> ranks =
      service.ListRanks(v1::ListRanksRequest());
  const v1::RankStatus& r1 = ranks->ranks(1);
  EXPECT_EQ(r1.last_step(), 7);
  EXPECT_DOUBLE_EQ(r1.last_step_time_s(), 0.25);
  EXPECT_EQ(r1.matrices_orthogonalized(), 2);
  EXPECT_DOUBLE_EQ(r1.ns_flops(), 1e9);
  EXPECT_EQ(r1.incarnation(), 101u);
  EXPECT_EQ(ranks->ranks(0).last_step(), -1);

  // Ranks 0, 2, 3 keep heart-beating; rank 1 goes silent.
  for (int i = 0; i < 4; ++i) {
    clock_.Advance(absl::Seconds(10));
    for (int r : {0, 2, 3}) {
      v1::HeartbeatRequest hb;
      hb.set_rank(r);
      hb.set_incarnation(100 + r);
      absl::StatusOr<v1::HeartbeatResponse> resp = service.Heartbeat(hb);
      ASSERT_THAT(resp, IsOk());
      // Rank 1 is lost once silent for more than 30 s: the job fails.
      EXPECT_EQ(resp->job_state(),
                i < 3 ? v1::JOB_STATE_RUNNING : v1::JOB_STATE_FAILED);
    }
  }
  EXPECT_THAT(states(),
              ::testing::ElementsAre("ready", "lost", "ready", "ready"));
  v1::HeartbeatRequest hb;
  hb.set_rank(1);
  hb.set_incarnation(101);
  ASSERT_THAT(service.Heartbeat(hb), IsOk());
  EXPECT_THAT(states(),
              ::testing::ElementsAre("ready", "running", "ready", "ready"));
}

TEST_F(CoordinatorServiceTest, RankStates_RealClockShortTimeout_Lost) {
  CoordinatorService::Options options = DefaultOptions();
  options.now = [] { return absl::Now(); };
  options.heartbeat_timeout = absl::Milliseconds(100);
  CoordinatorService service(options);
  for (const auto& r : JoinAll(service, Manifests(FourRankSpec()))) {
    ASSERT_THAT(r, IsOk());
  }
  absl::SleepFor(absl::Milliseconds(150));
  v1::HeartbeatRequest hb;
  hb.set_rank(2);
  hb.set_incarnation(102);
  ASSERT_THAT(service.Heartbeat(hb), IsOk());
  absl::StatusOr<v1::ListRanksResponse> ranks =
      service.ListRanks(v1::ListRanksRequest());
  ASSERT_THAT(ranks, IsOk());
  EXPECT_EQ(ranks->ranks(0).state(), v1::RANK_STATE_LOST);
  EXPECT_EQ(ranks->ranks(2).state(), v1::RANK_STATE_READY);
}

TEST_F(CoordinatorServiceTest, Heartbeat_StaleIncarnation_ReturnsAborted) {
  CoordinatorService service(DefaultOptions());
  for (const auto& r : JoinAll(service, Manifests(FourRankSpec()))) {
    ASSERT_THAT(r, IsOk());
  }
  v1::HeartbeatRequest hb;
  hb.set_rank(0);
  hb.set_incarnation(5);
  EXPECT_THAT(service.Heartbeat(hb),
              StatusIs(absl::StatusCode::kAborted,
                       AllOf(HasSubstr("rank 0"), HasSubstr("incarnation 5"))));
  v1::StepReport report;
  report.set_rank(0);
  report.set_incarnation(5);
  EXPECT_THAT(service.ReportStep(report),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("rank 0")));
}

TEST_F(CoordinatorServiceTest,
       ReportStep_BeforePlan_ReturnsFailedPrecondition) {
  CoordinatorService service(DefaultOptions());
  EXPECT_THAT(service.Join(JoinRequestFor(Manifests(FourRankSpec())[0], 10)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("rank")));
  v1::StepReport report;
  report.set_rank(0);
  report.set_incarnation(100);
  EXPECT_THAT(service.ReportStep(report),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("no plan yet")));
  EXPECT_EQ(service.ListRanks(v1::ListRanksRequest())->ranks(0).state(),
            v1::RANK_STATE_JOINING);
}

TEST_F(CoordinatorServiceTest, GetAssignments_Planned_ListsEveryRank) {
  CoordinatorService service(DefaultOptions());
  for (const auto& r : JoinAll(service, Manifests(FourRankSpec()))) {
    ASSERT_THAT(r, IsOk());
  }
  absl::StatusOr<v1::GetAssignmentsResponse> a =
      service.GetAssignments(v1::GetAssignmentsRequest());
  ASSERT_THAT(a, IsOk());
  ASSERT_EQ(a->ranks_size(), 4);
  int total = 0;
  for (const v1::RankAssignment& r : a->ranks()) total += r.matrices_size();
  EXPECT_EQ(total, 3);
  // LPT: fc1 (13230 FLOPs) -> 0, fc3 (7920) -> 1, fc2 (1170) -> 2.
  EXPECT_THAT(a->ranks(0).matrices(), ::testing::ElementsAre("fc1.weight"));
  EXPECT_THAT(a->ranks(1).matrices(), ::testing::ElementsAre("fc3.weight"));
  EXPECT_THAT(a->ranks(2).matrices(), ::testing::ElementsAre("fc2.weight"));
  EXPECT_EQ(a->ranks(3).matrices_size(), 0);
}

TEST_F(CoordinatorServiceTest, KeyGet_SetByAnotherThread_ReturnsValue) {
  CoordinatorService service(DefaultOptions());
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(30));
    v1::KeySetRequest set;
    set.set_key("gloo/rank0");
    set.set_value("127.0.0.1:1234");
    EXPECT_THAT(service.KeySet(set), IsOk());
  });
  v1::KeyGetRequest get;
  get.set_key("gloo/rank0");
  get.set_timeout_ms(2000);
  absl::StatusOr<v1::KeyGetResponse> got = service.KeyGet(get);
  setter.join();
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->value(), "127.0.0.1:1234");
}

TEST_F(CoordinatorServiceTest, KeyGet_Missing_ReturnsDeadlineExceeded) {
  CoordinatorService service(DefaultOptions());
  v1::KeyGetRequest get;
  get.set_key("nope");
  get.set_timeout_ms(50);
  EXPECT_THAT(service.KeyGet(get), StatusIs(absl::StatusCode::kDeadlineExceeded,
                                            HasSubstr("\"nope\"")));
  v1::KeySetRequest set;
  EXPECT_THAT(service.KeySet(set),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
}

// A report of `rank` (incarnation 100 + rank, as JoinRequestFor).
v1::StepReport ReportFor(int rank, int64_t step, double step_time_s) {
  v1::StepReport report;
  report.set_rank(rank);
  report.set_incarnation(100 + rank);
  report.set_step(step);
  report.set_step_time_s(step_time_s);
  return report;
}

std::vector<int64_t> Steps(const v1::GetReportsResponse& response, int rank) {
  std::vector<int64_t> steps;
  for (const v1::StepReport& r : response.reports()) {
    if (r.rank() == rank) steps.push_back(r.step());
  }
  return steps;
}

v1::GetReportsRequest ReportsRequest(int rank, int last_steps) {
  v1::GetReportsRequest request;
  request.set_rank(rank);
  request.set_last_steps(last_steps);
  return request;
}

// Two hosts of two ranks each join with one HostJoin per host: both get
// the plan, the same as a rank joining alone would (one hash), and the
// job is planned with all four ranks. A host listing a rank twice, or no
// rank, is refused by name.
TEST_F(CoordinatorServiceTest, HostJoin_TwoHostsOfTwo_OnePlanForAll) {
  CoordinatorService service(DefaultOptions());
  const std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  v1::HostJoinRequest bad;
  bad.set_host("node-x");
  EXPECT_THAT(HostJoin(service, bad),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("must be in [1, 1024]")));
  *bad.add_ranks() = JoinRequestFor(m[0]);
  *bad.add_ranks() = JoinRequestFor(m[0]);
  EXPECT_THAT(HostJoin(service, bad),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("node-x"), HasSubstr("rank 0 twice"))));

  std::vector<absl::StatusOr<v1::JoinResponse>> results(2);
  std::vector<std::thread> hosts;
  for (int h = 0; h < 2; ++h) {
    hosts.emplace_back([&, h] {
      v1::HostJoinRequest request;
      request.set_job_id("job");
      request.set_host(absl::StrCat("node-", h));
      for (int r : {2 * h, 2 * h + 1})
        *request.add_ranks() = JoinRequestFor(m[r]);
      results[h] = HostJoin(service, request);
    });
  }
  for (std::thread& t : hosts) t.join();
  ASSERT_THAT(results[0], IsOk());
  ASSERT_THAT(results[1], IsOk());
  EXPECT_FALSE(results[0]->plan().hash().empty());
  EXPECT_EQ(results[0]->plan().hash(), results[1]->plan().hash());
  EXPECT_EQ(results[0]->plan().world_size(), 4);
  absl::StatusOr<v1::JobInfo> job = service.GetJob(v1::GetJobRequest());
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->ranks_joined(), 4);
}

// A host agent's batch: every report kept as if sent alone; one bad
// report (a stale incarnation) refuses the whole batch by rank, keeping
// none of it.
TEST_F(CoordinatorServiceTest, ReportSteps_BatchKeptWhole_OrRefusedWhole) {
  CoordinatorService service(DefaultOptions());
  for (const auto& r : JoinAll(service, Manifests(FourRankSpec()))) {
    ASSERT_THAT(r, IsOk());
  }
  v1::StepReports batch;
  *batch.add_reports() = ReportFor(0, 5, 0.1);
  *batch.add_reports() = ReportFor(1, 5, 0.2);
  ASSERT_THAT(service.ReportSteps(batch), IsOk());
  absl::StatusOr<v1::GetReportsResponse> kept =
      service.GetReports(ReportsRequest(-1, 0));
  ASSERT_THAT(kept, IsOk());
  EXPECT_THAT(Steps(*kept, 0), ::testing::ElementsAre(5));
  EXPECT_THAT(Steps(*kept, 1), ::testing::ElementsAre(5));

  v1::StepReports bad;
  *bad.add_reports() = ReportFor(2, 6, 0.1);
  v1::StepReport stale = ReportFor(3, 6, 0.1);
  stale.set_incarnation(999);
  *bad.add_reports() = stale;
  EXPECT_THAT(service.ReportSteps(bad),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("rank 3")));
  kept = service.GetReports(ReportsRequest(2, 0));
  ASSERT_THAT(kept, IsOk());
  EXPECT_TRUE(Steps(*kept, 2).empty());
}

TEST_F(CoordinatorServiceTest, GetReports_RingFull_KeepsLastNByRankThenStep) {
  CoordinatorService::Options options = DefaultOptions();
  options.reports_kept = 4;
  CoordinatorService service(options);
  for (const auto& r : JoinAll(service, Manifests(FourRankSpec()))) {
    ASSERT_THAT(r, IsOk());
  }
  // Rank 2 first (the answer is by rank whatever the arrival order), then
  // rank 0 with ten steps into a ring of four, one pair out of order.
  for (int64_t step : {0, 1, 2}) {
    ASSERT_THAT(service.ReportStep(ReportFor(2, step, 0.1)), IsOk());
  }
  for (int64_t step : {0, 1, 2, 3, 4, 5, 6, 7, 9, 8}) {
    v1::StepReport report = ReportFor(0, step, 0.1);
    v1::OpTiming* op = report.add_ops();
    op->set_op(v1::OP_KIND_GATHER);
    op->set_start_s(1000.0 + step);
    op->set_end_s(1000.5 + step);
    ASSERT_THAT(service.ReportStep(report), IsOk());
  }

  absl::StatusOr<v1::GetReportsResponse> all =
      service.GetReports(ReportsRequest(-1, 0));
  ASSERT_THAT(all, IsOk());
  ASSERT_EQ(all->reports_size(), 7);
  std::vector<std::pair<int, int64_t>> order;
  for (const v1::StepReport& r : all->reports()) {
    order.push_back({r.rank(), r.step()});
  }
  EXPECT_THAT(order,
              ::testing::ElementsAre(
                  std::pair<int, int64_t>{0, 6}, std::pair<int, int64_t>{0, 7},
                  std::pair<int, int64_t>{0, 8}, std::pair<int, int64_t>{0, 9},
                  std::pair<int, int64_t>{2, 0}, std::pair<int, int64_t>{2, 1},
                  std::pair<int, int64_t>{2, 2}));
  // Whole reports are kept, per-operation timings included.
  ASSERT_EQ(all->reports(0).ops_size(), 1);
  EXPECT_DOUBLE_EQ(all->reports(0).ops(0).start_s(), 1006.0);

  absl::StatusOr<v1::GetReportsResponse> last2 =
      service.GetReports(ReportsRequest(-1, 2));
  ASSERT_THAT(last2, IsOk());
  EXPECT_THAT(Steps(*last2, 0), ::testing::ElementsAre(8, 9));
  EXPECT_THAT(Steps(*last2, 2), ::testing::ElementsAre(1, 2));

  absl::StatusOr<v1::GetReportsResponse> rank2 =
      service.GetReports(ReportsRequest(2, 0));
  ASSERT_THAT(rank2, IsOk());
  EXPECT_EQ(rank2->reports_size(), 3);
  EXPECT_THAT(Steps(*rank2, 0), ::testing::IsEmpty());

  // Joined but silent: no reports, no error.
  absl::StatusOr<v1::GetReportsResponse> rank1 =
      service.GetReports(ReportsRequest(1, 0));
  ASSERT_THAT(rank1, IsOk());
  EXPECT_EQ(rank1->reports_size(), 0);
}

TEST_F(CoordinatorServiceTest, GetReports_BadArguments_ReturnErrors) {
  CoordinatorService service(DefaultOptions());
  EXPECT_THAT(service.GetReports(ReportsRequest(0, 0)),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("rank 0")));
  EXPECT_THAT(service.GetReports(ReportsRequest(-2, 0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("-2")));
  EXPECT_THAT(
      service.GetReports(ReportsRequest(-1, -1)),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("last_steps")));
  v1::GetReportsRequest other_job = ReportsRequest(-1, 0);
  other_job.set_job_id("other");
  EXPECT_THAT(service.GetReports(other_job),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("other")));
  // Every rank of an empty job: nothing, no error.
  absl::StatusOr<v1::GetReportsResponse> none =
      service.GetReports(ReportsRequest(-1, 0));
  ASSERT_THAT(none, IsOk());
  EXPECT_EQ(none->reports_size(), 0);
}

std::vector<bool> Stragglers(CoordinatorService& service) {
  std::vector<bool> out;
  absl::StatusOr<v1::ListRanksResponse> ranks =
      service.ListRanks(v1::ListRanksRequest());
  EXPECT_THAT(ranks, IsOk());
  if (!ranks.ok()) return out;
  for (const v1::RankStatus& s : ranks->ranks()) out.push_back(s.straggler());
  return out;
}

TEST_F(CoordinatorServiceTest,
       ListRanks_OneRankTenTimesSlower_OnlyItIsStraggler) {
  CoordinatorService service(DefaultOptions());
  for (const auto& r : JoinAll(service, Manifests(FourRankSpec()))) {
    ASSERT_THAT(r, IsOk());
  }
  // Two reports: one other rank is not enough to compare with.
  ASSERT_THAT(service.ReportStep(ReportFor(0, 1, 0.10)), IsOk());
  ASSERT_THAT(service.ReportStep(ReportFor(3, 1, 1.00)), IsOk());
  EXPECT_THAT(Stragglers(service),
              ::testing::ElementsAre(false, false, false, false));
  // Three: rank 3 is 10x the median (0.10, 0.12) of the others.
  ASSERT_THAT(service.ReportStep(ReportFor(1, 1, 0.12)), IsOk());
  EXPECT_THAT(Stragglers(service),
              ::testing::ElementsAre(false, false, false, true));
  ASSERT_THAT(service.ReportStep(ReportFor(2, 1, 0.11)), IsOk());
  EXPECT_THAT(Stragglers(service),
              ::testing::ElementsAre(false, false, false, true));
  // Its next step is back in line: no longer flagged.
  ASSERT_THAT(service.ReportStep(ReportFor(3, 2, 0.13)), IsOk());
  EXPECT_THAT(Stragglers(service),
              ::testing::ElementsAre(false, false, false, false));
  // Just above 2x the others' median (0.11) is a straggler; just below not.
  ASSERT_THAT(service.ReportStep(ReportFor(3, 3, 0.23)), IsOk());
  EXPECT_THAT(Stragglers(service),
              ::testing::ElementsAre(false, false, false, true));
  ASSERT_THAT(service.ReportStep(ReportFor(3, 4, 0.21)), IsOk());
  EXPECT_THAT(Stragglers(service),
              ::testing::ElementsAre(false, false, false, false));
}

TEST_F(CoordinatorServiceTest, ListRanks_StragglerFactorOption_Used) {
  CoordinatorService::Options options = DefaultOptions();
  options.straggler_factor = 20.0;
  CoordinatorService service(options);
  for (const auto& r : JoinAll(service, Manifests(FourRankSpec()))) {
    ASSERT_THAT(r, IsOk());
  }
  for (int r = 0; r < 3; ++r) {
    ASSERT_THAT(service.ReportStep(ReportFor(r, 1, 0.1)), IsOk());
  }
  ASSERT_THAT(service.ReportStep(ReportFor(3, 1, 1.0)), IsOk());
  EXPECT_THAT(Stragglers(service),
              ::testing::ElementsAre(false, false, false, false));
}

TEST_F(CoordinatorServiceTest, ListRanks_ReportsDropped_FromLatestReport) {
  CoordinatorService service(DefaultOptions());
  for (const auto& r : JoinAll(service, Manifests(FourRankSpec()))) {
    ASSERT_THAT(r, IsOk());
  }
  v1::StepReport report = ReportFor(2, 1, 0.1);
  report.set_reports_dropped(3);
  ASSERT_THAT(service.ReportStep(report), IsOk());
  report.set_step(2);
  report.set_reports_dropped(17);
  ASSERT_THAT(service.ReportStep(report), IsOk());
  absl::StatusOr<v1::ListRanksResponse> ranks =
      service.ListRanks(v1::ListRanksRequest());
  ASSERT_THAT(ranks, IsOk());
  EXPECT_EQ(ranks->ranks(2).reports_dropped(), 17);
  EXPECT_EQ(ranks->ranks(2).state(), v1::RANK_STATE_RUNNING);
  EXPECT_EQ(ranks->ranks(2).last_step(), 2);
  EXPECT_EQ(ranks->ranks(0).reports_dropped(), 0);
}

// Real clock, 200 ms timeout: ranks 0, 2, 3 heartbeat every 20 ms, rank 1
// stops; rank 1 is lost within the timeout (plus scheduling slack), the
// others never are.
TEST_F(CoordinatorServiceTest, RankStates_HeartbeatsStop_LostWithinTimeout) {
  CoordinatorService::Options options = DefaultOptions();
  options.now = [] { return absl::Now(); };
  options.heartbeat_timeout = absl::Milliseconds(200);
  CoordinatorService service(options);
  for (const auto& r : JoinAll(service, Manifests(FourRankSpec()))) {
    ASSERT_THAT(r, IsOk());
  }
  absl::Mutex mu;
  bool stop_rank1 = false;
  bool done = false;
  absl::Time rank1_last_beat = absl::Now();
  std::thread beater([&] {
    while (true) {
      {
        absl::MutexLock lock(&mu);
        if (done) return;
      }
      for (int r = 0; r < 4; ++r) {
        {
          absl::MutexLock lock(&mu);
          if (r == 1 && stop_rank1) continue;
        }
        v1::HeartbeatRequest hb;
        hb.set_rank(r);
        hb.set_incarnation(100 + r);
        EXPECT_THAT(service.Heartbeat(hb), IsOk());
        if (r == 1) {
          absl::MutexLock lock(&mu);
          rank1_last_beat = absl::Now();
        }
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  });
  auto states = [&] {
    std::vector<std::string> out;
    absl::StatusOr<v1::ListRanksResponse> ranks =
        service.ListRanks(v1::ListRanksRequest());
    EXPECT_THAT(ranks, IsOk());
    if (ranks.ok()) {
      for (const v1::RankStatus& s : ranks->ranks())
        out.push_back(WireName(s.state()));
    }
    return out;
  };
  // Two timeouts with heartbeats: nobody is lost.
  absl::SleepFor(absl::Milliseconds(400));
  EXPECT_THAT(states(), ::testing::Each("ready"));

  {
    absl::MutexLock lock(&mu);
    stop_rank1 = true;
  }
  const absl::Time give_up = absl::Now() + absl::Seconds(3);
  std::vector<std::string> now_states;
  while (absl::Now() < give_up) {
    now_states = states();
    if (now_states.size() == 4 && now_states[1] == "lost") break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  absl::Duration silent;
  {
    absl::MutexLock lock(&mu);
    // No beat of rank 1 after stop_rank1 was seen, so this is its last.
    silent = absl::Now() - rank1_last_beat;
    done = true;
  }
  beater.join();
  EXPECT_THAT(now_states,
              ::testing::ElementsAre("ready", "lost", "ready", "ready"));
  // The coordinator stamped the last beat just before rank1_last_beat.
  EXPECT_GE(silent, absl::Milliseconds(190));
  EXPECT_LT(silent, absl::Milliseconds(200 + 300)) << "lost detected late";
}

// ListRanks over 256 ranks (its per-rank checks once O(ranks) each, now
// computed once per call): rank 5 and rank 77 froze at step 10 while the
// others reached step 11, so they are late; rank 200's last step took 10x
// the others' median. Exactly those three are flagged.
TEST_F(CoordinatorServiceTest, ListRanks_ManyRanks_LateAndSlowRanksFlagged) {
  constexpr int kWorld = 256;
  CoordinatorService service(DefaultOptions());
  const std::vector<v1::RankManifest> m = Manifests(
      MakeSpec({{"dp_shard", kWorld}}, {{"w", 4, 4, {"Replicate()"}}}));
  ASSERT_EQ(m.size(), static_cast<size_t>(kWorld));
  v1::HostJoinRequest host;
  host.set_host("node-0");
  for (const v1::RankManifest& manifest : m) {
    *host.add_ranks() = JoinRequestFor(manifest);
  }
  ASSERT_THAT(HostJoin(service, host), IsOk());
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_THAT(service.ReportStep(ReportFor(r, 10, 0.1)), IsOk());
  }
  clock_.Advance(absl::Seconds(1));  // 10x the median step time
  for (int r = 0; r < kWorld; ++r) {
    if (r == 5 || r == 77) continue;
    ASSERT_THAT(service.ReportStep(ReportFor(r, 11, r == 200 ? 1.0 : 0.1)),
                IsOk());
  }
  absl::StatusOr<v1::ListRanksResponse> ranks =
      service.ListRanks(v1::ListRanksRequest());
  ASSERT_THAT(ranks, IsOk());
  ASSERT_EQ(ranks->ranks_size(), kWorld);
  std::vector<int> flagged;
  for (const v1::RankStatus& s : ranks->ranks()) {
    if (s.straggler()) flagged.push_back(s.rank());
  }
  EXPECT_THAT(flagged, ::testing::ElementsAre(5, 77, 200));
  EXPECT_EQ(ranks->ranks(5).last_step(), 10);
  EXPECT_EQ(ranks->ranks(6).last_step(), 11);
}

// A report with more than kMaxReportOps operations is refused by rank and
// count, alone or in a batch, and nothing of it is kept.
TEST_F(CoordinatorServiceTest,
       ReportStep_TooManyOps_InvalidArgumentNothingKept) {
  CoordinatorService service(DefaultOptions());
  for (const auto& r : JoinAll(service, Manifests(FourRankSpec()))) {
    ASSERT_THAT(r, IsOk());
  }
  v1::StepReport big = ReportFor(1, 3, 0.1);
  for (int i = 0; i <= CoordinatorService::kMaxReportOps; ++i) {
    big.add_ops()->set_op(v1::OP_KIND_GATHER);
  }
  const auto refused =
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("rank 1's report of step 3 has 1048577 ops"),
                     HasSubstr("at most 1048576")));
  EXPECT_THAT(service.ReportStep(big), refused);
  v1::StepReports batch;
  *batch.add_reports() = ReportFor(0, 3, 0.1);
  *batch.add_reports() = big;
  EXPECT_THAT(service.ReportSteps(batch), refused);
  absl::StatusOr<v1::GetReportsResponse> kept =
      service.GetReports(ReportsRequest(-1, 0));
  ASSERT_THAT(kept, IsOk());
  EXPECT_EQ(kept->reports_size(), 0);
  big.mutable_ops()->RemoveLast();  // exactly the limit: accepted
  EXPECT_THAT(service.ReportStep(big), IsOk());
}

// GetReports stops building an answer larger than max_response_bytes and
// says how to ask for less; asking for the last steps only then works.
TEST_F(CoordinatorServiceTest, GetReports_AboveMaxResponse_ResourceExhausted) {
  CoordinatorService::Options options = DefaultOptions();
  options.max_response_bytes = 2000;
  CoordinatorService service(options);
  for (const auto& r : JoinAll(service, Manifests(FourRankSpec()))) {
    ASSERT_THAT(r, IsOk());
  }
  for (int64_t step = 0; step < 10; ++step) {
    v1::StepReport report = ReportFor(0, step, 0.1);
    for (int i = 0; i < 12; ++i) {
      v1::OpTiming* op = report.add_ops();
      op->set_op(v1::OP_KIND_ORTHOGONALIZE);
      op->set_bucket(i);
      op->set_start_s(1000.0 + step);
      op->set_end_s(1000.5 + step);
    }
    ASSERT_GT(report.ByteSizeLong(), 250u);  // 10 of them: above 2000
    ASSERT_THAT(service.ReportStep(report), IsOk());
  }
  EXPECT_THAT(service.GetReports(ReportsRequest(-1, 0)),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("2000 bytes"), HasSubstr("rank 0"),
                             HasSubstr("--last_steps"))));
  absl::StatusOr<v1::GetReportsResponse> last2 =
      service.GetReports(ReportsRequest(-1, 2));
  ASSERT_THAT(last2, IsOk());
  EXPECT_THAT(Steps(*last2, 0), ::testing::ElementsAre(8, 9));
  EXPECT_LE(last2->ByteSizeLong(), 2000u);
}

}  // namespace
}  // namespace muon
