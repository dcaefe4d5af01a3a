#include "checkpoint/checkpoint.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/checked_math.h"
#include "common/file_io.h"
#include "common/json_util.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace muon {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "checkpoint files are little-endian; this host is not");
static_assert(sizeof(float) == 4, "F32 is 4 bytes");

using json = nlohmann::json;

constexpr char kMetadataFile[] = "metadata.json";
constexpr const char* kMetadataKey = kSafetensorsMetadataKey;
constexpr char kDtypeF32[] = "F32";
constexpr size_t kMaxNameLength = 1024;
constexpr int64_t kFloatBytes = 4;

// ---------------------------------------------------------------------------
// Small helpers: file names, formatting, sizes.

std::string RankFileName(int rank) {
  return absl::StrCat("rank_", rank, ".safetensors");
}

std::string Quoted(const std::vector<std::string>& items) {
  std::vector<std::string> parts;
  parts.reserve(items.size());
  for (const std::string& s : items)
    parts.push_back(absl::StrCat("\"", s, "\""));
  return absl::StrCat("[", absl::StrJoin(parts, ","), "]");
}

// Bytes of an F32 tensor of `shape` (dims >= 0), or nullopt when it
// overflows int64.
std::optional<int64_t> F32Bytes(const std::vector<int64_t>& shape) {
  std::optional<int64_t> numel = CheckedProduct(shape);
  if (!numel.has_value()) return std::nullopt;
  return CheckedMul(*numel, kFloatBytes);
}

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > kMaxNameLength || name == kMetadataKey) {
    return false;
  }
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '_' || c == '.' ||
                    c == ':' || c == '/' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::string NameRule() {
  return "1 to 1024 characters of [A-Za-z0-9_.:/-], not \"__metadata__\"";
}

// ---------------------------------------------------------------------------
// Write-side validation.

absl::Status CheckMeta(const CheckpointMetadata& meta) {
  if (meta.format_version != kCheckpointFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint format_version ", meta.format_version,
        " cannot be written; this code writes ", kCheckpointFormatVersion));
  }
  if (meta.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint world_size ", meta.world_size, " < 1"));
  }
  if (meta.step < 0 || meta.step > kMaxCheckpointStep) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint step ", meta.step, " is outside [0, ",
                     kMaxCheckpointStep, "]"));
  }
  absl::Status s = meta.mesh.Validate();
  if (!s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint mesh: ", s.message()));
  }
  const int64_t mesh_world = CheckedProduct(meta.mesh.sizes).value_or(-1);
  if (mesh_world != meta.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint mesh ", meta.mesh.ToString(), " has ",
                     mesh_world, " ranks but world_size is ", meta.world_size));
  }
  return absl::OkStatus();
}

// Checks name, global shape and placements of `t`; returns the placements
// in canonical spelling.
absl::StatusOr<std::vector<std::string>> CheckTensorGlobal(
    const ShardTensorView& t, const Mesh& mesh) {
  if (!ValidName(t.name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor name \"", t.name, "\" is invalid: want ", NameRule()));
  }
  if (t.global_shape.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", t.name, ": global_shape is empty (need >= 1 dim)"));
  }
  for (int64_t d : t.global_shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", t.name, ": global_shape ",
                       ShapeToString(t.global_shape), " has a negative dim"));
    }
  }
  if (!F32Bytes(t.global_shape).has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", t.name, ": global_shape ",
                     ShapeToString(t.global_shape), " overflows int64 bytes"));
  }
  if (static_cast<int>(t.placements.size()) != mesh.ndim()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", t.name, ": ", t.placements.size(),
                     " placements for a mesh of ", mesh.ndim(), " dims (",
                     mesh.ToString(), ")"));
  }
  std::vector<std::string> canonical;
  canonical.reserve(t.placements.size());
  for (const std::string& text : t.placements) {
    absl::StatusOr<Placement> p = Placement::Parse(text);
    if (!p.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", t.name, ": ", p.status().message()));
    }
    if (p->kind == Placement::Kind::kPartial) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", t.name,
                       ": Partial() shards cannot be saved; reduce first"));
    }
    if (p->is_shard() && p->dim >= static_cast<int>(t.global_shape.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", t.name, ": placement ", text,
                       " but the tensor has ", t.global_shape.size(), " dims"));
    }
    canonical.push_back(p->ToString());
  }
  return canonical;
}

absl::Status CheckBox(const ShardTensorView& t) {
  if (t.box.size() != t.global_shape.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", t.name, ": box ", BoxToString(t.box), " has ", t.box.size(),
        " dims but global_shape ", ShapeToString(t.global_shape), " has ",
        t.global_shape.size()));
  }
  for (size_t d = 0; d < t.box.size(); ++d) {
    const Range& r = t.box[d];
    if (r.begin < 0 || r.begin > r.end || r.end > t.global_shape[d]) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", t.name, ": box ", BoxToString(t.box),
                       " lies outside global_shape ",
                       ShapeToString(t.global_shape), " in dim ", d));
    }
  }
  if (t.data == nullptr && BoxNumel(t.box) > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", t.name, ": data is null for non-empty box ",
                     BoxToString(t.box)));
  }
  return absl::OkStatus();
}

// Validates every tensor's global info and rejects duplicate names; returns
// the canonical placements per tensor.
absl::StatusOr<std::vector<std::vector<std::string>>> CheckTensors(
    const CheckpointMetadata& meta,
    const std::vector<ShardTensorView>& tensors) {
  std::vector<std::vector<std::string>> placements;
  placements.reserve(tensors.size());
  std::set<std::string> seen;
  for (const ShardTensorView& t : tensors) {
    MUON_ASSIGN_OR_RETURN(std::vector<std::string> p,
                          CheckTensorGlobal(t, meta.mesh));
    if (!seen.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", t.name, " appears twice"));
    }
    placements.push_back(std::move(p));
  }
  return placements;
}

// Shape: >= 1 dims, each >= 0, numel * 4 within int64.
bool ValidShape(const std::vector<int64_t>& shape) {
  if (shape.empty()) return false;
  for (int64_t d : shape) {
    if (d < 0) return false;
  }
  return F32Bytes(shape).has_value();
}

absl::Status CheckFormatVersion(const std::string& path, int64_t version) {
  if (version != kCheckpointFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": checkpoint format_version ", version,
                     " is not supported (this reader knows version ",
                     kCheckpointFormatVersion, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckFormatName(const std::string& path, const json* format) {
  if (format == nullptr || !format->is_string() ||
      format->get<std::string>() != kCheckpointFormat) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": not a ", kCheckpointFormat, " file (\"format\" is ",
        format == nullptr ? "missing" : DumpJson(*format), ")"));
  }
  return absl::OkStatus();
}

// metadata.json's "mesh" ({"names": [..], "sizes": [..]}) into meta->mesh,
// checked against meta->world_size.
absl::Status ParseMetadataMesh(const std::string& path, const json& root,
                               CheckpointMetadata* meta) {
  const json* mesh = JsonMember(root, "mesh");
  std::vector<int64_t> sizes;
  if (mesh == nullptr || !mesh->is_object() ||
      JsonMember(*mesh, "names") == nullptr ||
      !JsonToStringArray(*JsonMember(*mesh, "names"), &meta->mesh.names) ||
      JsonMember(*mesh, "sizes") == nullptr ||
      !JsonToInt64Array(*JsonMember(*mesh, "sizes"), &sizes)) {
    return absl::DataLossError(
        absl::StrCat(path,
                     ": field \"mesh\" missing or not {\"names\": "
                     "[string], \"sizes\": [int]}"));
  }
  meta->mesh.sizes.clear();
  const int64_t mesh_world =
      CheckedProduct(sizes, std::numeric_limits<int>::max()).value_or(-1);
  for (int64_t s : sizes) {
    if (s < 1 || s > std::numeric_limits<int>::max() || mesh_world < 0) {
      return absl::DataLossError(absl::StrCat(
          path, ": mesh sizes ", ShapeToString(sizes), " out of range"));
    }
    meta->mesh.sizes.push_back(static_cast<int>(s));
  }
  if (absl::Status s = meta->mesh.Validate(); !s.ok()) {
    return absl::DataLossError(absl::StrCat(path, ": mesh: ", s.message()));
  }
  if (mesh_world != meta->world_size) {
    return absl::DataLossError(absl::StrCat(
        path, ": mesh ", meta->mesh.ToString(), " has ", mesh_world,
        " ranks but world_size is ", meta->world_size));
  }

  return absl::OkStatus();
}

// metadata.json's "tensors" ({name: {"global_shape", "placements"}}) into
// `tensors`.
absl::Status ParseMetadataTensors(
    const std::string& path, const json& list,
    std::map<std::string, CheckpointReader::TensorInfo>* tensors) {
  for (auto it = list.begin(); it != list.end(); ++it) {
    const std::string& name = it.key();
    if (!ValidName(name)) {
      return absl::DataLossError(absl::StrCat(
          path, ": tensor name \"", name, "\" is invalid: want ", NameRule()));
    }
    CheckpointReader::TensorInfo info;
    const json* gs = JsonMember(it.value(), "global_shape");
    const json* pl = JsonMember(it.value(), "placements");
    if (gs == nullptr || !JsonToInt64Array(*gs, &info.global_shape) ||
        !ValidShape(info.global_shape)) {
      return absl::DataLossError(absl::StrCat(
          path, ": tensor ", name,
          ": global_shape missing, not a list of dims >= 0, or overflowing "
          "int64 bytes"));
    }
    if (pl == nullptr || !JsonToStringArray(*pl, &info.placements)) {
      return absl::DataLossError(absl::StrCat(
          path, ": tensor ", name, ": placements missing or not strings"));
    }
    (*tensors)[name] = std::move(info);
  }
  return absl::OkStatus();
}

// `text` parsed as JSON, or a discarded value when it is not JSON or nests
// more than kMaxSafetensorsJsonDepth deep (checked first: a file of 100 MiB
// of '[' would otherwise build a DOM of many GiB).
json ParseBoundedJson(absl::string_view text) {
  if (JsonDepth(text, kMaxSafetensorsJsonDepth) > kMaxSafetensorsJsonDepth) {
    return json(json::value_t::discarded);
  }
  return json::parse(text.begin(), text.end(), nullptr,
                     /*allow_exceptions=*/false);
}

// Parses metadata.json.
absl::Status ParseMetadataJson(
    const std::string& path, const std::string& text, CheckpointMetadata* meta,
    std::map<std::string, CheckpointReader::TensorInfo>* tensors) {
  const json root = ParseBoundedJson(text);
  if (root.is_discarded() || !root.is_object()) {
    return absl::DataLossError(
        absl::StrCat(path, ": not a valid JSON object (or nested more than ",
                     kMaxSafetensorsJsonDepth, " deep)"));
  }
  MUON_RETURN_IF_ERROR(CheckFormatName(path, JsonMember(root, "format")));
  auto bad = [&path](absl::string_view field, absl::string_view want) {
    return absl::DataLossError(
        absl::StrCat(path, ": field \"", field, "\" missing or not ", want));
  };
  int64_t v;
  const json* f = JsonMember(root, "format_version");
  if (f == nullptr || !JsonToInt64(*f, &v))
    return bad("format_version", "an integer");
  MUON_RETURN_IF_ERROR(CheckFormatVersion(path, v));
  meta->format_version = static_cast<int>(v);

  f = JsonMember(root, "world_size");
  if (f == nullptr || !JsonToInt64(*f, &v) || v < 1 ||
      v > std::numeric_limits<int>::max()) {
    return bad("world_size", "an integer in [1, 2^31)");
  }
  meta->world_size = static_cast<int>(v);

  MUON_RETURN_IF_ERROR(ParseMetadataMesh(path, root, meta));

  f = JsonMember(root, "plan_hash");
  if (f == nullptr || !f->is_string()) return bad("plan_hash", "a string");
  meta->plan_hash = f->get<std::string>();

  f = JsonMember(root, "step");
  if (f == nullptr || !JsonToInt64(*f, &v) || v < 0 || v > kMaxCheckpointStep) {
    return bad("step",
               absl::StrCat("an integer in [0, ", kMaxCheckpointStep, "]"));
  }
  meta->step = v;

  f = JsonMember(root, "blas_core");
  if (f != nullptr) {
    if (!f->is_string()) return bad("blas_core", "a string");
    meta->blas_core = f->get<std::string>();
  }

  const json* list = JsonMember(root, "tensors");
  if (list == nullptr || !list->is_object()) return bad("tensors", "an object");
  return ParseMetadataTensors(path, *list, tensors);
}

// FileSize of a checkpoint file; one that is not a regular file (a
// directory or device in its place) is a damaged checkpoint: DataLoss.
absl::StatusOr<int64_t> CheckpointFileSize(int fd, const std::string& path) {
  absl::StatusOr<int64_t> size = FileSize(fd, path);
  if (absl::IsFailedPrecondition(size.status())) {
    return absl::DataLossError(size.status().message());
  }
  return size;
}

// The rank file's safetensors header (common/safetensors.h), its format
// errors as DataLoss: a checkpoint file that does not parse is corrupted.
absl::StatusOr<SafetensorsHeader> ReadRankFileHeader(
    const std::string& path, const CheckpointMetadata& meta) {
  absl::StatusOr<SafetensorsHeader> header =
      ReadSafetensorsHeader(path, kCheckpointMaxHeaderBytes);
  if (header.ok()) return header;
  const absl::Status& s = header.status();
  if (absl::IsNotFound(s)) {
    return absl::DataLossError(
        absl::StrCat("checkpoint rank file missing: ", s.message(),
                     " (metadata.json says world_size ", meta.world_size, ")"));
  }
  if (absl::IsInvalidArgument(s) || absl::IsFailedPrecondition(s)) {
    return absl::DataLossError(s.message());
  }
  return s;
}

// The integer __metadata__[key] of rank file `path`, which must be `want`.
absl::Status ExpectMetadataInt(const std::string& path,
                               const std::map<std::string, std::string>& md,
                               const std::string& key, int64_t want) {
  auto it = md.find(key);
  int64_t value;
  if (it == md.end() || !absl::SimpleAtoi(it->second, &value)) {
    return absl::DataLossError(absl::StrCat(path, ": __metadata__ ", key,
                                            " missing or not an integer"));
  }
  if (value != want) {
    return absl::DataLossError(
        absl::StrCat(path, ": __metadata__ ", key, " is ", value, ", expected ",
                     want, " (file from another checkpoint?)"));
  }
  return absl::OkStatus();
}

// Checks that rank file `path`'s __metadata__ names this checkpoint: format,
// version, rank, world size, step and plan hash.
absl::Status CheckRankMetadata(const std::string& path,
                               const std::map<std::string, std::string>& md,
                               int rank, const CheckpointMetadata& meta) {
  auto format = md.find("format");
  const json format_json = format == md.end() ? json() : json(format->second);
  MUON_RETURN_IF_ERROR(
      CheckFormatName(path, format == md.end() ? nullptr : &format_json));
  auto version = md.find("format_version");
  int64_t v;
  if (version == md.end() || !absl::SimpleAtoi(version->second, &v)) {
    return absl::DataLossError(absl::StrCat(
        path, ": __metadata__ format_version missing or not an integer"));
  }
  MUON_RETURN_IF_ERROR(CheckFormatVersion(path, v));
  MUON_RETURN_IF_ERROR(ExpectMetadataInt(path, md, "rank", rank));
  MUON_RETURN_IF_ERROR(
      ExpectMetadataInt(path, md, "world_size", meta.world_size));
  MUON_RETURN_IF_ERROR(ExpectMetadataInt(path, md, "step", meta.step));
  auto hash = md.find("plan_hash");
  if (hash == md.end()) {
    return absl::DataLossError(
        absl::StrCat(path, ": __metadata__ plan_hash missing"));
  }
  if (hash->second != meta.plan_hash) {
    return absl::DataLossError(
        absl::StrCat(path, ": __metadata__ plan_hash \"", hash->second,
                     "\" differs from metadata.json's \"", meta.plan_hash,
                     "\" (file from another checkpoint?)"));
  }
  return absl::OkStatus();
}

// A shard's place in its tensor, from the rank file's __metadata__
// "<name>.global_shape", ".offsets" and ".placements" (JSON texts).
struct ShardPlacement {
  std::vector<int64_t> global_shape;
  std::vector<int64_t> offsets;
  std::vector<std::string> placements;
};

absl::StatusOr<ShardPlacement> ParseShardPlacement(
    const std::map<std::string, std::string>& md, const std::string& name,
    const std::function<absl::Status(absl::string_view)>& err) {
  auto gs = md.find(name + ".global_shape");
  auto off = md.find(name + ".offsets");
  auto pl = md.find(name + ".placements");
  if (gs == md.end() || off == md.end() || pl == md.end()) {
    return err("__metadata__ lacks its .global_shape, .offsets or .placements");
  }
  ShardPlacement out;
  const json gs_j = ParseBoundedJson(gs->second);
  if (gs_j.is_discarded() || !JsonToInt64Array(gs_j, &out.global_shape)) {
    return err(absl::StrCat("global_shape \"", gs->second,
                            "\" is not a list of integers"));
  }
  const json pl_j = ParseBoundedJson(pl->second);
  if (pl_j.is_discarded() || !JsonToStringArray(pl_j, &out.placements)) {
    return err(absl::StrCat("placements \"", pl->second,
                            "\" is not a list of strings"));
  }
  const json off_j = ParseBoundedJson(off->second);
  if (off_j.is_discarded() || !JsonToInt64Array(off_j, &out.offsets)) {
    return err(absl::StrCat("offsets \"", off->second,
                            "\" is not a list of integers"));
  }
  return out;
}

// The box of global indices a shard of `shape` at `where.offsets` covers,
// inside `where.global_shape`.
absl::StatusOr<std::vector<Range>> ShardBox(
    const std::vector<int64_t>& shape, const ShardPlacement& where,
    const std::function<absl::Status(absl::string_view)>& err) {
  if (where.offsets.size() != shape.size() ||
      shape.size() != where.global_shape.size()) {
    return err(absl::StrCat("offsets ", ShapeToString(where.offsets),
                            " and shape ", ShapeToString(shape),
                            " do not match the global_shape's ",
                            where.global_shape.size(), " dims"));
  }
  std::vector<Range> box;
  for (size_t d = 0; d < shape.size(); ++d) {
    const std::optional<int64_t> stop = CheckedAdd(where.offsets[d], shape[d]);
    if (where.offsets[d] < 0 || !stop.has_value() ||
        *stop > where.global_shape[d]) {
      return err(absl::StrCat("box at offsets ", ShapeToString(where.offsets),
                              " of shape ", ShapeToString(shape),
                              " lies outside global_shape ",
                              ShapeToString(where.global_shape)));
    }
    box.push_back({where.offsets[d], *stop});
  }
  return box;
}

// Adds the shard `t` of rank file `path` (rank `rank`) to `tensors`,
// checked against metadata.json's global shape and placements (or, for a
// tensor metadata.json does not list, the first rank file naming it).
absl::Status AddShard(
    const std::string& path, const SafetensorsHeader& header,
    const SafetensorsTensor& t, int rank,
    std::map<std::string, CheckpointReader::TensorInfo>* tensors) {
  auto err = [&](absl::string_view what) {
    return absl::DataLossError(
        absl::StrCat(path, ": tensor ", t.name, ": ", what));
  };
  if (!ValidName(t.name)) {
    return err(absl::StrCat("invalid name: want ", NameRule()));
  }
  if (t.dtype != kDtypeF32) {
    return absl::UnimplementedError(
        absl::StrCat(path, ": tensor ", t.name, ": dtype ", t.dtype,
                     " is not supported (only F32)"));
  }
  MUON_ASSIGN_OR_RETURN(ShardPlacement where,
                        ParseShardPlacement(header.metadata, t.name, err));
  auto info_it = tensors->find(t.name);
  const bool adopt = info_it == tensors->end();
  if (adopt) {
    info_it = tensors->emplace(t.name, CheckpointReader::TensorInfo{}).first;
  }
  CheckpointReader::TensorInfo& info = info_it->second;
  if (adopt) {
    // Listed in no metadata.json: its rank file's word is checked as
    // metadata.json's would be.
    if (!ValidShape(where.global_shape)) {
      return err(absl::StrCat("global_shape ",
                              ShapeToString(where.global_shape),
                              " is not a list of >= 1 dims >= 0 whose F32 "
                              "bytes fit in int64"));
    }
    info.global_shape = where.global_shape;
  }
  if (where.global_shape != info.global_shape) {
    return err(absl::StrCat("global_shape ", ShapeToString(where.global_shape),
                            " differs from metadata.json's ",
                            ShapeToString(info.global_shape)));
  }
  if (adopt) info.placements = where.placements;
  if (where.placements != info.placements) {
    return err(absl::StrCat("placements ", Quoted(where.placements),
                            " differ from metadata.json's ",
                            Quoted(info.placements)));
  }
  MUON_ASSIGN_OR_RETURN(std::vector<Range> box, ShardBox(t.shape, where, err));
  info.shards.push_back({rank, std::move(box),
                         header.data_offset + t.data_begin,
                         t.data_end - t.data_begin});
  return absl::OkStatus();
}

// Reads the header of one rank file and adds its shards to `tensors`.
absl::Status ReadRankHeader(
    const std::string& path, int rank, const CheckpointMetadata& meta,
    std::map<std::string, CheckpointReader::TensorInfo>* tensors,
    int64_t* file_size) {
  MUON_ASSIGN_OR_RETURN(SafetensorsHeader header,
                        ReadRankFileHeader(path, meta));
  *file_size = header.data_offset + header.data_size;
  MUON_RETURN_IF_ERROR(CheckRankMetadata(path, header.metadata, rank, meta));
  for (const SafetensorsTensor& t : header.tensors) {
    MUON_RETURN_IF_ERROR(AddShard(path, header, t, rank, tensors));
  }
  // The data section is exactly the tensors, back to back.
  if (absl::Status s = CheckSafetensorsPacked(path, header); !s.ok()) {
    return absl::DataLossError(s.message());
  }
  return absl::OkStatus();
}

// Reads the part `part` of `shard` (rank file `fd`) into `out`, which is laid
// out as the row-major region `region`. `part` lies inside both. One pread
// per contiguous run: the innermost dims that `part` covers whole in both
// the shard and the region are merged into the run.
absl::Status ReadPart(int fd, const std::string& path, const std::string& name,
                      const CheckpointReader::SavedShard& shard,
                      const std::vector<Range>& part,
                      const std::vector<Range>& region, float* out) {
  const int n = static_cast<int>(part.size());
  const std::vector<Range>& src = shard.box;
  std::vector<int64_t> src_stride(n, 1), dst_stride(n, 1);
  for (int d = n - 2; d >= 0; --d) {
    src_stride[d] = src_stride[d + 1] * src[d + 1].size();
    dst_stride[d] = dst_stride[d + 1] * region[d + 1].size();
  }
  int k = n - 1;
  while (k > 0 && part[k] == src[k] && part[k] == region[k]) --k;
  const int64_t run = part[k].size() * src_stride[k];  // floats
  std::vector<int64_t> idx(k);
  for (int d = 0; d < k; ++d) idx[d] = part[d].begin;
  while (true) {
    int64_t s = (part[k].begin - src[k].begin) * src_stride[k];
    int64_t t = (part[k].begin - region[k].begin) * dst_stride[k];
    for (int d = 0; d < k; ++d) {
      s += (idx[d] - src[d].begin) * src_stride[d];
      t += (idx[d] - region[d].begin) * dst_stride[d];
    }
    const int64_t offset = shard.file_offset + s * kFloatBytes;
    const int64_t want = run * kFloatBytes;
    MUON_ASSIGN_OR_RETURN(const int64_t got,
                          PreadFull(fd, out + t, want, offset, path));
    if (got != want) {
      return absl::DataLossError(absl::StrCat(
          path, ": tensor ", name, ": read of ", want, " bytes at offset ",
          offset, " came up short: got ", got));
    }
    int d = k - 1;
    for (; d >= 0; --d) {
      if (++idx[d] < part[d].end) break;
      idx[d] = part[d].begin;
    }
    if (d < 0) break;
  }
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------------------
// Writing.

absl::Status WriteCheckpointShard(const std::string& dir, int rank,
                                  const CheckpointMetadata& meta,
                                  const std::vector<ShardTensorView>& tensors) {
  if (dir.empty()) {
    return absl::InvalidArgumentError("checkpoint dir is empty");
  }
  MUON_RETURN_IF_ERROR(CheckMeta(meta));
  if (rank < 0 || rank >= meta.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " outside [0, ", meta.world_size, ")"));
  }
  MUON_ASSIGN_OR_RETURN(std::vector<std::vector<std::string>> placements,
                        CheckTensors(meta, tensors));
  for (const ShardTensorView& t : tensors) MUON_RETURN_IF_ERROR(CheckBox(t));

  std::map<std::string, std::string> md = {
      {"format", kCheckpointFormat},
      {"format_version", absl::StrCat(meta.format_version)},
      {"rank", absl::StrCat(rank)},
      {"world_size", absl::StrCat(meta.world_size)},
      {"step", absl::StrCat(meta.step)},
      {"plan_hash", meta.plan_hash}};
  std::vector<SafetensorsTensor> entries;
  std::vector<FilePiece> pieces(1);  // the header, filled below
  int64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const ShardTensorView& t = tensors[i];
    std::vector<int64_t> offsets;
    for (const Range& r : t.box) offsets.push_back(r.begin);
    // CheckBox bounded the box by a global shape whose bytes fit int64.
    const int64_t bytes = BoxNumel(t.box) * kFloatBytes;
    const std::optional<int64_t> end = CheckedAdd(offset, bytes);
    if (!end.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, ": shard data overflows int64 bytes at tensor ",
          t.name));
    }
    entries.push_back({t.name, kDtypeF32, BoxShape(t.box), offset, *end});
    md[t.name + ".global_shape"] = DumpJson(json(t.global_shape));
    md[t.name + ".offsets"] = DumpJson(json(offsets));
    md[t.name + ".placements"] = DumpJson(json(placements[i]));
    if (bytes > 0) pieces.push_back({t.data, static_cast<size_t>(bytes)});
    offset = *end;
  }
  const std::string head = EncodeSafetensorsHeader(entries, md);
  if (static_cast<int64_t>(head.size()) - 8 > kCheckpointMaxHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, ": safetensors header of ", head.size() - 8,
                     " bytes exceeds the cap of ", kCheckpointMaxHeaderBytes,
                     " (too many tensors)"));
  }
  pieces[0] = {head.data(), head.size()};

  MUON_RETURN_IF_ERROR(MakeDirs(dir));
  return AtomicWriteFile(dir, RankFileName(rank), pieces);
}

absl::Status WriteCheckpointMetadata(
    const std::string& dir, const CheckpointMetadata& meta,
    const std::vector<ShardTensorView>& tensors) {
  if (dir.empty()) {
    return absl::InvalidArgumentError("checkpoint dir is empty");
  }
  MUON_RETURN_IF_ERROR(CheckMeta(meta));
  MUON_ASSIGN_OR_RETURN(std::vector<std::vector<std::string>> placements,
                        CheckTensors(meta, tensors));
  json list = json::object();
  for (size_t i = 0; i < tensors.size(); ++i) {
    json entry = json::object();
    entry["global_shape"] = tensors[i].global_shape;
    entry["placements"] = placements[i];
    list[tensors[i].name] = std::move(entry);
  }
  json mesh = json::object();
  mesh["names"] = meta.mesh.names;
  mesh["sizes"] = meta.mesh.sizes;
  json root = json::object();
  root["format"] = kCheckpointFormat;
  root["format_version"] = meta.format_version;
  root["world_size"] = meta.world_size;
  root["mesh"] = std::move(mesh);
  root["plan_hash"] = meta.plan_hash;
  root["step"] = meta.step;
  if (!meta.blas_core.empty()) root["blas_core"] = meta.blas_core;
  root["tensors"] = std::move(list);
  std::string text = DumpJson(root, /*indent=*/2);
  text.push_back('\n');
  if (static_cast<int64_t>(text.size()) > kCheckpointMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metadata.json of ", text.size(), " bytes exceeds the cap of ",
        kCheckpointMaxHeaderBytes, " (too many tensors)"));
  }
  MUON_RETURN_IF_ERROR(MakeDirs(dir));
  return AtomicWriteFile(dir, kMetadataFile, {{text.data(), text.size()}});
}

// ---------------------------------------------------------------------------
// Reading.

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(
    const std::string& dir) {
  std::unique_ptr<CheckpointReader> reader(new CheckpointReader());
  reader->dir_ = dir;
  const std::string meta_path = JoinPath(dir, kMetadataFile);
  {
    absl::StatusOr<ScopedFd> fd = OpenForRead(meta_path);
    if (!fd.ok()) {
      if (absl::IsNotFound(fd.status())) {
        return absl::NotFoundError(absl::StrCat("no checkpoint in ", dir, ": ",
                                                fd.status().message()));
      }
      return fd.status();
    }
    MUON_ASSIGN_OR_RETURN(const int64_t size,
                          CheckpointFileSize(fd->get(), meta_path));
    if (size > kCheckpointMaxHeaderBytes) {
      return absl::DataLossError(absl::StrCat(meta_path, ": ", size,
                                              " bytes exceeds the cap of ",
                                              kCheckpointMaxHeaderBytes));
    }
    std::string text(static_cast<size_t>(size), '\0');
    MUON_ASSIGN_OR_RETURN(const int64_t got, PreadFull(fd->get(), text.data(),
                                                       size, 0, meta_path));
    text.resize(static_cast<size_t>(got));
    MUON_RETURN_IF_ERROR(ParseMetadataJson(meta_path, text, &reader->metadata_,
                                           &reader->tensors_));
  }
  reader->file_sizes_.assign(reader->metadata_.world_size, 0);
  for (int r = 0; r < reader->metadata_.world_size; ++r) {
    MUON_RETURN_IF_ERROR(ReadRankHeader(JoinPath(dir, RankFileName(r)), r,
                                        reader->metadata_, &reader->tensors_,
                                        &reader->file_sizes_[r]));
  }
  return reader;
}

std::vector<std::string> CheckpointReader::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, info] : tensors_) names.push_back(name);
  return names;
}

const CheckpointReader::TensorInfo* CheckpointReader::FindTensor(
    const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::StatusOr<std::vector<int64_t>> CheckpointReader::GlobalShape(
    const std::string& name) const {
  const TensorInfo* info = FindTensor(name);
  if (info == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint ", dir_, " has no tensor \"", name, "\""));
  }
  return info->global_shape;
}

absl::StatusOr<std::vector<std::string>> CheckpointReader::Placements(
    const std::string& name) const {
  const TensorInfo* info = FindTensor(name);
  if (info == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint ", dir_, " has no tensor \"", name, "\""));
  }
  return info->placements;
}

namespace {

// A region request against what the checkpoint holds of the tensor: the
// expected global shape, and a box of its dims inside it.
absl::Status CheckRegionRequest(const std::string& where,
                                const CheckpointReader::TensorInfo& info,
                                const std::vector<int64_t>& expected_shape,
                                const std::vector<Range>& box) {
  if (expected_shape != info.global_shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": expected global shape ", ShapeToString(expected_shape),
        " but the checkpoint has ", ShapeToString(info.global_shape)));
  }
  if (box.size() != info.global_shape.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": box ", BoxToString(box), " has ", box.size(),
        " dims but the global shape ", ShapeToString(info.global_shape),
        " has ", info.global_shape.size()));
  }
  for (size_t d = 0; d < box.size(); ++d) {
    if (box[d].begin < 0 || box[d].begin > box[d].end ||
        box[d].end > info.global_shape[d]) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": box ", BoxToString(box), " lies outside global shape ",
          ShapeToString(info.global_shape), " in dim ", d));
    }
  }
  return absl::OkStatus();
}

// DataLoss: part `missing` of region `box` is in no rank file; names the
// saved shards (the first 8).
absl::Status UncoveredRegionError(const std::string& where,
                                  const CheckpointReader::TensorInfo& info,
                                  const std::vector<Range>& box,
                                  const std::vector<Range>& missing) {
  std::vector<std::string> saved;
  for (const CheckpointReader::SavedShard& shard : info.shards) {
    if (saved.size() == 8) {
      saved.push_back("...");
      break;
    }
    saved.push_back(
        absl::StrCat("rank ", shard.rank, " ", BoxToString(shard.box)));
  }
  return absl::DataLossError(absl::StrCat(
      where, ": region ", BoxToString(box),
      " is not covered by the saved shards: ", BoxToString(missing),
      " is in no rank file (saved: ",
      saved.empty() ? "none" : absl::StrJoin(saved, ", "), ")"));
}

}  // namespace

absl::Status CheckpointReader::ReadRegion(
    const std::string& name, const std::vector<int64_t>& expected_global_shape,
    const std::vector<Range>& box, float* out) const {
  const TensorInfo* info = FindTensor(name);
  if (info == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint ", dir_, " has no tensor \"", name, "\""));
  }
  const std::string where =
      absl::StrCat("checkpoint ", dir_, ": tensor ", name);
  MUON_RETURN_IF_ERROR(
      CheckRegionRequest(where, *info, expected_global_shape, box));
  if (BoxNumel(box) == 0) return absl::OkStatus();
  if (out == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": out is null for box ", BoxToString(box)));
  }
  std::vector<std::vector<Range>> uncovered = {box};
  std::vector<std::vector<Range>> next;
  std::vector<Range> part;
  for (const SavedShard& shard : info->shards) {
    if (uncovered.empty()) break;
    if (shard.bytes == 0) continue;
    const std::string path = JoinPath(dir_, RankFileName(shard.rank));
    ScopedFd fd;
    next.clear();
    for (const std::vector<Range>& u : uncovered) {
      if (!IntersectBoxes(u, shard.box, &part)) {
        next.push_back(u);
        continue;
      }
      if (fd.get() < 0) {
        MUON_ASSIGN_OR_RETURN(fd, OpenForRead(path));
        MUON_ASSIGN_OR_RETURN(const int64_t size,
                              CheckpointFileSize(fd.get(), path));
        if (size != file_sizes_[shard.rank]) {
          return absl::DataLossError(absl::StrCat(
              path, ": tensor ", name, ": file is ", size, " bytes but was ",
              file_sizes_[shard.rank], " when the checkpoint was opened"));
        }
      }
      MUON_RETURN_IF_ERROR(
          ReadPart(fd.get(), path, name, shard, part, box, out));
      SubtractBox(u, part, &next);
    }
    uncovered.swap(next);
  }
  if (!uncovered.empty()) {
    return UncoveredRegionError(where, *info, box, uncovered.front());
  }
  return absl::OkStatus();
}

void CheckpointReader::Describe(std::ostream& out) const {
  out << "checkpoint " << dir_ << "\n";
  out << "  format " << kCheckpointFormat << " version "
      << metadata_.format_version << "\n";
  out << "  step " << metadata_.step << "\n";
  out << "  world size " << metadata_.world_size << ", mesh "
      << metadata_.mesh.ToString() << "\n";
  out << "  plan hash "
      << (metadata_.plan_hash.empty() ? "(none)" : metadata_.plan_hash) << "\n";
  out << "  CPU kernels "
      << (metadata_.blas_core.empty() ? "(not recorded)" : metadata_.blas_core)
      << "\n";
  out << "  " << tensors_.size() << " tensor"
      << (tensors_.size() == 1 ? "" : "s") << "\n";
  for (const auto& [name, info] : tensors_) {
    const int64_t bytes = F32Bytes(info.global_shape).value_or(-1);
    out << "  " << name << ": F32 " << ShapeToString(info.global_shape) << " ("
        << bytes << " bytes), placements " << Quoted(info.placements) << "\n";
    for (const SavedShard& shard : info.shards) {
      out << "    rank " << shard.rank << ": box " << BoxToString(shard.box)
          << ", " << shard.bytes << " bytes\n";
    }
  }
}

}  // namespace muon
