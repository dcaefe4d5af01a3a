#include "common/spec.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checked_math.h"
#include "common/edit_distance.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"

namespace muon {

namespace {

// Every field name (proto and JSON spelling) of `d` and the messages under it.
void CollectFieldNames(const google::protobuf::Descriptor* d,
                       std::set<const google::protobuf::Descriptor*>* seen,
                       std::set<std::string>* names) {
  if (d == nullptr || !seen->insert(d).second) return;
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    names->insert(f->name());
    names->insert(f->json_name());
    CollectFieldNames(f->message_type(), seen, names);
  }
}

// For protobuf's "(path) name: Cannot find field." the closest field name
// of the spec's messages, as " (did you mean \"x\"?)", or "".
std::string SuggestField(absl::string_view message) {
  const size_t end = message.find(": Cannot find field.");
  if (end == absl::string_view::npos) return "";
  absl::string_view name = message.substr(0, end);
  const size_t space = name.rfind(' ');
  if (space != absl::string_view::npos) name = name.substr(space + 1);
  std::set<const google::protobuf::Descriptor*> seen;
  std::set<std::string> names;
  CollectFieldNames(v1::JobSpec::descriptor(), &seen, &names);
  const std::string best =
      NearestName(name, std::vector<std::string>(names.begin(), names.end()));
  if (best.empty()) return absl::StrCat(" (unknown field \"", name, "\")");
  return absl::StrCat(" (unknown field \"", name, "\"; did you mean \"", best,
                      "\"?)");
}

}  // namespace

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
                     std::string(status.message()),
                     SuggestField(std::string(status.message()))));
  }
  return spec;
}

absl::StatusOr<v1::JobSpec> LoadJobSpec(const std::string& path) {
  // O_NONBLOCK: opening a FIFO does not wait for a writer; regular files
  // ignore it.
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat(
        "cannot open job spec file \"", path, "\": ", std::strerror(errno)));
  }
  absl::Cleanup close_fd = [fd] { ::close(fd); };
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return absl::NotFoundError(absl::StrCat(
        "cannot stat job spec file \"", path, "\": ", std::strerror(errno)));
  }
  // A pipe (bash's --spec <(command), /dev/stdin) is read as `cat` reads
  // it: blocking, until its writers close it (at once with none), bounded
  // in size by the loop below.
  if (S_ISFIFO(st.st_mode)) {
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
      return absl::NotFoundError(absl::StrCat(
          "cannot read job spec pipe \"", path, "\": ", std::strerror(errno)));
    }
  } else if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job spec file \"", path,
        "\" is neither a regular file nor a pipe (a device, socket or "
        "directory)"));
  }
  if (st.st_size > kMaxJobSpecFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job spec file \"", path, "\" is ", st.st_size,
        " bytes; a job spec may be at most ", kMaxJobSpecFileBytes, " bytes"));
  }
  std::string text;
  text.reserve(static_cast<size_t>(st.st_size));
  // Until the end of the file; a file that grew past the bound since fstat
  // is refused, so the loop reads at most kMaxJobSpecFileBytes + 64 KiB.
  char chunk[64 * 1024];
  while (true) {
    const ssize_t n = ::read(fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::NotFoundError(absl::StrCat(
          "cannot read job spec file \"", path, "\": ", std::strerror(errno)));
    }
    if (n == 0) break;
    if (static_cast<int64_t>(text.size()) + n > kMaxJobSpecFileBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job spec file \"", path, "\" holds more than ", kMaxJobSpecFileBytes,
          " bytes, the most a job spec may be"));
    }
    text.append(chunk, static_cast<size_t>(n));
  }
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(text);
  if (!spec.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job spec file \"", path, "\": ", spec.status().message()));
  }
  return spec;
}

namespace {

// Largest integer a JSON number carries exactly in every reader (an IEEE
// double's 53-bit significand; RFC 8259 section 6).
constexpr int64_t kMaxExactJsonInteger = (int64_t{1} << 53) - 1;

// Protobuf's JSON mapping prints 64-bit integers as strings ("48"); turns
// each such value of `json` (an object printed from a message of type `d`
// with proto field names) back into a number when its magnitude is at most
// kMaxExactJsonInteger.
void Int64StringsToNumbers(const google::protobuf::Descriptor* d,
                           nlohmann::ordered_json* json);

void Int64StringToNumber(const google::protobuf::FieldDescriptor* f,
                         nlohmann::ordered_json* value) {
  using FD = google::protobuf::FieldDescriptor;
  if (f->cpp_type() == FD::CPPTYPE_MESSAGE) {
    Int64StringsToNumbers(f->message_type(), value);
    return;
  }
  if (!value->is_string()) return;
  if (f->cpp_type() != FD::CPPTYPE_INT64 && f->cpp_type() != FD::CPPTYPE_UINT64)
    return;
  int64_t v = 0;
  if (!absl::SimpleAtoi(value->get<std::string>(), &v)) return;
  if (v > kMaxExactJsonInteger || v < -kMaxExactJsonInteger) return;
  *value = v;
}

void Int64StringsToNumbers(const google::protobuf::Descriptor* d,
                           nlohmann::ordered_json* json) {
  if (d == nullptr || !json->is_object()) return;
  for (auto& [key, value] : json->items()) {
    const google::protobuf::FieldDescriptor* f = d->FindFieldByName(key);
    if (f == nullptr) continue;
    if (f->is_map()) {
      // A map's values are the map entry's "value" field.
      const google::protobuf::FieldDescriptor* v =
          f->message_type()->FindFieldByName("value");
      for (auto& [k, entry] : value.items()) Int64StringToNumber(v, &entry);
    } else if (f->is_repeated()) {
      for (auto& element : value) Int64StringToNumber(f, &element);
    } else {
      Int64StringToNumber(f, &value);
    }
  }
}

}  // namespace

std::string JobSpecToJson(const v1::JobSpec& spec) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string out;
  // Printing a well-formed message cannot fail.
  (void)google::protobuf::util::MessageToJsonString(spec, &out, options);
  nlohmann::ordered_json json =
      nlohmann::ordered_json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return out;
  Int64StringsToNumbers(v1::JobSpec::descriptor(), &json);
  return json.dump(2);
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
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": placement \"", text,
          "\" is not one a parameter can have: use \"Shard(d)\" with a "
          "tensor dim d (0, 1, ...), \"Replicate()\", or "
          "\"_StridedShard(dim=d, sf=k)\""));
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

std::string SubMeshToString(const SubMesh& sub_mesh, const Mesh& mesh) {
  if (sub_mesh.empty()) return "every rank";
  std::vector<std::string> parts;
  for (size_t i = 0; i < sub_mesh.dims.size(); ++i) {
    parts.push_back(
        absl::StrCat(mesh.names[sub_mesh.dims[i]], "=", sub_mesh.coords[i]));
  }
  return absl::StrJoin(parts, ", ");
}

std::string SubMeshToString(
    const google::protobuf::Map<std::string, int32_t>& sub_mesh) {
  const std::map<std::string, int32_t> sorted(sub_mesh.begin(), sub_mesh.end());
  std::vector<std::string> parts;
  for (const auto& [name, value] : sorted) {
    parts.push_back(absl::StrCat(name, "=", value));
  }
  return absl::StrCat("{", absl::StrJoin(parts, ", "), "}");
}

std::string CoordToString(const Mesh& mesh, const std::vector<int>& coord) {
  if (mesh.ndim() == 0) return "(single device)";
  std::vector<std::string> parts;
  for (int d = 0; d < mesh.ndim() && d < static_cast<int>(coord.size()); ++d) {
    parts.push_back(absl::StrCat(mesh.names[d], "=", coord[d]));
  }
  return absl::StrJoin(parts, ", ");
}

absl::StatusOr<std::vector<Placement>> CheckMatrixPlacements(
    absl::string_view param,
    const google::protobuf::RepeatedPtrField<std::string>& texts,
    const Mesh& mesh, int tensor_ndim) {
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
    if (p.is_shard() && (p.dim < 0 || p.dim >= tensor_ndim)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": placement Shard(", p.dim, ") on mesh dim \"",
                       mesh.names[i], "\" shards tensor dim ", p.dim,
                       " but the parameter is ", tensor_ndim, "-D (use ",
                       tensor_ndim == 3 ? "Shard(0), Shard(1) or Shard(2)"
                                        : "Shard(0) or Shard(1)",
                       ")"));
    }
  }
  if (absl::Status s = CheckStridedShards(placements, mesh); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", s.message()));
  }
  return placements;
}

absl::Status CheckParamNameSize(absl::string_view name,
                                absl::string_view where) {
  if (name.size() <= kMaxTensorNameBytes) return absl::OkStatus();
  // The first 64 bytes, cut back to a UTF-8 character boundary.
  size_t cut = 64;
  while (cut > 0 && (static_cast<unsigned char>(name[cut]) & 0xC0) == 0x80) {
    --cut;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      where, "parameter \"", name.substr(0, cut), "...\" has a name of ",
      name.size(), " bytes; at most ", kMaxTensorNameBytes, " are supported"));
}

absl::Status CheckParamShape(
    absl::string_view param,
    const google::protobuf::RepeatedField<int64_t>& shape) {
  if (shape.size() != 2 && shape.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter \"", param, "\" has shape ", ShapeToString(shape), " (",
        shape.size(),
        "-D); Muon only orthogonalizes 2-D matrices [rows, cols] and 3-D "
        "expert stacks [experts, rows, cols]: optimize it with another "
        "optimizer (e.g. AdamW)"));
  }
  for (int64_t n : shape) {
    if (n < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter \"", param, "\" has shape ",
                       ShapeToString(shape), "; dims must be >= 1"));
    }
  }
  if (shape.size() == 3 && shape[0] > kMaxExperts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter \"", param, "\" has shape ", ShapeToString(shape), ": ",
        shape[0], " experts exceeds the limit of ", kMaxExperts));
  }
  if (!CheckedProduct(shape, kMaxParamElements).has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter \"", param, "\" has shape ",
                     ShapeToString(shape), ": more than ", kMaxParamElements,
                     " elements (the limit per parameter)"));
  }
  return absl::OkStatus();
}

int64_t NumMatrices(const google::protobuf::RepeatedField<int64_t>& shape) {
  return shape.size() == 3 ? shape[0] : 1;
}

void AddMatrixNameBytes(size_t name_bytes, int64_t num_matrices,
                        int64_t* total) {
  constexpr int64_t kSaturated = kMaxJobNameBytes + 1;
  const int64_t per_matrix =
      static_cast<int64_t>(std::min<size_t>(name_bytes, kSaturated)) +
      kMatrixNameSuffixBytes;
  const std::optional<int64_t> bytes =
      CheckedMul(per_matrix, std::max<int64_t>(num_matrices, 0));
  if (!bytes.has_value() || *bytes >= kSaturated - *total) {
    *total = kSaturated;
    return;
  }
  *total += *bytes;
}

absl::Status CheckJobSize(const Mesh& mesh, int64_t num_params,
                          int64_t num_matrices, int64_t name_bytes) {
  MUON_RETURN_IF_ERROR(mesh.Validate());
  if (num_params > kMaxParams) {
    return absl::InvalidArgumentError(
        absl::StrCat("the job has ", num_params, " parameters; at most ",
                     kMaxParams, " are supported"));
  }
  if (!CheckedProduct({num_matrices, int64_t{mesh.world_size()}},
                      kMaxMatrixRankBoxes)
           .has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the job has ", num_matrices, " matrices over the mesh ",
                     mesh.ToString(), " (", mesh.world_size(),
                     " ranks): matrices x world size must be at most ",
                     kMaxMatrixRankBoxes));
  }
  if (name_bytes > kMaxJobNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the job's matrix names would take more than ", kMaxJobNameBytes,
        " bytes in the plan, the most supported (each parameter's name plus ",
        kMatrixNameSuffixBytes,
        " bytes, once per matrix): shorten the names of the largest expert "
        "stacks"));
  }
  return absl::OkStatus();
}

absl::StatusOr<SubMesh> CheckSubMesh(
    absl::string_view param,
    const google::protobuf::Map<std::string, int32_t>& sub_mesh,
    const std::vector<Placement>& placements, const Mesh& mesh) {
  const std::string what = absl::StrCat("parameter \"", param, "\"");
  // Sorted by mesh dim so that the result (and every message) does not
  // depend on the map's iteration order.
  std::map<int, std::pair<std::string, int32_t>> by_dim;
  const std::map<std::string, int32_t> sorted(sub_mesh.begin(), sub_mesh.end());
  for (const auto& [name, value] : sorted) {
    const int d = mesh.DimIndex(name);
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": sub_mesh names mesh dim \"", name, "\" but the mesh ",
          mesh.ToString(), " has no such dim"));
    }
    by_dim[d] = {name, value};
  }
  SubMesh out;
  for (const auto& [d, entry] : by_dim) {
    const auto& [name, value] = entry;
    const int size = mesh.sizes[d];
    if (value < 0 || value >= size) {
      const bool pp = name == "pp";
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": ", name, pp ? " stage " : " coordinate ", value,
          " is out of range: mesh dim \"", name, "\" has ", size,
          pp ? " stages" : " coordinates", " (0..", size - 1, ")"));
    }
    if (d < static_cast<int>(placements.size()) &&
        !placements[d].is_replicate()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": placement ", placements[d].ToString(), " on mesh dim \"",
          name, "\" must be Replicate(): \"", name,
          "\" is an ownership dim of its sub_mesh {", name, "=", value,
          "} (the parameter lives only on ", name, " coordinate ", value,
          " and is never sharded or gathered across ", name, ")"));
    }
    out.dims.push_back(d);
    out.coords.push_back(value);
  }
  return out;
}

absl::Status ValidateExecutionOptions(const v1::ExecutionOptions& e) {
  const std::string& policy = e.assignment_policy();
  if (!policy.empty() && policy != "lpt" && policy != "round_robin") {
    return absl::InvalidArgumentError(
        absl::StrCat("execution.assignment_policy \"", policy,
                     "\" is not a policy (use \"lpt\" or \"round_robin\")"));
  }
  const std::string& dtype = e.exchange_dtype();
  if (!dtype.empty() && dtype != "float32" && dtype != "bfloat16") {
    return absl::InvalidArgumentError(
        absl::StrCat("execution.exchange_dtype \"", dtype,
                     "\" is not an exchange dtype (use \"float32\" or "
                     "\"bfloat16\")"));
  }
  const std::pair<const char*, int64_t> counts[] = {
      {"bucket_size_bytes", e.bucket_size_bytes()},
      {"prefetch_count", e.prefetch_count()},
      {"replan_every_steps", e.replan_every_steps()}};
  for (const auto& [name, value] : counts) {
    if (value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("execution.", name, " is ", value, "; must be >= 0"));
    }
  }
  return absl::OkStatus();
}

bool ExchangeIsBf16(const v1::ExecutionOptions& e) {
  return e.exchange_dtype() == "bfloat16";
}

int NsStepsOf(const v1::RankManifest& manifest) {
  return manifest.has_ns_steps() ? manifest.ns_steps() : kDefaultNsSteps;
}

namespace {

// Checks the job spec's mesh: every size >= 1, then Mesh::Validate.
absl::Status ValidateSpecMesh(const Mesh& mesh) {
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
  return absl::OkStatus();
}

// Checks parameter `param` (index i of the spec; `names` holds the names
// seen before it and gains its own): name, shape, row splits, placements
// and sub-mesh over `mesh`. Returns the number of matrices it holds.
absl::StatusOr<int64_t> ValidateSpecParam(const v1::ParamSpec& param, int i,
                                          const Mesh& mesh,
                                          std::set<std::string>* names) {
  if (param.name().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter at index ", i, " has an empty name"));
  }
  // Before the name is copied into `names` (or anywhere else).
  MUON_RETURN_IF_ERROR(CheckParamNameSize(param.name(), ""));
  if (!names->insert(param.name()).second) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter \"", param.name(), "\" is listed more than once"));
  }
  MUON_RETURN_IF_ERROR(CheckParamShape(param.name(), param.shape()));
  {
    const std::vector<int64_t> shape(param.shape().begin(),
                                     param.shape().end());
    const std::vector<int64_t> splits(param.row_splits().begin(),
                                      param.row_splits().end());
    if (absl::Status s = CheckRowSplits(shape, splits); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter \"", param.name(), "\": ", s.message()));
    }
  }
  const int64_t num_matrices = param.row_splits_size() > 0
                                   ? param.row_splits_size()
                                   : NumMatrices(param.shape());
  MUON_ASSIGN_OR_RETURN(std::vector<Placement> placements,
                        CheckMatrixPlacements(param.name(), param.placements(),
                                              mesh, param.shape_size()));
  MUON_RETURN_IF_ERROR(
      CheckSubMesh(param.name(), param.sub_mesh(), placements, mesh).status());
  return num_matrices;
}

}  // namespace

absl::Status ValidateJobSpec(const v1::JobSpec& spec, bool per_rank_boxes) {
  MUON_RETURN_IF_ERROR(ValidateExecutionOptions(spec.execution()));
  const Mesh mesh = MeshFromProto(spec.mesh());
  MUON_RETURN_IF_ERROR(ValidateSpecMesh(mesh));
  if (spec.params_size() > kMaxParams) {
    return absl::InvalidArgumentError(
        absl::StrCat("the job spec has ", spec.params_size(),
                     " parameters; at most ", kMaxParams, " are supported"));
  }
  int64_t num_matrices = 0;
  int64_t name_bytes = 0;
  std::set<std::string> names;
  for (int i = 0; i < spec.params_size(); ++i) {
    MUON_ASSIGN_OR_RETURN(const int64_t param_matrices,
                          ValidateSpecParam(spec.params(i), i, mesh, &names));
    num_matrices += param_matrices;
    AddMatrixNameBytes(spec.params(i).name().size(), param_matrices,
                       &name_bytes);
  }
  if (!per_rank_boxes) {
    if (num_matrices > kMaxSharedLayoutMatrices) {
      return absl::InvalidArgumentError(
          absl::StrCat("the job has ", num_matrices, " matrices; at most ",
                       kMaxSharedLayoutMatrices, " are supported"));
    }
    return CheckJobSize(mesh, spec.params_size(), /*num_matrices=*/0,
                        name_bytes);
  }
  MUON_RETURN_IF_ERROR(
      CheckJobSize(mesh, spec.params_size(), num_matrices, name_bytes));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::RankManifest>> ManifestsFromSpec(
    const v1::JobSpec& spec) {
  MUON_RETURN_IF_ERROR(ValidateJobSpec(spec));
  const Mesh mesh = MeshFromProto(spec.mesh());
  const int world = mesh.world_size();

  // Per parameter: canonical placements and sub-mesh.
  std::vector<std::vector<Placement>> placements(spec.params_size());
  std::vector<SubMesh> sub_meshes(spec.params_size());
  for (int i = 0; i < spec.params_size(); ++i) {
    const v1::ParamSpec& param = spec.params(i);
    MUON_ASSIGN_OR_RETURN(
        placements[i], CheckMatrixPlacements(param.name(), param.placements(),
                                             mesh, param.shape_size()));
    MUON_ASSIGN_OR_RETURN(
        sub_meshes[i],
        CheckSubMesh(param.name(), param.sub_mesh(), placements[i], mesh));
  }

  std::vector<v1::RankManifest> manifests(world);
  for (int r = 0; r < world; ++r) {
    const std::vector<int> coord = mesh.Coord(r);
    v1::RankManifest& m = manifests[r];
    m.set_rank(r);
    m.set_world_size(world);
    *m.mutable_mesh() = spec.mesh();
    *m.mutable_execution() = spec.execution();
    if (spec.optimizer().has_ns_steps()) {
      m.set_ns_steps(spec.optimizer().ns_steps());
    }
    for (int i = 0; i < spec.params_size(); ++i) {
      if (!sub_meshes[i].Contains(coord)) continue;
      const v1::ParamSpec& param = spec.params(i);
      const std::vector<int64_t> shape(param.shape().begin(),
                                       param.shape().end());
      absl::StatusOr<std::vector<Range>> ranges =
          LocalRanges(shape, placements[i], mesh, coord, sub_meshes[i]);
      if (!ranges.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "parameter \"", param.name(), "\": ", ranges.status().message()));
      }
      v1::ParamManifest* pm = m.add_params();
      pm->set_name(param.name());
      *pm->mutable_global_shape() = param.shape();
      for (const Range& range : *ranges) pm->add_local_shape(range.size());
      for (const Placement& p : placements[i]) {
        pm->add_placements(p.ToString());
      }
      pm->set_dtype("float32");
      *pm->mutable_sub_mesh() = param.sub_mesh();
      *pm->mutable_row_splits() = param.row_splits();
    }
  }
  return manifests;
}

}  // namespace muon
