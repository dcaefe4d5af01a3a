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
//
// Thread-safety: every function here is pure and may be called concurrently.
#ifndef MUON_COMMON_SPEC_H_
#define MUON_COMMON_SPEC_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/layout.h"
#include "google/protobuf/repeated_field.h"
#include "muon/v1/coordinator.pb.h"

namespace muon {

// Parses a job spec from JSON text (protobuf's JSON mapping). Does not
// validate it; see ValidateJobSpec.
// Errors:
//   InvalidArgument: the text is not a JobSpec in JSON; the message carries
//     protobuf's own message (e.g. an unknown field's name).
absl::StatusOr<v1::JobSpec> ParseJobSpecJson(absl::string_view json);

// Reads and parses the job spec file at `path` (no validation).
// Errors:
//   NotFound: the file cannot be opened (names the path).
//   InvalidArgument: the file is not a JobSpec in JSON (names the path and
//     carries protobuf's message).
absl::StatusOr<v1::JobSpec> LoadJobSpec(const std::string& path);

// Serializes a spec to pretty-printed JSON with snake_case field names
// (the same spelling ParseJobSpecJson reads).
std::string JobSpecToJson(const v1::JobSpec& spec);

// Checks a spec: mesh sizes >= 1 with unique non-empty names; each
// parameter has a non-empty unique name, a 2-D shape with dims >= 1, one
// placement per mesh dim, placements that parse, no Partial, and Shard dims
// in {0, 1}.
// Errors:
//   InvalidArgument: the first problem found; the message names the
//     parameter (or mesh dim) and the offending value.
absl::Status ValidateJobSpec(const v1::JobSpec& spec);

// The manifest each rank of the job would send on Join, index = rank:
// rank, world size, mesh, the execution options, and per parameter its name,
// global shape, canonical placements ("Shard(0)", "Replicate()"), dtype
// "float32" and the local shape that rank holds (torch.chunk rule, see
// LocalBox in common/layout.h). Validates the spec first.
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

// Checks a 2-D parameter's placements against the mesh: one per mesh dim,
// each parses, none is Partial, Shard dims are 0 or 1. Returns them parsed.
// Errors:
//   InvalidArgument: names the parameter, the mesh dim and the placement.
absl::StatusOr<std::vector<Placement>> CheckMatrixPlacements(
    absl::string_view param,
    const google::protobuf::RepeatedPtrField<std::string>& placements,
    const Mesh& mesh);

// "[10, 7]" for a shape.
std::string ShapeToString(
    const google::protobuf::RepeatedField<int64_t>& shape);

// "Shard(0)" for one placement, "[Shard(0), Replicate()]" for several, "[]"
// for none.
std::string PlacementsToString(const std::vector<Placement>& placements);

}  // namespace muon

#endif  // MUON_COMMON_SPEC_H_
