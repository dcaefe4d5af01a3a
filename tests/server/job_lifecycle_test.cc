// Job states and generations of the coordinator core (no gRPC): a job goes
// waiting -> planned -> running -> finished, the daemon then serves the next
// job as generation 2 with the previous rendezvous keys removed, a second
// job is rejected while one runs before it writes anything, and a failed
// job ends its generation once its ranks are gone.
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator_service.h"
#include "tests/server/fake_clock.h"
#include "tests/server/test_specs.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::muon::testing::FakeClock;
using ::muon::testing::FourRankSpec;
using ::muon::testing::Manifests;
using ::testing::HasSubstr;

class JobLifecycleTest : public ::testing::Test {
 protected:
  JobLifecycleTest() {
    CoordinatorService::Options options;
    options.job_id = "job";
    options.default_join_timeout = absl::Seconds(5);
    options.heartbeat_timeout = absl::Seconds(10);
    options.now = [this] { return clock_.Now(); };
    service_ = std::make_unique<CoordinatorService>(options);
  }

  // Joins the four ranks with incarnations base + rank; returns rank 0's.
  absl::StatusOr<v1::JoinResponse> JoinAll(uint64_t base) {
    std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
    std::vector<absl::StatusOr<v1::JoinResponse>> results(
        4, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int r = 0; r < 4; ++r) {
      threads.emplace_back([&, r] { results[r] = Join(m[r], base + r); });
    }
    for (std::thread& t : threads) t.join();
    for (const auto& r : results) {
      if (!r.ok()) return r;
    }
    return results[0];
  }

  absl::StatusOr<v1::JoinResponse> Join(const v1::RankManifest& m,
                                        uint64_t incarnation) {
    v1::JoinRequest request;
    *request.mutable_manifest() = m;
    request.set_incarnation(incarnation);
    return service_->Join(request);
  }

  absl::Status Heartbeat(int rank, uint64_t incarnation, bool leaving) {
    v1::HeartbeatRequest hb;
    hb.set_rank(rank);
    hb.set_incarnation(incarnation);
    hb.set_leaving(leaving);
    return service_->Heartbeat(hb).status();
  }

  absl::Status KeySet(const std::string& key, const std::string& value) {
    v1::KeySetRequest request;
    request.set_key(key);
    request.set_value(value);
    return service_->KeySet(request).status();
  }

  absl::StatusOr<v1::KeyGetResponse> KeyGet(const std::string& key) {
    v1::KeyGetRequest request;
    request.set_key(key);
    return service_->KeyGet(request);
  }

  v1::JobState State() {
    return service_->GetJob(v1::GetJobRequest())->state();
  }

  FakeClock clock_;
  std::unique_ptr<CoordinatorService> service_;
};

TEST_F(JobLifecycleTest, States_WaitingPlannedRunningFinished) {
  EXPECT_EQ(State(), v1::JOB_STATE_WAITING);
  ASSERT_THAT(KeySet("gloo/0", "a"), IsOk());
  ASSERT_THAT(JoinAll(100), IsOk());
  EXPECT_EQ(State(), v1::JOB_STATE_PLANNED);
  v1::StepReport report;
  report.set_rank(2);
  report.set_incarnation(102);
  report.set_step(1);
  ASSERT_THAT(service_->ReportStep(report), IsOk());
  EXPECT_EQ(State(), v1::JOB_STATE_RUNNING);
  for (int r = 0; r < 3; ++r) ASSERT_THAT(Heartbeat(r, 100 + r, true), IsOk());
  EXPECT_EQ(State(), v1::JOB_STATE_RUNNING);  // rank 3 has not left
  ASSERT_THAT(Heartbeat(3, 103, true), IsOk());
  EXPECT_EQ(State(), v1::JOB_STATE_FINISHED);
  EXPECT_EQ(service_->GetJob(v1::GetJobRequest())->generation(), 1);
}

TEST_F(JobLifecycleTest, SecondJobWhileRunning_RejectedBeforeWritingAnything) {
  ASSERT_THAT(KeySet("gloo/0", "job1-addr"), IsOk());
  ASSERT_THAT(JoinAll(100), IsOk());
  const std::string hash = service_->GetJob(v1::GetJobRequest())->plan_hash();
  // Another job's rank 0 (another incarnation) and its rendezvous key.
  EXPECT_THAT(Join(Manifests(FourRankSpec())[0], 900),
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr("a second job or a restarted rank is "
                                 "rejected")));
  EXPECT_THAT(
      KeySet("gloo/0", "job2-addr"),
      StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("\"gloo/0\"")));
  // The running job is untouched.
  absl::StatusOr<v1::KeyGetResponse> value = KeyGet("gloo/0");
  ASSERT_THAT(value, IsOk());
  EXPECT_EQ(value->value(), "job1-addr");
  v1::JobInfo job = *service_->GetJob(v1::GetJobRequest());
  EXPECT_EQ(job.state(), v1::JOB_STATE_PLANNED);
  EXPECT_EQ(job.plan_hash(), hash);
  EXPECT_EQ(service_->ListRanks(v1::ListRanksRequest())->ranks(0).incarnation(),
            100u);
}

TEST_F(JobLifecycleTest, NextJobAfterFinish_NewGenerationKeysRemoved) {
  ASSERT_THAT(KeySet("gloo/0", "job1-addr"), IsOk());
  ASSERT_THAT(JoinAll(100), IsOk());
  for (int r = 0; r < 4; ++r) ASSERT_THAT(Heartbeat(r, 100 + r, true), IsOk());
  EXPECT_EQ(State(), v1::JOB_STATE_FINISHED);
  // The next job's first KeySet starts generation 2 with an empty store.
  ASSERT_THAT(KeySet("gloo/0", "job2-addr"), IsOk());
  v1::JobInfo job = *service_->GetJob(v1::GetJobRequest());
  EXPECT_EQ(job.generation(), 2);
  EXPECT_EQ(job.state(), v1::JOB_STATE_WAITING);
  EXPECT_EQ(job.ranks_joined(), 0);
  EXPECT_EQ(KeyGet("gloo/0")->value(), "job2-addr");
  ASSERT_THAT(JoinAll(200), IsOk());
  EXPECT_EQ(State(), v1::JOB_STATE_PLANNED);
  EXPECT_EQ(service_->ListRanks(v1::ListRanksRequest())->ranks(3).incarnation(),
            203u);
}

TEST_F(JobLifecycleTest, FailedJob_NextGenerationOnlyAfterItsRanksAreGone) {
  ASSERT_THAT(JoinAll(100), IsOk());
  v1::HeartbeatRequest hb;
  hb.set_rank(1);
  hb.set_incarnation(101);
  hb.set_error("CUDA error: out of memory");
  ASSERT_THAT(service_->Heartbeat(hb), IsOk());
  EXPECT_EQ(State(), v1::JOB_STATE_FAILED);
  // Ranks 0, 2, 3 are still alive: the restarted job must wait.
  EXPECT_THAT(Join(Manifests(FourRankSpec())[0], 500),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("generation 1")));
  // Once every rank is silent for the heartbeat timeout, the next Join
  // starts generation 2.
  clock_.Advance(absl::Seconds(11));
  ASSERT_THAT(JoinAll(500), IsOk());
  v1::JobInfo job = *service_->GetJob(v1::GetJobRequest());
  EXPECT_EQ(job.generation(), 2);
  EXPECT_EQ(job.state(), v1::JOB_STATE_PLANNED);
  EXPECT_EQ(job.error(), "");
  EXPECT_EQ(job.failed_rank(), -1);
}

TEST_F(JobLifecycleTest, WaitingJoins_HoldNoThreadAndShutdownCompletesThem) {
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  std::vector<absl::StatusOr<v1::JoinResponse>> results(
      3, absl::UnknownError("not run"));
  for (int r = 0; r < 3; ++r) {
    v1::JoinRequest request;
    *request.mutable_manifest() = m[r];
    request.set_incarnation(100 + r);
    request.set_timeout_ms(60000);
    service_->JoinAsync(request,
                        [&results, r](absl::StatusOr<v1::JoinResponse> result) {
                          results[r] = std::move(result);
                        });
  }
  // No thread waits: the calls returned and are still pending.
  for (const auto& r : results) {
    EXPECT_THAT(r, StatusIs(absl::StatusCode::kUnknown, HasSubstr("not run")));
  }
  EXPECT_EQ(service_->GetJob(v1::GetJobRequest())->ranks_joined(), 3);
  service_->Shutdown();
  for (const auto& r : results) {
    EXPECT_THAT(r, StatusIs(absl::StatusCode::kUnavailable,
                            HasSubstr("shutting down")));
  }
}

TEST_F(JobLifecycleTest, JoinWorldSizeAboveLimit_RejectedAlone) {
  v1::RankManifest m = Manifests(FourRankSpec())[0];
  m.set_world_size(1 << 20);
  EXPECT_THAT(Join(m, 1), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("must be in [1, 262144]")));
  EXPECT_EQ(State(), v1::JOB_STATE_WAITING);
  EXPECT_EQ(service_->GetJob(v1::GetJobRequest())->world_size(), 0);
}

}  // namespace
}  // namespace muon
