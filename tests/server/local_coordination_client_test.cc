// Tests of server/local_coordination_client.h (rank 0's embedded mode).
#include "server/local_coordination_client.h"

#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/test_specs.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::muon::testing::FourRankSpec;
using ::muon::testing::Manifests;
using ::testing::HasSubstr;

TEST(LocalCoordinationClientTest, JoinAndViews_FourRanks_SharePlan) {
  CoordinatorService::Options options;
  options.job_id = "embedded";
  CoordinatorService service(options);
  std::vector<v1::RankManifest> m = Manifests(FourRankSpec());
  std::vector<absl::StatusOr<v1::JoinResponse>> results(
      4, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      LocalCoordinationClient client(&service, "embedded");
      v1::JoinRequest request;
      *request.mutable_manifest() = m[r];
      request.set_incarnation(r + 1);
      request.set_timeout_ms(2000);
      results[r] = client.Join(request);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const auto& r : results) ASSERT_THAT(r, IsOk());
  EXPECT_EQ(results[0]->plan().job_id(), "embedded");

  LocalCoordinationClient client(&service, "embedded");
  EXPECT_EQ(client.GetPlan()->hash(), results[3]->plan().hash());
  EXPECT_EQ(client.GetJob()->state(), v1::JOB_STATE_PLANNED);
  EXPECT_EQ(client.GetAssignments()->ranks_size(), 4);
  EXPECT_EQ(client.ListRanks()->ranks_size(), 4);
  v1::HeartbeatRequest hb;
  hb.set_rank(2);
  hb.set_incarnation(3);
  EXPECT_THAT(client.Heartbeat(hb), IsOk());
  v1::StepReport report;
  report.set_rank(2);
  report.set_incarnation(3);
  EXPECT_THAT(client.ReportStep(report), IsOk());
  EXPECT_THAT(client.KeySet("k", "v"), IsOk());
  EXPECT_EQ(*client.KeyGet("k", absl::ZeroDuration()), "v");
  EXPECT_THAT(
      client.KeyGet("missing", absl::Milliseconds(20)),
      StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("\"missing\"")));
}

TEST(LocalCoordinationClientTest, GetJob_OtherJobId_ReturnsInvalidArgument) {
  CoordinatorService service(CoordinatorService::Options{});
  LocalCoordinationClient client(&service, "not-this-one");
  EXPECT_THAT(client.GetJob(), StatusIs(absl::StatusCode::kInvalidArgument,
                                        HasSubstr("\"not-this-one\"")));
}

}  // namespace
}  // namespace muon
