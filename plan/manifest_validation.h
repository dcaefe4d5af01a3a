// Cross-rank checks of the manifests the ranks send on Join, and the job
// layout the planner works from.
//
// Every rank describes what it holds (mesh, per parameter its global shape,
// placements, sub-mesh and local shape). Ranks may list different
// parameters: with pipeline parallelism a rank lists only its stage's
// parameters, with per-expert 2-D parameters only its experts'. Before
// planning, PlanJob (plan/plan_job.h) checks that
//   - the ranks agree with each other about every parameter they share;
//   - each parameter is listed by exactly the ranks of its sub-mesh
//     (ParamManifest.sub_mesh, e.g. {"pp": 1}; empty = every rank);
//   - each local shape is what the torch.chunk rule (common/layout.h,
//     LocalRanges) says it must be.
// The result is the union of the parameters and the list of the job's
// logical matrices (a 2-D parameter is one matrix, a 3-D expert stack one
// per expert slice), each with the box every rank holds. A failure here is
// returned to every rank of the job before any collective runs.
//
// Thread-safety: pure functions; JobLayout is a plain value.
#ifndef MUON_PLAN_MANIFEST_VALIDATION_H_
#define MUON_PLAN_MANIFEST_VALIDATION_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/layout.h"
#include "muon/v1/coordinator.pb.h"

namespace muon {

// One parameter (2-D matrix or 3-D expert stack) as the whole job holds it.
struct ParamLayout {
  std::string name;
  // Global shape: [rows, cols] or [experts, rows, cols].
  std::vector<int64_t> shape;
  std::vector<Placement> placements;  // one per mesh dim
  // Ranks it lives on (pp stage, ep owner); empty = every rank.
  SubMesh sub_mesh;
  // Blocks of rows, each its own matrix (ParamSpec.row_splits); empty =
  // none.
  std::vector<int64_t> row_splits;
  // Its matrices are JobLayout::matrices[first_matrix, first_matrix +
  // num_matrices) (one for a 2-D parameter, one per slice of a stack).
  int first_matrix = 0;
  int num_matrices = 0;

  // A 3-D [experts, rows, cols] expert stack.
  bool is_stack() const { return shape.size() == 3; }
  // Several matrices: a stack's slices or row blocks.
  bool is_sliced() const { return is_stack() || !row_splits.empty(); }
};

// One logical matrix: the planner's unit of work (a 2-D parameter, or one
// expert slice of a 3-D stack).
struct MatrixLayout {
  int param_index = 0;  // into JobLayout::params
  int slice = 0;        // expert index in a 3-D stack; 0 for 2-D
  // The parameter's name, or "name[e]" for slice e of a stack.
  std::string name;
  int64_t rows = 0;  // global shape of the matrix
  int64_t cols = 0;
  // Box each rank holds (index = rank); empty outside the parameter's
  // sub-mesh, on ranks holding other experts, and for empty torch.chunk
  // shards.
  BoxList boxes;             // shared by matrices of the same layout
  int requested_owner = -1;  // from a user's assign_fn; -1 = none
};

// The validated layout of a job: what the planner needs.
struct JobLayout {
  Mesh mesh;
  int world_size = 0;
  // Union of the ranks' parameters: ranks scanned 0..N-1, each rank's list
  // in order, first appearance wins.
  std::vector<ParamLayout> params;
  // Every logical matrix: parameters in `params` order, slices ascending.
  std::vector<MatrixLayout> matrices;
  // Execution options every rank agreed on (assignment policy, bucket
  // size); taken from rank 0's manifest.
  v1::ExecutionOptions execution;
  // Newton-Schulz iterations every rank's optimizer runs
  // (RankManifest.ns_steps; 5 when unset).
  int ns_steps = 5;
};

// Checks the manifests of a whole job (manifests[r] is rank r's) and
// returns its layout. Checks, in order:
//   - at least one manifest; manifests[r].rank == r;
//   - every world_size equals manifests.size() and the mesh's world size;
//   - every rank's mesh equals rank 0's (and the mesh is valid);
//   - execution options (assignment_policy, bucket_size_bytes,
//     async_gpu_parallelism, prefetch_count) agree;
//   - ns_steps (unset = 5) is in [0, 100) and agrees;
//   - names are non-empty and listed at most once per rank;
//   - every rank listing a parameter agrees on its global shape,
//     placements, dtype and sub_mesh (compared with the first rank listing
//     it), and ranks list shared parameters in the same relative order;
//   - shapes are 2-D or 3-D with dims >= 1; placements parse, one per mesh
//     dim, none Partial, Shard dim below the tensor's rank; the sub_mesh
//     names mesh dims with coordinates in range, Replicate() on them;
//   - each parameter is listed by exactly the ranks inside its sub-mesh;
//   - each rank's local shape equals the torch.chunk rule (LocalRanges);
//   - requested_owners are empty on every rank or given on every rank, one
//     per matrix of that rank's manifest (parameters in order, a 3-D stack
//     one per slice); all ranks listing a matrix request the same owner, in
//     [0, world) and holding a non-empty box of that matrix.
// Errors:
//   InvalidArgument: the first problem found; the message names the
//     parameter, the rank(s), the coordinate and the values, e.g.
//     `parameter "fc1.weight": rank 2 reports global shape [64, 32] but
//     rank 0 reports [32, 64]`,
//     `parameter "layers.3.attn.wq" (sub-mesh pp=1) is missing on rank 5
//     (coordinate pp=1, tp=1)`,
//     `parameter "layers.3.attn.wq" (sub-mesh pp=1) is listed on rank 2
//     outside its sub-mesh (coordinate pp=0, tp=0)`.
absl::StatusOr<JobLayout> ValidateManifests(
    const std::vector<v1::RankManifest>& manifests);

// The layout of the job a spec describes, without building any rank's
// manifest: the same JobLayout ValidateManifests returns for
// ManifestsFromSpec(spec) (parameters in the union order: by the first rank
// of their sub-mesh, then spec order; canonical placements; execution
// options and ns_steps from the spec, 5 when unset), in O(matrices +
// distinct layouts x ranks) memory: matrices with the same shape,
// placements and sub-mesh share their boxes.
// Errors: InvalidArgument: as ValidateJobSpec(spec, per_rank_boxes=false);
//   ns_steps outside [0, 100); distinct layouts x world size above
//   kMaxMatrixRankBoxes boxes (names the count).
absl::StatusOr<JobLayout> LayoutFromSpec(const v1::JobSpec& spec);

// The job spec of `layout`, the inverse of LayoutFromSpec: `job_id`, the
// mesh, every parameter in layout order with its global shape, placements
// (Placement::ToString) and sub_mesh, the execution options and
// optimizer.ns_steps = layout.ns_steps. LayoutFromSpec of the result gives
// the same mesh, parameters and matrices, boxes included (requested owners,
// which a spec does not carry, aside).
v1::JobSpec JobSpecFromLayout(const JobLayout& layout,
                              absl::string_view job_id);

// The first difference between the jobs `given` and `live` describe (mesh,
// parameter names in order, global shapes, placements, sub-meshes), as
// "mesh dp_shard=4 differs from the live job's dp_shard=2" or
// `parameter "fc1.weight": global shape [64, 32] differs from the live
// job's [32, 64]`; "" when they describe the same layout. Placements
// compare in canonical form ("S(0)" equals "Shard(0)"); job ids, optimizer
// and execution options are not compared.
std::string DescribeLayoutDifference(const v1::JobSpec& given,
                                     const v1::JobSpec& live);

// Names the first difference between rank 0's manifest `m0` and another
// rank's `mr` that ValidateManifests would report for a job whose ranks
// share one layout: world size, mesh, execution options, ns_steps, a
// parameter listed on one rank only, a shared parameter's global shape,
// placements, dtype or sub_mesh, the order of the list, the number of
// requested owners. Used to diagnose a compact manifest whose layout hash
// differs (plan/compact_manifest.h). O(parameters).
// Returns InvalidArgument naming the parameter, rank and values, e.g.
//   `parameter "fc1.weight": rank 2 reports global shape [64, 32] but rank
//   0 reports [32, 64]`; OK when no difference is found.
absl::Status DiagnoseLayoutMismatch(const v1::RankManifest& m0,
                                    const v1::RankManifest& mr);

// Boxes computed once per distinct (shape, placements, sub-mesh, row
// splits), shared by the matrices of AppendParam calls with the same cache.
struct LayoutCache {
  // Keyed by the shape, the placements, the sub-mesh's (mesh dim index,
  // coordinate) pairs and the row splits (never by mesh dim names).
  std::map<std::string, std::vector<MatrixBoxes>> entries;
  int64_t boxes = 0;       // boxes held by the entries
  int64_t max_boxes = -1;  // bound on `boxes`; -1 = none
};

// Appends a checked parameter and its matrices (ParamMatrices, through the
// cache) to `layout`; `what` names it in errors ("parameter \"w\"").
// Errors: InvalidArgument (ParamMatrices' errors; the cache's box bound).
absl::Status AppendParam(ParamLayout param, absl::string_view what,
                         JobLayout* layout, LayoutCache* cache);

}  // namespace muon

#endif  // MUON_PLAN_MANIFEST_VALIDATION_H_
