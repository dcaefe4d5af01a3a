// CoordinatorService's structured log lines (Options::log) and observer events
// (Options::observer), driven directly.
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/wire_names.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator_observer.h"
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
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;

// Log lines and observer events, captured under a lock.
class Capture : public CoordinatorObserver {
 public:
  void Add(absl::string_view line) {
    absl::MutexLock lock(&mu_);
    lines_.emplace_back(line);
  }
  // Lines starting with "event=NAME ".
  std::vector<std::string> Events(absl::string_view name) {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> out;
    for (const std::string& line : lines_) {
      if (absl::StartsWith(line, absl::StrCat("event=", name, " "))) {
        out.push_back(line);
      }
    }
    return out;
  }
  void OnStepReport(const v1::StepReport& report) override {
    absl::MutexLock lock(&mu_);
    reported_steps_.push_back(report.step());
  }
  void OnJobState(v1::JobState state, int64_t generation) override {
    absl::MutexLock lock(&mu_);
    states_.push_back(WireName(state));
  }
  void OnPlan(int64_t version, absl::string_view hash) override {
    absl::MutexLock lock(&mu_);
    plans_.emplace_back(hash);
  }
  std::vector<std::string> states() {
    absl::MutexLock lock(&mu_);
    return states_;
  }
  std::vector<std::string> plans() {
    absl::MutexLock lock(&mu_);
    return plans_;
  }
  std::vector<int64_t> reported_steps() {
    absl::MutexLock lock(&mu_);
    return reported_steps_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> states_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> plans_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> reported_steps_ ABSL_GUARDED_BY(mu_);
};

class CoordinatorLogTest : public ::testing::Test {
 protected:
  CoordinatorService::Options Options() {
    CoordinatorService::Options options;
    options.job_id = "logs";
    options.default_join_timeout = absl::Seconds(5);
    options.heartbeat_timeout = absl::Seconds(30);
    options.now = [this] { return clock_.Now(); };
    options.log = [this](absl::string_view line) { capture_.Add(line); };
    options.observer = &capture_;
    return options;
  }

  // Joins the four ranks of FourRankSpec, each from its own thread.
  void JoinAll(CoordinatorService& service) {
    const std::vector<v1::RankManifest> manifests = Manifests(FourRankSpec());
    std::vector<std::thread> threads;
    for (const v1::RankManifest& m : manifests) {
      threads.emplace_back([&service, m] {
        v1::JoinRequest request;
        *request.mutable_manifest() = m;
        request.set_incarnation(100 + m.rank());
        request.set_timeout_ms(5000);
        EXPECT_THAT(service.Join(request), IsOk());
      });
    }
    for (std::thread& t : threads) t.join();
  }

  FakeClock clock_;
  Capture capture_;
};

TEST_F(CoordinatorLogTest, JoinPlanLostRank_OneKeyValueLineEach) {
  CoordinatorService service(Options());
  JoinAll(service);

  const std::vector<std::string> joins = capture_.Events("join");
  ASSERT_EQ(joins.size(), 4u);
  EXPECT_THAT(joins,
              Contains(AllOf(HasSubstr("rank=2"), HasSubstr("world_size=4"),
                             HasSubstr("manifest=full"),
                             HasSubstr("incarnation=102"))));
  absl::StatusOr<v1::Plan> plan = service.GetPlan(v1::GetPlanRequest());
  ASSERT_THAT(plan, IsOk());
  EXPECT_THAT(capture_.Events("plan"),
              ElementsAre(AllOf(
                  HasSubstr("job=logs"), HasSubstr("hash=" + plan->hash()),
                  HasSubstr("version=0"), HasSubstr("matrices=3"),
                  HasSubstr("ranks=4"), HasSubstr("compact_manifests=0"))));
  EXPECT_THAT(capture_.plans(), ElementsAre(plan->hash()));

  // A step report: running (one job_state line; heartbeats log nothing).
  v1::StepReport report;
  report.set_rank(1);
  report.set_incarnation(101);
  report.set_step(1);
  report.set_step_time_s(0.5);
  ASSERT_THAT(service.ReportStep(report), IsOk());
  EXPECT_THAT(capture_.reported_steps(), ElementsAre(1));
  for (int r = 0; r < 4; ++r) {
    v1::HeartbeatRequest hb;
    hb.set_rank(r);
    hb.set_incarnation(100 + r);
    ASSERT_THAT(service.Heartbeat(hb), IsOk());
  }
  EXPECT_THAT(capture_.Events("heartbeat"), IsEmpty());

  // Rank 3 goes silent past the heartbeat timeout: lost, job failed.
  for (int i = 0; i < 4; ++i) {
    clock_.Advance(absl::Seconds(10));
    for (int r : {0, 1, 2}) {
      v1::HeartbeatRequest hb;
      hb.set_rank(r);
      hb.set_incarnation(100 + r);
      ASSERT_THAT(service.Heartbeat(hb), IsOk());
    }
  }
  EXPECT_THAT(capture_.Events("rank_lost"),
              ElementsAre(AllOf(HasSubstr("rank=3"),
                                HasSubstr("heartbeat_timeout_s=30.000"),
                                HasSubstr("last_step=-1"))));
  EXPECT_THAT(
      capture_.Events("job_state"),
      ElementsAre(AllOf(HasSubstr("from=waiting"), HasSubstr("to=planned")),
                  AllOf(HasSubstr("from=planned"), HasSubstr("to=running")),
                  AllOf(HasSubstr("from=running"), HasSubstr("to=failed"))));
  EXPECT_THAT(capture_.states(), ElementsAre("planned", "running", "failed"));
}

TEST_F(CoordinatorLogTest, RejectedRequests_WrongJobAndBadJoin_Logged) {
  CoordinatorService service(Options());
  v1::GetJobRequest other;
  other.set_job_id("fashion-mnist");
  EXPECT_THAT(service.GetJob(other),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("")));
  EXPECT_THAT(capture_.Events("rejected"),
              ElementsAre(AllOf(HasSubstr("reason=job_id"),
                                HasSubstr("request_job=fashion-mnist"),
                                HasSubstr("job=logs"))));

  // A rank outside the world: the Join alone is rejected.
  v1::JoinRequest request;
  *request.mutable_manifest() = Manifests(FourRankSpec())[0];
  request.mutable_manifest()->set_rank(7);
  request.set_incarnation(9);
  EXPECT_THAT(service.Join(request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("")));
  EXPECT_THAT(capture_.Events("join_rejected"),
              ElementsAre(AllOf(HasSubstr("rank=7"), HasSubstr("incarnation=9"),
                                HasSubstr("code=INVALID_ARGUMENT"),
                                HasSubstr("error=\""))));
  EXPECT_THAT(capture_.Events("join"), IsEmpty());
}

TEST_F(CoordinatorLogTest, FailedRank_LoggedOnceWithItsError) {
  CoordinatorService service(Options());
  JoinAll(service);
  for (int i = 0; i < 2; ++i) {
    v1::HeartbeatRequest hb;
    hb.set_rank(2);
    hb.set_incarnation(102);
    hb.set_error("CUDA out of memory");
    ASSERT_THAT(service.Heartbeat(hb), IsOk());
  }
  EXPECT_THAT(capture_.Events("rank_failed"),
              ElementsAre(AllOf(HasSubstr("rank=2"),
                                HasSubstr("error=\"CUDA out of memory\""))));
  EXPECT_THAT(capture_.states(), ElementsAre("planned", "failed"));
}

TEST(LogValueTest, PlainOrQuoted) {
  EXPECT_EQ(LogValue("abc"), "abc");
  EXPECT_EQ(LogValue(""), "\"\"");
  EXPECT_EQ(LogValue("a b\"c"), "\"a b\\\"c\"");
  EXPECT_EQ(LogValue("k=v"), "\"k=v\"");
}

}  // namespace
}  // namespace muon
