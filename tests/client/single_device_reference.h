// The single-device equivalence harness of the multi-rank tests: one
// Problem (global parameter shapes, 2-D or 3-D expert stacks, with seeded
// initial values and per-step gradients), the same steps run with
// muon::Muon on a single device (RunSingleDevice), each rank's torch.chunk
// shards cut from the global tensors and stepped on rank threads
// (CutShards, RunDistributedSteps), and the checks that the ranks end, bit
// for bit, where the single device does (ExpectShardsMatchSingleDevice,
// ExpectEachMatrixOrthogonalizedOnce).
//
// Typical use, ranks as threads of the test (tests/client/thread_world.h
// gives each rank a communicator and a coordinator client):
//   const Problem problem = MakeProblem({{"w", {10, 7}}}, /*steps=*/3);
//   absl::StatusOr<SingleDeviceResult> single =
//       RunSingleDevice(problem, options);
//   DistributedRun run(world.size());
//   std::vector<absl::Status> st = RunDistributedSteps(
//       problem, UniformLayout(Mesh::OneDim(4), {Placement::Shard(0)}, 1),
//       [&](int rank, RankShards& shards) { return Muon::Create(...); },
//       &run);
//   ExpectShardsMatchSingleDevice(problem, *single, run);
//   ExpectEachMatrixOrthogonalizedOnce(problem, *single, run);
//
// The single-device run is the reference: it is muon::Muon itself, whose
// step is checked against torch.optim.Muon's formulas in
// tests/client/muon_test.cc.
#ifndef MUON_TESTS_CLIENT_SINGLE_DEVICE_REFERENCE_H_
#define MUON_TESTS_CLIENT_SINGLE_DEVICE_REFERENCE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/muon.h"
#include "client/parameter.h"
#include "common/layout.h"

namespace muon {
namespace testing {

// One parameter of a problem.
struct TensorSpec {
  std::string name;
  // Global shape: [rows, cols], or [experts, rows, cols] when expert_stack.
  std::vector<int64_t> shape;
  // A 3-D stack of expert matrices (Parameter::expert_stack).
  bool expert_stack = false;
  // Row blocks orthogonalized on their own (Parameter::row_splits).
  std::vector<int64_t> row_splits = {};
};

// Product of the dims (1 for an empty shape).
int64_t Numel(const std::vector<int64_t>& shape);

// The global tensors of a run, identical for the single-device run and
// every distributed run: row-major float32 values.
struct Problem {
  std::vector<TensorSpec> specs;
  std::vector<std::vector<float>> init;                // [param]
  std::vector<std::vector<std::vector<float>>> grads;  // [step][param]

  int steps() const { return static_cast<int>(grads.size()); }
  // Matrices Newton-Schulz sees: one per 2-D parameter, one per expert
  // slice of a stack.
  int matrices() const;
};

// A problem over `specs` with `steps` steps. Values come from
// RandomValues (tests/client/rank_threads.h), uniform in [-1, 1): initial
// values of parameter i from seed 7 + i, the step-s gradient (s from 0)
// from seed 1000 * (s + 1) + i.
Problem MakeProblem(const std::vector<TensorSpec>& specs, int steps);

// Where the single device ends after every step of a problem.
struct SingleDeviceResult {
  std::vector<std::vector<float>> params;   // [param], after the last step
  std::vector<std::vector<float>> buffers;  // [param], momentum, ditto
  // [param], NorMuon's row state ([..., rows] of the parameter), ditto;
  // empty without MuonOptions::normuon.
  std::vector<std::vector<float>> variances;
  std::vector<StepStats> stats;  // [step]
};

// Runs problem.steps() steps of muon::Muon with `options` and no
// DistributedConfig over one muon::Parameter per spec (whole tensors, the
// step-s gradients fed before step s). Pins OpenBLAS to one thread first
// (process-wide): its results depend on the thread count, and the ranks
// compared with this run need the same setting.
// Errors: those of Muon::Create, and of Step (message prefixed "step N: ").
absl::StatusOr<SingleDeviceResult> RunSingleDevice(const Problem& problem,
                                                   const MuonOptions& options);

// How a problem's parameters are laid out over the ranks.
struct ProblemLayout {
  Mesh mesh;
  // [param]: one placement per mesh dim.
  std::vector<std::vector<Placement>> placements;
  // [param]: the ranks a parameter lives on (pp stage, ep owner); an empty
  // vector = every parameter on every rank.
  std::vector<SubMesh> sub_meshes;
};

// `params` parameters, each placed as `placements` on `mesh`, none
// restricted to a sub-mesh.
ProblemLayout UniformLayout(const Mesh& mesh,
                            const std::vector<Placement>& placements,
                            size_t params);

// One rank's shards of a problem's parameters.
struct RankShards {
  // The parameters this rank holds (those whose sub-mesh contains it), in
  // problem order: name, global and local shape, expert_stack, data cut
  // from the initial values, grad zeros.
  std::vector<Parameter> params;
  // [local]: index of the parameter in problem.specs.
  std::vector<int> held;
  // [local]: the region of the global tensor held, one Range per dim.
  std::vector<std::vector<Range>> ranges;

  // Pointers to `params`, for Muon::Create and the config factories.
  std::vector<Parameter*> Pointers();
  // Cuts the step-`step` gradients into the parameters' grad vectors.
  void SetGrads(const Problem& problem, int step);
};

// Rank `rank`'s shards of `problem` under `layout` (LocalRanges: the
// torch.chunk rule, nested shards left to right).
// Errors: InvalidArgument from LocalRanges (placements that do not fit), or
// when `layout` does not list one placement list (and sub-mesh, if any) per
// parameter.
absl::StatusOr<RankShards> CutShards(const Problem& problem,
                                     const ProblemLayout& layout, int rank);

// The region `ranges` (one Range per dim) of a row-major tensor `global` of
// `shape`, row-major.
std::vector<float> ExtractRegion(const std::vector<float>& global,
                                 const std::vector<int64_t>& shape,
                                 const std::vector<Range>& ranges);

// Writes `local` (the region `ranges`, row-major) into `global`.
void InsertRegion(const std::vector<float>& local,
                  const std::vector<int64_t>& shape,
                  const std::vector<Range>& ranges, std::vector<float>* global);

// The ranks' side of an equivalence run. Destroy it (or clear `muons`)
// before the communicators and coordinator the optimizers use: a member
// declared after them, or of a class derived from ThreadWorld, is.
struct DistributedRun {
  explicit DistributedRun(int world_size)
      : shards(world_size), muons(world_size), stats(world_size) {}

  int size() const { return static_cast<int>(shards.size()); }

  std::vector<RankShards> shards;             // [rank]
  std::vector<std::unique_ptr<Muon>> muons;   // [rank]; null until created
  std::vector<std::vector<StepStats>> stats;  // [rank][step]
};

// Makes rank `rank`'s optimizer over `shards.Pointers()` (its config, its
// communicator and coordinator client are the caller's).
using MakeMuonFn = std::function<absl::StatusOr<std::unique_ptr<Muon>>(
    int rank, RankShards& shards)>;

// On run->size() rank threads (RunOnRanks): cuts each rank's shards
// (CutShards), makes its optimizer with `make_muon`, then runs
// problem.steps() steps, feeding each step's gradients and recording
// last_step_stats(). Returns every rank's status; a failed step's message
// is prefixed "step N: ".
std::vector<absl::Status> RunDistributedSteps(const Problem& problem,
                                              const ProblemLayout& layout,
                                              const MakeMuonFn& make_muon,
                                              DistributedRun* run);

// Expects, bit for bit, every rank's shard of every parameter it holds, and
// its momentum buffer, to equal the same region of the single-device result
// (so replicas are checked too), and every parameter reassembled from the
// ranks' shards to equal the single-device one (an element no rank holds
// fails the check).
void ExpectShardsMatchSingleDevice(const Problem& problem,
                                   const SingleDeviceResult& single,
                                   const DistributedRun& run);

// Zero redundancy: at every step, summed over the ranks, each matrix is
// orthogonalized exactly once (problem.matrices(), as on the single device)
// and the Newton-Schulz FLOPs equal the single-device figure.
void ExpectEachMatrixOrthogonalizedOnce(const Problem& problem,
                                        const SingleDeviceResult& single,
                                        const DistributedRun& run);

}  // namespace testing
}  // namespace muon

#endif  // MUON_TESTS_CLIENT_SINGLE_DEVICE_REFERENCE_H_
