#include "plan/manifest_validation.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checked_math.h"
#include "common/edit_distance.h"
#include "common/spec.h"
#include "common/status_macros.h"

namespace muon {
namespace {

// "; rank R has \"x\" (...)" when rank R lists a name that `name` was
// probably meant as (a dotted prefix apart, as DDP's "module." or
// torch.compile's "_orig_mod.", or a near typo); "" otherwise.
std::string NearNameNote(const std::string& name, const v1::RankManifest& m,
                         int rank) {
  std::vector<std::string> names;
  for (const v1::ParamManifest& p : m.params()) names.push_back(p.name());
  const std::string near = NearestName(name, names);
  if (near.empty()) return "";
  return absl::StrCat("; rank ", rank, " has \"", near,
                      "\": pass the same parameter names on every rank (a "
                      "wrapper such as DDP or torch.compile adds a prefix "
                      "like \"module.\" or \"_orig_mod.\")");
}

std::string Quoted(const std::string& s) { return absl::StrCat("\"", s, "\""); }

std::string PlacementTexts(
    const google::protobuf::RepeatedPtrField<std::string>& placements) {
  return absl::StrCat("[", absl::StrJoin(placements, ", "), "]");
}

std::string OwnersToString(
    const google::protobuf::RepeatedField<int32_t>& owners) {
  return absl::StrCat("[", absl::StrJoin(owners, ", "), "]");
}

// "[2, 3]", or the first ranks and a count for long lists.
std::string RanksToString(const std::vector<int>& ranks) {
  constexpr size_t kMax = 8;
  if (ranks.size() <= kMax) {
    return absl::StrCat("[", absl::StrJoin(ranks, ", "), "]");
  }
  return absl::StrCat("[",
                      absl::StrJoin(ranks.begin(), ranks.begin() + kMax, ", "),
                      ", ...] (", ranks.size(), " ranks)");
}

// "(sub-mesh pp=1)" or "(no sub-mesh: every rank)".
std::string SubMeshNote(const SubMesh& sub_mesh, const Mesh& mesh) {
  if (sub_mesh.empty()) return "(no sub-mesh: every rank)";
  return absl::StrCat("(sub-mesh ", SubMeshToString(sub_mesh, mesh), ")");
}

// `parameter "w"` for a 2-D parameter, `parameter "w" expert slice 3` for
// a slice of a stack.
std::string MatrixWhat(const ParamLayout& param, const MatrixLayout& m) {
  if (!param.row_splits.empty()) {
    return absl::StrCat("parameter ", Quoted(param.name), " row block ",
                        m.slice);
  }
  if (!param.is_stack()) return absl::StrCat("parameter ", Quoted(param.name));
  return absl::StrCat("parameter ", Quoted(param.name), " expert slice ",
                      m.slice);
}

bool SamePlacements(const v1::ParamManifest& a, const v1::ParamManifest& b) {
  if (a.placements_size() != b.placements_size()) return false;
  for (int d = 0; d < a.placements_size(); ++d) {
    absl::StatusOr<Placement> pa = Placement::Parse(a.placements(d));
    absl::StatusOr<Placement> pb = Placement::Parse(b.placements(d));
    const bool same =
        (pa.ok() && pb.ok()) ? *pa == *pb : a.placements(d) == b.placements(d);
    if (!same) return false;
  }
  return true;
}

// Checks that rank `r`'s copy of a parameter agrees with rank `r0`'s (the
// first rank listing it): global shape, placements, dtype and sub_mesh.
absl::Status CheckParamAgrees(const v1::ParamManifest& p0, int r0,
                              const v1::ParamManifest& pr, int r) {
  const std::string what = absl::StrCat("parameter ", Quoted(p0.name()));
  if (!std::equal(pr.global_shape().begin(), pr.global_shape().end(),
                  p0.global_shape().begin(), p0.global_shape().end())) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": rank ", r, " reports global shape ",
                     ShapeToString(pr.global_shape()), " but rank ", r0,
                     " reports ", ShapeToString(p0.global_shape())));
  }
  if (!SamePlacements(pr, p0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": rank ", r, " reports placements ",
                     PlacementTexts(pr.placements()), " but rank ", r0,
                     " reports ", PlacementTexts(p0.placements())));
  }
  if (!std::equal(pr.row_splits().begin(), pr.row_splits().end(),
                  p0.row_splits().begin(), p0.row_splits().end())) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": rank ", r, " reports row splits ",
                     ShapeToString(pr.row_splits()), " but rank ", r0,
                     " reports ", ShapeToString(p0.row_splits())));
  }
  if (pr.dtype() != p0.dtype()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": rank ", r, " reports dtype ", Quoted(pr.dtype()),
                     " but rank ", r0, " reports ", Quoted(p0.dtype())));
  }
  const std::map<std::string, int32_t> a(pr.sub_mesh().begin(),
                                         pr.sub_mesh().end());
  const std::map<std::string, int32_t> b(p0.sub_mesh().begin(),
                                         p0.sub_mesh().end());
  if (a != b) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": rank ", r, " reports sub_mesh ",
                     SubMeshToString(pr.sub_mesh()), " but rank ", r0,
                     " reports ", SubMeshToString(p0.sub_mesh())));
  }
  return absl::OkStatus();
}

// torch.optim.Muon requires ns_steps < 100.
constexpr int kMaxNsSteps = 100;

// "normuon=true" for a variant named "normuon"; "normuon=false" for none
// when rank 0 runs "normuon" (the option's name either way).
std::string TransformPresence(const v1::OwnerTransformSpec& t,
                              const v1::OwnerTransformSpec& other) {
  if (t.name().empty()) return absl::StrCat(other.name(), "=false");
  return absl::StrCat(t.name(), "=true");
}

// Rank r's owner-side variant (its name, hyperparameters and row state)
// against rank 0's: the owner's decides every holder's update and row
// state, so they must be the same. A hyperparameter is named as its option
// ("normuon_beta2").
absl::Status CheckOwnerTransformAgrees(const v1::OwnerTransformSpec& t0,
                                       const v1::OwnerTransformSpec& tr,
                                       int r) {
  if (tr.name() != t0.name()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", r, " reports ", TransformPresence(tr, t0),
        " but rank 0 reports ", TransformPresence(t0, tr),
        "; every rank must run the same optimizer (the variant's row state "
        "travels with the exchanges)"));
  }
  std::set<std::string> keys;
  for (const auto& [k, v] : t0.params()) keys.insert(k);
  for (const auto& [k, v] : tr.params()) keys.insert(k);
  for (const std::string& k : keys) {
    const auto i0 = t0.params().find(k);
    const auto ir = tr.params().find(k);
    if (i0 != t0.params().end() && ir != tr.params().end() &&
        i0->second == ir->second) {
      continue;
    }
    auto value = [](const auto& params, const auto& it) {
      return it == params.end() ? std::string("(unset)")
                                : absl::StrCat(it->second);
    };
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", r, " reports ", tr.name(), "_", k, "=", value(tr.params(), ir),
        " but rank 0 reports ", t0.name(), "_", k, "=", value(t0.params(), i0),
        "; every rank must run the same optimizer"));
  }
  if (!std::equal(t0.row_state().begin(), t0.row_state().end(),
                  tr.row_state().begin(), tr.row_state().end())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", r, " reports ", tr.name(), " row state [",
        absl::StrJoin(tr.row_state(), ", "), "] but rank 0 reports [",
        absl::StrJoin(t0.row_state(), ", "),
        "]; every rank must run the same optimizer"));
  }
  return absl::OkStatus();
}

// The optimizer options rank r's manifest carries against rank 0's:
// ns_steps (the cost model's k) and the owner-side variant.
absl::Status CheckOptimizerAgrees(const v1::RankManifest& m0,
                                  const v1::RankManifest& mr, int r) {
  // The optimizer's Newton-Schulz iterations: the cost model's k.
  const int k = NsStepsOf(mr);
  if (k < 0 || k >= kMaxNsSteps) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", r, " reports ns_steps ", k, "; must be in [0, ",
                     kMaxNsSteps, ")"));
  }
  if (k != NsStepsOf(m0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", r, " reports ns_steps ", k, " but rank 0 reports ",
        NsStepsOf(m0), "; every rank must run the same optimizer"));
  }
  return CheckOwnerTransformAgrees(m0.owner_transform(), mr.owner_transform(),
                                   r);
}

// The execution options rank r's manifest carries that shape the plan
// (assignment policy, execution mode, exchange dtype, bucket size) against
// rank 0's.
absl::Status CheckPlanOptionsAgree(const v1::ExecutionOptions& e0,
                                   const v1::ExecutionOptions& e, int r) {
  auto policy = [](const v1::ExecutionOptions& x) {
    return x.assignment_policy().empty() ? std::string("lpt")
                                         : x.assignment_policy();
  };
  if (policy(e) != policy(e0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", r, " reports assignment_policy ",
                     Quoted(e.assignment_policy()), " but rank 0 reports ",
                     Quoted(e0.assignment_policy())));
  }
  if (e.async_gpu_parallelism() != e0.async_gpu_parallelism() ||
      e.prefetch_count() != e0.prefetch_count()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", r, " runs async_gpu_parallelism=",
        e.async_gpu_parallelism() ? "true" : "false", " prefetch_count=",
        e.prefetch_count(), " but rank 0 runs async_gpu_parallelism=",
        e0.async_gpu_parallelism() ? "true" : "false", " prefetch_count=",
        e0.prefetch_count(), "; every rank must use the same execution mode"));
  }
  if (ExchangeIsBf16(e) != ExchangeIsBf16(e0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", r, " exchanges ", ExchangeIsBf16(e) ? "bfloat16" : "float32",
        " but rank 0 exchanges ", ExchangeIsBf16(e0) ? "bfloat16" : "float32",
        " (execution.exchange_dtype); every rank must use the same"));
  }
  if (e.bucket_size_bytes() != e0.bucket_size_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", r, " reports bucket_size_bytes ", e.bucket_size_bytes(),
        " but rank 0 reports ", e0.bucket_size_bytes()));
  }
  return absl::OkStatus();
}

// The execution options rank r's manifest carries that shape the step
// schedule (re-plan period, backward overlap) against rank 0's.
absl::Status CheckScheduleOptionsAgree(const v1::ExecutionOptions& e0,
                                       const v1::ExecutionOptions& e, int r) {
  if (e.replan_every_steps() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", r, " reports replan_every_steps ",
                     e.replan_every_steps(), "; must be >= 0"));
  }
  if (e.overlap_backward() != e0.overlap_backward()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", r,
        " reports overlap_backward=", e.overlap_backward() ? "true" : "false",
        " but rank 0 reports overlap_backward=",
        e0.overlap_backward() ? "true" : "false",
        "; every rank must order its buckets the same way"));
  }
  if (e.replan_every_steps() != e0.replan_every_steps()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", r, " reports replan_every_steps ", e.replan_every_steps(),
        " but rank 0 reports ", e0.replan_every_steps(),
        "; every rank must re-plan at the same steps"));
  }
  return absl::OkStatus();
}

// Checks that rank r's mesh, execution options and ns_steps agree with
// rank 0's (the mesh of rank 0 is `mesh0`, already validated).
absl::Status CheckRankAgreesWithRank0(const v1::RankManifest& m0,
                                      const Mesh& mesh0,
                                      const v1::RankManifest& mr, int r) {
  const Mesh mesh = MeshFromProto(mr.mesh());
  if (mesh != mesh0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", r, " reports mesh ", mesh.ToString(),
                     " but rank 0 reports ", mesh0.ToString()));
  }
  // Execution options that shape the plan must agree.
  MUON_RETURN_IF_ERROR(
      CheckPlanOptionsAgree(m0.execution(), mr.execution(), r));
  MUON_RETURN_IF_ERROR(
      CheckScheduleOptionsAgree(m0.execution(), mr.execution(), r));
  return CheckOptimizerAgrees(m0, mr, r);
}

absl::Status CheckRanksMeshAndOptions(
    const std::vector<v1::RankManifest>& manifests, JobLayout* layout) {
  const int n = static_cast<int>(manifests.size());
  for (int r = 0; r < n; ++r) {
    if (manifests[r].rank() != r) {
      return absl::InvalidArgumentError(
          absl::StrCat("manifest ", r, " reports rank ", manifests[r].rank(),
                       "; expected rank ", r));
    }
  }
  const v1::RankManifest& m0 = manifests[0];
  layout->mesh = MeshFromProto(m0.mesh());
  absl::Status mesh_status = layout->mesh.Validate();
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
  if (layout->mesh.world_size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mesh ", layout->mesh.ToString(), " has ", layout->mesh.world_size(),
        " ranks but the world size is ", n));
  }
  for (int r = 0; r < n; ++r) {
    MUON_RETURN_IF_ERROR(
        CheckRankAgreesWithRank0(m0, layout->mesh, manifests[r], r));
  }
  layout->world_size = n;
  layout->execution = m0.execution();
  layout->ns_steps = NsStepsOf(m0);
  return absl::OkStatus();
}

// The union of the ranks' parameter lists.
struct Union {
  // Per union parameter: the first rank listing it and its entry there.
  std::vector<int> first_rank;
  std::vector<const v1::ParamManifest*> first;
  // Per union parameter: the ranks listing it, ascending, and its index in
  // each of their lists.
  std::vector<std::vector<int>> listed_on;
  std::vector<std::vector<int>> listed_at;
  // Per rank: the union index of each entry of its list.
  std::vector<std::vector<int>> of_rank;
};

// Checks the name of entry `pos` of rank r's list: non-empty, at most
// kMaxTensorNameBytes bytes (checked before it is copied into `seen`, the
// union's index or the layout), not in `seen` (the rank's names so far),
// which gains it.
absl::Status CheckListedName(const std::string& name, int r, int pos,
                             std::set<std::string>* seen) {
  if (name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", r, ": parameter at index ", pos, " has an empty name"));
  }
  MUON_RETURN_IF_ERROR(
      CheckParamNameSize(name, absl::StrCat("rank ", r, ": ")));
  if (!seen->insert(name).second) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter ", Quoted(name), " is listed more than once on rank ", r));
  }
  return absl::OkStatus();
}

absl::StatusOr<Union> BuildUnion(
    const std::vector<v1::RankManifest>& manifests) {
  const int n = static_cast<int>(manifests.size());
  Union u;
  u.of_rank.resize(n);
  absl::flat_hash_map<std::string, int> index;
  for (int r = 0; r < n; ++r) {
    const v1::RankManifest& m = manifests[r];
    if (m.params_size() > kMaxParams) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", r, " lists ", m.params_size(),
                       " parameters; at most ", kMaxParams, " are supported"));
    }
    std::set<std::string> seen;
    // Per first-listing rank q: the last union index (of a parameter first
    // listed by q) seen on this rank, to check the relative order.
    std::map<int, int> last_of;
    for (int pos = 0; pos < m.params_size(); ++pos) {
      const v1::ParamManifest& p = m.params(pos);
      MUON_RETURN_IF_ERROR(CheckListedName(p.name(), r, pos, &seen));
      auto [it, inserted] =
          index.emplace(p.name(), static_cast<int>(u.first.size()));
      const int i = it->second;
      if (inserted) {
        u.first_rank.push_back(r);
        u.first.push_back(&p);
        u.listed_on.emplace_back();
        u.listed_at.emplace_back();
      } else {
        MUON_RETURN_IF_ERROR(
            CheckParamAgrees(*u.first[i], u.first_rank[i], p, r));
      }
      const int q = u.first_rank[i];
      auto last = last_of.find(q);
      if (last != last_of.end() && last->second > i) {
        const std::string& before = u.first[last->second]->name();
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", r, " lists parameter ", Quoted(before), " before ",
            Quoted(p.name()), " but rank ", q, " lists ", Quoted(p.name()),
            " before ", Quoted(before),
            " (ranks must list the parameters they share in the same "
            "order)"));
      }
      last_of[q] = i;
      u.listed_on[i].push_back(r);
      u.listed_at[i].push_back(pos);
      u.of_rank[r].push_back(i);
    }
  }
  return u;
}

// Checks that union parameter i (laid out as `param`, named `what` in
// messages) is listed by exactly the ranks of its sub-mesh.
absl::Status CheckListedOnSubMesh(
    const std::vector<v1::RankManifest>& manifests, const Union& u, int i,
    const ParamLayout& param, const std::string& what, const Mesh& mesh,
    int n) {
  std::vector<char> listed(n, 0);
  for (int r : u.listed_on[i]) listed[r] = 1;
  for (int r = 0; r < n; ++r) {
    const std::vector<int> coord = mesh.Coord(r);
    const bool inside = param.sub_mesh.Contains(coord);
    if (inside && !listed[r]) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " ", SubMeshNote(param.sub_mesh, mesh), " is missing on rank ",
          r, " (coordinate ", CoordToString(mesh, coord),
          "); it is listed on ranks ", RanksToString(u.listed_on[i]),
          NearNameNote(param.name, manifests[r], r)));
    }
    if (!inside && listed[r]) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " ", SubMeshNote(param.sub_mesh, mesh), " is listed on rank ",
          r, " outside its sub-mesh (coordinate ", CoordToString(mesh, coord),
          ")"));
    }
  }
  return absl::OkStatus();
}

// Checks that every rank listing union parameter i reports the local shape
// the torch.chunk rule gives it under `param`'s placements and sub-mesh.
absl::Status CheckLocalShapes(const std::vector<v1::RankManifest>& manifests,
                              const Union& u, int i, const ParamLayout& param,
                              const std::string& what, const Mesh& mesh) {
  for (size_t j = 0; j < u.listed_on[i].size(); ++j) {
    const int r = u.listed_on[i][j];
    const std::vector<int> coord = mesh.Coord(r);
    absl::StatusOr<std::vector<Range>> ranges =
        LocalRanges(param.shape, param.placements, mesh, coord, param.sub_mesh);
    if (!ranges.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", ranges.status().message()));
    }
    std::vector<int64_t> expected;
    for (const Range& range : *ranges) expected.push_back(range.size());
    const v1::ParamManifest& pr = manifests[r].params(u.listed_at[i][j]);
    if (!std::equal(pr.local_shape().begin(), pr.local_shape().end(),
                    expected.begin(), expected.end())) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": rank ", r, " local shape ", ShapeToString(pr.local_shape()),
          " does not match ", PlacementsToString(param.placements), " of ",
          ShapeToString(param.shape), " over ", mesh.ToString(),
          param.sub_mesh.empty()
              ? ""
              : absl::StrCat(" (sub-mesh ",
                             SubMeshToString(param.sub_mesh, mesh),
                             ", rank at ", CoordToString(mesh, coord), ")"),
          ": expected ", ShapeToString(expected)));
    }
  }
  return absl::OkStatus();
}

// Checks one union parameter (shape, placements, sub-mesh, membership,
// local shapes) and appends it and its matrices to `layout`.
absl::Status AddParam(const std::vector<v1::RankManifest>& manifests,
                      const Union& u, int i, JobLayout* layout,
                      LayoutCache* cache) {
  const Mesh& mesh = layout->mesh;
  const int n = layout->world_size;
  const v1::ParamManifest& p = *u.first[i];
  const std::string what = absl::StrCat("parameter ", Quoted(p.name()));
  MUON_RETURN_IF_ERROR(CheckParamShape(p.name(), p.global_shape()));

  ParamLayout param;
  param.name = p.name();
  param.shape.assign(p.global_shape().begin(), p.global_shape().end());
  param.row_splits.assign(p.row_splits().begin(), p.row_splits().end());
  MUON_ASSIGN_OR_RETURN(
      param.placements,
      CheckMatrixPlacements(p.name(), p.placements(), mesh,
                            static_cast<int>(param.shape.size())));
  MUON_ASSIGN_OR_RETURN(param.sub_mesh, CheckSubMesh(p.name(), p.sub_mesh(),
                                                     param.placements, mesh));

  // Listed by exactly the ranks of its sub-mesh.
  MUON_RETURN_IF_ERROR(
      CheckListedOnSubMesh(manifests, u, i, param, what, mesh, n));
  // Local shapes: the torch.chunk rule.
  MUON_RETURN_IF_ERROR(CheckLocalShapes(manifests, u, i, param, what, mesh));

  return AppendParam(std::move(param), what, layout, cache);
}

// Checks that rank r requests one owner per matrix it lists (`count`
// matrices); `giver` is the first rank that requests owners at all.
absl::Status CheckRequestedOwnerCount(
    const std::vector<v1::RankManifest>& manifests, int r, int count,
    int giver) {
  const v1::RankManifest& m = manifests[r];
  if (m.requested_owners_size() == 0 && count > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", r, " requests owners [] but rank ", giver, " requests owners ",
        OwnersToString(manifests[giver].requested_owners()),
        " (assign_fn must run on every rank or on none)"));
  }
  if (m.requested_owners_size() != count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", r, ": requested_owners has ", m.requested_owners_size(),
        " entries but the rank lists ", count,
        " matrices (its parameters in order, one per expert slice of a 3-D "
        "stack); give one owner per matrix"));
  }
  return absl::OkStatus();
}

// Checks that `owner`, the owner rank r requests for `matrix` of `param`
// (named `what` in messages), is in range and holds part of the matrix.
absl::Status CheckRequestedOwnerHolds(const JobLayout& layout,
                                      const ParamLayout& param,
                                      const MatrixLayout& matrix,
                                      const std::string& what, int owner,
                                      int r) {
  const int n = layout.world_size;
  if (owner < 0 || owner >= n) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": requested owner rank ", owner, " is out of range [0, ", n,
        ") (requested by rank ", r, ")"));
  }
  if (!matrix.boxes[owner].empty()) return absl::OkStatus();
  const std::vector<int> coord = layout.mesh.Coord(owner);
  if (!param.sub_mesh.Contains(coord)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": requested owner rank ", owner, " (coordinate ",
        CoordToString(layout.mesh, coord), ") is outside its sub-mesh ",
        SubMeshToString(param.sub_mesh, layout.mesh),
        " and holds none of it (requested by rank ", r,
        "); the owner must hold part of the matrix"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": requested owner rank ", owner,
      " holds an empty shard of it (coordinate ",
      CoordToString(layout.mesh, coord), "; ",
      PlacementsToString(param.placements), " of ", ShapeToString(param.shape),
      " over ", layout.mesh.ToString(), "; requested by rank ", r,
      "); the owner must hold part of the matrix"));
}

// Requested owners (a user's assign_fn), one per matrix of each manifest.
absl::Status CheckRequestedOwners(
    const std::vector<v1::RankManifest>& manifests, const Union& u,
    JobLayout* layout) {
  const int n = layout->world_size;
  int giver = -1;  // a rank that requests owners
  for (int r = 0; r < n && giver < 0; ++r) {
    if (manifests[r].requested_owners_size() > 0) giver = r;
  }
  if (giver < 0) return absl::OkStatus();
  std::vector<int> requested_by(layout->matrices.size(), -1);
  for (int r = 0; r < n; ++r) {
    const v1::RankManifest& m = manifests[r];
    int count = 0;
    for (int i : u.of_rank[r]) count += layout->params[i].num_matrices;
    MUON_RETURN_IF_ERROR(CheckRequestedOwnerCount(manifests, r, count, giver));
    int k = 0;
    for (int i : u.of_rank[r]) {
      const ParamLayout& param = layout->params[i];
      for (int mi = param.first_matrix;
           mi < param.first_matrix + param.num_matrices; ++mi, ++k) {
        MatrixLayout& matrix = layout->matrices[mi];
        const int owner = m.requested_owners(k);
        const std::string what = MatrixWhat(param, matrix);
        if (requested_by[mi] >= 0) {
          if (owner != matrix.requested_owner) {
            return absl::InvalidArgumentError(absl::StrCat(
                what, ": rank ", r, " requests owner ", owner, " but rank ",
                requested_by[mi], " requests owner ", matrix.requested_owner,
                " (assign_fn must return the same assignment on every "
                "rank)"));
          }
          continue;
        }
        MUON_RETURN_IF_ERROR(
            CheckRequestedOwnerHolds(*layout, param, matrix, what, owner, r));
        matrix.requested_owner = owner;
        requested_by[mi] = r;
      }
    }
  }
  return absl::OkStatus();
}

// The layout cache key of `param`: shape, placements, sub-mesh and row
// splits. The sub-mesh is keyed by mesh dim index and coordinate, never by
// dim name: a name may hold any character ("p=0, q"), so names could make
// two sub-meshes print alike and share one another's boxes.
std::string LayoutKey(const ParamLayout& param) {
  std::vector<std::string> sub_mesh;
  for (size_t k = 0; k < param.sub_mesh.dims.size(); ++k) {
    sub_mesh.push_back(
        absl::StrCat(param.sub_mesh.dims[k], ":", param.sub_mesh.coords[k]));
  }
  return absl::StrCat(ShapeToString(param.shape), " ",
                      PlacementsToString(param.placements), " {",
                      absl::StrJoin(sub_mesh, ","), "} ",
                      ShapeToString(param.row_splits));
}

}  // namespace

absl::Status AppendParam(ParamLayout param, absl::string_view what,
                         JobLayout* layout, LayoutCache* cache) {
  const std::string key = LayoutKey(param);
  auto cached = cache->entries.find(key);
  if (cached == cache->entries.end()) {
    const int64_t slices = param.is_stack()
                               ? param.shape[0]
                               : std::max<int64_t>(1, param.row_splits.size());
    const int64_t added = slices * layout->world_size;
    if (cache->max_boxes >= 0 && cache->boxes + added > cache->max_boxes) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": the job's distinct parameter layouts need more than ",
          cache->max_boxes, " boxes (layouts x ", layout->world_size,
          " ranks)"));
    }
    cache->boxes += added;
    absl::StatusOr<std::vector<MatrixBoxes>> matrices =
        ParamMatrices(param.shape, param.placements, layout->mesh,
                      param.sub_mesh, param.row_splits);
    if (!matrices.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", matrices.status().message()));
    }
    cached = cache->entries.emplace(key, *std::move(matrices)).first;
  }
  const int param_index = static_cast<int>(layout->params.size());
  param.first_matrix = static_cast<int>(layout->matrices.size());
  param.num_matrices = static_cast<int>(cached->second.size());
  for (const MatrixBoxes& mb : cached->second) {
    MatrixLayout m;
    m.param_index = param_index;
    m.slice = mb.slice;
    m.name = param.is_sliced() ? absl::StrCat(param.name, "[", mb.slice, "]")
                               : param.name;
    m.rows = mb.rows;
    m.cols = mb.cols;
    m.boxes = mb.boxes;  // shared with every matrix of the same layout
    layout->matrices.push_back(std::move(m));
  }
  layout->params.push_back(std::move(param));
  return absl::OkStatus();
}

absl::StatusOr<JobLayout> ValidateManifests(
    const std::vector<v1::RankManifest>& manifests) {
  if (manifests.empty()) {
    return absl::InvalidArgumentError("no rank manifests to validate");
  }
  JobLayout layout;
  MUON_RETURN_IF_ERROR(CheckRanksMeshAndOptions(manifests, &layout));
  MUON_ASSIGN_OR_RETURN(Union u, BuildUnion(manifests));
  // Sizes first (checked arithmetic, documented limits), before any
  // per-rank table is sized by them.
  int64_t num_matrices = 0;
  int64_t name_bytes = 0;
  for (const v1::ParamManifest* p : u.first) {
    MUON_RETURN_IF_ERROR(CheckParamShape(p->name(), p->global_shape()));
    const int64_t param_matrices = p->row_splits_size() > 0
                                       ? p->row_splits_size()
                                       : NumMatrices(p->global_shape());
    num_matrices += param_matrices;
    AddMatrixNameBytes(p->name().size(), param_matrices, &name_bytes);
  }
  MUON_RETURN_IF_ERROR(CheckJobSize(layout.mesh,
                                    static_cast<int64_t>(u.first.size()),
                                    num_matrices, name_bytes));
  LayoutCache cache;
  for (int i = 0; i < static_cast<int>(u.first.size()); ++i) {
    MUON_RETURN_IF_ERROR(AddParam(manifests, u, i, &layout, &cache));
  }
  MUON_RETURN_IF_ERROR(CheckRequestedOwners(manifests, u, &layout));
  return layout;
}

}  // namespace muon

namespace muon {

absl::StatusOr<JobLayout> LayoutFromSpec(const v1::JobSpec& spec) {
  MUON_RETURN_IF_ERROR(ValidateJobSpec(spec, /*per_rank_boxes=*/false));
  JobLayout layout;
  layout.mesh = MeshFromProto(spec.mesh());
  layout.world_size = layout.mesh.world_size();
  layout.execution = spec.execution();
  layout.ns_steps = spec.optimizer().has_ns_steps()
                        ? spec.optimizer().ns_steps()
                        : kDefaultNsSteps;
  if (layout.ns_steps < 0 || layout.ns_steps >= kMaxNsSteps) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer.ns_steps is ", layout.ns_steps,
                     "; must be in [0, ", kMaxNsSteps, ")"));
  }
  // The union order of ValidateManifests(ManifestsFromSpec(spec)): a
  // parameter first appears on the lowest rank of its sub-mesh.
  std::vector<std::pair<int, ParamLayout>> params;
  params.reserve(spec.params_size());
  for (const v1::ParamSpec& p : spec.params()) {
    ParamLayout param;
    param.name = p.name();
    param.shape.assign(p.shape().begin(), p.shape().end());
    param.row_splits.assign(p.row_splits().begin(), p.row_splits().end());
    MUON_ASSIGN_OR_RETURN(
        param.placements,
        CheckMatrixPlacements(p.name(), p.placements(), layout.mesh,
                              static_cast<int>(param.shape.size())));
    MUON_ASSIGN_OR_RETURN(
        param.sub_mesh,
        CheckSubMesh(p.name(), p.sub_mesh(), param.placements, layout.mesh));
    std::vector<int> coord(layout.mesh.ndim(), 0);
    for (size_t k = 0; k < param.sub_mesh.dims.size(); ++k) {
      coord[param.sub_mesh.dims[k]] = param.sub_mesh.coords[k];
    }
    params.emplace_back(layout.mesh.RankOf(coord), std::move(param));
  }
  std::stable_sort(
      params.begin(), params.end(),
      [](const auto& a, const auto& b) { return a.first < b.first; });
  LayoutCache cache;
  cache.max_boxes = kMaxMatrixRankBoxes;
  for (auto& [first_rank, param] : params) {
    const std::string what = absl::StrCat("parameter ", Quoted(param.name));
    MUON_RETURN_IF_ERROR(AppendParam(std::move(param), what, &layout, &cache));
  }
  return layout;
}

v1::JobSpec JobSpecFromLayout(const JobLayout& layout,
                              absl::string_view job_id) {
  v1::JobSpec spec;
  spec.set_job_id(std::string(job_id));
  *spec.mutable_mesh() = MeshToProto(layout.mesh);
  for (const ParamLayout& p : layout.params) {
    v1::ParamSpec* out = spec.add_params();
    out->set_name(p.name);
    for (int64_t d : p.shape) out->add_shape(d);
    for (const Placement& placement : p.placements) {
      out->add_placements(placement.ToString());
    }
    for (size_t k = 0; k < p.sub_mesh.dims.size(); ++k) {
      (*out->mutable_sub_mesh())[layout.mesh.names[p.sub_mesh.dims[k]]] =
          p.sub_mesh.coords[k];
    }
    for (int64_t n : p.row_splits) out->add_row_splits(n);
  }
  *spec.mutable_execution() = layout.execution;
  spec.mutable_optimizer()->set_ns_steps(layout.ns_steps);
  return spec;
}

namespace {

// The placements as canonical strings, or the texts as given where one
// does not parse (so that a difference still shows).
std::vector<std::string> CanonicalPlacements(
    const google::protobuf::RepeatedPtrField<std::string>& placements) {
  std::vector<std::string> out;
  for (const std::string& text : placements) {
    absl::StatusOr<Placement> p = Placement::Parse(text);
    out.push_back(p.ok() ? p->ToString() : text);
  }
  return out;
}

// The first difference of one parameter both specs list, or "".
std::string DescribeParamDifference(const v1::ParamSpec& given,
                                    const v1::ParamSpec& live) {
  const std::string what = absl::StrCat("parameter ", Quoted(given.name()));
  if (!std::equal(given.shape().begin(), given.shape().end(),
                  live.shape().begin(), live.shape().end())) {
    return absl::StrCat(what, ": global shape ", ShapeToString(given.shape()),
                        " differs from the live job's ",
                        ShapeToString(live.shape()));
  }
  const std::vector<std::string> a = CanonicalPlacements(given.placements());
  const std::vector<std::string> b = CanonicalPlacements(live.placements());
  if (a != b) {
    return absl::StrCat(what, ": placements [", absl::StrJoin(a, ", "),
                        "] differ from the live job's [",
                        absl::StrJoin(b, ", "), "]");
  }
  if (SubMeshToString(given.sub_mesh()) != SubMeshToString(live.sub_mesh())) {
    return absl::StrCat(what, ": sub_mesh ", SubMeshToString(given.sub_mesh()),
                        " differs from the live job's ",
                        SubMeshToString(live.sub_mesh()));
  }
  return "";
}

}  // namespace

std::string DescribeLayoutDifference(const v1::JobSpec& given,
                                     const v1::JobSpec& live) {
  const Mesh a = MeshFromProto(given.mesh());
  const Mesh b = MeshFromProto(live.mesh());
  if (a.names != b.names || a.sizes != b.sizes) {
    return absl::StrCat("mesh ", a.ToString(), " differs from the live job's ",
                        b.ToString());
  }
  std::map<std::string, const v1::ParamSpec*> live_params;
  std::vector<std::string> live_names;
  for (const v1::ParamSpec& p : live.params()) {
    live_params[p.name()] = &p;
    live_names.push_back(p.name());
  }
  std::set<std::string> given_names;
  for (const v1::ParamSpec& p : given.params()) {
    given_names.insert(p.name());
    auto it = live_params.find(p.name());
    if (it == live_params.end()) {
      const std::string near = NearestName(p.name(), live_names);
      return absl::StrCat(
          "parameter ", Quoted(p.name()), " is not in the live job",
          near.empty() ? ""
                       : absl::StrCat(" (did you mean ", Quoted(near), "?)"));
    }
    std::string difference = DescribeParamDifference(p, *it->second);
    if (!difference.empty()) return difference;
  }
  for (const v1::ParamSpec& p : live.params()) {
    if (given_names.count(p.name()) == 0) {
      return absl::StrCat("the live job's parameter ", Quoted(p.name()),
                          " is not in the spec");
    }
  }
  return "";
}

absl::Status DiagnoseLayoutMismatch(const v1::RankManifest& m0,
                                    const v1::RankManifest& mr) {
  const int r = mr.rank();
  if (mr.world_size() != m0.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", r, " reports world size ", mr.world_size(),
                     " but rank 0 reports ", m0.world_size()));
  }
  const Mesh mesh0 = MeshFromProto(m0.mesh());
  MUON_RETURN_IF_ERROR(CheckRankAgreesWithRank0(m0, mesh0, mr, r));
  std::map<std::string, int> index0;
  for (int i = 0; i < m0.params_size(); ++i) index0[m0.params(i).name()] = i;
  std::map<std::string, int> index_r;
  int last = -1;
  for (int i = 0; i < mr.params_size(); ++i) {
    const v1::ParamManifest& pr = mr.params(i);
    index_r[pr.name()] = i;
    auto it = index0.find(pr.name());
    if (it == index0.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter ", Quoted(pr.name()), " is listed on rank ", r,
          " but not on rank 0 (the same layout on every rank "
          "was expected: no sub-mesh)",
          NearNameNote(pr.name(), m0, 0)));
    }
    MUON_RETURN_IF_ERROR(CheckParamAgrees(m0.params(it->second), 0, pr, r));
    if (it->second < last) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", Quoted(pr.name()), ": rank ", r,
                       " lists its parameters in another order than rank 0"));
    }
    last = it->second;
  }
  for (const v1::ParamManifest& p0 : m0.params()) {
    if (!index_r.count(p0.name())) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", Quoted(p0.name()),
                       " (no sub-mesh: every rank) is missing on rank ", r,
                       NearNameNote(p0.name(), mr, r)));
    }
  }
  if (mr.requested_owners_size() != m0.requested_owners_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", r, " requests ", mr.requested_owners_size(),
        " owners but rank 0 requests ", m0.requested_owners_size()));
  }
  return absl::OkStatus();
}

}  // namespace muon
