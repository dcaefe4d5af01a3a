// Compact manifests on Join (plan/compact_manifest.h): ranks whose manifest
// follows from rank 0's layout send O(1) bytes, the plan is the one full
// manifests give, and a mismatch is still named by parameter, rank and values
// after the coordinator asks for the full manifest.
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/compact_manifest.h"
#include "plan/plan_job.h"
#include "server/coordinator_service.h"
#include "tests/server/fake_clock.h"
#include "tests/server/host_join.h"
#include "tests/server/test_specs.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::muon::testing::ExpertSpec;
using ::muon::testing::FakeClock;
using ::muon::testing::FourRankSpec;
using ::muon::testing::HostJoin;
using ::muon::testing::Manifests;
using ::muon::testing::PipelineSpec;
using ::testing::AllOf;
using ::testing::HasSubstr;

// Rank r's Join: full manifest for rank 0 or when !compact, else compact.
v1::JoinRequest Request(const v1::RankManifest& m, bool compact) {
  v1::JoinRequest request;
  request.set_job_id("job");
  request.set_incarnation(100 + m.rank());
  request.set_timeout_ms(5000);
  if (compact) {
    *request.mutable_compact() = MakeCompactManifest(m);
  } else {
    *request.mutable_manifest() = m;
  }
  return request;
}

class CompactJoinTest : public ::testing::Test {
 protected:
  CoordinatorService::Options Options() {
    CoordinatorService::Options options;
    options.job_id = "job";
    options.default_join_timeout = absl::Seconds(5);
    options.heartbeat_timeout = absl::Seconds(30);
    options.now = [this] { return clock_.Now(); };
    return options;
  }

  // Joins every request from its own thread. A rank asked for its full
  // manifest joins again with `full[r]` (as control/agent.cc does) and its
  // first response is kept in asked[r].
  std::vector<absl::StatusOr<v1::JoinResponse>> JoinAll(
      CoordinatorService& service, const std::vector<v1::JoinRequest>& requests,
      const std::vector<v1::RankManifest>& full, std::vector<bool>* asked) {
    const size_t n = requests.size();
    std::vector<absl::StatusOr<v1::JoinResponse>> results(
        n, absl::UnknownError("not run"));
    asked->assign(n, false);
    std::vector<std::thread> threads;
    for (size_t r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        results[r] = service.Join(requests[r]);
        if (results[r].ok() && results[r]->send_full_manifest()) {
          (*asked)[r] = true;
          results[r] = service.Join(Request(full[r], /*compact=*/false));
        }
      });
    }
    for (std::thread& t : threads) t.join();
    return results;
  }

  FakeClock clock_;
};

TEST_F(CompactJoinTest, RanksFollowingTheLayout_PlanEqualsFullManifestPlan) {
  for (const v1::JobSpec& spec : {FourRankSpec(), ExpertSpec()}) {
    const std::vector<v1::RankManifest> manifests = Manifests(spec);
    std::vector<v1::JoinRequest> requests;
    for (const v1::RankManifest& m : manifests) {
      ASSERT_THAT(CheckManifestFollowsLayout(m), IsOk()) << m.rank();
      requests.push_back(Request(m, /*compact=*/m.rank() != 0));
    }
    CoordinatorService service(Options());
    std::vector<bool> asked;
    auto results = JoinAll(service, requests, manifests, &asked);
    absl::StatusOr<JobPlan> full = PlanJob(manifests, "job", PlanDefaults());
    ASSERT_THAT(full, IsOk());
    for (size_t r = 0; r < results.size(); ++r) {
      ASSERT_THAT(results[r], IsOk()) << r;
      EXPECT_FALSE(asked[r]) << "rank " << r << " was asked to resend";
      EXPECT_EQ(results[r]->plan().hash(), full->plan.hash()) << r;
    }
    // A compact Join is O(1): no parameter in it.
    EXPECT_LT(requests[1].ByteSizeLong(), 64u);
    EXPECT_GT(requests[0].ByteSizeLong(), requests[1].ByteSizeLong());
  }
}

// Ranks 1 and 3 spell out the defaults rank 0 leaves unset (assignment
// policy "lpt", exchange dtype "float32", ns_steps 5) and name their own
// device: the full manifests' checks take these as equal, and so does the
// layout hash, so no rank is asked for its full manifest (at 16k ranks,
// expanding them is what the job-size check refuses).
TEST_F(CompactJoinTest, DefaultsSpelledOutOrPerRankDevice_NoFullManifestAsked) {
  std::vector<v1::RankManifest> manifests = Manifests(FourRankSpec());
  for (int r : {1, 3}) {
    v1::ExecutionOptions* e = manifests[r].mutable_execution();
    e->set_assignment_policy("lpt");
    e->set_exchange_dtype("float32");
    e->set_device(absl::StrCat("cuda:", r));
    e->set_gpu_precision("fp32");
    manifests[r].set_ns_steps(5);
  }
  manifests[0].clear_ns_steps();
  std::vector<v1::JoinRequest> requests;
  for (const v1::RankManifest& m : manifests) {
    requests.push_back(Request(m, /*compact=*/m.rank() != 0));
  }
  CoordinatorService service(Options());
  std::vector<bool> asked;
  auto results = JoinAll(service, requests, manifests, &asked);
  absl::StatusOr<JobPlan> full = PlanJob(manifests, "job", PlanDefaults());
  ASSERT_THAT(full, IsOk());
  EXPECT_EQ(asked, std::vector<bool>(4, false));
  for (size_t r = 0; r < results.size(); ++r) {
    ASSERT_THAT(results[r], IsOk()) << r;
    EXPECT_EQ(results[r]->plan().hash(), full->plan.hash()) << r;
  }
}

TEST_F(CompactJoinTest, LayoutDiffers_FullManifestAskedThenParameterNamed) {
  std::vector<v1::RankManifest> manifests = Manifests(FourRankSpec());
  // Rank 2's model has fc2 [3, 6] where rank 0's has [3, 5].
  v1::JobSpec other = FourRankSpec();
  other.mutable_params(1)->set_shape(1, 6);
  manifests[2] = Manifests(other)[2];
  std::vector<v1::JoinRequest> requests;
  for (const v1::RankManifest& m : manifests) {
    requests.push_back(Request(m, m.rank() != 0));
  }
  CoordinatorService service(Options());
  std::vector<bool> asked;
  auto results = JoinAll(service, requests, manifests, &asked);
  EXPECT_EQ(asked, (std::vector<bool>{false, false, true, false}));
  for (const auto& r : results) {
    EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument,
                            AllOf(HasSubstr("parameter \"fc2.weight\""),
                                  HasSubstr("rank 2"), HasSubstr("[3, 6]"),
                                  HasSubstr("[3, 5]"))));
  }
}

// The Join that completes the world has a deadline too: here rank 3
// joins last, planning asks rank 2 (whose layout differs) for its full
// manifest and removes it, and rank 2 never comes back. Every waiter,
// rank 3 included, then ends at its own timeout naming rank 2 (before,
// rank 3 waited forever and its generation never ended).
TEST_F(CompactJoinTest, LastJoinerAfterResendAsked_TimesOutNamingMissingRank) {
  std::vector<v1::RankManifest> manifests = Manifests(FourRankSpec());
  v1::JobSpec other = FourRankSpec();
  other.mutable_params(1)->set_shape(1, 6);
  manifests[2] = Manifests(other)[2];
  std::vector<absl::StatusOr<v1::JoinResponse>> results(
      4, absl::UnknownError("not run"));
  std::vector<absl::Notification> done(4);
  CoordinatorService service(Options());
  for (int r : {0, 1, 2, 3}) {  // rank 3 completes the world
    v1::JoinRequest request = Request(manifests[r], r != 0);
    request.set_timeout_ms(200);
    service.JoinAsync(request, [&, r](absl::StatusOr<v1::JoinResponse> got) {
      results[r] = std::move(got);
      done[r].Notify();
    });
  }
  ASSERT_TRUE(done[2].WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_THAT(results[2], IsOk());
  EXPECT_TRUE(results[2]->send_full_manifest());
  for (int r : {0, 1, 3}) {
    ASSERT_TRUE(done[r].WaitForNotificationWithTimeout(absl::Seconds(10)))
        << "rank " << r << "'s Join never ended";
    EXPECT_THAT(
        results[r],
        StatusIs(absl::StatusCode::kDeadlineExceeded,
                 AllOf(HasSubstr(absl::StrCat("rank ", r, " timed out")),
                       HasSubstr("ranks [2]"))));
  }
  service.Shutdown();  // before `done` and `results` go
}

TEST_F(CompactJoinTest, WrongCoordinate_EveryRankGetsErrorNamingRank) {
  const std::vector<v1::RankManifest> manifests = Manifests(FourRankSpec());
  std::vector<v1::JoinRequest> requests;
  for (const v1::RankManifest& m : manifests) {
    requests.push_back(Request(m, m.rank() != 0));
  }
  requests[3].mutable_compact()->set_coord(0, 1);  // rank 3 is at (3)
  CoordinatorService service(Options());
  std::vector<bool> asked;
  auto results = JoinAll(service, requests, manifests, &asked);
  for (const auto& r : results) {
    EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument,
                            AllOf(HasSubstr("rank 3 reports mesh coordinate "
                                            "(1)"),
                                  HasSubstr("is at (3)"))));
  }
}

TEST_F(CompactJoinTest, Rank0Compact_Refused) {
  const std::vector<v1::RankManifest> manifests = Manifests(FourRankSpec());
  std::vector<v1::JoinRequest> requests;
  for (const v1::RankManifest& m : manifests)
    requests.push_back(Request(m, true));
  CoordinatorService service(Options());
  std::vector<bool> asked;
  auto results = JoinAll(service, requests, manifests, &asked);
  for (const auto& r : results) {
    EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument,
                            HasSubstr("rank 0 must send its full manifest")));
  }
}

TEST_F(CompactJoinTest, PipelineJobWithCompactRanks_FullManifestsPlanAsBefore) {
  // Rank 0's layout has pipeline stages: no rank follows it, so every
  // compact rank is asked for its full manifest and the job plans as with
  // full manifests.
  const std::vector<v1::RankManifest> manifests = Manifests(PipelineSpec());
  std::vector<v1::JoinRequest> requests;
  for (const v1::RankManifest& m : manifests) {
    requests.push_back(Request(m, m.rank() != 0));
  }
  CoordinatorService service(Options());
  std::vector<bool> asked;
  auto results = JoinAll(service, requests, manifests, &asked);
  absl::StatusOr<JobPlan> full = PlanJob(manifests, "job", PlanDefaults());
  ASSERT_THAT(full, IsOk());
  for (size_t r = 0; r < results.size(); ++r) {
    ASSERT_THAT(results[r], IsOk()) << r;
    EXPECT_EQ(asked[r], r != 0) << r;
    EXPECT_EQ(results[r]->plan().hash(), full->plan.hash()) << r;
  }
}

// Host mode on a pipeline job of 8 ranks: host 0 (rank 0 full, ranks 1-3
// compact) and host 1 (ranks 4-7 compact). The compact ranks are asked for full
// manifests while rank 0 still waits: host 0's HostJoin answers with
// send_full_manifest at once instead of waiting for rank 0, both hosts
// rejoin their ranks with full manifests, and both get the plan of the
// full manifests.
TEST_F(CompactJoinTest, HostJoin_FullManifestAsked_AnsweredAtOnceThenPlans) {
  const std::vector<v1::RankManifest> manifests = Manifests(PipelineSpec());
  ASSERT_EQ(manifests.size(), 8u);
  std::vector<absl::StatusOr<v1::JoinResponse>> first(
      2, absl::UnknownError("not run"));
  std::vector<absl::StatusOr<v1::JoinResponse>> results(
      2, absl::UnknownError("not run"));
  CoordinatorService service(Options());
  std::vector<std::thread> hosts;
  for (int h = 0; h < 2; ++h) {
    hosts.emplace_back([&, h] {
      v1::HostJoinRequest compact, full;
      compact.set_host(absl::StrCat("node-", h));
      full.set_host(absl::StrCat("node-", h));
      for (int r = 4 * h; r < 4 * h + 4; ++r) {
        *compact.add_ranks() = Request(manifests[r], r != 0);
        *full.add_ranks() = Request(manifests[r], /*compact=*/false);
      }
      first[h] = HostJoin(service, compact);
      results[h] = first[h].ok() && first[h]->send_full_manifest()
                       ? HostJoin(service, full)
                       : first[h];
    });
  }
  for (std::thread& t : hosts) t.join();
  absl::StatusOr<JobPlan> plan = PlanJob(manifests, "job", PlanDefaults());
  ASSERT_THAT(plan, IsOk());
  for (int h = 0; h < 2; ++h) {
    ASSERT_THAT(first[h], IsOk()) << "host " << h;
    EXPECT_TRUE(first[h]->send_full_manifest()) << "host " << h;
    ASSERT_THAT(results[h], IsOk()) << "host " << h;
    EXPECT_FALSE(results[h]->send_full_manifest()) << "host " << h;
    EXPECT_EQ(results[h]->plan().hash(), plan->plan.hash()) << "host " << h;
  }
}

TEST(CompactManifestTest, FollowsLayout_PipelineOrWrongLocalShape_NotCompact) {
  EXPECT_THAT(
      CheckManifestFollowsLayout(Manifests(PipelineSpec())[5]),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("sub-mesh")));
  v1::RankManifest m = Manifests(FourRankSpec())[1];
  m.mutable_params(0)->set_local_shape(0, 2);  // chunk rule gives 3
  EXPECT_THAT(CheckManifestFollowsLayout(m),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("fc1.weight"), HasSubstr("[3, 7]"))));
}

// What the layout hash tells apart: an option the full checks compare
// changes it; a default spelled out or a per-rank device field does not.
TEST(CompactManifestTest, LayoutHash_ChangesExactlyWithWhatTheChecksCompare) {
  const v1::RankManifest base = Manifests(FourRankSpec())[1];
  const std::string hash = ManifestLayoutHash(base);
  std::vector<std::function<void(v1::RankManifest*)>> same = {
      [](v1::RankManifest* m) {
        m->mutable_execution()->set_assignment_policy("lpt");
      },
      [](v1::RankManifest* m) {
        m->mutable_execution()->set_exchange_dtype("float32");
      },
      [](v1::RankManifest* m) { m->set_ns_steps(5); },
      [](v1::RankManifest* m) { m->mutable_execution()->set_device("cuda:7"); },
      [](v1::RankManifest* m) {
        m->mutable_execution()->set_gpu_precision("bf16");
      },
  };
  std::vector<std::function<void(v1::RankManifest*)>> different = {
      [](v1::RankManifest* m) {
        m->mutable_execution()->set_assignment_policy("round_robin");
      },
      [](v1::RankManifest* m) {
        m->mutable_execution()->set_exchange_dtype("bfloat16");
      },
      [](v1::RankManifest* m) { m->set_ns_steps(6); },
      [](v1::RankManifest* m) {
        m->mutable_execution()->set_bucket_size_bytes(1 << 20);
      },
      [](v1::RankManifest* m) { m->mutable_params(0)->set_name("other"); },
  };
  for (size_t i = 0; i < same.size(); ++i) {
    v1::RankManifest m = base;
    same[i](&m);
    EXPECT_EQ(ManifestLayoutHash(m), hash) << "change " << i;
  }
  for (size_t i = 0; i < different.size(); ++i) {
    v1::RankManifest m = base;
    different[i](&m);
    EXPECT_NE(ManifestLayoutHash(m), hash) << "change " << i;
  }
}

TEST(CompactManifestTest, ManifestForRank_EqualsTheSpecsManifestOfEveryRank) {
  const std::vector<v1::RankManifest> manifests = Manifests(ExpertSpec());
  for (size_t r = 0; r < manifests.size(); ++r) {
    absl::StatusOr<v1::RankManifest> m =
        ManifestForRank(manifests[0], static_cast<int>(r));
    ASSERT_THAT(m, IsOk());
    EXPECT_EQ(m->SerializeAsString(), manifests[r].SerializeAsString()) << r;
    EXPECT_EQ(ManifestLayoutHash(manifests[r]),
              ManifestLayoutHash(manifests[0]));
  }
}

}  // namespace
}  // namespace muon
