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
using ::muon::testing::MakeSpec;
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

// The embedded rank's Join notes it before the Join starts the next
// generation: the next job's Join response still names it as the
// coordinator's host.
TEST(LocalCoordinationClientTest, NextGeneration_EmbeddedRankStillNamed) {
  CoordinatorService::Options options;
  options.job_id = "embedded";
  CoordinatorService service(options);
  const std::vector<v1::RankManifest> m =
      Manifests(MakeSpec({{"dp_shard", 1}}, {{"w", 4, 4, {"Replicate()"}}}));
  ASSERT_EQ(m.size(), 1u);
  LocalCoordinationClient client(&service, "embedded");
  for (uint64_t incarnation : {1, 2}) {
    v1::JoinRequest request;
    *request.mutable_manifest() = m[0];
    request.set_incarnation(incarnation);
    request.set_timeout_ms(2000);
    absl::StatusOr<v1::JoinResponse> joined = client.Join(request);
    ASSERT_THAT(joined, IsOk()) << "incarnation " << incarnation;
    EXPECT_TRUE(joined->coordinator_in_rank()) << "incarnation " << incarnation;
    EXPECT_EQ(joined->coordinator_rank(), 0);
    EXPECT_EQ(service.generation(), static_cast<int64_t>(incarnation));
    // The rank leaves: its generation is over, the next Join starts one.
    v1::HeartbeatRequest leave;
    leave.set_rank(0);
    leave.set_incarnation(incarnation);
    leave.set_leaving(true);
    ASSERT_THAT(client.Heartbeat(leave), IsOk());
  }
}

TEST(LocalCoordinationClientTest, GetJob_OtherJobId_ReturnsInvalidArgument) {
  CoordinatorService service(CoordinatorService::Options{});
  LocalCoordinationClient client(&service, "not-this-one");
  EXPECT_THAT(client.GetJob(), StatusIs(absl::StatusCode::kInvalidArgument,
                                        HasSubstr("\"not-this-one\"")));
}

}  // namespace
}  // namespace muon
