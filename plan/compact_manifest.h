// Compact manifests: a rank whose manifest follows from the job's layout sends
// O(1) bytes on Join instead of O(parameters).
//
// In the usual job every rank lists the same parameters with the same
// global shapes, placements and dtypes (no pipeline stages or per-expert
// sub-meshes, no requested owners), and its local shapes are the
// torch.chunk rule's at its mesh coordinate. Such a rank sends a
// v1::CompactManifest: its rank, world size, coordinate and the hash of
// its manifest without the rank and the local shapes (ManifestLayoutHash).
// Rank 0 always sends its full manifest: it defines the layout. The
// coordinator checks every compact rank's coordinate and layout hash
// against rank 0's and plans from rank 0's layout (LayoutFromSpec of
// JobSpecFromManifest), O(matrices + ranks) instead of O(matrices x ranks);
// a rank whose hash differs is asked for its full manifest
// (JoinResponse.send_full_manifest) and DiagnoseLayoutMismatch
// (plan/manifest_validation.h) names the parameter, rank and values.
//
// Thread-safety: pure functions.
#ifndef MUON_PLAN_COMPACT_MANIFEST_H_
#define MUON_PLAN_COMPACT_MANIFEST_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "muon/v1/coordinator.pb.h"

namespace muon {

// StableMessageHash (plan/planner.h) of `manifest` with `rank` cleared and
// every parameter's local_shape cleared: equal on every rank of a job whose
// ranks share one layout. Spellings that the full manifests' checks take
// as equal hash alike: an unset assignment_policy as "lpt", exchange_dtype
// as "float32", ns_steps as kDefaultNsSteps; execution.device and
// gpu_precision (per-rank, compared by no check) are left out. 16 hex
// digits. O(parameters).
std::string ManifestLayoutHash(const v1::RankManifest& manifest);

// Whether `manifest` follows from its own layout, i.e. may be sent as a
// CompactManifest: the mesh is valid and has world_size ranks, the rank is
// in [0, world_size), no requested owners, no parameter has a sub_mesh,
// and every local shape equals the torch.chunk rule's (LocalRanges,
// common/layout.h) at the rank's coordinate. O(parameters).
// Errors: FailedPrecondition saying why not (the rank then sends its full
// manifest, and the usual checks name any real problem).
absl::Status CheckManifestFollowsLayout(const v1::RankManifest& manifest);

// The compact form of `manifest`: rank, world size, mesh coordinate and
// ManifestLayoutHash. Requires CheckManifestFollowsLayout(manifest) to be
// OK (the coordinate is empty for an invalid mesh).
v1::CompactManifest MakeCompactManifest(const v1::RankManifest& manifest);

// Rank `rank`'s manifest as it follows from `layout_source` (a manifest for
// which CheckManifestFollowsLayout is OK, normally rank 0's): the same
// fields, with the rank and the local shapes at its coordinate. For
// diagnosing a mixed job (some ranks compact, some not) with the full
// checks. O(parameters).
// Errors: InvalidArgument: rank outside [0, world_size) or an invalid mesh.
absl::StatusOr<v1::RankManifest> ManifestForRank(
    const v1::RankManifest& layout_source, int rank);

// The job spec of `manifest`'s layout: job id, mesh, parameters (name,
// global shape, placements, sub_mesh), execution options and
// optimizer.ns_steps (when set); what LayoutFromSpec
// (plan/manifest_validation.h) plans from. Local shapes, dtypes and
// requested owners are not part of a spec. O(parameters).
v1::JobSpec JobSpecFromManifest(const v1::RankManifest& manifest,
                                absl::string_view job_id);

}  // namespace muon

#endif  // MUON_PLAN_COMPACT_MANIFEST_H_
