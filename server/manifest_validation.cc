#include "server/manifest_validation.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/spec.h"
#include "common/status_macros.h"

namespace muon {
namespace {

std::string Quoted(const std::string& s) { return absl::StrCat("\"", s, "\""); }

std::string PlacementTexts(
    const google::protobuf::RepeatedPtrField<std::string>& placements) {
  return absl::StrCat("[", absl::StrJoin(placements, ", "), "]");
}

std::string OwnersToString(
    const google::protobuf::RepeatedField<int32_t>& owners) {
  return absl::StrCat("[", absl::StrJoin(owners, ", "), "]");
}

// Checks that rank `r`'s copy of parameter `i` agrees with rank 0's.
absl::Status CheckParamAgrees(const v1::ParamManifest& p0,
                              const v1::ParamManifest& pr, int r, int i) {
  if (pr.name() != p0.name()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter ", i, ": rank ", r, " reports ", Quoted(pr.name()),
        " but rank 0 reports ", Quoted(p0.name()),
        " (every rank must list the same parameters in the same order)"));
  }
  const std::string what = absl::StrCat("parameter ", Quoted(p0.name()));
  if (!std::equal(pr.global_shape().begin(), pr.global_shape().end(),
                  p0.global_shape().begin(), p0.global_shape().end())) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": rank ", r, " reports global shape ",
                     ShapeToString(pr.global_shape()), " but rank 0 reports ",
                     ShapeToString(p0.global_shape())));
  }
  bool same_placements = pr.placements_size() == p0.placements_size();
  for (int d = 0; same_placements && d < pr.placements_size(); ++d) {
    absl::StatusOr<Placement> a = Placement::Parse(pr.placements(d));
    absl::StatusOr<Placement> b = Placement::Parse(p0.placements(d));
    same_placements =
        (a.ok() && b.ok()) ? *a == *b : pr.placements(d) == p0.placements(d);
  }
  if (!same_placements) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": rank ", r, " reports placements ",
                     PlacementTexts(pr.placements()), " but rank 0 reports ",
                     PlacementTexts(p0.placements())));
  }
  if (pr.dtype() != p0.dtype()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": rank ", r, " reports dtype ", Quoted(pr.dtype()),
                     " but rank 0 reports ", Quoted(p0.dtype())));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<JobLayout> ValidateManifests(
    const std::vector<v1::RankManifest>& manifests) {
  if (manifests.empty()) {
    return absl::InvalidArgumentError("no rank manifests to validate");
  }
  const int n = static_cast<int>(manifests.size());
  for (int r = 0; r < n; ++r) {
    if (manifests[r].rank() != r) {
      return absl::InvalidArgumentError(
          absl::StrCat("manifest ", r, " reports rank ", manifests[r].rank(),
                       "; expected rank ", r));
    }
  }

  // World size and mesh.
  const v1::RankManifest& m0 = manifests[0];
  JobLayout layout;
  layout.mesh = MeshFromProto(m0.mesh());
  absl::Status mesh_status = layout.mesh.Validate();
  if (!mesh_status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank 0 reports an invalid mesh: ", mesh_status.message()));
  }
  for (int r = 0; r < n; ++r) {
    if (manifests[r].world_size() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", r, " reports world size ",
                       manifests[r].world_size(), " but ", n, " ranks joined"));
    }
  }
  if (layout.mesh.world_size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mesh ", layout.mesh.ToString(), " has ", layout.mesh.world_size(),
        " ranks but the world size is ", n));
  }
  for (int r = 1; r < n; ++r) {
    const Mesh mesh = MeshFromProto(manifests[r].mesh());
    if (mesh != layout.mesh) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", r, " reports mesh ", mesh.ToString(),
                       " but rank 0 reports ", layout.mesh.ToString()));
    }
  }
  layout.world_size = n;

  // Execution options that shape the plan must agree.
  for (int r = 1; r < n; ++r) {
    const v1::ExecutionOptions& e = manifests[r].execution();
    if (e.assignment_policy() != m0.execution().assignment_policy()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", r, " reports assignment_policy ",
                       Quoted(e.assignment_policy()), " but rank 0 reports ",
                       Quoted(m0.execution().assignment_policy())));
    }
    if (e.bucket_size_bytes() != m0.execution().bucket_size_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", r, " reports bucket_size_bytes ", e.bucket_size_bytes(),
          " but rank 0 reports ", m0.execution().bucket_size_bytes()));
    }
  }
  layout.execution = m0.execution();

  // Same parameter list everywhere.
  for (int r = 1; r < n; ++r) {
    const v1::RankManifest& mr = manifests[r];
    const int common = std::min(mr.params_size(), m0.params_size());
    for (int i = 0; i < common; ++i) {
      MUON_RETURN_IF_ERROR(CheckParamAgrees(m0.params(i), mr.params(i), r, i));
    }
    if (mr.params_size() != m0.params_size()) {
      const bool more = mr.params_size() > m0.params_size();
      const v1::ParamManifest& extra =
          more ? mr.params(common) : m0.params(common);
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", r, " lists ", mr.params_size(),
                       " parameters but rank 0 "
                       "lists ",
                       m0.params_size(), "; parameter ", Quoted(extra.name()),
                       " is only on rank ", more ? r : 0));
    }
  }

  // Per parameter: shape, placements, local shapes.
  std::set<std::string> names;
  for (int i = 0; i < m0.params_size(); ++i) {
    const v1::ParamManifest& p = m0.params(i);
    if (p.name().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter at index ", i, " has an empty name"));
    }
    if (!names.insert(p.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter ", Quoted(p.name()), " is listed more than once"));
    }
    if (p.global_shape_size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter ", Quoted(p.name()), " has global shape ",
          ShapeToString(p.global_shape()), " (", p.global_shape_size(),
          "-D); Muon only orthogonalizes 2-D matrices"));
    }
    if (p.global_shape(0) < 1 || p.global_shape(1) < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", Quoted(p.name()), " has global shape ",
                       ShapeToString(p.global_shape()), "; dims must be >= 1"));
    }
    ParamLayout param;
    param.name = p.name();
    param.rows = p.global_shape(0);
    param.cols = p.global_shape(1);
    MUON_ASSIGN_OR_RETURN(
        param.placements,
        CheckMatrixPlacements(p.name(), p.placements(), layout.mesh));
    absl::StatusOr<std::vector<Box>> boxes =
        AllBoxes(param.rows, param.cols, param.placements, layout.mesh);
    if (!boxes.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter ", Quoted(p.name()), ": ", boxes.status().message()));
    }
    param.boxes = *std::move(boxes);
    for (int r = 0; r < n; ++r) {
      const v1::ParamManifest& pr = manifests[r].params(i);
      const Box& box = param.boxes[r];
      const bool ok = pr.local_shape_size() == 2 &&
                      pr.local_shape(0) == box.rows.size() &&
                      pr.local_shape(1) == box.cols.size();
      if (!ok) {
        return absl::InvalidArgumentError(absl::StrCat(
            "parameter ", Quoted(p.name()), ": rank ", r, " local shape ",
            ShapeToString(pr.local_shape()), " does not match ",
            PlacementsToString(param.placements), " of ",
            ShapeToString(p.global_shape()), " over ", layout.mesh.ToString(),
            ": expected [", box.rows.size(), ", ", box.cols.size(), "]"));
      }
    }
    layout.params.push_back(std::move(param));
  }

  // Requested owners (a user's assign_fn).
  for (int r = 1; r < n; ++r) {
    const auto& a = manifests[r].requested_owners();
    const auto& b = m0.requested_owners();
    if (!std::equal(a.begin(), a.end(), b.begin(), b.end())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", r, " requests owners ", OwnersToString(a),
          " but rank 0 requests owners ", OwnersToString(b),
          " (assign_fn must return the same assignment on every rank)"));
    }
  }
  if (m0.requested_owners_size() > 0) {
    if (m0.requested_owners_size() != m0.params_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("requested_owners has ", m0.requested_owners_size(),
                       " entries but there are ", m0.params_size(),
                       " parameters; give one owner per parameter"));
    }
    for (int i = 0; i < m0.params_size(); ++i) {
      ParamLayout& param = layout.params[i];
      const int owner = m0.requested_owners(i);
      if (owner < 0 || owner >= n) {
        return absl::InvalidArgumentError(absl::StrCat(
            "parameter ", Quoted(param.name), ": requested owner rank ", owner,
            " is out of range [0, ", n, ")"));
      }
      if (param.boxes[owner].empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "parameter ", Quoted(param.name), ": requested owner rank ", owner,
            " holds an empty shard of it (",
            PlacementsToString(param.placements), " of [", param.rows, ", ",
            param.cols, "] over ", layout.mesh.ToString(),
            "); the owner must hold part of the "
            "matrix"));
      }
      param.requested_owner = owner;
    }
  }
  return layout;
}

}  // namespace muon
