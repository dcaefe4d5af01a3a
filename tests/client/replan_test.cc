// Re-planning from measured times (ExecutionOptions.replan_every_steps): four
// ranks as threads with one in-process coordinator; rank 2's Newton-Schulz
// engine is artificially slow. After the first re-plan boundaries the
// coordinator's cost model sees it, rank 2's load drops, every rank switches at
// the same step to the same plan, and the parameters and momentum stay bitwise
// equal to the single-device run.
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/ns_engine.h"
#include "tests/client/rank_threads.h"
#include "tests/client/single_device_reference.h"
#include "tests/client/thread_world.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::muon::testing::DistributedRun;
using ::muon::testing::ExpectEachMatrixOrthogonalizedOnce;
using ::muon::testing::ExpectShardsMatchSingleDevice;
using ::muon::testing::kJoinTimeoutMs;
using ::muon::testing::MakeProblem;
using ::muon::testing::Problem;
using ::muon::testing::RankShards;
using ::muon::testing::RunDistributedSteps;
using ::muon::testing::RunSingleDevice;
using ::muon::testing::SingleDeviceResult;
using ::muon::testing::ThreadWorld;
using ::muon::testing::UniformLayout;
using ::testing::HasSubstr;

constexpr int kWorld = 4;
constexpr int kSlowRank = 2;
constexpr int kSteps = 6;
constexpr int kReplanEvery = 2;

// The CPU engine, then a sleep of (slowdown - 1) x the time it took plus
// 20 ms: the rank's measured seconds per FLOP are at least `slowdown` times
// the others', and stay well above them on a loaded machine, where another
// rank's 64 x 64 Newton-Schulz can be descheduled for milliseconds.
class SlowEngine final : public kernels::NsEngine {
 public:
  explicit SlowEngine(double slowdown)
      : inner_(kernels::MakeCpuNsEngine()), slowdown_(slowdown) {}
  absl::Status Orthogonalize(const float* u, int64_t rows, int64_t cols,
                             const kernels::NewtonSchulzOptions& options,
                             float* out) override {
    const absl::Time t0 = absl::Now();
    absl::Status s = inner_->Orthogonalize(u, rows, cols, options, out);
    absl::SleepFor((slowdown_ - 1) * (absl::Now() - t0) +
                   absl::Milliseconds(20));
    return s;
  }
  absl::Status Reserve(int64_t rows, int64_t cols,
                       const kernels::NewtonSchulzOptions& options) override {
    return inner_->Reserve(rows, cols, options);
  }
  std::string name() const override { return "slow " + inner_->name(); }

 private:
  std::unique_ptr<kernels::NsEngine> inner_;
  double slowdown_;
};

// Eight 64x64 matrices FSDP-sharded over four ranks: every rank holds each,
// so LPT gives every rank two while their speeds are unknown.
Problem EightMatrices() {
  std::vector<::muon::testing::TensorSpec> specs;
  for (int i = 0; i < 8; ++i) {
    specs.push_back({"layers." + std::to_string(i) + ".weight", {64, 64}});
  }
  return MakeProblem(specs, kSteps);
}

int OwnedBy(const v1::Plan& plan, int rank) {
  int n = 0;
  for (const v1::MatrixPlan& m : plan.matrices()) n += m.owner() == rank;
  return n;
}

class World : public ThreadWorld {
 public:
  World() : ThreadWorld(kWorld), run(kWorld) {}

  // Rank `rank`'s FSDP config over its shards, with this world's process
  // group and coordinator client (bounded join).
  absl::StatusOr<DistributedConfig> Config(int rank, RankShards& shards) {
    AutoConfigOptions o;
    o.fsdp = comm(rank);
    o.coordinator = client(rank);
    absl::StatusOr<DistributedConfig> config =
        CreateAutoConfig(shards.Pointers(), o);
    if (!config.ok()) return config.status();
    config->state.join_timeout_ms = kJoinTimeoutMs;
    config->state.incarnation = 100 + rank;
    return config;
  }

  DistributedRun run;
};

TEST(ReplanTest, SlowRank_LoadDropsAfterReplan_ResultsBitwiseUnchanged) {
  const Problem problem = EightMatrices();
  MuonOptions options;
  options.lr = 0.02;
  const absl::StatusOr<SingleDeviceResult> single =
      RunSingleDevice(problem, options);
  ASSERT_THAT(single, IsOk());
  World world;
  ASSERT_TRUE(world.Connect());
  const auto layout =
      UniformLayout(Mesh::OneDim(kWorld), {Placement::Shard(0)}, 8);
  std::vector<v1::Plan> first(kWorld);
  std::vector<absl::Status> statuses = RunDistributedSteps(
      problem, layout,
      [&](int rank,
          RankShards& shards) -> absl::StatusOr<std::unique_ptr<Muon>> {
        absl::StatusOr<DistributedConfig> config = world.Config(rank, shards);
        if (!config.ok()) return config.status();
        config->execution.set_replan_every_steps(kReplanEvery);
        if (rank == kSlowRank) {
          config->ns_engine_factory =
              []() -> absl::StatusOr<std::unique_ptr<kernels::NsEngine>> {
            return std::make_unique<SlowEngine>(8.0);
          };
        }
        absl::StatusOr<std::unique_ptr<Muon>> muon =
            Muon::Create(shards.Pointers(), options, *std::move(config));
        if (muon.ok()) first[rank] = (*muon)->plan();
        return muon;
      },
      &world.run);
  for (int r = 0; r < kWorld; ++r) ASSERT_THAT(statuses[r], IsOk()) << r;

  // Before: two matrices each. After: the slow rank owns fewer; every rank
  // runs the same re-plan.
  EXPECT_EQ(OwnedBy(first[kSlowRank], kSlowRank), 2);
  const v1::Plan& last = world.run.muons[0]->plan();
  EXPECT_GE(last.version(), 1);
  EXPECT_LT(OwnedBy(last, kSlowRank), 2);
  for (int r = 1; r < kWorld; ++r) {
    EXPECT_EQ(world.run.muons[r]->plan().hash(), last.hash()) << r;
  }
  // The coordinator's plan carries the cost model: the slow rank measured
  // slower per FLOP than every other rank.
  absl::StatusOr<v1::Plan> full = world.service().GetPlan(v1::GetPlanRequest());
  ASSERT_THAT(full, IsOk());
  EXPECT_EQ(full->hash(), last.hash());
  ASSERT_EQ(full->loads_size(), kWorld);
  for (int r = 0; r < kWorld; ++r) {
    if (r == kSlowRank) continue;
    EXPECT_GT(full->loads(kSlowRank).seconds_per_flop(),
              2 * full->loads(r).seconds_per_flop())
        << r;
  }
  // Each matrix's Newton-Schulz does not depend on its owner.
  ExpectShardsMatchSingleDevice(problem, *single, world.run);
  ExpectEachMatrixOrthogonalizedOnce(problem, *single, world.run);
}

TEST(ReplanTest, ReplanOff_ReplanRpcRefusedNamingTheSetting) {
  World world;
  ASSERT_TRUE(world.Connect());
  const Problem problem = MakeProblem({{"w", {8, 8}}}, 1);
  const auto layout =
      UniformLayout(Mesh::OneDim(kWorld), {Placement::Shard(0)}, 1);
  std::vector<absl::Status> statuses = RunDistributedSteps(
      problem, layout,
      [&](int rank,
          RankShards& shards) -> absl::StatusOr<std::unique_ptr<Muon>> {
        absl::StatusOr<DistributedConfig> config = world.Config(rank, shards);
        if (!config.ok()) return config.status();
        return Muon::Create(shards.Pointers(), MuonOptions(),
                            *std::move(config));
      },
      &world.run);
  for (int r = 0; r < kWorld; ++r) ASSERT_THAT(statuses[r], IsOk()) << r;
  v1::ReplanRequest request;
  request.set_rank(1);
  request.set_incarnation(101);
  request.set_step(2);
  EXPECT_THAT(world.client(1)->Replan(request),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("re-planning is off")));
}

}  // namespace
}  // namespace muon
