// The job spec file: reading, checking and expanding a v1::JobSpec.
//
// A job spec (JSON, protobuf's JSON mapping of muon.v1.JobSpec; snake_case
// or lowerCamelCase field names) describes the mesh, every parameter's global
// shape and DTensor placements, and the optimizer and execution options.
// `muonctl plan` reads one offline; tests turn one into the rank manifests
// the trainers would send (ManifestsFromSpec).
//
// Example:
//   {"job_id": "mlp", "mesh": {"dims": [{"name": "dp_shard", "size": 4}]},
//    "params": [{"name": "fc1.weight", "shape": [256, 784],
//                "placements": ["Shard(0)"]}]}
// A pipeline-parallel parameter names its stage, an expert stack is 3-D:
//   {"name": "layers.3.wq", "shape": [4096, 4096],
//    "placements": ["Replicate()", "Shard(0)"], "sub_mesh": {"pp": 1}}
//   {"name": "layers.0.experts.w1", "shape": [8, 14336, 4096],
//    "placements": ["Shard(1)", "Shard(0)"]}   // mesh dp_shard x ep
//
// Thread-safety: every function here is pure and may be called concurrently.
#ifndef MUON_COMMON_SPEC_H_
#define MUON_COMMON_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/layout.h"
#include "google/protobuf/map.h"
#include "google/protobuf/repeated_field.h"
#include "muon/v1/coordinator.pb.h"

namespace muon {

// Parses a job spec from JSON text (protobuf's JSON mapping). Does not
// validate it; see ValidateJobSpec.
// Errors:
//   InvalidArgument: the text is not a JobSpec in JSON; the message carries
//     protobuf's own message (e.g. an unknown field's name).
absl::StatusOr<v1::JobSpec> ParseJobSpecJson(absl::string_view json);

// Largest job spec file LoadJobSpec reads, in bytes (256 MiB): room for
// kMaxParams (2^20) parameters at about 250 bytes of JSON each, while a
// file such as /dev/zero, or a huge one named by mistake, is refused
// before it is read into memory.
inline constexpr int64_t kMaxJobSpecFileBytes = int64_t{256} << 20;

// Reads and parses the job spec file at `path` (no validation): a regular
// file or a pipe (bash's <(command), /dev/stdin; read until its writers
// close it, as `cat` does), at most kMaxJobSpecFileBytes bytes.
// Errors:
//   NotFound: the file cannot be opened or read (names the path and
//     strerror's text).
//   InvalidArgument: the path is neither a regular file nor a pipe (a
//     device such as /dev/zero, a socket or a directory), or holds more
//     than kMaxJobSpecFileBytes (names the path, its size and the limit),
//     or is not a JobSpec in JSON (names the path and carries protobuf's
//     message).
absl::StatusOr<v1::JobSpec> LoadJobSpec(const std::string& path);

// Serializes a spec to pretty-printed JSON with snake_case field names
// (the same spelling ParseJobSpecJson reads). 64-bit integers (shapes,
// bucket_size_bytes) are JSON numbers, as in hand-written specs, where
// protobuf's JSON mapping would print strings ("48"); a magnitude above
// 2^53 - 1, which a JSON number cannot carry exactly, stays a string.
std::string JobSpecToJson(const v1::JobSpec& spec);

// Checks the size of a whole job before anything is sized by it: the
// mesh's world size (Mesh::Validate: at most kMaxWorldSize ranks, checked
// product), at most kMaxParams parameters, `num_matrices` x world size
// (the per-rank boxes the planner keeps) at most kMaxMatrixRankBoxes, and
// `name_bytes` (the sum of MatrixNameBytes over the parameters) at most
// kMaxJobNameBytes.
// Errors:
//   InvalidArgument: names the mesh, the count and the limit.
absl::Status CheckJobSize(const Mesh& mesh, int64_t num_params,
                          int64_t num_matrices, int64_t name_bytes);

// Bytes the plan's matrix names of one parameter take, counted as
// (name bytes + kMatrixNameSuffixBytes) x `num_matrices`, and added to
// `*total` saturating at kMaxJobNameBytes + 1 (so a sum over any number of
// parameters never overflows). `num_matrices` is at most
// kMaxParamElements (a checked shape's).
void AddMatrixNameBytes(size_t name_bytes, int64_t num_matrices,
                        int64_t* total);

// Matrices of a checked parameter shape: 1 for 2-D, shape[0] for 3-D.
int64_t NumMatrices(const google::protobuf::RepeatedField<int64_t>& shape);

// Checks the execution options wherever they come from (a spec file, the
// C ABI's muonrt_options, DistributedConfig): assignment_policy empty,
// "lpt" or "round_robin"; exchange_dtype empty, "float32" or "bfloat16";
// bucket_size_bytes, prefetch_count and replan_every_steps >= 0.
// Errors: InvalidArgument naming the field and value, e.g.
//   `execution.prefetch_count is -1; must be >= 0`.
absl::Status ValidateExecutionOptions(const v1::ExecutionOptions& execution);

// Whether the exchange carries bf16 (execution.exchange_dtype "bfloat16").
bool ExchangeIsBf16(const v1::ExecutionOptions& execution);

// RankManifest.ns_steps and OptimizerOptions.ns_steps when unset: 5, as
// torch.optim.Muon's default.
inline constexpr int kDefaultNsSteps = 5;

// `manifest`'s ns_steps, kDefaultNsSteps when unset.
int NsStepsOf(const v1::RankManifest& manifest);

// Checks a spec: its execution options (ValidateExecutionOptions), mesh
// sizes >= 1 with unique non-empty names, at most
// kMaxMeshDims dims and kMaxWorldSize ranks, kMaxParams parameters (see
// CheckJobSize and CheckParamShape for the size limits); each
// parameter has a non-empty unique name of at most kMaxTensorNameBytes
// bytes, a 2-D [rows, cols] or 3-D [experts, rows, cols] (expert stack)
// shape with dims >= 1, one placement per mesh dim, placements that parse,
// no Partial, Shard dims below the tensor's rank, the _StridedShard split
// factors FSDP2 gives (CheckStridedShards, named by parameter); its
// sub_mesh (CheckSubMesh) names mesh dims with
// coordinates in range, and its placement on those dims is Replicate().
// Errors:
//   InvalidArgument: the first problem found; the message names the
//     parameter (or mesh dim) and the offending value, e.g.
//     `parameter "layers.7.mlp.w1": pp stage 4 is out of range: mesh dim
//     "pp" has 4 stages (0..3)`.
//
// `per_rank_boxes` false skips the matrices x world size bound (for
// planners that share boxes between matrices of one layout, see
// LayoutFromSpec in plan/manifest_validation.h); the job may then hold at
// most kMaxSharedLayoutMatrices matrices.
absl::Status ValidateJobSpec(const v1::JobSpec& spec,
                             bool per_rank_boxes = true);

// Most matrices of a job planned with shared boxes (2^24).
inline constexpr int64_t kMaxSharedLayoutMatrices = int64_t{1} << 24;

// The manifest each rank of the job would send on Join, index = rank:
// rank, world size, mesh, the execution options, ns_steps (the optimizer's,
// when the spec sets it; unset = 5), and per parameter the rank
// holds (those whose sub_mesh contains the rank's coordinate, in spec order)
// its name, global shape, canonical placements ("Shard(0)", "Replicate()"),
// dtype "float32", sub_mesh, and the local shape that rank holds (one entry
// per tensor dim; torch.chunk rule, see LocalRanges in common/layout.h). A
// rank outside a parameter's sub-mesh does not list it. requested_owners is
// left empty. Validates the spec first.
// Errors:
//   InvalidArgument: as ValidateJobSpec.
absl::StatusOr<std::vector<v1::RankManifest>> ManifestsFromSpec(
    const v1::JobSpec& spec);

// Conversions between the wire mesh and the layout mesh. MeshFromProto does
// not validate; call Mesh::Validate.
Mesh MeshFromProto(const v1::Mesh& mesh);
v1::Mesh MeshToProto(const Mesh& mesh);

// Parses one placement string per mesh dim ("Shard(0)", "Replicate()", ...).
// `what` names the owner of the placements in error messages, e.g.
// `parameter "fc1.weight"`.
// Errors:
//   InvalidArgument: a placement does not parse (names `what` and the text).
absl::StatusOr<std::vector<Placement>> ParsePlacements(
    const google::protobuf::RepeatedPtrField<std::string>& placements,
    absl::string_view what);

// Checks a parameter's placements against the mesh: one per mesh dim, each
// parses, none is Partial, Shard dims are in [0, tensor_ndim) (2 for a
// matrix, 3 for an expert stack), and every _StridedShard's split factor
// is the product of the sizes of the later mesh dims that Shard its tensor
// dim (CheckStridedShards, common/layout.h). Returns them parsed.
// Errors:
//   InvalidArgument: names the parameter, the mesh dim and the placement,
//     e.g. `parameter "w": _StridedShard(dim=0, sf=4) on mesh dim
//     "dp_shard": the split factor must be the product of ...`.
absl::StatusOr<std::vector<Placement>> CheckMatrixPlacements(
    absl::string_view param,
    const google::protobuf::RepeatedPtrField<std::string>& placements,
    const Mesh& mesh, int tensor_ndim = 2);

// Checks a parameter's global shape: 2-D [rows, cols] or 3-D [experts,
// rows, cols] (an expert stack), every dim >= 1, at most kMaxExperts
// experts and kMaxParamElements elements in all (common/checked_math.h;
// the product is computed with checked int64 arithmetic).
// Errors:
//   InvalidArgument: names the parameter, the shape and the exceeded limit.
absl::Status CheckParamShape(
    absl::string_view param,
    const google::protobuf::RepeatedField<int64_t>& shape);

// Checks a parameter name's size: at most kMaxTensorNameBytes bytes
// (common/checked_math.h; every matrix of the plan copies the name).
// `where` prefixes the message: "" in a job spec, "rank 3: " in a rank's
// manifest.
// Errors:
//   InvalidArgument: names `where`, the name's first 64 bytes and its size,
//     e.g. `rank 3: parameter "aaaa..." has a name of 1048576 bytes; at
//     most 4096 are supported`.
absl::Status CheckParamNameSize(absl::string_view name,
                                absl::string_view where);

// Checks a parameter's sub_mesh (ParamSpec.sub_mesh, ParamManifest.sub_mesh)
// against the mesh and the parameter's parsed placements: every name is a
// mesh dim, every value a coordinate in [0, size), and the placement on
// each named dim is Replicate() (an ownership dim is never sharded or
// gathered across). Returns it with dims in mesh order.
// Errors:
//   InvalidArgument: names the parameter, the dim and the value, e.g.
//     `parameter "layers.7.mlp.w1": pp stage 4 is out of range: mesh dim
//     "pp" has 4 stages (0..3)`, `parameter "w": sub_mesh names mesh dim
//     "ep" but the mesh dp_shard=4 has no such dim`, `parameter "w":
//     placement Shard(0) on mesh dim "pp" ... must be Replicate()`.
absl::StatusOr<SubMesh> CheckSubMesh(
    absl::string_view param,
    const google::protobuf::Map<std::string, int32_t>& sub_mesh,
    const std::vector<Placement>& placements, const Mesh& mesh);

// "pp=1" or "pp=1, ep=3" (mesh dim order); "every rank" when empty.
std::string SubMeshToString(const SubMesh& sub_mesh, const Mesh& mesh);

// A wire sub_mesh as "{ep=3, pp=1}" (names sorted); "{}" when empty.
std::string SubMeshToString(
    const google::protobuf::Map<std::string, int32_t>& sub_mesh);

// A mesh coordinate as "pp=1, tp=0" ("(single device)" for a 0-D mesh).
std::string CoordToString(const Mesh& mesh, const std::vector<int>& coord);

// "[10, 7]" for a shape (the std::vector overload is in common/layout.h).
std::string ShapeToString(
    const google::protobuf::RepeatedField<int64_t>& shape);

// "Shard(0)" for one placement, "[Shard(0), Replicate()]" for several, "[]"
// for none.
std::string PlacementsToString(const std::vector<Placement>& placements);

}  // namespace muon

#endif  // MUON_COMMON_SPEC_H_
