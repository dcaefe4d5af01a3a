// Failure propagation in the coordinator's core (XLA's coordination service
// model): a rank that stops heart-beating is lost after heartbeat_timeout,
// and every other rank's Heartbeat response carries a job error naming it;
// a rank's reported error does the same; the first failure wins; a rank
// that leaves cleanly is "finished", never lost; a late rank is flagged a
// straggler before it is lost.
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
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
using ::testing::AllOf;
using ::testing::HasSubstr;

class FailurePropagationTest : public ::testing::Test {
 protected:
  CoordinatorService::Options Options() {
    CoordinatorService::Options options;
    options.job_id = "job";
    options.default_join_timeout = absl::Seconds(2);
    options.heartbeat_timeout = absl::Milliseconds(300);
    options.now = [this] { return clock_.Now(); };
    return options;
  }

  void JoinAll(CoordinatorService& service) {
    std::vector<v1::RankManifest> manifests = Manifests(FourRankSpec());
    std::vector<std::thread> threads;
    std::vector<absl::Status> statuses(manifests.size());
    for (size_t r = 0; r < manifests.size(); ++r) {
      threads.emplace_back([&, r] {
        v1::JoinRequest request;
        *request.mutable_manifest() = manifests[r];
        request.set_incarnation(100 + r);
        request.set_timeout_ms(2000);
        absl::StatusOr<v1::JoinResponse> response = service.Join(request);
        statuses[r] = response.status();
        if (response.ok()) {
          EXPECT_EQ(
              response->heartbeat_timeout_ms(),
              absl::ToInt64Milliseconds(service.options().heartbeat_timeout));
        }
      });
    }
    for (std::thread& t : threads) t.join();
    for (const absl::Status& s : statuses) ASSERT_THAT(s, IsOk());
  }

  static absl::StatusOr<v1::HeartbeatResponse> Beat(
      CoordinatorService& service, int rank, const std::string& error = "",
      bool leaving = false) {
    v1::HeartbeatRequest request;
    request.set_rank(rank);
    request.set_incarnation(100 + rank);
    request.set_error(error);
    request.set_leaving(leaving);
    return service.Heartbeat(request);
  }

  FakeClock clock_;
};

// A host agent's heartbeat for ranks 0 and 1, every 100 ms, keeps both
// alive; rank 2 (another host, silent) is lost and named; rank 3's own
// heartbeat keeps it alive as before.
TEST_F(FailurePropagationTest,
       HostHeartbeat_KeepsItsRanksAlive_SilentHostRankNamed) {
  CoordinatorService service(Options());
  JoinAll(service);
  v1::HostHeartbeatRequest host;
  host.set_host("node-a");
  for (int r : {0, 1}) {
    v1::HeartbeatRequest* beat = host.add_ranks();
    beat->set_rank(r);
    beat->set_incarnation(100 + r);
  }
  for (int i = 0; i < 3; ++i) {
    clock_.Advance(absl::Milliseconds(100));
    absl::StatusOr<v1::HeartbeatResponse> response =
        service.HostHeartbeat(host);
    ASSERT_THAT(response, IsOk());
    EXPECT_EQ(response->job_error(), "");
    ASSERT_THAT(Beat(service, 3), IsOk());
  }
  clock_.Advance(absl::Milliseconds(100));
  absl::StatusOr<v1::HeartbeatResponse> response = service.HostHeartbeat(host);
  ASSERT_THAT(response, IsOk());
  EXPECT_EQ(response->job_state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(response->failed_rank(), 2);
  EXPECT_THAT(response->job_error(), HasSubstr("rank 2 lost"));
}

// Host "node-a" (ranks 0 and 1) beats every 100 ms: its first beat lists
// both, the later ones `later_ranks`; ranks 2 and 3 beat on their own every
// 50 ms. Returns the first job error the direct beats see and when (ms
// after the first host beat), or "" after `host_beats` host beats and
// 600 ms of silence.
std::pair<std::string, int> RunHostThenSilence(
    CoordinatorService& service, FakeClock& clock,
    const std::vector<int>& later_ranks, int host_beats) {
  auto host_beat = [&service](const std::vector<int>& ranks) {
    v1::HostHeartbeatRequest host;
    host.set_host("node-a");
    for (int r : ranks) {
      v1::HeartbeatRequest* beat = host.add_ranks();
      beat->set_rank(r);
      beat->set_incarnation(100 + r);
    }
    return service.HostHeartbeat(host);
  };
  EXPECT_THAT(host_beat({0, 1}), IsOk());
  for (int ms = 50; ms <= 100 * (host_beats - 1) + 600; ms += 50) {
    clock.Advance(absl::Milliseconds(50));
    if (ms % 100 == 0 && ms < 100 * host_beats) {
      EXPECT_THAT(host_beat(later_ranks), IsOk());
    }
    for (int r : {2, 3}) {
      v1::HeartbeatRequest request;
      request.set_rank(r);
      request.set_incarnation(100 + r);
      absl::StatusOr<v1::HeartbeatResponse> response =
          service.Heartbeat(request);
      EXPECT_THAT(response, IsOk());
      if (response.ok() && !response->job_error().empty()) {
        return {response->job_error(), ms};
      }
    }
  }
  return {"", -1};
}

// The host's last beat before it died left rank 0 out (its agent had not
// heard from it lately): when rank 0 passes the timeout the host has been
// silent for less, and the coordinator waits for the host's timeout to
// name both its ranks instead of rank 0 alone.
TEST_F(FailurePropagationTest,
       HostHeartbeat_RankLeftOutOfHostsLastBeat_HostNamedWithBothRanks) {
  CoordinatorService service(Options());
  JoinAll(service);
  // Beats at 0 ms (ranks 0, 1) and 100 ms (rank 1), then the host dies.
  const auto [error, ms] = RunHostThenSilence(service, clock_, {1}, 2);
  EXPECT_THAT(error, HasSubstr("ranks 0, 1 of host \"node-a\" lost"));
  // Rank 0 passed the 300 ms timeout at 350 ms (then its host had been
  // silent 250 ms); the host passes it at 450 ms.
  EXPECT_EQ(ms, 450);
}

// The host lives on and beats for rank 1 only (rank 0 hangs): rank 0 is
// named alone once past the timeout, without waiting.
TEST_F(FailurePropagationTest,
       HostHeartbeat_HostBeatsOnWithoutARank_ThatRankNamedAloneInTime) {
  CoordinatorService service(Options());
  JoinAll(service);
  const auto [error, ms] = RunHostThenSilence(service, clock_, {1}, 20);
  EXPECT_THAT(error, HasSubstr("rank 0 lost"));
  EXPECT_THAT(error, ::testing::Not(HasSubstr("of host")));
  EXPECT_EQ(ms, 350);
}

// An entry's error becomes the job error naming that rank; a bad entry
// (a rank listed twice, a stale incarnation, a rank that never joined)
// refuses the whole call by name and records nothing.
TEST_F(FailurePropagationTest,
       HostHeartbeat_EntryErrorFailsJob_BadEntriesRefusedWhole) {
  CoordinatorService service(Options());
  JoinAll(service);
  auto beat = [](v1::HostHeartbeatRequest* host, int rank, uint64_t inc) {
    v1::HeartbeatRequest* b = host->add_ranks();
    b->set_rank(rank);
    b->set_incarnation(inc);
    return b;
  };
  v1::HostHeartbeatRequest twice;
  twice.set_host("node-a");
  beat(&twice, 0, 100);
  beat(&twice, 0, 100);
  EXPECT_THAT(service.HostHeartbeat(twice),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("node-a"), HasSubstr("rank 0 twice"))));
  v1::HostHeartbeatRequest stale;
  stale.set_host("node-b");
  beat(&stale, 1, 101);
  beat(&stale, 2, 999)->set_error("must not be recorded");
  EXPECT_THAT(service.HostHeartbeat(stale),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("node-b")));
  v1::HostHeartbeatRequest unknown;
  beat(&unknown, 7, 107);
  EXPECT_THAT(service.HostHeartbeat(unknown),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  v1::HostHeartbeatRequest too_many;
  for (int i = 0; i <= CoordinatorService::kMaxHostRanks; ++i) {
    beat(&too_many, i, 100 + i);
  }
  EXPECT_THAT(
      service.HostHeartbeat(too_many),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at most 1024")));
  // Nothing above failed the job.
  absl::StatusOr<v1::HeartbeatResponse> ok = Beat(service, 3);
  ASSERT_THAT(ok, IsOk());
  EXPECT_EQ(ok->job_error(), "");

  v1::HostHeartbeatRequest failing;
  failing.set_host("node-c");
  beat(&failing, 2, 102);
  beat(&failing, 3, 103)->set_error("CUDA error: illegal address");
  absl::StatusOr<v1::HeartbeatResponse> failed = service.HostHeartbeat(failing);
  ASSERT_THAT(failed, IsOk());
  EXPECT_EQ(failed->failed_rank(), 3);
  EXPECT_THAT(failed->job_error(),
              HasSubstr("rank 3 failed: CUDA error: illegal address"));
}

// A host name longer than kMaxHostNameBytes (it is kept in each listed
// rank's entry) is refused naming its size and the limit; 256 bytes pass.
TEST_F(FailurePropagationTest, HostHeartbeat_HostNameTooLong_InvalidArgument) {
  CoordinatorService service(Options());
  JoinAll(service);
  v1::HostHeartbeatRequest host;
  host.set_host(std::string(CoordinatorService::kMaxHostNameBytes + 1, 'h'));
  v1::HeartbeatRequest* beat = host.add_ranks();
  beat->set_rank(0);
  beat->set_incarnation(100);
  EXPECT_THAT(service.HostHeartbeat(host),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("host name is 257 bytes"),
                             HasSubstr("at most 256"))));
  host.set_host(std::string(CoordinatorService::kMaxHostNameBytes, 'h'));
  EXPECT_THAT(service.HostHeartbeat(host), IsOk());
}

// A rank's reported error is kept (and sent with every heartbeat response)
// cut to kMaxErrorBytes, before a UTF-8 character that would straddle the
// cut: the job error stays valid UTF-8.
TEST_F(FailurePropagationTest, Heartbeat_LongError_CutAtUtf8Boundary) {
  CoordinatorService service(Options());
  JoinAll(service);
  // "\xc3\xa9" (e-acute) occupies bytes 4095 and 4096 of the error.
  const std::string error =
      std::string(CoordinatorService::kMaxErrorBytes - 1, 'x') + "\xc3\xa9" +
      std::string(10000, 'y');
  ASSERT_THAT(Beat(service, 1, error), IsOk());
  absl::StatusOr<v1::HeartbeatResponse> response = Beat(service, 0);
  ASSERT_THAT(response, IsOk());
  EXPECT_EQ(response->failed_rank(), 1);
  EXPECT_EQ(response->job_error(),
            "rank 1 failed: " +
                std::string(CoordinatorService::kMaxErrorBytes - 1, 'x'));
}

TEST_F(FailurePropagationTest,
       Heartbeat_RankSilentPastTimeout_EveryRankGetsErrorNamingIt) {
  CoordinatorService service(Options());
  JoinAll(service);
  // Ranks 0, 1, 3 keep heart-beating every 100 ms; rank 2 goes silent.
  for (int i = 0; i < 3; ++i) {
    clock_.Advance(absl::Milliseconds(100));
    for (int r : {0, 1, 3}) {
      absl::StatusOr<v1::HeartbeatResponse> response = Beat(service, r);
      ASSERT_THAT(response, IsOk());
      EXPECT_EQ(response->job_error(), "")
          << "after " << (i + 1) * 100 << " ms";
      EXPECT_EQ(response->job_state(), v1::JOB_STATE_PLANNED);
    }
  }
  clock_.Advance(absl::Milliseconds(100));  // rank 2 silent 400 ms > 300 ms
  for (int r : {0, 1, 3}) {
    absl::StatusOr<v1::HeartbeatResponse> response = Beat(service, r);
    ASSERT_THAT(response, IsOk());
    EXPECT_EQ(response->job_state(), v1::JOB_STATE_FAILED);
    EXPECT_EQ(response->failed_rank(), 2);
    EXPECT_THAT(response->job_error(),
                AllOf(HasSubstr("rank 2 lost"), HasSubstr("no heartbeat for"),
                      HasSubstr("heartbeat timeout 0.30 s")));
  }
  absl::StatusOr<v1::JobInfo> job = service.GetJob(v1::GetJobRequest());
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(job->failed_rank(), 2);
  EXPECT_THAT(job->error(), HasSubstr("rank 2 lost"));
}

TEST_F(FailurePropagationTest,
       Heartbeat_ReportedError_OtherRanksGetItAndFirstFailureWins) {
  CoordinatorService service(Options());
  JoinAll(service);
  ASSERT_THAT(Beat(service, 1, "parameter \"w\" has a NaN gradient"), IsOk());
  // A later report (a rank that merely saw the failure) does not overwrite.
  ASSERT_THAT(Beat(service, 3, "connection reset by peer"), IsOk());
  for (int r : {0, 2}) {
    absl::StatusOr<v1::HeartbeatResponse> response = Beat(service, r);
    ASSERT_THAT(response, IsOk());
    EXPECT_EQ(response->failed_rank(), 1);
    EXPECT_THAT(response->job_error(),
                AllOf(HasSubstr("rank 1 failed"), HasSubstr("NaN gradient")));
  }
  // And a rank lost afterwards does not replace it either.
  clock_.Advance(absl::Seconds(1));
  absl::StatusOr<v1::HeartbeatResponse> response = Beat(service, 0);
  ASSERT_THAT(response, IsOk());
  EXPECT_EQ(response->failed_rank(), 1);
}

TEST_F(FailurePropagationTest, Heartbeat_Leaving_RankFinishedNeverLost) {
  CoordinatorService service(Options());
  JoinAll(service);
  ASSERT_THAT(Beat(service, 3, "", /*leaving=*/true), IsOk());
  for (int i = 0; i < 5; ++i) {
    clock_.Advance(absl::Milliseconds(100));
    for (int r : {0, 1, 2}) {
      absl::StatusOr<v1::HeartbeatResponse> response = Beat(service, r);
      ASSERT_THAT(response, IsOk());
      EXPECT_EQ(response->job_error(), "");
    }
  }
  absl::StatusOr<v1::ListRanksResponse> ranks =
      service.ListRanks(v1::ListRanksRequest());
  ASSERT_THAT(ranks, IsOk());
  EXPECT_EQ(ranks->ranks(3).state(), v1::RANK_STATE_FINISHED);
}

TEST_F(FailurePropagationTest, Join_AfterLeaving_RankCanBeLostAgain) {
  CoordinatorService service(Options());
  JoinAll(service);
  ASSERT_THAT(Beat(service, 3, "", /*leaving=*/true), IsOk());
  // Rank 3 makes a new optimizer: the same incarnation joins again.
  v1::JoinRequest again;
  *again.mutable_manifest() = Manifests(FourRankSpec())[3];
  again.set_incarnation(103);
  ASSERT_THAT(service.Join(again), IsOk());
  for (int i = 0; i < 2; ++i) {
    clock_.Advance(absl::Milliseconds(200));
    for (int r : {0, 1, 2}) ASSERT_THAT(Beat(service, r), IsOk());
  }
  absl::StatusOr<v1::HeartbeatResponse> response = Beat(service, 0);
  ASSERT_THAT(response, IsOk());
  EXPECT_EQ(response->failed_rank(), 3);
  EXPECT_THAT(response->job_error(), HasSubstr("rank 3 lost"));
}

TEST_F(FailurePropagationTest, ListRanks_FrozenRankLate_StragglerBeforeLost) {
  CoordinatorService::Options options = Options();
  options.heartbeat_timeout = absl::Seconds(30);
  CoordinatorService service(options);
  JoinAll(service);
  auto report = [&](int rank, int64_t step) {
    v1::StepReport r;
    r.set_rank(rank);
    r.set_incarnation(100 + rank);
    r.set_step(step);
    r.set_step_time_s(0.1);
    ASSERT_THAT(service.ReportStep(r), IsOk());
  };
  for (int r = 0; r < 4; ++r) report(r, 1);
  // Rank 2 freezes after step 1; the others go on to step 5.
  for (int step = 2; step <= 5; ++step) {
    clock_.Advance(absl::Milliseconds(100));
    for (int r : {0, 1, 3}) report(r, step);
  }
  absl::StatusOr<v1::ListRanksResponse> ranks =
      service.ListRanks(v1::ListRanksRequest());
  ASSERT_THAT(ranks, IsOk());
  EXPECT_TRUE(ranks->ranks(2).straggler());
  EXPECT_EQ(ranks->ranks(2).state(), v1::RANK_STATE_RUNNING);  // not lost yet
  for (int r : {0, 1, 3}) EXPECT_FALSE(ranks->ranks(r).straggler()) << r;
}

}  // namespace
}  // namespace muon
