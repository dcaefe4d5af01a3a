// Shared plumbing of the layout examples (examples/layouts/*.cc, one per
// parallelism layout: FSDP, DDP, HSDP, TP, CP, EP, PP and their hybrids):
// what every example needs but that is not the point of the example.
//
//  - RankContext: this rank and its process group (the C++ counterpart of
//    dist.init_process_group / dist.group.WORLD).
//  - Tiny models (ParamDef lists) and deterministic values: the full
//    initial weights and the full gradient of every step, as pure functions
//    of (parameter name, step), identical in every process.
//  - LocalModel: this rank's shards of a model, cut from the full tensors
//    with common/layout.h (LocalRanges + CopyRegion), i.e. what FSDP, TP,
//    EP or a pipeline stage would hand the optimizer; it fills the step's
//    gradients and finally checks the parameters bit for bit against a
//    single-device run of the same model and gradients.
//  - ExampleMain: the `main` of every example binary. Without --rank it is
//    the launcher: it starts --nproc rank processes of the same binary (rank
//    0 embeds the coordinator and writes its port to a file; the launcher
//    waits for it, then starts the other ranks pointed at it), waits for all
//    of them with a bound, and prints one line
//      example <layout>: OK (world N, max_abs_diff 0)
//    With --rank it is one rank: InitProcessGroup, run the example, report.
#ifndef MUON_EXAMPLES_LAYOUTS_EXAMPLE_MAIN_H_
#define MUON_EXAMPLES_LAYOUTS_EXAMPLE_MAIN_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/muon.h"
#include "client/parameter.h"
#include "comm/communicator.h"
#include "common/layout.h"
#include "coordination/coordination_client.h"

namespace muon::examples {

// One rank of an example job.
struct RankContext {
  int rank = 0;
  int world_size = 1;
  // Every rank of the job (Gloo over loopback): dist.group.WORLD. Split it
  // into the layout's process groups (dist.new_group).
  Communicator* world = nullptr;
  // The job's coordinator (embedded in rank 0); give it to the config.
  CoordinationClient* coordinator = nullptr;
  // This process's incarnation (for the config).
  uint64_t incarnation = 0;
  // Filled by LocalModel::CheckAgainstSingleDevice.
  double max_abs_diff = -1;
  int64_t values_checked = 0;
};

// One logical (unsharded) parameter of an example model.
struct ParamDef {
  std::string name;
  // [rows, cols], or [experts, rows, cols] for an MoE expert stack.
  std::vector<int64_t> shape;
  bool expert_stack() const { return shape.size() == 3; }
};

// Tiny models. Sizes are chosen so that most shards are uneven
// (torch.chunk: the last chunk is smaller).
// A bias-free 3-layer MLP: fc1 [16, 13], fc2 [12, 16], fc3 [10, 12].
std::vector<ParamDef> Mlp();
// `layers` transformer blocks (d_model 11, d_ff 18), each
// layers.<i>.attention.qkv_proj [33, 11], layers.<i>.attention.out_proj
// [11, 11], layers.<i>.ffn.w1 [18, 11], layers.<i>.ffn.w2 [11, 18].
std::vector<ParamDef> Transformer(int layers);
// An MoE layer with `experts` experts (d_model 11, d_ff 18): router.weight
// [experts, 11] (2-D) and two expert stacks experts.w1 [experts, 18, 11],
// experts.w2 [experts, 11, 18].
std::vector<ParamDef> MoE(int experts);

// Optimizer options of every example (and of its single-device reference).
MuonOptions ExampleOptions();
// Optimizer steps every example runs.
inline constexpr int kSteps = 3;

// Deterministic full tensors, the same in every process: a pure function of
// (parameter name, step); uniform in [-0.1, 0.1) for weights and [-1, 1)
// for gradients.
std::vector<float> FullInit(const ParamDef& def);
std::vector<float> FullGrad(const ParamDef& def, int step);

// Python's list(range(start, stop, step)): the ranks of a process group.
std::vector<int> RankRange(int start, int stop, int step = 1);

// The same placement list for every parameter of `model`.
std::vector<std::vector<Placement>> SamePlacements(
    const std::vector<ParamDef>& model,
    const std::vector<Placement>& placements);

// This rank's shards of a model, as a framework would hold them: local
// data and gradient buffers (kept here, stable for the object's life) plus
// the block of the full tensor each one holds; the optimizer gets views of
// them (client/tensor_view.h).
class LocalModel {
 public:
  LocalModel() = default;
  LocalModel(LocalModel&&) = default;
  LocalModel& operator=(LocalModel&&) = default;

  // Adds this rank's shard of `def`: the block that `placements` (one per
  // mesh dim) give mesh coordinate mesh.Coord(rank), as DTensor would hold
  // it. A rank outside `sub_mesh` (another pipeline stage) does not hold
  // the parameter and skips it.
  absl::Status AddShard(const ParamDef& def, const Mesh& mesh,
                        const std::vector<Placement>& placements, int rank,
                        const SubMesh& sub_mesh = {});
  // Adds the whole parameter (single device, or a replica).
  void AddFull(const ParamDef& def);

  // The optimizer's parameter list: views of this model's buffers.
  std::vector<ParamView> params();
  const std::vector<ParamDef>& defs() const { return defs_; }
  int size() const { return static_cast<int>(params_.size()); }

  // Fills every local gradient with this rank's block of FullGrad(step):
  // the gradient after backward (and the data-parallel all-reduce or
  // reduce-scatter).
  void SetGrads(int step);

  // Runs `model` on a single device (muon::Muon without a config, the same
  // options, FullInit and FullGrad for kSteps steps) and compares each local
  // shard with its block of the result, bit for bit. Sets
  // ctx.max_abs_diff / values_checked. Errors: Internal with the rank, the
  // max_abs_diff and the first mismatch (parameter, element, both values).
  absl::Status CheckAgainstSingleDevice(const std::vector<ParamDef>& model,
                                        RankContext& ctx) const;

 private:
  std::vector<ParamDef> defs_;
  // Per local parameter, the range of every tensor dim it holds.
  std::vector<std::vector<Range>> ranges_;
  // Heap-allocated so params() pointers survive moves of this object.
  std::vector<std::unique_ptr<Parameter>> params_;
};

// This rank's shards of every parameter of `model`, parameter i laid out by
// placements[i] over `mesh` (and living on sub_meshes[i] when given).
absl::StatusOr<LocalModel> ShardModel(
    const std::vector<ParamDef>& model, const Mesh& mesh,
    const std::vector<std::vector<Placement>>& placements, int rank,
    const std::vector<SubMesh>& sub_meshes = {});

// One example binary.
struct Example {
  std::string name;       // "fsdp": the target and the OK line's name
  int default_world = 1;  // rank processes (--nproc overrides)
  std::function<absl::Status(RankContext&)> run;
};

// The `main` of an example binary (see the file comment). Flags: --nproc,
// --timeout_s (bound on the whole job), and internal ones for the ranks.
// Returns the process exit code: 0 when every rank ran the example and
// matched the single-device run.
int ExampleMain(int argc, char** argv, const Example& example);

}  // namespace muon::examples

#endif  // MUON_EXAMPLES_LAYOUTS_EXAMPLE_MAIN_H_
