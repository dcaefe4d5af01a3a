// Multi-rank tests of muon::Muon: N ranks as N threads of this process, each
// with its own GlooCommunicator (TCP on 127.0.0.1) and its own
// LocalCoordinationClient over ONE shared in-process CoordinatorService
// (join, plan, plan-hash confirmation and the Gloo rendezvous): the harness
// of tests/client/distributed_world.h. The Muon variants over the same
// layouts are in muon_variants_test.cc.
//
// What is checked:
//   - Correctness: 3 steps with seeded gradients give, bit for bit, the
//     single-device parameters, and every rank's momentum buffer equals the
//     region of the single-device buffer it holds. FSDP Shard(0)/Shard(1)
//     (uneven shards, and empty shards where a dim is smaller than the
//     world), DDP (Replicate) at 2 and 4 ranks, a DTensor-style mesh config
//     and HSDP. The problem, the single-device run, the shard cutting and
//     the comparison are the shared harness of
//     tests/client/single_device_reference.h.
//   - Zero redundancy: over the ranks, matrices_orthogonalized sums to the
//     number of matrices and ns_flops to the single-device figure.
//   - Bad input is reported on EVERY rank before any collective, with the
//     parameters untouched (and the process group still usable afterwards).
//
// OpenBLAS results depend on its thread count, so every test that compares
// bits pins it to 1 thread first (RunSingleDevice does). Every blocking
// call is bounded: Gloo collectives and rendezvous by GlooOptions.timeout,
// Join by join_timeout_ms; RunOnRanks aborts the process instead of hanging
// if a rank still does not finish.
#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "client/parameter.h"
#include "comm/communicator.h"
#include "common/layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/newton_schulz.h"
#include "tests/client/distributed_world.h"
#include "tests/client/rank_threads.h"
#include "tests/client/single_device_reference.h"
#include "tests/client/thread_world.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;

using ::muon::testing::AutoConfig;
using ::muon::testing::BitwiseEqual;
using ::muon::testing::ExpectMatchesSingleDevice;
using ::muon::testing::ExpectShardsMatchSingleDevice;
using ::muon::testing::kSteps;
using ::muon::testing::MatricesProblem;
using ::muon::testing::MeshConfig;
using ::muon::testing::OneDimLayout;
using ::muon::testing::Problem;
using ::muon::testing::ProblemLayout;
using ::muon::testing::RunOnRanks;
using ::muon::testing::RunSingleDevice;
using ::muon::testing::SingleDeviceResult;
using ::muon::testing::TestOptions;
using ::muon::testing::World;

// --- Bitwise equality with the single-device step ---

TEST(MuonDistributedTest, Step_FsdpShard0FourRanks_MatchesSingleDeviceBitwise) {
  const Problem problem = MatricesProblem();
  World world(4);
  ExpectMatchesSingleDevice(
      world, problem,
      OneDimLayout(4, Placement::Shard(0), problem.specs.size()),
      AutoConfig(/*fsdp=*/true, /*shard_dim=*/0));
}

TEST(MuonDistributedTest, Step_FsdpShard1FourRanks_MatchesSingleDeviceBitwise) {
  const Problem problem = MatricesProblem();
  World world(4);
  ExpectMatchesSingleDevice(
      world, problem,
      OneDimLayout(4, Placement::Shard(1), problem.specs.size()),
      AutoConfig(/*fsdp=*/true, /*shard_dim=*/1));
}

TEST(MuonDistributedTest, Step_DdpTwoRanks_MatchesSingleDeviceBitwise) {
  const Problem problem = MatricesProblem();
  World world(2);
  ExpectMatchesSingleDevice(world, problem,
                            OneDimLayout(2, Placement::Replicate(), 4),
                            AutoConfig(/*fsdp=*/false));
}

TEST(MuonDistributedTest, Step_DdpFourRanks_MatchesSingleDeviceBitwise) {
  const Problem problem = MatricesProblem();
  World world(4);
  ExpectMatchesSingleDevice(world, problem,
                            OneDimLayout(4, Placement::Replicate(), 4),
                            AutoConfig(/*fsdp=*/false));
}

// DTensor-style config with a different placement per parameter.
TEST(MuonDistributedTest,
     Step_MeshConfigMixedPlacementsFourRanks_MatchesSingleDeviceBitwise) {
  const Problem problem = MatricesProblem();
  ProblemLayout layout;
  layout.mesh = Mesh::OneDim(4, "dp_shard");
  layout.placements = {{Placement::Shard(1)},
                       {Placement::Shard(0)},
                       {Placement::Replicate()},
                       {Placement::Shard(1)}};
  World world(4);
  ExpectMatchesSingleDevice(world, problem, layout, MeshConfig(layout));
}

// HSDP: dp_replicate=2 x dp_shard=2, [Replicate(), Shard(0)].
TEST(MuonDistributedTest, Step_HsdpTwoByTwoMesh_MatchesSingleDeviceBitwise) {
  const Problem problem = MatricesProblem();
  ProblemLayout layout;
  layout.mesh.names = {"dp_replicate", "dp_shard"};
  layout.mesh.sizes = {2, 2};
  layout.placements.assign(problem.specs.size(),
                           {Placement::Replicate(), Placement::Shard(0)});
  World world(4);
  ExpectMatchesSingleDevice(world, problem, layout, MeshConfig(layout));
}

// Buckets of several matrices (one exchange for all of them).
TEST(MuonDistributedTest,
     Step_FsdpShard0LargeBuckets_MatchesSingleDeviceBitwise) {
  const Problem problem = MatricesProblem();
  World world(4);
  ExpectMatchesSingleDevice(
      world, problem, OneDimLayout(4, Placement::Shard(0), 4),
      AutoConfig(/*fsdp=*/true, 0), TestOptions(),
      [](DistributedConfig& c) { c.execution.set_bucket_size_bytes(1 << 20); });
}

TEST(MuonDistributedTest,
     Step_FsdpShard1RoundRobinNesterovOffMatchRms_MatchesSingleDeviceBitwise) {
  const Problem problem = MatricesProblem();
  MuonOptions o = TestOptions();
  o.nesterov = false;
  o.adjust_lr_fn = kernels::AdjustLrFn::kMatchRmsAdamW;
  World world(4);
  ExpectMatchesSingleDevice(
      world, problem, OneDimLayout(4, Placement::Shard(1), 4),
      AutoConfig(/*fsdp=*/true, 1), o, [](DistributedConfig& c) {
        c.execution.set_assignment_policy("round_robin");
      });
}

// A valid user assign_fn (every matrix to rank 1) is honoured: same bits,
// assignments() says so on every rank, and only rank 1 orthogonalizes.
TEST(MuonDistributedTest,
     Step_CustomAssignFnAllToRankOne_MatchesSingleDeviceAndAssignments) {
  const Problem problem = MatricesProblem();
  World world(4);
  ExpectMatchesSingleDevice(
      world, problem, OneDimLayout(4, Placement::Shard(0), 4),
      AutoConfig(/*fsdp=*/true, 0), TestOptions(), [](DistributedConfig& c) {
        c.assign_fn = [](const std::vector<MatrixInfo>& infos, int) {
          std::map<int, std::vector<int>> out;
          for (const MatrixInfo& m : infos) out[1].push_back(m.index);
          return out;
        };
      });
  const std::map<int, std::vector<int>> expected = {{1, {0, 1, 2, 3}}};
  for (int r = 0; r < world.size(); ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    ASSERT_NE(world.run.muons[r], nullptr);
    std::map<int, std::vector<int>> got = world.run.muons[r]->assignments();
    for (auto& [rank, indices] : got) std::sort(indices.begin(), indices.end());
    EXPECT_EQ(got, expected);
    for (int step = 0; step < kSteps; ++step) {
      EXPECT_EQ(world.run.stats[r][step].matrices_orthogonalized,
                r == 1 ? 4 : 0);
    }
  }
}

// Zero redundancy per rank: each rank orthogonalizes exactly the matrices
// the plan gives it (so, summed over the world, each matrix once) and reports
// their NS FLOPs; DDP replicas split the work instead of each redoing it.
TEST(MuonDistributedTest,
     Step_FsdpAndDdp_EachRankOrthogonalizesItsOwnMatrices) {
  const Problem problem = MatricesProblem();
  for (const bool fsdp : {true, false}) {
    SCOPED_TRACE(fsdp ? "FSDP Shard(0)" : "DDP");
    World world(4);
    ExpectMatchesSingleDevice(
        world, problem,
        OneDimLayout(4, fsdp ? Placement::Shard(0) : Placement::Replicate(),
                     problem.specs.size()),
        AutoConfig(fsdp, 0));
    int owners = 0;
    for (int r = 0; r < world.size(); ++r) {
      SCOPED_TRACE(absl::StrCat("rank ", r));
      ASSERT_NE(world.run.muons[r], nullptr);
      const std::map<int, std::vector<int>> a =
          world.run.muons[r]->assignments();
      const std::vector<int> mine =
          a.count(r) > 0 ? a.at(r) : std::vector<int>();
      if (!mine.empty()) ++owners;
      double flops = 0;
      for (int i : mine) {
        flops += kernels::NewtonSchulzFlops(problem.specs[i].shape[0],
                                            problem.specs[i].shape[1],
                                            TestOptions().ns_steps);
      }
      for (int step = 0; step < kSteps; ++step) {
        EXPECT_EQ(world.run.stats[r][step].matrices_orthogonalized,
                  static_cast<int>(mine.size()));
        EXPECT_DOUBLE_EQ(world.run.stats[r][step].ns_flops, flops);
      }
    }
    // 4 matrices over 4 ranks: the work is spread, not all on one rank.
    EXPECT_GT(owners, 1);
  }
}

// --- Bad input: the same error on every rank, before any collective ---

// Expects every rank's status to have `code` and a message naming `param`
// and the rank itself (when name_rank), every parameter to be untouched, and
// the process group to be still usable (no rank is stuck in, or has left
// behind, a half-issued collective).
void ExpectFailsOnEveryRank(World& world, const std::vector<absl::Status>& st,
                            const std::vector<std::vector<Parameter>>& before,
                            absl::StatusCode code,
                            const std::vector<std::string>& substrings,
                            bool name_rank = true) {
  const int n = world.size();
  ASSERT_EQ(st.size(), static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_EQ(st[r].code(), code) << st[r];
    for (const std::string& s : substrings) {
      EXPECT_THAT(std::string(st[r].message()), HasSubstr(s));
    }
    if (name_rank) {
      EXPECT_THAT(std::string(st[r].message()),
                  HasSubstr(absl::StrCat("rank ", r)));
    }
    EXPECT_EQ(world.run.muons[r], nullptr);
    ASSERT_EQ(world.params(r).size(), before[r].size());
    for (size_t i = 0; i < before[r].size(); ++i) {
      EXPECT_TRUE(BitwiseEqual(world.params(r)[i].data, before[r][i].data))
          << world.params(r)[i].name;
    }
  }
  std::vector<absl::Status> barrier =
      RunOnRanks(n, [&](int rank) { return world.comm(rank)->Barrier(); });
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(barrier[r].ok()) << "rank " << r << ": " << barrier[r];
  }
}

// Runs, on every rank: cut shards (FSDP Shard(0) over the world), let
// `mutate` change this rank's parameters, then Create with `customize`.
// Returns every rank's Create status; `before` receives the parameters as
// they were handed to Create.
std::vector<absl::Status> CreateOnEveryRank(
    World& world, const Problem& problem,
    const std::function<void(int rank, std::vector<Parameter>&)>& mutate,
    const std::function<void(DistributedConfig&)>& customize,
    std::vector<std::vector<Parameter>>* before) {
  before->assign(world.size(), {});
  return RunOnRanks(world.size(), [&](int rank) -> absl::Status {
    const ProblemLayout layout =
        OneDimLayout(world.size(), Placement::Shard(0), problem.specs.size());
    if (absl::Status s = world.MakeShards(rank, problem, layout); !s.ok()) {
      return absl::InternalError(absl::StrCat("test setup: ", s.message()));
    }
    if (mutate) mutate(rank, world.params(rank));
    (*before)[rank] = world.params(rank);
    return world.CreateMuon(rank, AutoConfig(/*fsdp=*/true, 0), TestOptions(),
                            customize);
  });
}

TEST(MuonDistributedTest,
     Create_OneDimParameterOnEveryRank_ReturnsInvalidArgumentOnEveryRank) {
  const Problem problem = MatricesProblem();
  World world(4);
  ASSERT_TRUE(world.Connect());
  std::vector<std::vector<Parameter>> before;
  std::vector<absl::Status> st = CreateOnEveryRank(
      world, problem,
      [](int rank, std::vector<Parameter>& params) {
        Parameter bias;
        bias.name = "layers.0.bias";
        bias.global_shape = {10};
        const Range chunk = ChunkRange(10, 4, rank);
        bias.local_shape = {chunk.size()};
        bias.data.assign(chunk.size(), 0.25f);
        bias.grad.assign(chunk.size(), 0.0f);
        params.insert(params.begin() + 1, bias);
      },
      nullptr, &before);
  ExpectFailsOnEveryRank(world, st, before, absl::StatusCode::kInvalidArgument,
                         {"layers.0.bias", "[10]"});
}

TEST(MuonDistributedTest,
     Create_ThreeDimParameterOnEveryRank_ReturnsInvalidArgumentOnEveryRank) {
  const Problem problem = MatricesProblem();
  World world(4);
  ASSERT_TRUE(world.Connect());
  std::vector<std::vector<Parameter>> before;
  std::vector<absl::Status> st = CreateOnEveryRank(
      world, problem,
      [](int rank, std::vector<Parameter>& params) {
        Parameter conv;
        conv.name = "conv.weight";
        conv.global_shape = {8, 3, 2};
        conv.local_shape = {2, 3, 2};
        conv.data.assign(12, 0.5f);
        conv.grad.assign(12, 0.0f);
        params.push_back(conv);
      },
      nullptr, &before);
  ExpectFailsOnEveryRank(world, st, before, absl::StatusCode::kInvalidArgument,
                         {"conv.weight", "[8, 3, 2]"});
}

// Rank 2 says layers.1.weight is [4, 5] (its own 1x5 shard fits both
// [3, 5] and [4, 5], so its local checks pass); the coordinator compares the
// manifests and answers every rank with the same error.
TEST(
    MuonDistributedTest,
    Create_ManifestsDisagreeOnGlobalShape_ReturnsSameInvalidArgumentOnEveryRank) {
  const Problem problem = MatricesProblem();
  World world(4);
  ASSERT_TRUE(world.Connect());
  std::vector<std::vector<Parameter>> before;
  std::vector<absl::Status> st = CreateOnEveryRank(
      world, problem,
      [](int rank, std::vector<Parameter>& params) {
        if (rank == 2) params[1].global_shape = {4, 5};
      },
      nullptr, &before);
  ExpectFailsOnEveryRank(world, st, before, absl::StatusCode::kInvalidArgument,
                         {"layers.1.weight", "rank 2", "[4, 5]", "[3, 5]"},
                         /*name_rank=*/false);
  for (int r = 1; r < world.size(); ++r) {
    EXPECT_EQ(st[r], st[0]) << "rank " << r;
  }
}

// assign_fn results that are invalid the same way on every rank (assign_fn
// is deterministic).
TEST(MuonDistributedTest,
     Create_AssignFnMissingOwner_ReturnsInvalidArgumentOnEveryRank) {
  const Problem problem = MatricesProblem();
  World world(4);
  ASSERT_TRUE(world.Connect());
  std::vector<std::vector<Parameter>> before;
  std::vector<absl::Status> st = CreateOnEveryRank(
      world, problem, nullptr,
      [](DistributedConfig& c) {
        c.assign_fn = [](const std::vector<MatrixInfo>&, int) {
          return std::map<int, std::vector<int>>{{0, {0}}, {1, {1}}, {2, {3}}};
        };
      },
      &before);
  ExpectFailsOnEveryRank(world, st, before, absl::StatusCode::kInvalidArgument,
                         {"layers.2.weight"});
}

TEST(MuonDistributedTest,
     Create_AssignFnDuplicatedOwner_ReturnsInvalidArgumentOnEveryRank) {
  const Problem problem = MatricesProblem();
  World world(4);
  ASSERT_TRUE(world.Connect());
  std::vector<std::vector<Parameter>> before;
  std::vector<absl::Status> st = CreateOnEveryRank(
      world, problem, nullptr,
      [](DistributedConfig& c) {
        c.assign_fn = [](const std::vector<MatrixInfo>&, int) {
          return std::map<int, std::vector<int>>{
              {0, {0, 1}}, {1, {2}}, {2, {3, 1}}};
        };
      },
      &before);
  ExpectFailsOnEveryRank(world, st, before, absl::StatusCode::kInvalidArgument,
                         {"layers.1.weight", "0", "2"});
  for (int r = 0; r < world.size(); ++r) {
    EXPECT_THAT(std::string(st[r].message()),
                AnyOf(HasSubstr("ranks 0 and 2"), HasSubstr("ranks 2 and 0")))
        << "rank " << r;
  }
}

TEST(MuonDistributedTest,
     Create_AssignFnOwnerOutOfRange_ReturnsInvalidArgumentOnEveryRank) {
  const Problem problem = MatricesProblem();
  for (const int bad_rank : {4, -1}) {
    SCOPED_TRACE(absl::StrCat("owner rank ", bad_rank));
    World world(4);
    ASSERT_TRUE(world.Connect());
    std::vector<std::vector<Parameter>> before;
    std::vector<absl::Status> st = CreateOnEveryRank(
        world, problem, nullptr,
        [bad_rank](DistributedConfig& c) {
          c.assign_fn = [bad_rank](const std::vector<MatrixInfo>&, int) {
            return std::map<int, std::vector<int>>{
                {0, {0}}, {1, {1}}, {bad_rank, {2}}, {3, {3}}};
          };
        },
        &before);
    ExpectFailsOnEveryRank(
        world, st, before, absl::StatusCode::kInvalidArgument,
        {"layers.2.weight", absl::StrCat("rank ", bad_rank)});
  }
}

// Rank 3 holds an empty shard of layers.1.weight ([3, 5] over 4 ranks), so
// it cannot own it; the coordinator rejects the plan on every rank.
TEST(MuonDistributedTest,
     Create_AssignFnOwnerWithEmptyShard_ReturnsInvalidArgumentOnEveryRank) {
  const Problem problem = MatricesProblem();
  World world(4);
  ASSERT_TRUE(world.Connect());
  std::vector<std::vector<Parameter>> before;
  std::vector<absl::Status> st = CreateOnEveryRank(
      world, problem, nullptr,
      [](DistributedConfig& c) {
        c.assign_fn = [](const std::vector<MatrixInfo>&, int) {
          return std::map<int, std::vector<int>>{
              {0, {0}}, {1, {2}}, {2, {3}}, {3, {1}}};
        };
      },
      &before);
  ExpectFailsOnEveryRank(world, st, before, absl::StatusCode::kInvalidArgument,
                         {"layers.1.weight", "rank 3"}, /*name_rank=*/false);
  for (int r = 1; r < world.size(); ++r) {
    EXPECT_EQ(st[r], st[0]) << "rank " << r;
  }
}

// A missing gradient on every rank: FailedPrecondition everywhere from the
// preflight, parameters and momentum buffers untouched, and the job still
// steps afterwards. (layers.3.weight, 12x16, is non-empty on every rank: for
// an empty shard a missing gradient is the expected size, 0.)
TEST(MuonDistributedTest,
     Step_MissingGradientOnEveryRank_ReturnsFailedPreconditionOnEveryRank) {
  openblas_set_num_threads(1);
  const Problem problem = MatricesProblem();
  World world(4);
  ASSERT_TRUE(world.Connect());
  const ProblemLayout layout = OneDimLayout(4, Placement::Shard(0), 4);
  // [rank][param], around the failed step.
  std::vector<std::vector<std::vector<float>>> data_before(4), bufs_before(4),
      data_after(4), bufs_after(4);
  std::vector<absl::Status> failed(4);
  std::vector<int64_t> steps_after_failure(4, -1);
  std::vector<absl::Status> st = RunOnRanks(4, [&](int rank) -> absl::Status {
    if (absl::Status s = world.MakeShards(rank, problem, layout); !s.ok()) {
      return s;
    }
    if (absl::Status s =
            world.CreateMuon(rank, AutoConfig(true, 0), TestOptions());
        !s.ok()) {
      return s;
    }
    Muon& muon = *world.run.muons[rank];
    world.run.shards[rank].SetGrads(problem, 0);
    if (absl::Status s = muon.Step(); !s.ok()) return s;
    world.run.shards[rank].SetGrads(problem, 1);
    world.params(rank)[3].grad.clear();
    for (size_t i = 0; i < world.params(rank).size(); ++i) {
      data_before[rank].push_back(world.params(rank)[i].data);
      bufs_before[rank].push_back(muon.momentum_buffer(i));
    }
    failed[rank] = muon.Step();
    steps_after_failure[rank] = muon.step_count();
    for (size_t i = 0; i < world.params(rank).size(); ++i) {
      data_after[rank].push_back(world.params(rank)[i].data);
      bufs_after[rank].push_back(muon.momentum_buffer(i));
    }
    // With the gradient back the job goes on: the ranks are still in step.
    world.params(rank)[3].grad.assign(world.params(rank)[3].data.size(), 0.0f);
    world.run.shards[rank].SetGrads(problem, 1);
    return muon.Step();
  });
  for (int r = 0; r < 4; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_TRUE(st[r].ok()) << st[r];
    EXPECT_THAT(failed[r],
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         AllOf(HasSubstr("layers.3.weight"),
                               HasSubstr(absl::StrCat("rank ", r)))));
    EXPECT_EQ(steps_after_failure[r], 1);
    ASSERT_EQ(data_after[r].size(), data_before[r].size());
    for (size_t i = 0; i < data_before[r].size(); ++i) {
      EXPECT_TRUE(BitwiseEqual(data_after[r][i], data_before[r][i])) << i;
      EXPECT_TRUE(BitwiseEqual(bufs_after[r][i], bufs_before[r][i])) << i;
    }
  }
  // Equality with a single-device run of 2 steps (the failed step not
  // counted): parameters and momentum buffers.
  Problem two = problem;
  two.grads.resize(2);
  const absl::StatusOr<SingleDeviceResult> single =
      RunSingleDevice(two, TestOptions());
  ASSERT_THAT(single, IsOk());
  for (int r = 0; r < 4; ++r) {
    ASSERT_NE(world.run.muons[r], nullptr);
    EXPECT_EQ(world.run.muons[r]->step_count(), 2) << "rank " << r;
  }
  ExpectShardsMatchSingleDevice(two, *single, world.run);
}

}  // namespace
}  // namespace muon
