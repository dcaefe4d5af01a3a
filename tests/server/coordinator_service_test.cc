// Tests of server/coordinator_service.h driven directly (no gRPC).
#include "server/coordinator_service.h"

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "tests/server/test_specs.h"

namespace muon {
namespace {

using ::muon::testing::FourRankSpec;
using ::muon::testing::Manifests;
using ::testing::AllOf;
using ::testing::HasSubstr;

// A clock tests move by hand.
class FakeClock {
 public:
  absl::Time Now() {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ = absl::FromUnixSeconds(1700000000);
};

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
  for (const auto& r : results) {
    EXPECT_EQ(r->plan().SerializeAsString(), plan.SerializeAsString());
  }
  absl::StatusOr<v1::JobInfo> job = service.GetJob(v1::GetJobRequest());
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->state(), "planned");
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
  EXPECT_EQ(job->state(), "failed");
  EXPECT_THAT(job->error(), HasSubstr("fc1.weight"));
  EXPECT_THAT(service.GetPlan(v1::GetPlanRequest()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("planning failed")));
  absl::StatusOr<v1::ListRanksResponse> ranks =
      service.ListRanks(v1::ListRanksRequest());
  ASSERT_THAT(ranks, IsOk());
  for (const v1::RankStatus& s : ranks->ranks()) EXPECT_EQ(s.state(), "failed");
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
  for (const auto& r : results) {
    EXPECT_EQ(r->plan().SerializeAsString(), plan.SerializeAsString());
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
  EXPECT_EQ(job->state(), "waiting");
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

TEST_F(CoordinatorServiceTest, Join_WorldSizeDisagreesWithOptions_FailsJob) {
  CoordinatorService::Options options = DefaultOptions();
  options.world_size = 2;
  CoordinatorService service(options);
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  EXPECT_THAT(service.Join(JoinRequestFor(m[0])),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank 0 reports world size 4 but the job's "
                                 "world size is 2")));
  EXPECT_EQ(service.GetJob(v1::GetJobRequest())->state(), "failed");
}

TEST_F(CoordinatorServiceTest, Join_RankOutOfRange_FailsJobForWaitingRanks) {
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
  t.join();
  EXPECT_THAT(waiting, StatusIs(absl::StatusCode::kInvalidArgument,
                                HasSubstr("rank 9")));
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

TEST_F(CoordinatorServiceTest, Join_AfterPlanned_SameIncarnationGetsPlan) {
  CoordinatorService service(DefaultOptions());
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  auto results = JoinAll(service, m);
  ASSERT_THAT(results[3], IsOk());
  absl::StatusOr<v1::JoinResponse> again = service.Join(JoinRequestFor(m[3]));
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(again->plan().hash(), results[3]->plan().hash());
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
    for (const v1::RankStatus& s : ranks->ranks()) out.push_back(s.state());
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
      EXPECT_EQ(resp->job_state(), "planned");
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
  EXPECT_EQ(ranks->ranks(0).state(), "lost");
  EXPECT_EQ(ranks->ranks(2).state(), "ready");
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
            "joining");
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

}  // namespace
}  // namespace muon
