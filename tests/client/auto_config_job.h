// The harness of the CreateAutoConfig tests (auto_config_test.cc: the
// layouts and bitwise steps; auto_config_errors_test.cc: bad groups and
// options): N ranks as N threads of this process (tests/client/
// thread_world.h), each with a GlooCommunicator world and sub-groups made
// with world->Split(ranks), rendezvousing through one in-process
// CoordinatorService; the hand-written expected meshes and placements, and
// the checks of CreateAutoConfig's output against them.
#ifndef MUON_TESTS_CLIENT_AUTO_CONFIG_JOB_H_
#define MUON_TESTS_CLIENT_AUTO_CONFIG_JOB_H_

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
namespace auto_config_testing {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

inline constexpr int kSteps = 3;
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

inline std::vector<std::string> PlacementStrings(const ParamPlacement& pl) {
  std::vector<std::string> out;
  for (const Placement& p : pl.placements) out.push_back(p.ToString());
  return out;
}

// --- Problems and expected layouts ---

// The harness's problem (tests/client/single_device_reference.h) with
// kSteps steps.
inline Problem MakeProblem(const std::vector<TensorSpec>& specs) {
  return ::muon::testing::MakeProblem(specs, kSteps);
}

// Uneven (10x7 over 2 or 4), smaller than the world in one dim (3x5, 5x3:
// empty shards under nested sharding), and even.
inline std::vector<TensorSpec> Matrices() {
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

inline Mesh MakeMesh(std::vector<std::string> names, std::vector<int> sizes) {
  Mesh m;
  m.names = std::move(names);
  m.sizes = std::move(sizes);
  return m;
}

inline ParamPlacement Placed(std::vector<Placement> placements,
                             SubMesh sub_mesh = {}) {
  ParamPlacement p;
  p.placements = std::move(placements);
  p.sub_mesh = std::move(sub_mesh);
  return p;
}

inline const Placement kR = Placement::Replicate();
inline Placement S(int d) { return Placement::Shard(d); }

// Rank `rank`'s group along mesh dim `dim` (the ranks whose coordinates
// differ from its own only there), ascending.
inline std::vector<int> MeshGroup(const Mesh& mesh, const std::string& dim,
                                  int rank) {
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

inline GroupDef MeshGroupDef(const std::string& role, const Mesh& mesh,
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
inline std::vector<absl::StatusOr<DistributedConfig>> CreateOnEveryRank(
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
inline void ExpectConfigs(
    Job& job, const std::vector<absl::StatusOr<DistributedConfig>>& cfgs,
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
inline void ExpectAutoConfig(Job& job, const Problem& problem,
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
inline void ExpectInvalidArgument(
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
inline std::vector<std::vector<std::string>> Every(
    int n, const std::vector<std::string>& substrings) {
  return std::vector<std::vector<std::string>>(n, substrings);
}

// --- Shared mesh layouts (ranks row-major, last dim fastest) ---

// dp_shard=2 x tp=2: tp group of r = {2*(r/2), 2*(r/2)+1}, fsdp group of r
// = {r%2, r%2+2}.
inline const Mesh& TpFsdpMesh() {
  static const Mesh* m = new Mesh(MakeMesh({"dp_shard", "tp"}, {2, 2}));
  return *m;
}

inline std::vector<GroupDef> TpFsdpGroups() {
  return {MeshGroupDef("tp", TpFsdpMesh(), "tp"),
          MeshGroupDef("fsdp", TpFsdpMesh(), "dp_shard")};
}

// dp_replicate=2 x dp_shard=2.
inline const Mesh& HsdpMesh() {
  static const Mesh* m =
      new Mesh(MakeMesh({"dp_replicate", "dp_shard"}, {2, 2}));
  return *m;
}

inline std::vector<GroupDef> HsdpGroups() {
  return {MeshGroupDef("fsdp", HsdpMesh(), "dp_shard"),
          MeshGroupDef("replicate", HsdpMesh(), "dp_replicate")};
}

// ===================== Success: mesh and placements =====================

}  // namespace auto_config_testing
}  // namespace muon

#endif  // MUON_TESTS_CLIENT_AUTO_CONFIG_JOB_H_
