#ifndef MUON_TESTS_CLIENT_DISTRIBUTED_WORLD_H_
#define MUON_TESTS_CLIENT_DISTRIBUTED_WORLD_H_

// The multi-rank harness of muon_distributed_test and muon_variants_test:
// N ranks as N threads of this process, each with its own GlooCommunicator
// (TCP on 127.0.0.1) and LocalCoordinationClient over one in-process
// CoordinatorService (ThreadWorld); the test problem (uneven and empty
// shards), config factories for auto (process-group) and mesh (DTensor)
// configs, and the bitwise comparison with the single-device run
// (tests/client/single_device_reference.h).

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "client/parameter.h"
#include "comm/communicator.h"
#include "common/layout.h"
#include "gtest/gtest.h"
#include "tests/client/rank_threads.h"
#include "tests/client/single_device_reference.h"
#include "tests/client/thread_world.h"
#include "tests/status_matchers.h"

namespace muon {
namespace testing {

constexpr int kSteps = 3;

// Uneven (10x7 over 4: chunks 3,3,3,1 rows / 2,2,2,1 cols), smaller than the
// world in one dim (3x5 and 5x3 over 4: an empty shard), and even.
inline Problem MatricesProblem() {
  return MakeProblem({{"layers.0.weight", {10, 7}},
                      {"layers.1.weight", {3, 5}},
                      {"layers.2.weight", {5, 3}},
                      {"layers.3.weight", {12, 16}}},
                     kSteps);
}

inline MuonOptions TestOptions() {
  MuonOptions o;
  o.lr = 0.02;  // visible updates; everything else torch's defaults
  o.nesterov = true;
  return o;
}

// Makes a rank's DistributedConfig from its parameters, process group and
// coordinator client.
using ConfigFactory = std::function<absl::StatusOr<DistributedConfig>(
    const std::vector<Parameter*>& params, Communicator* comm,
    CoordinationClient* coordinator)>;

inline ProblemLayout OneDimLayout(int world_size, Placement placement,
                                  size_t matrices) {
  return UniformLayout(Mesh::OneDim(world_size), {placement}, matrices);
}

inline ConfigFactory AutoConfig(bool fsdp, int shard_dim = 0) {
  return
      [fsdp, shard_dim](const std::vector<Parameter*>& params,
                        Communicator* comm, CoordinationClient* coordinator) {
        AutoConfigOptions o;
        if (fsdp) {
          o.fsdp = comm;
          o.fsdp_shard_dim = shard_dim;
        } else {
          o.ddp = comm;
        }
        o.coordinator = coordinator;
        return CreateAutoConfig(params, o);
      };
}

inline ConfigFactory MeshConfig(const ProblemLayout& layout) {
  return [layout](const std::vector<Parameter*>&, Communicator* comm,
                  CoordinationClient* coordinator) {
    std::vector<ParamPlacement> placements;
    for (const auto& p : layout.placements) {
      placements.push_back(ParamPlacement{p});
    }
    return CreateMeshConfig(layout.mesh, placements, comm, coordinator);
  };
}

// MeshConfig for a layout with sub-meshes (pipeline stages, expert
// groups): each rank's config lists only the parameters it holds (matched
// to the layout's by name among `names`), with their sub-meshes.
inline ConfigFactory SubMeshConfig(const ProblemLayout& layout,
                                   const std::vector<std::string>& names) {
  return [layout, names](const std::vector<Parameter*>& params,
                         Communicator* comm, CoordinationClient* coordinator)
             -> absl::StatusOr<DistributedConfig> {
    std::vector<ParamPlacement> placements;
    for (const Parameter* p : params) {
      const auto it = std::find(names.begin(), names.end(), p->name);
      if (it == names.end()) {
        return absl::InvalidArgumentError("SubMeshConfig: unknown parameter " +
                                          p->name);
      }
      const size_t i = static_cast<size_t>(it - names.begin());
      placements.push_back(ParamPlacement{
          layout.placements[i],
          layout.sub_meshes.empty() ? SubMesh{} : layout.sub_meshes[i]});
    }
    return CreateMeshConfig(layout.mesh, placements, comm, coordinator);
  };
}

// One job: a coordinator, and per rank a coordination client, a Gloo process
// group (ThreadWorld), and the ranks' shards, optimizers and step stats
// (`run`). `run` is destroyed before the ThreadWorld base: the optimizers
// stop their agents before the process groups and the coordinator go.
class World : public ::muon::testing::ThreadWorld {
 public:
  explicit World(int world_size) : ThreadWorld(world_size), run(world_size) {}

  // Cuts rank `rank`'s shards of the problem as `layout` says (must run
  // before the optimizer is made; the vectors are not resized afterwards).
  absl::Status MakeShards(int rank, const Problem& problem,
                          const ProblemLayout& layout) {
    absl::StatusOr<RankShards> shards = CutShards(problem, layout, rank);
    if (!shards.ok()) return shards.status();
    run.shards[rank] = *std::move(shards);
    return absl::OkStatus();
  }

  std::vector<Parameter>& params(int rank) { return run.shards[rank].params; }

  // Builds the rank's config with `factory` (bounded join) and the
  // optimizer over `shards`.
  absl::StatusOr<std::unique_ptr<Muon>> MakeMuon(
      int rank, RankShards& shards, const ConfigFactory& factory,
      const MuonOptions& options,
      const std::function<void(DistributedConfig&)>& customize = nullptr) {
    absl::StatusOr<DistributedConfig> config =
        factory(shards.Pointers(), comm(rank), client(rank));
    if (!config.ok()) return config.status();
    config->state.join_timeout_ms = kJoinTimeoutMs;
    config->state.incarnation = 100 + rank;
    if (customize) customize(*config);
    return Muon::Create(shards.Pointers(), options, *std::move(config));
  }

  // The same into run.muons[rank].
  absl::Status CreateMuon(
      int rank, const ConfigFactory& factory, const MuonOptions& options,
      const std::function<void(DistributedConfig&)>& customize = nullptr) {
    absl::StatusOr<std::unique_ptr<Muon>> muon =
        MakeMuon(rank, run.shards[rank], factory, options, customize);
    if (!muon.ok()) return muon.status();
    run.muons[rank] = *std::move(muon);
    return absl::OkStatus();
  }

  DistributedRun run;
};

// Runs kSteps distributed steps on `world` (shards cut as `layout`, config
// from `factory`) and compares with the single-device run bit for bit
// (every shard, replica, momentum buffer and reassembled parameter, and the
// zero-redundancy counters of every step), then checks that every rank
// holds the same plan, whose owners cover every matrix once.
inline void ExpectMatchesSingleDevice(
    World& world, const Problem& problem, const ProblemLayout& layout,
    const ConfigFactory& factory, const MuonOptions& options = TestOptions(),
    const std::function<void(DistributedConfig&)>& customize = nullptr) {
  const absl::StatusOr<SingleDeviceResult> single =
      RunSingleDevice(problem, options);
  ASSERT_THAT(single, IsOk());
  ASSERT_TRUE(world.Connect());
  const int n = world.size();
  std::vector<absl::Status> statuses = RunDistributedSteps(
      problem, layout,
      [&](int rank, RankShards& shards) {
        return world.MakeMuon(rank, shards, factory, options, customize);
      },
      &world.run);
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
  }
  ExpectShardsMatchSingleDevice(problem, *single, world.run);
  ExpectEachMatrixOrthogonalizedOnce(problem, *single, world.run);

  // Every rank holds the same plan, and its owners cover every matrix once.
  std::map<int, std::vector<int>> assignments =
      world.run.muons[0]->assignments();
  // Indices are positions in matrices(): one per 2-D parameter, per
  // expert slice, per row block.
  const int matrices = problem.matrices();
  std::vector<int> owned(matrices, 0);
  for (const auto& [rank, indices] : assignments) {
    EXPECT_GE(rank, 0);
    EXPECT_LT(rank, n);
    for (int i : indices) {
      ASSERT_GE(i, 0);
      ASSERT_LT(i, matrices);
      ++owned[i];
    }
  }
  EXPECT_EQ(owned, std::vector<int>(matrices, 1));
  for (int r = 1; r < n; ++r) {
    EXPECT_EQ(world.run.muons[r]->assignments(), assignments) << "rank " << r;
    EXPECT_EQ(world.run.muons[r]->plan().hash(),
              world.run.muons[0]->plan().hash());
  }
}

}  // namespace testing
}  // namespace muon

#endif  // MUON_TESTS_CLIENT_DISTRIBUTED_WORLD_H_
