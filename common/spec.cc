#include "common/spec.h"

#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"

namespace muon {

absl::StatusOr<v1::JobSpec> ParseJobSpecJson(absl::string_view json) {
  v1::JobSpec spec;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  google::protobuf::util::Status status =
      google::protobuf::util::JsonStringToMessage(
          google::protobuf::StringPiece(json.data(), json.size()), &spec,
          options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("job spec is not valid JSON for muon.v1.JobSpec: ",
                     std::string(status.message())));
  }
  return spec;
}

absl::StatusOr<v1::JobSpec> LoadJobSpec(const std::string& path) {
  std::ifstream in(path, std::ios::in | std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot open job spec file \"", path, "\""));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) {
    return absl::NotFoundError(
        absl::StrCat("cannot read job spec file \"", path, "\""));
  }
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(buffer.str());
  if (!spec.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job spec file \"", path, "\": ", spec.status().message()));
  }
  return spec;
}

std::string JobSpecToJson(const v1::JobSpec& spec) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  std::string out;
  // Printing a well-formed message cannot fail.
  (void)google::protobuf::util::MessageToJsonString(spec, &out, options);
  return out;
}

Mesh MeshFromProto(const v1::Mesh& mesh) {
  Mesh out;
  for (const v1::MeshDim& dim : mesh.dims()) {
    out.names.push_back(dim.name());
    out.sizes.push_back(dim.size());
  }
  return out;
}

v1::Mesh MeshToProto(const Mesh& mesh) {
  v1::Mesh out;
  for (int i = 0; i < mesh.ndim(); ++i) {
    v1::MeshDim* dim = out.add_dims();
    dim->set_name(mesh.names[i]);
    dim->set_size(mesh.sizes[i]);
  }
  return out;
}

absl::StatusOr<std::vector<Placement>> ParsePlacements(
    const google::protobuf::RepeatedPtrField<std::string>& placements,
    absl::string_view what) {
  std::vector<Placement> out;
  out.reserve(placements.size());
  for (const std::string& text : placements) {
    absl::StatusOr<Placement> p = Placement::Parse(text);
    if (!p.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": bad placement \"", text,
                       "\" (expected \"Shard(d)\" or \"Replicate()\"): ",
                       p.status().message()));
    }
    out.push_back(*p);
  }
  return out;
}

std::string ShapeToString(
    const google::protobuf::RepeatedField<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string PlacementsToString(const std::vector<Placement>& placements) {
  if (placements.size() == 1) return placements[0].ToString();
  std::vector<std::string> parts;
  for (const Placement& p : placements) parts.push_back(p.ToString());
  return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
}

absl::StatusOr<std::vector<Placement>> CheckMatrixPlacements(
    absl::string_view param,
    const google::protobuf::RepeatedPtrField<std::string>& texts,
    const Mesh& mesh) {
  const std::string what = absl::StrCat("parameter \"", param, "\"");
  if (texts.size() != mesh.ndim()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " has ", texts.size(), " placements [",
        absl::StrJoin(texts, ", "), "] but the mesh ", mesh.ToString(), " has ",
        mesh.ndim(), " dims: give one placement per mesh dim"));
  }
  MUON_ASSIGN_OR_RETURN(std::vector<Placement> placements,
                        ParsePlacements(texts, what));
  for (int i = 0; i < static_cast<int>(placements.size()); ++i) {
    const Placement& p = placements[i];
    if (p.kind == Placement::Kind::kPartial) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": Partial() placement on mesh dim \"", mesh.names[i],
          "\" is not supported (a pending reduction); reduce the gradient "
          "first and use Shard(d) or Replicate()"));
    }
    if (p.is_shard() && p.dim != 0 && p.dim != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": placement Shard(", p.dim, ") on mesh dim \"",
                       mesh.names[i], "\" shards tensor dim ", p.dim,
                       " but the parameter is 2-D (use Shard(0) or Shard(1))"));
    }
  }
  return placements;
}

absl::Status ValidateJobSpec(const v1::JobSpec& spec) {
  const Mesh mesh = MeshFromProto(spec.mesh());
  for (int i = 0; i < mesh.ndim(); ++i) {
    if (mesh.sizes[i] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh dim ", i, " \"", mesh.names[i], "\" has size ",
                       mesh.sizes[i], "; sizes must be >= 1"));
    }
  }
  absl::Status mesh_status = mesh.Validate();
  if (!mesh_status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("mesh: ", mesh_status.message()));
  }
  std::set<std::string> names;
  for (int i = 0; i < spec.params_size(); ++i) {
    const v1::ParamSpec& param = spec.params(i);
    if (param.name().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter at index ", i, " has an empty name"));
    }
    if (!names.insert(param.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter \"", param.name(), "\" is listed more than once"));
    }
    if (param.shape_size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter \"", param.name(), "\" has shape ",
          ShapeToString(param.shape()), " (", param.shape_size(),
          "-D); Muon only orthogonalizes 2-D matrices: optimize it with "
          "another optimizer (e.g. AdamW)"));
    }
    if (param.shape(0) < 1 || param.shape(1) < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter \"", param.name(), "\" has shape ",
                       ShapeToString(param.shape()), "; dims must be >= 1"));
    }
    MUON_RETURN_IF_ERROR(
        CheckMatrixPlacements(param.name(), param.placements(), mesh).status());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::RankManifest>> ManifestsFromSpec(
    const v1::JobSpec& spec) {
  MUON_RETURN_IF_ERROR(ValidateJobSpec(spec));
  const Mesh mesh = MeshFromProto(spec.mesh());
  const int world = mesh.world_size();

  // Per parameter: canonical placements and every rank's box.
  std::vector<std::vector<Placement>> placements(spec.params_size());
  std::vector<std::vector<Box>> boxes(spec.params_size());
  for (int i = 0; i < spec.params_size(); ++i) {
    const v1::ParamSpec& param = spec.params(i);
    MUON_ASSIGN_OR_RETURN(
        placements[i],
        CheckMatrixPlacements(param.name(), param.placements(), mesh));
    absl::StatusOr<std::vector<Box>> all =
        AllBoxes(param.shape(0), param.shape(1), placements[i], mesh);
    if (!all.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter \"", param.name(), "\": ", all.status().message()));
    }
    boxes[i] = *std::move(all);
  }

  std::vector<v1::RankManifest> manifests(world);
  for (int r = 0; r < world; ++r) {
    v1::RankManifest& m = manifests[r];
    m.set_rank(r);
    m.set_world_size(world);
    *m.mutable_mesh() = spec.mesh();
    *m.mutable_execution() = spec.execution();
    for (int i = 0; i < spec.params_size(); ++i) {
      const v1::ParamSpec& param = spec.params(i);
      v1::ParamManifest* pm = m.add_params();
      pm->set_name(param.name());
      pm->add_global_shape(param.shape(0));
      pm->add_global_shape(param.shape(1));
      pm->add_local_shape(boxes[i][r].rows.size());
      pm->add_local_shape(boxes[i][r].cols.size());
      for (const Placement& p : placements[i]) {
        pm->add_placements(p.ToString());
      }
      pm->set_dtype("float32");
    }
  }
  return manifests;
}

}  // namespace muon
