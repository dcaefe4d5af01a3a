// How a Muon optimizer's parameters are laid out over ranks and who
// orthogonalizes what: who owns each matrix (assign_fn), how its update
// reaches the owner and comes back (gather_fn, redistribute_fn), what the
// rank knows of the setup (state) and how the step runs
// (async_gpu_parallelism, prefetch_count).
//
// A DistributedConfig is a value: build it once per rank with
// CreateAutoConfig (process-group style) or CreateMeshConfig (DTensor style),
// or fill it by hand for a custom framework, then pass it to Muon::Create.
// No config (std::nullopt) means the single-device path.
#ifndef MUON_CLIENT_DISTRIBUTED_CONFIG_H_
#define MUON_CLIENT_DISTRIBUTED_CONFIG_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/parameter.h"
#include "comm/communicator.h"
#include "common/layout.h"
#include "coordination/coordination_client.h"
#include "kernels/ns_engine.h"
#include "muon/v1/coordinator.pb.h"

namespace muon {

// What an assign_fn sees of one matrix: a 2-D parameter, or one expert
// slice of a 3-D stack.
struct MatrixInfo {
  int index = 0;        // position in the list passed to assign_fn
  int param_index = 0;  // position in the optimizer's parameter list
  int slice = 0;        // expert index (0 for 2-D)
  std::string name;     // parameter name
  int64_t rows = 0;     // global shape of the matrix
  int64_t cols = 0;
};

// Maps each rank to the indices (MatrixInfo::index) of the matrices it
// orthogonalizes; with only 2-D parameters these are the parameter indices.
// Must be deterministic: every rank calls it with the same arguments and
// must get the same answer. Every matrix must appear exactly once; ranks are
// in [0, world_size) and must hold a shard.
using AssignFn = std::function<std::map<int, std::vector<int>>(
    const std::vector<MatrixInfo>& params, int world_size)>;

// Custom gather: moves the update U of one matrix (parameter `param_index`,
// expert `slice` of a 3-D stack, 0 for 2-D) from the ranks' shards to `owner`.
// Called on every rank that has the parameter, for each of its matrices, in
// plan order (so collectives inside it line up). `local_shard` is this rank's
// part of U for that matrix (row-major, its local [rows, cols]); `full` is a
// [rows, cols] row-major buffer to fill on the owner and nullptr elsewhere.
using GatherFn =
    std::function<absl::Status(int param_index, int slice, int owner,
                               const float* local_shard, float* full)>;

// Custom redistribute: sends every holder its part of the orthogonalized O of
// one matrix. Called like GatherFn. `full` is O on the owner (nullptr
// elsewhere); `local_shard` receives this rank's part (its local [rows, cols]).
using RedistributeFn =
    std::function<absl::Status(int param_index, int slice, int owner,
                               const float* full, float* local_shard)>;

// Placement of one parameter over the mesh (DTensor's placements).
struct ParamPlacement {
  std::vector<Placement> placements;  // one per mesh dim
  // Ownership dims (pp stage, ep owner): the parameter lives only on the
  // ranks of this sub-mesh. Empty = every rank.
  SubMesh sub_mesh;
};

// Everything a rank knows about the distributed setup.
struct DistributedState {
  int rank = 0;
  int world_size = 1;
  // The device mesh and, per parameter (optimizer order), its placements.
  Mesh mesh;
  std::vector<ParamPlacement> param_placements;
  // Process group spanning the mesh (the data path). Not owned; must
  // outlive the optimizer. Its buffers must be on the parameters' device
  // (Communicator::buffer_device: Gloo for CPU parameters, NCCL on the
  // parameters' GPU for CUDA ones) when the world is larger than one.
  Communicator* communicator = nullptr;
  // A group over the same ranks on host memory (Gloo) for the step's
  // control values, one float per rank: MuonOptions::check_finite's and
  // transactional_step's agreements (c10d keeps a Gloo group beside NCCL
  // for the same purpose). Not owned. nullptr = `communicator` when its
  // buffers are host memory; with an NCCL `communicator`, world size > 1
  // and either option on, it is required (InitProcessGroup makes one).
  Communicator* control_communicator = nullptr;
  // The coordinator (join, plan, reports). Not owned. nullptr = plan
  // locally, with no cross-rank validation of manifests (debug only).
  CoordinationClient* coordinator = nullptr;
  // Incarnation id of this rank process (fresh per process start).
  uint64_t incarnation = 0;
  // How long Join waits for the other ranks.
  int64_t join_timeout_ms = 60000;
};

struct DistributedConfig {
  // Empty = the coordinator's policy (longest-processing-time-first).
  AssignFn assign_fn;
  // Empty = one packed all-to-all(v) per bucket each way (exact split
  // sizes, no padding).
  GatherFn gather_fn;
  RedistributeFn redistribute_fn;
  DistributedState state;
  // How the plan is made and the step runs: the job spec's "execution"
  // message (proto/muon/v1/coordinator.proto), the one definition of these
  // settings, which the C ABI and Python fill too:
  //   assignment_policy: "lpt" (longest-processing-time-first, also when
  //     empty) or "round_robin", when assign_fn is empty;
  //   bucket_size_bytes: bytes of full fp32 matrices per bucket (0 = one
  //     matrix per owner);
  //   async_gpu_parallelism: false = sequential debug mode; true = comm and
  //     compute streams overlap, with prefetch_count buckets gathered ahead;
  //   replan_every_steps: re-plan from measured times every this many steps
  //     (0 = never; needs a coordinator).
  // device and gpu_precision (the job spec's spelling of MuonOptions.device
  // and gpu_precision) set MuonOptions' when given; set to other values
  // in both places, Create refuses them. Muon::Create checks it all
  // (ResolveOptions).
  v1::ExecutionOptions execution;
  // Makes this rank's Newton-Schulz engine instead of MuonOptions.device's
  // (empty = that one): a custom kernel, or in tests a slowed one.
  std::function<absl::StatusOr<std::unique_ptr<kernels::NsEngine>>()>
      ns_engine_factory;
};

// Process groups for CreateAutoConfig (fsdp / tp / HSDP shard+replicate /
// cp / dp / pp / ep groups, as a PyTorch job holds them). Each group is
// a Communicator this rank belongs to, split from `world`; its
// global_ranks() place it in the mesh. Unset groups are not used.
//
// The mesh is built from the groups given, in the standard order
// pp x dp_replicate x dp_shard x cp x ep x tp (ranks row-major, tp
// fastest), like torch's init_device_mesh; every group must be exactly this
// rank's row of that mesh (so the groups neither overlap otherwise nor
// leave a rank out).
//
// Placements per parameter (2-D [rows, cols]; 3-D expert stacks
// [experts, rows, cols] shift tensor dims by one and take Shard(0) on ep):
//   pp: the parameter lives only on this rank's stage (sub-mesh pp=stage);
//   dp_replicate (DDP, HSDP's replicate group), cp: Replicate();
//   dp_shard (FSDP, HSDP's shard group): Shard(fsdp_shard_dim);
//   ep: Shard(0) of expert stacks, Replicate() of 2-D parameters;
//   tp: Shard(tp_dim_per_param[i]) if given, else Shard(tp_shard_dim).
struct AutoConfigOptions {
  // Spans every rank: the data path's process group. nullptr = the one
  // group given when it spans the world.
  Communicator* world = nullptr;
  // FSDP (or HSDP's shard) group and the tensor dim it shards.
  Communicator* fsdp = nullptr;
  int fsdp_shard_dim = 0;
  // HSDP's replicate group (with fsdp), or DDP's group (without).
  Communicator* replicate = nullptr;
  // DDP: same as `replicate` (give one of the two).
  Communicator* ddp = nullptr;
  // Tensor parallel group, its default shard dim, and per-parameter dims
  // (optimizer index -> tensor dim).
  Communicator* tp = nullptr;
  int tp_shard_dim = 0;
  std::map<int, int> tp_dim_per_param;
  // Context parallel group (parameters replicated).
  Communicator* cp = nullptr;
  // Expert parallel group.
  Communicator* ep = nullptr;
  // Pipeline group (the ranks holding the same position in every stage),
  // this rank's stage and the number of stages; stage < 0 = this rank's
  // index in the pp group.
  Communicator* pp = nullptr;
  int pp_stage = -1;
  int pp_num_stages = 0;
  CoordinationClient* coordinator = nullptr;
  uint64_t incarnation = 0;
};

// Builds the mesh and placements from the groups above and the parameters'
// shapes.
// Errors (InvalidArgument, naming the group, rank and values):
//   no group given; world missing while no group spans the world; a group
//   this rank is not in; group sizes whose product is not the world size;
//   a group that is not this rank's row of the standard mesh (groups that
//   overlap or do not tile the world); pp stage >= number of stages, or a
//   number of stages that differs from the pp group's size; a shard dim out
//   of range; a parameter whose local shape disagrees with the placements
//   (e.g. a wrong tp shard dim: names the parameter, the expected and the
//   actual local shape); dp and replicate both given.
absl::StatusOr<DistributedConfig> CreateAutoConfig(
    const std::vector<ParamView>& params, const AutoConfigOptions& options);
// The same for owning Parameters (their views).
absl::StatusOr<DistributedConfig> CreateAutoConfig(
    const std::vector<Parameter*>& params, const AutoConfigOptions& options);

// DTensor analog: `mesh` and one placement list per parameter
// (optimizer order). `communicator` spans the mesh (rank = row-major mesh
// coordinate). Errors: InvalidArgument when the mesh size differs from the
// communicator's world size or a placement list has the wrong length.
absl::StatusOr<DistributedConfig> CreateMeshConfig(
    const Mesh& mesh, const std::vector<ParamPlacement>& placements,
    Communicator* communicator, CoordinationClient* coordinator,
    uint64_t incarnation = 0);

}  // namespace muon

#endif  // MUON_CLIENT_DISTRIBUTED_CONFIG_H_
