#include "plan/compact_manifest.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/layout.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "plan/planner.h"

namespace muon {
namespace {

// The mesh of `m`, checked against its world size and rank.
absl::StatusOr<Mesh> CheckedMesh(const v1::RankManifest& m, int rank) {
  const Mesh mesh = MeshFromProto(m.mesh());
  absl::Status valid = mesh.Validate();
  if (!valid.ok()) return valid;
  if (mesh.world_size() != m.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("mesh ", mesh.ToString(), " has ", mesh.world_size(),
                     " ranks but the world size is ", m.world_size()));
  }
  if (rank < 0 || rank >= m.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside [0, ", m.world_size(), ")"));
  }
  return mesh;
}

// The torch.chunk local shape of parameter `p` at `coord`, after checking
// its global shape (CheckParamShape: 2-D or 3-D, dims >= 1, the element
// limit) so that nothing is computed from an unchecked one.
// Errors: InvalidArgument naming the parameter (the shape, a placement
// that does not parse, LocalRanges' errors).
absl::StatusOr<std::vector<int64_t>> ChunkShape(const v1::ParamManifest& p,
                                                const Mesh& mesh,
                                                const std::vector<int>& coord) {
  MUON_RETURN_IF_ERROR(CheckParamShape(p.name(), p.global_shape()));
  const std::string what = absl::StrCat("parameter \"", p.name(), "\": ");
  std::vector<Placement> placements;
  for (const std::string& text : p.placements()) {
    absl::StatusOr<Placement> placement = Placement::Parse(text);
    if (!placement.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, placement.status().message()));
    }
    placements.push_back(*placement);
  }
  const std::vector<int64_t> shape(p.global_shape().begin(),
                                   p.global_shape().end());
  absl::StatusOr<std::vector<Range>> ranges =
      LocalRanges(shape, placements, mesh, coord);
  if (!ranges.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ranges.status().message()));
  }
  std::vector<int64_t> local;
  for (const Range& r : *ranges) local.push_back(r.size());
  return local;
}

}  // namespace

std::string ManifestLayoutHash(const v1::RankManifest& manifest) {
  v1::RankManifest layout = manifest;
  layout.clear_rank();
  for (v1::ParamManifest& p : *layout.mutable_params()) p.clear_local_shape();
  // Spellings the full manifests' checks take as equal hash alike
  // (CheckRanksMeshAndOptions, plan/manifest_validation.h): unset fields
  // as their defaults, and the per-rank device fields, which no check
  // compares, left out.
  v1::ExecutionOptions* e = layout.mutable_execution();
  if (e->assignment_policy().empty()) e->set_assignment_policy("lpt");
  if (e->exchange_dtype().empty()) e->set_exchange_dtype("float32");
  e->clear_device();
  e->clear_gpu_precision();
  layout.set_ns_steps(NsStepsOf(manifest));
  return StableMessageHash(layout);
}

absl::Status CheckManifestFollowsLayout(const v1::RankManifest& m) {
  absl::StatusOr<Mesh> mesh = CheckedMesh(m, m.rank());
  if (!mesh.ok()) {
    return absl::FailedPreconditionError(mesh.status().message());
  }
  if (m.requested_owners_size() > 0) {
    return absl::FailedPreconditionError("the rank requests owners");
  }
  const std::vector<int> coord = mesh->Coord(m.rank());
  for (const v1::ParamManifest& p : m.params()) {
    if (!p.sub_mesh().empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("parameter \"", p.name(), "\" lives on a sub-mesh"));
    }
    absl::StatusOr<std::vector<int64_t>> local = ChunkShape(p, *mesh, coord);
    if (!local.ok()) {
      return absl::FailedPreconditionError(local.status().message());
    }
    if (!std::equal(local->begin(), local->end(), p.local_shape().begin(),
                    p.local_shape().end())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "parameter \"", p.name(), "\": local shape [",
          absl::StrJoin(p.local_shape(), ", "), "] is not the chunk rule's [",
          absl::StrJoin(*local, ", "), "]"));
    }
  }
  return absl::OkStatus();
}

v1::CompactManifest MakeCompactManifest(const v1::RankManifest& m) {
  v1::CompactManifest c;
  c.set_rank(m.rank());
  c.set_world_size(m.world_size());
  absl::StatusOr<Mesh> mesh = CheckedMesh(m, m.rank());
  if (mesh.ok()) {
    for (int x : mesh->Coord(m.rank())) c.add_coord(x);
  }
  c.set_layout_hash(ManifestLayoutHash(m));
  return c;
}

absl::StatusOr<v1::RankManifest> ManifestForRank(
    const v1::RankManifest& layout_source, int rank) {
  absl::StatusOr<Mesh> mesh = CheckedMesh(layout_source, rank);
  if (!mesh.ok()) return mesh.status();
  const std::vector<int> coord = mesh->Coord(rank);
  v1::RankManifest m = layout_source;
  m.set_rank(rank);
  for (v1::ParamManifest& p : *m.mutable_params()) {
    absl::StatusOr<std::vector<int64_t>> local = ChunkShape(p, *mesh, coord);
    if (!local.ok()) return local.status();
    p.clear_local_shape();
    for (int64_t n : *local) p.add_local_shape(n);
  }
  return m;
}

v1::JobSpec JobSpecFromManifest(const v1::RankManifest& m,
                                absl::string_view job_id) {
  v1::JobSpec spec;
  spec.set_job_id(std::string(job_id));
  *spec.mutable_mesh() = m.mesh();
  *spec.mutable_execution() = m.execution();
  if (m.has_ns_steps()) spec.mutable_optimizer()->set_ns_steps(m.ns_steps());
  spec.mutable_params()->Reserve(m.params_size());
  for (const v1::ParamManifest& p : m.params()) {
    v1::ParamSpec* ps = spec.add_params();
    ps->set_name(p.name());
    *ps->mutable_shape() = p.global_shape();
    *ps->mutable_placements() = p.placements();
    *ps->mutable_sub_mesh() = p.sub_mesh();
    *ps->mutable_row_splits() = p.row_splits();
  }
  return spec;
}

}  // namespace muon
