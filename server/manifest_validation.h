// Cross-rank checks of the manifests the ranks send on Join, and the job
// layout the planner works from.
//
// Every rank describes what it holds (mesh, per parameter its global shape,
// placements and local shape). Before planning, the coordinator checks that
// the ranks agree with each other and that each local shape is what the
// torch.chunk rule (common/layout.h, LocalBox) says it must be. A failure
// here is returned to every rank of the job before any collective runs.
//
// Thread-safety: pure functions; JobLayout is a plain value.
#ifndef MUON_SERVER_MANIFEST_VALIDATION_H_
#define MUON_SERVER_MANIFEST_VALIDATION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/layout.h"
#include "muon/v1/coordinator.pb.h"

namespace muon {

// One 2-D parameter as the whole job holds it.
struct ParamLayout {
  std::string name;
  int64_t rows = 0;  // global shape [rows, cols]
  int64_t cols = 0;
  std::vector<Placement> placements;  // one per mesh dim
  std::vector<Box> boxes;             // index = rank; may be empty boxes
  int requested_owner = -1;           // from a user's assign_fn; -1 = none
};

// The validated layout of a job: what the planner needs.
struct JobLayout {
  Mesh mesh;
  int world_size = 0;
  std::vector<ParamLayout> params;  // in manifest order
  // Execution options every rank agreed on (assignment policy, bucket
  // size); taken from rank 0's manifest.
  v1::ExecutionOptions execution;
};

// Checks the manifests of a whole job (manifests[r] is rank r's) and
// returns its layout. Checks, in order:
//   - at least one manifest; manifests[r].rank == r;
//   - every world_size equals manifests.size() and the mesh's world size;
//   - every rank's mesh equals rank 0's (and the mesh is valid);
//   - every rank lists the same parameters in the same order with the same
//     global shape, placements and dtype;
//   - names are non-empty and unique; shapes are 2-D with dims >= 1;
//   - placements parse, one per mesh dim, none Partial, Shard dim in {0,1};
//   - each rank's local shape equals the torch.chunk rule (LocalBox);
//   - requested_owners are empty on every rank or identical on every rank,
//     one per parameter, each in [0, world) and holding a non-empty shard;
//   - execution options (assignment_policy, bucket_size_bytes) agree.
// Errors:
//   InvalidArgument: the first disagreement found; the message names the
//     parameter, the ranks and both values, e.g.
//     `parameter "fc1.weight": rank 2 reports global shape [64, 32] but
//     rank 0 reports [32, 64]`.
absl::StatusOr<JobLayout> ValidateManifests(
    const std::vector<v1::RankManifest>& manifests);

}  // namespace muon

#endif  // MUON_SERVER_MANIFEST_VALIDATION_H_
