// Tests of muon::CreateAutoConfig (client/distributed_config.h), the
// process-group style config: N ranks as N threads of this process, each with a
// GlooCommunicator world (TCP on 127.0.0.1) and sub-groups made with
// world->Split(ranks), all rendezvousing through ONE shared in-process
// CoordinatorService (one LocalCoordinationClient per rank;
// tests/client/thread_world.h).
//
// What is checked (the config's layouts and its process-group validation):
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
//   - Bad groups and options: InvalidArgument on every rank whose input is
//     wrong, with a message naming the group, the rank and the values.
//
// Every blocking call is bounded: Gloo rendezvous and collectives by
// GlooOptions.timeout, Join by join_timeout_ms; RunOnRanks aborts the process
// instead of hanging if a rank still does not finish.
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
#include "absl/strings/str_join.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "client/parameter.h"
#include "comm/communicator.h"
#include "common/layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/rank_threads.h"
#include "tests/client/single_device_reference.h"
#include "tests/client/thread_world.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr int kSteps = 3;
using ::muon::testing::CutShards;
using ::muon::testing::DistributedRun;
using ::muon::testing::ExpectEachMatrixOrthogonalizedOnce;
using ::muon::testing::ExpectShardsMatchSingleDevice;
using ::muon::testing::kJoinTimeoutMs;
using ::muon::testing::Problem;
using ::muon::testing::ProblemLayout;
using ::muon::testing::RankShards;
using ::muon::testing::RunDistributedSteps;
using ::muon::testing::RunOnRanks;
using ::muon::testing::RunSingleDevice;
using ::muon::testing::SingleDeviceResult;
using ::muon::testing::TensorSpec;

std::vector<std::string> PlacementStrings(const ParamPlacement& pl) {
  std::vector<std::string> out;
  for (const Placement& p : pl.placements) out.push_back(p.ToString());
  return out;
}

// --- Problems and expected layouts ---

// The harness's problem (tests/client/single_device_reference.h) with
// kSteps steps.
Problem MakeProblem(const std::vector<TensorSpec>& specs) {
  return ::muon::testing::MakeProblem(specs, kSteps);
}

// Uneven (10x7 over 2 or 4), smaller than the world in one dim (3x5, 5x3:
// empty shards under nested sharding), and even.
std::vector<TensorSpec> Matrices() {
  return {{"layers.0.weight", {10, 7}},
          {"layers.1.weight", {3, 5}},
          {"layers.2.weight", {5, 3}},
          {"layers.3.weight", {12, 16}}};
}

// What the test expects CreateAutoConfig to build: the mesh and, per
// parameter of the problem, its placements and sub-mesh. The test also cuts
// the ranks' shards from it (a rank holds the parameters whose sub-mesh
// contains it).
struct Expected {
  Mesh mesh;
  std::vector<ParamPlacement> params;  // [problem param]

  // The same as the harness's layout, to cut shards with.
  ProblemLayout Layout() const {
    ProblemLayout layout;
    layout.mesh = mesh;
    for (const ParamPlacement& p : params) {
      layout.placements.push_back(p.placements);
      layout.sub_meshes.push_back(p.sub_mesh);
    }
    return layout;
  }
};

Mesh MakeMesh(std::vector<std::string> names, std::vector<int> sizes) {
  Mesh m;
  m.names = std::move(names);
  m.sizes = std::move(sizes);
  return m;
}

ParamPlacement Placed(std::vector<Placement> placements,
                      SubMesh sub_mesh = {}) {
  ParamPlacement p;
  p.placements = std::move(placements);
  p.sub_mesh = std::move(sub_mesh);
  return p;
}

const Placement kR = Placement::Replicate();
Placement S(int d) { return Placement::Shard(d); }

// Rank `rank`'s group along mesh dim `dim` (the ranks whose coordinates
// differ from its own only there), ascending.
std::vector<int> MeshGroup(const Mesh& mesh, const std::string& dim, int rank) {
  const int d = mesh.DimIndex(dim);
  std::vector<int> coord = mesh.Coord(rank);
  std::vector<int> out;
  for (int i = 0; i < mesh.sizes[d]; ++i) {
    coord[d] = i;
    out.push_back(mesh.RankOf(coord));
  }
  return out;
}

// --- The job: coordinator, per-rank world and sub-groups, shards ---

// A sub-group every rank makes with world->Split(ranks(rank)), stored under
// `role` ("fsdp", "replicate", "ddp", "tp", "cp", "ep", "pp"). A null
// `ranks` means the role is the world communicator itself.
struct GroupDef {
  std::string role;
  std::function<std::vector<int>(int rank)> ranks;
};

GroupDef MeshGroupDef(const std::string& role, const Mesh& mesh,
                      const std::string& dim) {
  return GroupDef{role,
                  [mesh, dim](int rank) { return MeshGroup(mesh, dim, rank); }};
}

// One job: a ThreadWorld (one coordinator; per rank a coordination client
// and a Gloo world) plus, per rank, the sub-groups split from the world and
// the shards, optimizers and step stats (`run`). Members go before the base
// in this order: optimizers first (they stop their agents), then the
// sub-groups, then the worlds, the clients and the coordinator.
class Job : public ::muon::testing::ThreadWorld {
 public:
  explicit Job(int world_size)
      : ThreadWorld(world_size),
        run(world_size),
        owned_groups_(world_size),
        groups_(world_size) {}

  // Optimizers first (the dtor body runs before any member goes).
  ~Job() {
    run.muons.clear();
    groups_.clear();
    owned_groups_.clear();
  }

  Communicator* world(int rank) { return comm(rank); }
  // The sub-group `role` of `rank`, or nullptr.
  Communicator* group(int rank, const std::string& role) {
    auto it = groups_[rank].find(role);
    return it == groups_[rank].end() ? nullptr : it->second;
  }

  // Creates every rank's Gloo world, then, in the order of `defs` (the same
  // on every rank), its sub-groups. Returns false (with a failure recorded)
  // if any rank failed.
  bool Connect(const std::vector<GroupDef>& defs) {
    if (!ThreadWorld::Connect()) return false;
    std::vector<absl::Status> statuses =
        RunOnRanks(size(), [&](int rank) -> absl::Status {
          for (const GroupDef& def : defs) {
            if (!def.ranks) {
              groups_[rank][def.role] = world(rank);
              continue;
            }
            const std::vector<int> ranks = def.ranks(rank);
            absl::StatusOr<std::unique_ptr<Communicator>> g =
                world(rank)->Split(ranks);
            if (!g.ok()) {
              return absl::Status(g.status().code(),
                                  absl::StrCat("Split for ", def.role, " [",
                                               absl::StrJoin(ranks, ", "),
                                               "]: ", g.status().message()));
            }
            groups_[rank][def.role] = g->get();
            owned_groups_[rank].push_back(*std::move(g));
          }
          return absl::OkStatus();
        });
    bool ok = true;
    for (int r = 0; r < size(); ++r) {
      EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
      ok = ok && statuses[r].ok();
    }
    return ok;
  }

  // AutoConfigOptions with every group of `rank` in its field, `world` set
  // when `with_world`, and this rank's coordinator client.
  AutoConfigOptions Options(int rank, bool with_world = true) {
    AutoConfigOptions o;
    if (with_world) o.world = world(rank);
    o.fsdp = group(rank, "fsdp");
    o.replicate = group(rank, "replicate");
    o.ddp = group(rank, "ddp");
    o.tp = group(rank, "tp");
    o.cp = group(rank, "cp");
    o.ep = group(rank, "ep");
    o.pp = group(rank, "pp");
    o.coordinator = client(rank);
    o.incarnation = 100 + rank;
    return o;
  }

  // Cuts rank `rank`'s shards of the problem's initial weights as `layout`
  // says; the rank holds the parameters whose sub-mesh contains it, in
  // problem order.
  absl::Status MakeShards(int rank, const Problem& problem,
                          const Expected& layout) {
    absl::StatusOr<RankShards> shards =
        CutShards(problem, layout.Layout(), rank);
    if (!shards.ok()) return shards.status();
    run.shards[rank] = *std::move(shards);
    return absl::OkStatus();
  }

  std::vector<Parameter*> Pointers(int rank) {
    return run.shards[rank].Pointers();
  }
  // The parameters rank `rank` holds, and their indices in the problem.
  std::vector<Parameter>& params(int rank) { return run.shards[rank].params; }
  const std::vector<int>& held(int rank) const { return run.shards[rank].held; }

  // Shards, optimizers and step stats of every rank.
  DistributedRun run;

 private:
  // Sub-groups made by Split, and every role (also world-as-group) by name.
  std::vector<std::vector<std::unique_ptr<Communicator>>> owned_groups_;
  std::vector<std::map<std::string, Communicator*>> groups_;
};

// Adjusts a rank's options (shard dims, pp stage, ...) after Job::Options.
using OptionsFn = std::function<void(int rank, AutoConfigOptions&)>;

// Runs CreateAutoConfig on every rank (threads) with the rank's current
// parameters and Job::Options(rank, with_world) adjusted by `adjust`.
std::vector<absl::StatusOr<DistributedConfig>> CreateOnEveryRank(
    Job& job, const OptionsFn& adjust, bool with_world = true) {
  std::vector<absl::StatusOr<DistributedConfig>> configs(
      job.size(), absl::UnknownError("not run"));
  std::vector<absl::Status> st =
      RunOnRanks(job.size(), [&](int rank) -> absl::Status {
        AutoConfigOptions o = job.Options(rank, with_world);
        if (adjust) adjust(rank, o);
        configs[rank] = CreateAutoConfig(job.Pointers(rank), o);
        return absl::OkStatus();
      });
  return configs;
}

// Expects every rank's config to carry `expected`'s mesh, this rank's
// placements and sub-meshes (for the parameters it holds), its rank, the
// world communicator and its coordinator client.
void ExpectConfigs(Job& job,
                   const std::vector<absl::StatusOr<DistributedConfig>>& cfgs,
                   const Expected& expected, bool world_is_set = true) {
  ASSERT_EQ(cfgs.size(), static_cast<size_t>(job.size()));
  for (int r = 0; r < job.size(); ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    ASSERT_THAT(cfgs[r].status(), IsOk());
    const DistributedState& state = cfgs[r]->state;
    EXPECT_EQ(state.mesh.names, expected.mesh.names);
    EXPECT_EQ(state.mesh.sizes, expected.mesh.sizes);
    EXPECT_EQ(state.rank, r);
    EXPECT_EQ(state.world_size, job.size());
    ASSERT_NE(state.communicator, nullptr);
    if (world_is_set) {
      EXPECT_EQ(state.communicator, job.world(r));
    }
    EXPECT_EQ(state.communicator->rank(), r);
    EXPECT_EQ(state.communicator->world_size(), job.size());
    EXPECT_EQ(state.coordinator, job.client(r));
    EXPECT_EQ(state.incarnation, static_cast<uint64_t>(100 + r));
    ASSERT_EQ(state.param_placements.size(), job.held(r).size());
    for (size_t k = 0; k < job.held(r).size(); ++k) {
      const ParamPlacement& want = expected.params[job.held(r)[k]];
      const ParamPlacement& got = state.param_placements[k];
      SCOPED_TRACE(absl::StrCat("parameter ", job.params(r)[k].name));
      EXPECT_EQ(PlacementStrings(got), PlacementStrings(want));
      EXPECT_EQ(got.sub_mesh.dims, want.sub_mesh.dims);
      EXPECT_EQ(got.sub_mesh.coords, want.sub_mesh.coords);
    }
  }
}

// Connects `job` with `groups`, cuts every rank's shards of `problem` as
// `expected` says, runs CreateAutoConfig on every rank and checks the
// configs against `expected`.
void ExpectAutoConfig(Job& job, const Problem& problem,
                      const Expected& expected,
                      const std::vector<GroupDef>& groups,
                      const OptionsFn& adjust, bool with_world = true) {
  ASSERT_TRUE(job.Connect(groups));
  for (int r = 0; r < job.size(); ++r) {
    ASSERT_THAT(job.MakeShards(r, problem, expected), IsOk());
  }
  ExpectConfigs(job, CreateOnEveryRank(job, adjust, with_world), expected,
                with_world);
}

// Expects rank r's status to be InvalidArgument naming "rank r" and every
// string of substrings[r].
void ExpectInvalidArgument(
    const std::vector<absl::StatusOr<DistributedConfig>>& cfgs,
    const std::vector<std::vector<std::string>>& substrings,
    bool name_rank = true) {
  ASSERT_EQ(cfgs.size(), substrings.size());
  for (size_t r = 0; r < cfgs.size(); ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_THAT(cfgs[r].status(),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
    const std::string message(cfgs[r].status().message());
    if (name_rank) {
      EXPECT_THAT(message, HasSubstr(absl::StrCat("rank ", r, ":")));
    }
    for (const std::string& s : substrings[r]) {
      EXPECT_THAT(message, HasSubstr(s));
    }
  }
}

// Same substrings for every rank.
std::vector<std::vector<std::string>> Every(
    int n, const std::vector<std::string>& substrings) {
  return std::vector<std::vector<std::string>>(n, substrings);
}

// --- Shared mesh layouts (ranks row-major, last dim fastest) ---

// dp_shard=2 x tp=2: tp group of r = {2*(r/2), 2*(r/2)+1}, fsdp group of r
// = {r%2, r%2+2}.
const Mesh& TpFsdpMesh() {
  static const Mesh* m = new Mesh(MakeMesh({"dp_shard", "tp"}, {2, 2}));
  return *m;
}

std::vector<GroupDef> TpFsdpGroups() {
  return {MeshGroupDef("tp", TpFsdpMesh(), "tp"),
          MeshGroupDef("fsdp", TpFsdpMesh(), "dp_shard")};
}

// dp_replicate=2 x dp_shard=2.
const Mesh& HsdpMesh() {
  static const Mesh* m =
      new Mesh(MakeMesh({"dp_replicate", "dp_shard"}, {2, 2}));
  return *m;
}

std::vector<GroupDef> HsdpGroups() {
  return {MeshGroupDef("fsdp", HsdpMesh(), "dp_shard"),
          MeshGroupDef("replicate", HsdpMesh(), "dp_replicate")};
}

// ===================== Success: mesh and placements =====================

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
}  // namespace muon
