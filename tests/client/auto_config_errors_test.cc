// Tests of muon::CreateAutoConfig's process-group validation
// (client/distributed_config.h) on the harness of tests/client/
// auto_config_job.h: bad groups (overlapping, not tiling the world, roles
// swapped, no world group), bad pipeline stages and shard dims give
// InvalidArgument on every rank whose input is wrong, with a message naming
// the group, the rank and the values. Every blocking call is bounded as in
// auto_config_test.cc.
#include <string>
#include <vector>

#include "tests/client/auto_config_job.h"

namespace muon {
namespace auto_config_testing {
namespace {

// ===================== Errors: groups =====================

// Overlapping fsdp and tp groups are rejected: both span the 4 ranks, so
// they are not orthogonal.
TEST(AutoConfigTest,
     CreateAutoConfig_FsdpAndTpBothWholeWorld_ReturnsInvalidArgumentDoNotTile) {
  const Problem problem = MakeProblem(Matrices());
  Job job(4);
  ASSERT_TRUE(job.Connect({GroupDef{"fsdp",
                                    [](int) {
                                      return std::vector<int>{0, 1, 2, 3};
                                    }},
                           GroupDef{"tp", [](int) {
                                      return std::vector<int>{0, 1, 2, 3};
                                    }}}));
  for (int r = 0; r < 4; ++r) {
    ASSERT_THAT(job.MakeShards(
                    r, problem,
                    Expected{MakeMesh({"dp_shard"}, {4}),
                             std::vector<ParamPlacement>(4, Placed({S(0)}))}),
                IsOk());
  }
  ExpectInvalidArgument(CreateOnEveryRank(job, nullptr),
                        Every(4, {"dp_shard=4 x tp=4", "16 ranks",
                                  "world size is 4", "must tile the world"}));
}

// Sizes whose product is not the world size: fsdp of 2 and tp of 2 at
// world 8 (disjoint pairs, each this rank's own).
TEST(AutoConfigTest,
     CreateAutoConfig_GroupSizesProductNotWorldSize_ReturnsInvalidArgument) {
  const Problem problem = MakeProblem(Matrices());
  Job job(8);
  ASSERT_TRUE(job.Connect(
      {GroupDef{"tp",
                [](int r) {
                  return std::vector<int>{2 * (r / 2), 2 * (r / 2) + 1};
                }},
       GroupDef{"fsdp", [](int r) {
                  const int base = 4 * (r / 4) + r % 2;
                  return std::vector<int>{base, base + 2};
                }}}));
  for (int r = 0; r < 8; ++r) {
    ASSERT_THAT(
        job.MakeShards(r, problem,
                       Expected{MakeMesh({"x"}, {8}),
                                std::vector<ParamPlacement>(4, Placed({kR}))}),
        IsOk());
  }
  ExpectInvalidArgument(
      CreateOnEveryRank(job, nullptr),
      Every(8, {"dp_shard=2 x tp=2", "hold 4 ranks", "world size is 8"}));
}

// tp and fsdp with swapped roles: tp = {r%2, r%2+2}, fsdp = {2*(r/2),
// 2*(r/2)+1}. Sizes tile, but the groups are not this rank's rows of
// dp_shard=2 x tp=2: ranks 1 and 2 land on each other's coordinate, ranks 0
// and 3 on their own coordinate with the wrong dp_shard group.
TEST(AutoConfigTest,
     CreateAutoConfig_TpFsdpRolesSwapped_ReturnsInvalidArgumentNamingGroups) {
  const Problem problem = MakeProblem(Matrices());
  Job job(4);
  ASSERT_TRUE(job.Connect({MeshGroupDef("tp", TpFsdpMesh(), "dp_shard"),
                           MeshGroupDef("fsdp", TpFsdpMesh(), "tp")}));
  const Expected layout{MakeMesh({"x"}, {4}),
                        std::vector<ParamPlacement>(4, Placed({kR}))};
  for (int r = 0; r < 4; ++r) {
    ASSERT_THAT(job.MakeShards(r, problem, layout), IsOk());
  }
  ExpectInvalidArgument(
      CreateOnEveryRank(job, nullptr),
      {{"the dp_shard group is [0, 1]", "dp_shard=2 x tp=2",
        "this rank's dp_shard group is [0, 2]",
        "groups overlap or do not tile the world"},
       {"mesh coordinate (1, 0)", "which is rank 2"},
       {"mesh coordinate (0, 1)", "which is rank 1"},
       {"the dp_shard group is [2, 3]", "this rank's dp_shard group is [1, 3]",
        "groups overlap or do not tile the world"}});
}

// Two groups and no `world`: CreateAutoConfig cannot know the data path.
TEST(AutoConfigTest,
     CreateAutoConfig_SeveralGroupsWithoutWorld_ReturnsInvalidArgument) {
  const Problem problem = MakeProblem(Matrices());
  Job job(4);
  ASSERT_TRUE(job.Connect(TpFsdpGroups()));
  for (int r = 0; r < 4; ++r) {
    ASSERT_THAT(
        job.MakeShards(r, problem,
                       Expected{TpFsdpMesh(), std::vector<ParamPlacement>(
                                                  4, Placed({S(0), S(0)}))}),
        IsOk());
  }
  ExpectInvalidArgument(CreateOnEveryRank(job, nullptr, /*with_world=*/false),
                        Every(4, {"several groups", "`world`"}),
                        /*name_rank=*/false);
}

TEST(AutoConfigTest,
     CreateAutoConfig_BothDdpAndReplicate_ReturnsInvalidArgument) {
  const Problem problem = MakeProblem(Matrices());
  Job job(2);
  ASSERT_TRUE(job.Connect({GroupDef{"ddp", nullptr}}));
  for (int r = 0; r < 2; ++r) {
    ASSERT_THAT(
        job.MakeShards(r, problem,
                       Expected{MakeMesh({"dp_replicate"}, {2}),
                                std::vector<ParamPlacement>(4, Placed({kR}))}),
        IsOk());
  }
  ExpectInvalidArgument(
      CreateOnEveryRank(
          job, [&](int rank, AutoConfigOptions& o) { o.replicate = o.ddp; }),
      Every(2, {"ddp", "replicate", "not both"}), /*name_rank=*/false);
}

TEST(AutoConfigTest, CreateAutoConfig_NoGroup_ReturnsInvalidArgument) {
  Parameter p;
  p.name = "w";
  p.local_shape = {4, 4};
  p.data.assign(16, 0.0f);
  AutoConfigOptions o;
  EXPECT_THAT(CreateAutoConfig({&p}, o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("no process group")));
}

// A single group that does not span the world, with no `world`: fsdp pairs
// {0, 1} and {2, 3} of a 4-rank job. The header lists "world missing while
// no group spans the world" as InvalidArgument. Ranks 0 and 1 cannot tell
// their pair from a 2-rank world (global_ranks [0, 1]) and are not checked;
// ranks 2 and 3 can: their group's global ranks are [2, 3], not 0..1.
std::vector<absl::StatusOr<DistributedConfig>> CreateWithPairsAsOnlyGroup(
    Job& job) {
  const Problem problem = MakeProblem(Matrices());
  EXPECT_TRUE(job.Connect(
      {GroupDef{"fsdp", [](int r) {
                  return std::vector<int>{2 * (r / 2), 2 * (r / 2) + 1};
                }}}));
  const Expected layout{MakeMesh({"x", "dp_shard"}, {2, 2}),
                        std::vector<ParamPlacement>(4, Placed({kR, S(0)}))};
  for (int r = 0; r < 4; ++r) {
    EXPECT_THAT(job.MakeShards(r, problem, layout), IsOk());
  }
  return CreateOnEveryRank(job, nullptr, /*with_world=*/false);
}

TEST(AutoConfigTest,
     CreateAutoConfig_OneGroupNotSpanningWorldNoWorld_ReturnsInvalidArgument) {
  Job job(4);
  std::vector<absl::StatusOr<DistributedConfig>> cfgs =
      CreateWithPairsAsOnlyGroup(job);
  for (int r = 2; r < 4; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_THAT(cfgs[r].status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("dp_shard group [2, 3]")));
  }
}

TEST(AutoConfigTest,
     CreateAutoConfig_OneGroupNotSpanningWorldNoWorld_NamesGlobalRankAndWorld) {
  Job job(4);
  std::vector<absl::StatusOr<DistributedConfig>> cfgs =
      CreateWithPairsAsOnlyGroup(job);
  for (int r = 2; r < 4; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_THAT(cfgs[r].status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(absl::StrCat("rank ", r, ":")),
                               HasSubstr("[2, 3]"), HasSubstr("`world`"))));
  }
}

// ===================== Errors: pipeline stages =====================

// Connects a pp-only job of `n` ranks (pp = world) with every rank holding
// all parameters of `problem` (sub-mesh pp=its own stage, so the shapes are
// fine whatever the stage check says).
void ConnectPpOnly(Job& job, const Problem& problem) {
  ASSERT_TRUE(job.Connect({GroupDef{"pp", nullptr}}));
  for (int r = 0; r < job.size(); ++r) {
    ASSERT_THAT(
        job.MakeShards(r, problem,
                       Expected{MakeMesh({"x"}, {job.size()}),
                                std::vector<ParamPlacement>(
                                    problem.specs.size(), Placed({kR}))}),
        IsOk());
  }
}

// An invalid pp stage id is rejected: pp = WORLD, stage 4 of 4.
TEST(AutoConfigTest,
     CreateAutoConfig_PpStageEqualsNumStages_ReturnsInvalidArgument) {
  const Problem problem = MakeProblem(Matrices());
  Job job(4);
  ConnectPpOnly(job, problem);
  ExpectInvalidArgument(CreateOnEveryRank(
                            job,
                            [](int, AutoConfigOptions& o) {
                              o.pp_stage = 4;
                              o.pp_num_stages = 4;
                            },
                            /*with_world=*/false),
                        Every(4, {"pp stage 4", "out of range", "4 stages"}));
}

TEST(AutoConfigTest,
     CreateAutoConfig_PpNumStagesMoreThanGroupSize_ReturnsInvalidArgument) {
  const Problem problem = MakeProblem(Matrices());
  Job job(4);
  ConnectPpOnly(job, problem);
  ExpectInvalidArgument(
      CreateOnEveryRank(
          job, [](int, AutoConfigOptions& o) { o.pp_num_stages = 8; },
          /*with_world=*/false),
      Every(4, {"8 pipeline stages", "pp group has 4 ranks"}));
}

// Fewer stages than pp ranks: ranks 0 and 1 (derived stages 0, 1) learn
// that the counts differ; ranks 2 and 3 (derived stages 2, 3) that their
// stage is out of range for 2 stages.
TEST(AutoConfigTest,
     CreateAutoConfig_PpNumStagesFewerThanGroupSize_ReturnsInvalidArgument) {
  const Problem problem = MakeProblem(Matrices());
  Job job(4);
  ConnectPpOnly(job, problem);
  ExpectInvalidArgument(
      CreateOnEveryRank(
          job, [](int, AutoConfigOptions& o) { o.pp_num_stages = 2; },
          /*with_world=*/false),
      {{"2 pipeline stages", "pp group has 4 ranks"},
       {"2 pipeline stages", "pp group has 4 ranks"},
       {"pp stage 2", "out of range", "2 stages"},
       {"pp stage 3", "out of range", "2 stages"}});
}

// Stages swapped on both ranks of a 2-rank pp group.
TEST(AutoConfigTest,
     CreateAutoConfig_PpStageDisagreesWithPosition_ReturnsInvalidArgument) {
  const Problem problem = MakeProblem(Matrices());
  Job job(2);
  ConnectPpOnly(job, problem);
  ExpectInvalidArgument(CreateOnEveryRank(
                            job,
                            [](int rank, AutoConfigOptions& o) {
                              o.pp_stage = 1 - rank;
                              o.pp_num_stages = 2;
                            },
                            /*with_world=*/false),
                        {{"pp stage 1", "at position 0 of its pp group"},
                         {"pp stage 0", "at position 1 of its pp group"}});
}

// Only rank 2 gives a wrong stage (PP + FSDP, pp=2 x dp_shard=2): only rank
// 2 fails; the other ranks get their configs.
TEST(AutoConfigTest,
     CreateAutoConfig_PpStageWrongOnOneRank_ReturnsInvalidArgumentOnThatRank) {
  const Problem problem = MakeProblem(Matrices());
  const Mesh mesh = MakeMesh({"pp", "dp_shard"}, {2, 2});
  Expected expected;
  expected.mesh = mesh;
  for (int i = 0; i < 4; ++i) {
    expected.params.push_back(Placed({kR, S(0)}, SubMesh{{0}, {i / 2}}));
  }
  Job job(4);
  ASSERT_TRUE(job.Connect({MeshGroupDef("fsdp", mesh, "dp_shard"),
                           MeshGroupDef("pp", mesh, "pp")}));
  for (int r = 0; r < 4; ++r) {
    ASSERT_THAT(job.MakeShards(r, problem, expected), IsOk());
  }
  std::vector<absl::StatusOr<DistributedConfig>> cfgs =
      CreateOnEveryRank(job, [](int rank, AutoConfigOptions& o) {
        o.pp_num_stages = 2;
        o.pp_stage = rank == 2 ? 0 : rank / 2;
      });
  for (int r = 0; r < 4; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    if (r == 2) {
      EXPECT_THAT(cfgs[r].status(),
                  StatusIs(absl::StatusCode::kInvalidArgument,
                           AllOf(HasSubstr("rank 2:"), HasSubstr("pp stage 0"),
                                 HasSubstr("position 1"))));
    } else {
      EXPECT_THAT(cfgs[r].status(), IsOk());
    }
  }
}

// ===================== Errors: shard dims and local shapes ==============

// Parameters cut as TP + FSDP with tp Shard(1) (so [10, 7] at rank 0 is
// rows 0..5, cols 0..4: [5, 4]), but the config says tp_shard_dim = 0,
// which would give [3, 7].
TEST(
    AutoConfigTest,
    CreateAutoConfig_TpShardDimDisagreesWithLocalShapes_ReturnsInvalidArgument) {
  const Problem problem = MakeProblem(
      {{"layers.0.weight", {10, 7}}, {"layers.3.weight", {12, 16}}});
  Expected built;
  built.mesh = TpFsdpMesh();
  built.params.assign(2, Placed({S(0), S(1)}));
  Job job(4);
  ASSERT_TRUE(job.Connect(TpFsdpGroups()));
  for (int r = 0; r < 4; ++r) {
    ASSERT_THAT(job.MakeShards(r, problem, built), IsOk());
  }
  // Local [rows, cols] under [Shard(0), Shard(1)] and under [Shard(0),
  // Shard(0)] of [10, 7] at each rank (rows 5,5 then 3,2; cols 4,3).
  const std::vector<std::string> actual = {"[5, 4]", "[5, 3]", "[5, 4]",
                                           "[5, 3]"};
  const std::vector<std::string> wanted = {"[3, 7]", "[2, 7]", "[3, 7]",
                                           "[2, 7]"};
  std::vector<std::vector<std::string>> substrings;
  for (int r = 0; r < 4; ++r) {
    substrings.push_back({"\"layers.0.weight\"", "has local shape " + actual[r],
                          "gives " + wanted[r], "[Shard(0), Shard(0)]",
                          "dp_shard=2 x tp=2", "of [10, 7]"});
  }
  ExpectInvalidArgument(
      CreateOnEveryRank(job,
                        [](int, AutoConfigOptions& o) { o.tp_shard_dim = 0; }),
      substrings);
}

// Right default tp dim, wrong per-parameter dim for the second parameter
// only: the message names that parameter.
TEST(AutoConfigTest,
     CreateAutoConfig_TpDimPerParamDisagreesWithLocalShape_NamesThatParameter) {
  const Problem problem =
      MakeProblem({{"layers.0.weight", {8, 6}}, {"layers.1.weight", {12, 16}}});
  Expected built;
  built.mesh = TpFsdpMesh();
  built.params.assign(2, Placed({S(0), S(1)}));
  Job job(4);
  ASSERT_TRUE(job.Connect(TpFsdpGroups()));
  for (int r = 0; r < 4; ++r) {
    ASSERT_THAT(job.MakeShards(r, problem, built), IsOk());
  }
  ExpectInvalidArgument(
      CreateOnEveryRank(job,
                        [](int, AutoConfigOptions& o) {
                          o.tp_shard_dim = 1;
                          o.tp_dim_per_param = {{1, 0}};
                        }),
      Every(4, {"\"layers.1.weight\"", "has local shape [6, 8]",
                "gives [3, 16]", "tp_dim_per_param"}));
}

// fsdp_shard_dim = 2 on 2-D parameters.
TEST(AutoConfigTest,
     CreateAutoConfig_FsdpShardDimOutOfRange_ReturnsInvalidArgument) {
  const Problem problem = MakeProblem(Matrices());
  Job job(4);
  ASSERT_TRUE(job.Connect({GroupDef{"fsdp", nullptr}}));
  for (int r = 0; r < 4; ++r) {
    ASSERT_THAT(job.MakeShards(
                    r, problem,
                    Expected{MakeMesh({"dp_shard"}, {4}),
                             std::vector<ParamPlacement>(4, Placed({S(0)}))}),
                IsOk());
  }
  ExpectInvalidArgument(
      CreateOnEveryRank(
          job, [](int, AutoConfigOptions& o) { o.fsdp_shard_dim = 2; },
          /*with_world=*/false),
      Every(4,
            {"\"layers.0.weight\"", "dp_shard shard dim 2", "out of range"}));
}

// Negative tp dims (per parameter) and fsdp dims on an expert stack (its
// dims shift by one, so 2 is [rows, cols]'s 2: out of range).
TEST(
    AutoConfigTest,
    CreateAutoConfig_NegativeTpDimOrStackFsdpDimOutOfRange_ReturnsInvalidArgument) {
  {
    SCOPED_TRACE("tp_dim_per_param -1");
    const Problem problem = MakeProblem(Matrices());
    Job job(4);
    ASSERT_TRUE(job.Connect(TpFsdpGroups()));
    for (int r = 0; r < 4; ++r) {
      ASSERT_THAT(
          job.MakeShards(r, problem,
                         Expected{TpFsdpMesh(), std::vector<ParamPlacement>(
                                                    4, Placed({S(0), S(0)}))}),
          IsOk());
    }
    ExpectInvalidArgument(
        CreateOnEveryRank(job,
                          [](int, AutoConfigOptions& o) {
                            o.tp_dim_per_param = {{2, -1}};
                          }),
        Every(4, {"\"layers.2.weight\"", "tp shard dim -1", "out of range"}));
  }
  {
    SCOPED_TRACE("expert stack, fsdp_shard_dim 2");
    const Problem problem =
        MakeProblem({{"moe.experts", {8, 6, 4}, /*expert_stack=*/true}});
    Job job(2);
    ASSERT_TRUE(job.Connect({GroupDef{"fsdp", nullptr}}));
    for (int r = 0; r < 2; ++r) {
      ASSERT_THAT(job.MakeShards(
                      r, problem,
                      Expected{MakeMesh({"dp_shard"}, {2}), {Placed({S(1)})}}),
                  IsOk());
    }
    ExpectInvalidArgument(
        CreateOnEveryRank(
            job, [](int, AutoConfigOptions& o) { o.fsdp_shard_dim = 2; },
            /*with_world=*/false),
        Every(2, {"\"moe.experts\"", "dp_shard shard dim 2", "out of range"}));
  }
}

}  // namespace
}  // namespace auto_config_testing
}  // namespace muon
