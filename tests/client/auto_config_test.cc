// Tests of muon::CreateAutoConfig (client/distributed_config.h), the
// process-group style config, on the harness of tests/client/
// auto_config_job.h:
//   - The mesh CreateAutoConfig builds (names and sizes in the standard order
//     pp x dp_replicate x dp_shard x cp x ep x tp) and, per parameter, its
//     placements and sub-mesh, for FSDP, DDP (ddp and replicate), TP + FSDP
//     with per-parameter tp dims, HSDP, TP + HSDP, CP + TP, EP (3-D expert
//     stacks), EP + TP, PP and PP + FSDP. The expected placements are written
//     out by hand in each test; the test cuts each rank's shards from them
//     (common/layout's torch.chunk rule), so CreateAutoConfig's local-shape
//     check also sees consistent input.
//   - End to end: TP + FSDP and HSDP (and EP + TP, PP + FSDP) through
//     CreateAutoConfig + Muon::Create + Step give, bit for bit, the
//     single-device parameters and momentum buffers, with each matrix
//     orthogonalized exactly once in the world (the shared harness of
//     tests/client/single_device_reference.h).
// Every blocking call is bounded: Gloo rendezvous and collectives by
// GlooOptions.timeout, Join by join_timeout_ms; RunOnRanks aborts the process
// instead of hanging if a rank still does not finish.
#include <string>
#include <vector>

#include "tests/client/auto_config_job.h"

namespace muon {
namespace auto_config_testing {
namespace {

TEST(AutoConfigTest, MeshGroup_TpFsdpMesh_GivesStandardGroups) {
  // The test's own group arithmetic, against the standard layout written
  // out: tp groups {0, 1} and {2, 3}, dp_shard groups {0, 2} and {1, 3}.
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(MeshGroup(TpFsdpMesh(), "tp", r),
              (std::vector<int>{2 * (r / 2), 2 * (r / 2) + 1}));
    EXPECT_EQ(MeshGroup(TpFsdpMesh(), "dp_shard", r),
              (std::vector<int>{r % 2, r % 2 + 2}));
  }
}

TEST(AutoConfigTest,
     CreateAutoConfig_FsdpOnlyFourRanksNoWorld_ShardsOnOneDimDpShardMesh) {
  for (const int dim : {0, 1}) {
    SCOPED_TRACE(absl::StrCat("fsdp_shard_dim ", dim));
    const Problem problem = MakeProblem(Matrices());
    Expected expected;
    expected.mesh = MakeMesh({"dp_shard"}, {4});
    expected.params.assign(problem.specs.size(), Placed({S(dim)}));
    Job job(4);
    ExpectAutoConfig(
        job, problem, expected, {GroupDef{"fsdp", nullptr}},
        [dim](int, AutoConfigOptions& o) { o.fsdp_shard_dim = dim; },
        /*with_world=*/false);
    // torch.chunk: [3, 5] over 4 ranks (dim 0) is 1,1,1,0 rows; [5, 3]
    // (dim 1) is 1,1,1,0 cols.
    const std::vector<int64_t> want =
        dim == 0 ? std::vector<int64_t>{0, 5} : std::vector<int64_t>{5, 0};
    EXPECT_EQ(job.params(3)[dim == 0 ? 1 : 2].local_shape, want);
  }
}

TEST(AutoConfigTest,
     CreateAutoConfig_DdpOrReplicateOnlyFourRanks_ReplicatesOnDpReplicateMesh) {
  for (const std::string role : {"ddp", "replicate"}) {
    SCOPED_TRACE(role);
    const Problem problem = MakeProblem(Matrices());
    Expected expected;
    expected.mesh = MakeMesh({"dp_replicate"}, {4});
    expected.params.assign(problem.specs.size(), Placed({kR}));
    Job job(4);
    ExpectAutoConfig(job, problem, expected, {GroupDef{role, nullptr}}, nullptr,
                     /*with_world=*/false);
    EXPECT_EQ(job.params(2)[0].local_shape, (std::vector<int64_t>{10, 7}));
  }
}

// The same with `world` given explicitly (world == the one group).
TEST(AutoConfigTest, CreateAutoConfig_FsdpWithExplicitWorld_SameMesh) {
  const Problem problem = MakeProblem(Matrices());
  Expected expected;
  expected.mesh = MakeMesh({"dp_shard"}, {4});
  expected.params.assign(problem.specs.size(), Placed({S(0)}));
  Job job(4);
  ExpectAutoConfig(job, problem, expected, {GroupDef{"fsdp", nullptr}}, nullptr,
                   /*with_world=*/true);
}

// TP + FSDP: dp_shard=2 x tp=2, fsdp Shard(0); tp Shard(1) by default
// (tp_shard_dim = 1) and Shard(0) for parameters 1 and 3 (tp_dim_per_param),
// so [3, 5] nests Shard(0) twice (rows 2,1 then 1,1 / 1,0: an empty shard).
TEST(AutoConfigTest,
     CreateAutoConfig_TpFsdpFourRanksPerParamTpDims_MixesShard0AndShard1) {
  const Problem problem = MakeProblem(Matrices());
  Expected expected;
  expected.mesh = TpFsdpMesh();
  expected.params = {Placed({S(0), S(1)}), Placed({S(0), S(0)}),
                     Placed({S(0), S(1)}), Placed({S(0), S(0)})};
  Job job(4);
  ExpectAutoConfig(job, problem, expected, TpFsdpGroups(),
                   [](int, AutoConfigOptions& o) {
                     o.fsdp_shard_dim = 0;
                     o.tp_shard_dim = 1;
                     o.tp_dim_per_param = {{1, 0}, {3, 0}};
                   });
  // Rank 1 = (dp_shard 0, tp 1): [10, 7] rows 0..5, cols 4..7; rank 3 =
  // (1, 1): [3, 5] rows 2..3 split by tp into 1 and 0 rows.
  EXPECT_EQ(job.params(1)[0].local_shape, (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(job.params(3)[1].local_shape, (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(job.params(1)[3].local_shape, (std::vector<int64_t>{3, 16}));
}

// tp_dim_per_param overrides the default both ways (default 0, map -> 1).
TEST(AutoConfigTest,
     CreateAutoConfig_TpFsdpDefaultShard0MapShard1_PerParamDimWins) {
  const Problem problem = MakeProblem(Matrices());
  Expected expected;
  expected.mesh = TpFsdpMesh();
  expected.params = {Placed({S(1), S(0)}), Placed({S(1), S(1)}),
                     Placed({S(1), S(0)}), Placed({S(1), S(0)})};
  Job job(4);
  ExpectAutoConfig(job, problem, expected, TpFsdpGroups(),
                   [](int, AutoConfigOptions& o) {
                     o.fsdp_shard_dim = 1;
                     o.tp_shard_dim = 0;
                     o.tp_dim_per_param = {{1, 1}};
                   });
}

// HSDP: dp_replicate=2 x dp_shard=2, [Replicate(), Shard(1)].
TEST(AutoConfigTest, CreateAutoConfig_HsdpFourRanks_ReplicateThenShard) {
  const Problem problem = MakeProblem(Matrices());
  Expected expected;
  expected.mesh = HsdpMesh();
  expected.params.assign(problem.specs.size(), Placed({kR, S(1)}));
  Job job(4);
  ExpectAutoConfig(job, problem, expected, HsdpGroups(),
                   [](int, AutoConfigOptions& o) { o.fsdp_shard_dim = 1; });
}

// TP + HSDP at 8 ranks: dp_replicate=2 x dp_shard=2 x tp=2.
TEST(AutoConfigTest, CreateAutoConfig_TpHsdpEightRanks_ThreeDimMesh) {
  const Problem problem = MakeProblem(Matrices());
  const Mesh mesh = MakeMesh({"dp_replicate", "dp_shard", "tp"}, {2, 2, 2});
  Expected expected;
  expected.mesh = mesh;
  expected.params = {Placed({kR, S(0), S(1)}), Placed({kR, S(0), S(0)}),
                     Placed({kR, S(0), S(1)}), Placed({kR, S(0), S(1)})};
  // Groups split in an order unlike the mesh order: CreateAutoConfig orders
  // the mesh itself.
  Job job(8);
  ExpectAutoConfig(job, problem, expected,
                   {MeshGroupDef("tp", mesh, "tp"),
                    MeshGroupDef("replicate", mesh, "dp_replicate"),
                    MeshGroupDef("fsdp", mesh, "dp_shard")},
                   [](int, AutoConfigOptions& o) {
                     o.tp_shard_dim = 1;
                     o.tp_dim_per_param = {{1, 0}};
                   });
  // The groups of the standard order (tp fastest): rank 5 = (1, 0, 1).
  EXPECT_EQ(job.group(5, "tp")->global_ranks(), (std::vector<int>{4, 5}));
  EXPECT_EQ(job.group(5, "fsdp")->global_ranks(), (std::vector<int>{5, 7}));
  EXPECT_EQ(job.group(5, "replicate")->global_ranks(),
            (std::vector<int>{1, 5}));
}

// CP + TP at 4 ranks: cp=2 x tp=2, [Replicate(), Shard(tp)].
TEST(AutoConfigTest, CreateAutoConfig_CpTpFourRanks_ReplicateOnCp) {
  const Problem problem = MakeProblem(Matrices());
  const Mesh mesh = MakeMesh({"cp", "tp"}, {2, 2});
  Expected expected;
  expected.mesh = mesh;
  expected.params = {Placed({kR, S(0)}), Placed({kR, S(0)}), Placed({kR, S(1)}),
                     Placed({kR, S(0)})};
  Job job(4);
  ExpectAutoConfig(
      job, problem, expected,
      {MeshGroupDef("cp", mesh, "cp"), MeshGroupDef("tp", mesh, "tp")},
      [](int, AutoConfigOptions& o) {
        o.tp_dim_per_param = {{2, 1}};
      });
}

// Expert stack [8, 6, 4] and 2-D parameters.
std::vector<TensorSpec> MoeTensors() {
  return {{"attn.weight", {6, 4}},
          {"moe.experts", {8, 6, 4}, /*expert_stack=*/true},
          {"head.weight", {10, 7}}};
}

// EP at 4 ranks: the stack takes Shard(0) on ep (2 experts per rank), 2-D
// parameters Replicate().
TEST(AutoConfigTest,
     CreateAutoConfig_EpFourRanks_StackShard0Matrices2DReplicate) {
  const Problem problem = MakeProblem(MoeTensors());
  Expected expected;
  expected.mesh = MakeMesh({"ep"}, {4});
  expected.params = {Placed({kR}), Placed({S(0)}), Placed({kR})};
  Job job(4);
  ExpectAutoConfig(job, problem, expected, {GroupDef{"ep", nullptr}}, nullptr,
                   /*with_world=*/false);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(job.params(r)[1].local_shape, (std::vector<int64_t>{2, 6, 4}));
    EXPECT_EQ(job.params(r)[0].local_shape, (std::vector<int64_t>{6, 4}));
  }
}

// EP + TP at 4 ranks: ep=2 x tp=2, tp_shard_dim 1 (cols): the stack is
// [Shard(0), Shard(2)] (tensor dims shift by one), 2-D [Replicate(),
// Shard(1)].
TEST(AutoConfigTest, CreateAutoConfig_EpTpFourRanks_StackTpDimShifted) {
  const Problem problem = MakeProblem(MoeTensors());
  const Mesh mesh = MakeMesh({"ep", "tp"}, {2, 2});
  Expected expected;
  expected.mesh = mesh;
  expected.params = {Placed({kR, S(1)}), Placed({S(0), S(2)}),
                     Placed({kR, S(1)})};
  Job job(4);
  ExpectAutoConfig(
      job, problem, expected,
      {MeshGroupDef("tp", mesh, "tp"), MeshGroupDef("ep", mesh, "ep")},
      [](int, AutoConfigOptions& o) { o.tp_shard_dim = 1; });
  EXPECT_EQ(job.params(3)[1].local_shape, (std::vector<int64_t>{4, 6, 2}));
}

// PP at 2 ranks (pp = world, no `world`): each rank lists only its stage's
// parameters; every parameter gets sub-mesh pp=stage.
TEST(AutoConfigTest, CreateAutoConfig_PpTwoRanks_SubMeshIsStage) {
  for (const bool explicit_stage : {false, true}) {
    SCOPED_TRACE(explicit_stage ? "pp_stage given" : "pp_stage derived");
    const Problem problem = MakeProblem(Matrices());
    Expected expected;
    expected.mesh = MakeMesh({"pp"}, {2});
    // Stage 0: layers 0, 1; stage 1: layers 2, 3.
    for (int i = 0; i < 4; ++i) {
      expected.params.push_back(Placed({kR}, SubMesh{{0}, {i / 2}}));
    }
    Job job(2);
    ExpectAutoConfig(
        job, problem, expected, {GroupDef{"pp", nullptr}},
        [explicit_stage](int rank, AutoConfigOptions& o) {
          o.pp_num_stages = 2;
          if (explicit_stage) o.pp_stage = rank;
        },
        /*with_world=*/false);
    EXPECT_EQ(job.held(0), (std::vector<int>{0, 1}));
    EXPECT_EQ(job.held(1), (std::vector<int>{2, 3}));
  }
}

// PP + FSDP at 4 ranks: pp=2 x dp_shard=2; stage of rank r is r/2.
TEST(AutoConfigTest, CreateAutoConfig_PpFsdpFourRanks_SubMeshAndShard) {
  const Problem problem = MakeProblem(Matrices());
  const Mesh mesh = MakeMesh({"pp", "dp_shard"}, {2, 2});
  Expected expected;
  expected.mesh = mesh;
  for (int i = 0; i < 4; ++i) {
    expected.params.push_back(Placed({kR, S(0)}, SubMesh{{0}, {i / 2}}));
  }
  Job job(4);
  ExpectAutoConfig(
      job, problem, expected,
      {MeshGroupDef("fsdp", mesh, "dp_shard"), MeshGroupDef("pp", mesh, "pp")},
      [](int rank, AutoConfigOptions& o) {
        o.pp_num_stages = 2;
        o.pp_stage = rank / 2;
      });
  EXPECT_EQ(job.group(3, "pp")->global_ranks(), (std::vector<int>{1, 3}));
  EXPECT_EQ(job.held(3), (std::vector<int>{2, 3}));
}

// ===================== End to end: bitwise vs single device =============

MuonOptions TestOptions() {
  MuonOptions o;
  o.lr = 0.02;  // visible updates; everything else torch's defaults
  o.nesterov = true;
  return o;
}

// Connects `job` with `groups`, cuts shards as `expected`, builds every
// rank's config with CreateAutoConfig (checked against `expected`), then
// Muon::Create + kSteps steps with seeded gradients, and compares with the
// single-device run bit for bit (tests/client/single_device_reference.h):
// every parameter reassembled from the ranks' shards, each rank's own shard
// (replicas too) and momentum buffer, and the zero-redundancy counters of
// every step; every rank runs the same plan.
void ExpectEndToEndMatchesSingleDevice(Job& job, const Problem& problem,
                                       const Expected& expected,
                                       const std::vector<GroupDef>& groups,
                                       const OptionsFn& adjust) {
  const MuonOptions options = TestOptions();
  const absl::StatusOr<SingleDeviceResult> single =
      RunSingleDevice(problem, options);
  ASSERT_THAT(single, IsOk());
  ASSERT_TRUE(job.Connect(groups));
  const int n = job.size();
  std::vector<absl::StatusOr<DistributedConfig>> configs(
      n, absl::UnknownError("not run"));
  std::vector<absl::Status> statuses = RunDistributedSteps(
      problem, expected.Layout(),
      [&](int rank,
          RankShards& shards) -> absl::StatusOr<std::unique_ptr<Muon>> {
        AutoConfigOptions o = job.Options(rank);
        if (adjust) adjust(rank, o);
        configs[rank] = CreateAutoConfig(shards.Pointers(), o);
        if (!configs[rank].ok()) return configs[rank].status();
        DistributedConfig config = *configs[rank];
        config.state.join_timeout_ms = kJoinTimeoutMs;
        return Muon::Create(shards.Pointers(), options, std::move(config));
      },
      &job.run);
  for (int r = 0; r < n; ++r) {
    ASSERT_THAT(statuses[r], IsOk()) << "rank " << r;
  }
  ExpectConfigs(job, configs, expected);
  ExpectShardsMatchSingleDevice(problem, *single, job.run);
  ExpectEachMatrixOrthogonalizedOnce(problem, *single, job.run);
  for (int r = 1; r < n; ++r) {
    EXPECT_EQ(job.run.muons[r]->plan().hash(), job.run.muons[0]->plan().hash())
        << "rank " << r;
  }
}

TEST(AutoConfigTest,
     Step_TpFsdpFourRanksAutoConfig_MatchesSingleDeviceBitwise) {
  const Problem problem = MakeProblem(Matrices());
  Expected expected;
  expected.mesh = TpFsdpMesh();
  expected.params = {Placed({S(0), S(1)}), Placed({S(0), S(0)}),
                     Placed({S(0), S(1)}), Placed({S(0), S(0)})};
  Job job(4);
  ExpectEndToEndMatchesSingleDevice(job, problem, expected, TpFsdpGroups(),
                                    [](int, AutoConfigOptions& o) {
                                      o.tp_shard_dim = 1;
                                      o.tp_dim_per_param = {{1, 0}, {3, 0}};
                                    });
}

TEST(AutoConfigTest, Step_HsdpFourRanksAutoConfig_MatchesSingleDeviceBitwise) {
  const Problem problem = MakeProblem(Matrices());
  Expected expected;
  expected.mesh = HsdpMesh();
  expected.params.assign(problem.specs.size(), Placed({kR, S(1)}));
  Job job(4);
  ExpectEndToEndMatchesSingleDevice(
      job, problem, expected, HsdpGroups(),
      [](int, AutoConfigOptions& o) { o.fsdp_shard_dim = 1; });
}

TEST(AutoConfigTest, Step_EpTpFourRanksAutoConfig_MatchesSingleDeviceBitwise) {
  const Problem problem = MakeProblem(MoeTensors());
  const Mesh mesh = MakeMesh({"ep", "tp"}, {2, 2});
  Expected expected;
  expected.mesh = mesh;
  expected.params = {Placed({kR, S(1)}), Placed({S(0), S(2)}),
                     Placed({kR, S(1)})};
  Job job(4);
  ExpectEndToEndMatchesSingleDevice(
      job, problem, expected,
      {MeshGroupDef("tp", mesh, "tp"), MeshGroupDef("ep", mesh, "ep")},
      [](int, AutoConfigOptions& o) { o.tp_shard_dim = 1; });
}

TEST(AutoConfigTest,
     Step_PpFsdpFourRanksAutoConfig_MatchesSingleDeviceBitwise) {
  const Problem problem = MakeProblem(Matrices());
  const Mesh mesh = MakeMesh({"pp", "dp_shard"}, {2, 2});
  Expected expected;
  expected.mesh = mesh;
  for (int i = 0; i < 4; ++i) {
    expected.params.push_back(Placed({kR, S(0)}, SubMesh{{0}, {i / 2}}));
  }
  Job job(4);
  ExpectEndToEndMatchesSingleDevice(
      job, problem, expected,
      {MeshGroupDef("fsdp", mesh, "dp_shard"), MeshGroupDef("pp", mesh, "pp")},
      [](int, AutoConfigOptions& o) { o.pp_num_stages = 2; });
}

}  // namespace
}  // namespace auto_config_testing
}  // namespace muon
