// Sharded checkpoints of fp32 tensors, one file per rank, readable under
// any other layout (resharding on load), in the vocabulary of
// torch.distributed.checkpoint: every rank saves the shard it holds of each
// tensor, tagged with the tensor's global shape, placements and the box of
// global indices the shard covers; a reader asks for any box of a tensor and
// gets it assembled from the saved shards that overlap it.
//
// On disk, a checkpoint directory DIR holds
//   DIR/metadata.json              (written once, by one rank)
//   DIR/rank_<r>.safetensors       (r = 0 .. world_size-1, one per rank)
// and nothing else is read. Each rank file is a safetensors file exactly as
// https://github.com/huggingface/safetensors specifies: an 8-byte
// little-endian uint64 header length N, N bytes of JSON header (padded with
// spaces so the data starts 8-byte aligned), then the raw little-endian
// data, tensors packed back to back in the order given:
//   {"__metadata__": {"format": "muon-checkpoint", "format_version": "1",
//                     "rank": "1", "world_size": "4", "step": "100",
//                     "plan_hash": "...",
//                     "<name>.global_shape": "[512,784]",
//                     "<name>.offsets": "[128,0]",
//                     "<name>.placements": "[\"Shard(0)\"]", ...},
//    "<name>": {"dtype": "F32", "shape": [128,784],
//               "data_offsets": [0, 401408]}, ...}
// (data_offsets are bytes from the start of the data section; offsets are
// the global index of the shard's first element per dim). metadata.json is
//   {"format": "muon-checkpoint", "format_version": 1, "world_size": 4,
//    "mesh": {"names": ["dp_shard"], "sizes": [4]}, "plan_hash": "...",
//    "step": 100,
//    "tensors": {"<name>": {"global_shape": [512,784],
//                           "placements": ["Shard(0)"]}, ...}}
//
// Writing: every rank calls WriteCheckpointShard for its own file and one
// rank (rank 0 by convention) calls WriteCheckpointMetadata; each file is
// written to a temporary name in DIR, fsync'ed and renamed into place, so a
// reader sees a file whole or not at all. The caller synchronizes the ranks
// (e.g. a barrier) before anyone opens the checkpoint.
//
// Reading: CheckpointReader::Open reads metadata.json and every rank file's
// header (never the data) and checks all of it before trusting any of it;
// ReadRegion then preads exactly the bytes a requested box needs.
//
// Tensor names are data, never paths: file names are only the ones above.
// Host byte order must be little-endian (checked at compile time).
#ifndef MUON_CHECKPOINT_CHECKPOINT_H_
#define MUON_CHECKPOINT_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/layout.h"

namespace muon {

// Version written to, and the only version accepted from, checkpoints.
inline constexpr int kCheckpointFormatVersion = 1;
// Value of "format" in metadata.json and in every rank file's
// __metadata__.
inline constexpr char kCheckpointFormat[] = "muon-checkpoint";
// Largest safetensors header (and metadata.json) accepted, in bytes; the
// writer refuses to produce a larger one.
inline constexpr int64_t kCheckpointMaxHeaderBytes = int64_t{100} << 20;
// Largest step count a checkpoint (or a state_dict) may carry: 2^62, so
// that the counter a step increments never overflows int64.
inline constexpr int64_t kMaxCheckpointStep = int64_t{1} << 62;

// What a checkpoint says about the job that wrote it.
struct CheckpointMetadata {
  // Format version (kCheckpointFormatVersion when written by this code).
  int format_version = kCheckpointFormatVersion;
  // Number of rank files; must equal mesh.world_size().
  int world_size = 1;
  // Device mesh of the writing job (a 0-D mesh for a single device).
  Mesh mesh;
  // Plan hash of the writing job (opaque; invalid UTF-8 is written as
  // U+FFFD).
  std::string plan_hash;
  // Optimizer step the checkpoint was taken after, in
  // [0, kMaxCheckpointStep].
  int64_t step = 0;
  // The writer's CPU kernel set (kernels::BlasCoreName(), e.g. "SkylakeX
  // (OpenBLAS 0.3.21 ...)"), which with the OpenBLAS version decides the
  // CPU Newton-Schulz bits. Optional in metadata.json ("blas_core"; empty
  // when absent: a job whose Newton-Schulz ran on a GPU, or a checkpoint
  // written before it was recorded).
  std::string blas_core;
};

// One tensor of one rank's shard: an N-d box (N >= 1) of a global fp32
// tensor, held as row-major contiguous local data of shape
// [box[0].size(), ..., box[N-1].size()].
struct ShardTensorView {
  // Tensor name: 1 to 1024 characters of [A-Za-z0-9_.:/-], not
  // "__metadata__". Same on every rank that holds a piece of the tensor.
  std::string name;
  // Shape of the whole (global) tensor, N >= 1 dims, each >= 0.
  std::vector<int64_t> global_shape;
  // DTensor placements, one per mesh dim, in DTensor spelling
  // ("Shard(0)", "Replicate()", ...; see Placement::Parse; Partial() is
  // refused: reduce first). Recorded, in canonical spelling
  // (Placement::ToString), for readers; the box below defines the data.
  std::vector<std::string> placements;
  // Per dim, the global index range [begin, end) this rank holds; may be
  // empty (a rank holding nothing of the tensor).
  std::vector<Range> box;
  // prod(box sizes) floats, row-major. Not owned; may be null when the box
  // is empty.
  const float* data = nullptr;
};

// Writes DIR/rank_<rank>.safetensors holding `tensors` (in that order),
// creating DIR and its parents if needed; atomic (temporary file in DIR,
// fsync, rename). Writes prod(box sizes) * 4 bytes of data per tensor plus
// the header.
// Errors:
//   InvalidArgument: dir empty; rank outside [0, meta.world_size);
//     meta.world_size < 1, meta.step outside [0, kMaxCheckpointStep],
//     meta.mesh invalid or of another
//     world size, meta.format_version != kCheckpointFormatVersion; a tensor
//     with a bad name, a duplicate name, an empty or negative global shape,
//     a box whose rank differs from the shape's or that lies outside the
//     global shape, placements that do not parse or whose count differs from
//     the mesh's ndim, a Shard dim >= the tensor's rank, null data for a
//     non-empty box, a size overflowing int64 bytes, or a header above
//     kCheckpointMaxHeaderBytes (names the tensor and the values).
//   NotFound / PermissionDenied / ResourceExhausted / Internal: creating,
//     writing, syncing or renaming a file failed (ENOENT / EACCES, EPERM,
//     EROFS / ENOSPC, EDQUOT / anything else); names the path and strerror.
absl::Status WriteCheckpointShard(const std::string& dir, int rank,
                                  const CheckpointMetadata& meta,
                                  const std::vector<ShardTensorView>& tensors);

// Writes DIR/metadata.json for the checkpoint (atomic, as above), creating
// DIR if needed. Only name, global_shape and placements of `tensors` are
// used (box and data are ignored), so any rank's list of views, or a list
// built for the purpose, will do. Tensors it does not name (parameters of
// pipeline stages the writing rank does not hold) are described by the rank
// files themselves, which must then agree with each other.
// Errors: as WriteCheckpointShard, without the box/data checks.
absl::Status WriteCheckpointMetadata(
    const std::string& dir, const CheckpointMetadata& meta,
    const std::vector<ShardTensorView>& tensors);

// A checkpoint directory opened for reading, resharding on the fly: any box
// of any saved tensor can be read, whatever layout wrote it.
//
// Lifecycle: Open -> metadata()/tensor_names()/ReadRegion()* -> destroy.
// Holds no open files between calls: each ReadRegion opens the rank files
// it needs and checks that their sizes are still those seen by Open.
// Thread-safety: all methods are const and may be called concurrently.
class CheckpointReader {
 public:
  // One rank's saved piece of a tensor.
  struct SavedShard {
    int rank = 0;
    // Global index range per dim.
    std::vector<Range> box;
    // Bytes from the start of the rank file to the piece's first float.
    int64_t file_offset = 0;
    // prod(box sizes) * 4.
    int64_t bytes = 0;
  };
  // What the checkpoint holds of one tensor.
  struct TensorInfo {
    std::vector<int64_t> global_shape;
    std::vector<std::string> placements;
    // Pieces in ascending rank order (a rank appears at most once; a
    // replicated tensor appears once per rank holding it).
    std::vector<SavedShard> shards;
  };

  // Opens checkpoint directory `dir`: reads metadata.json and the header of
  // every rank_<r>.safetensors, r < world_size (not the data). Checks that
  // each file exists, that the header length is <= file size - 8 and <=
  // kCheckpointMaxHeaderBytes, that the JSON is valid and of the expected
  // types, dtypes are F32, shapes/offsets/global shapes agree with each other
  // and with metadata.json without int64 overflow, data_offsets pack the
  // data section exactly (a truncated file is an error), and that rank,
  // world size, step and plan hash agree across files.
  // Errors (all name the file, and the tensor where there is one):
  //   NotFound: no DIR/metadata.json.
  //   InvalidArgument: "format" is not "muon-checkpoint" (not a checkpoint).
  //   FailedPrecondition: format_version is not kCheckpointFormatVersion.
  //   Unimplemented: a dtype other than F32.
  //   DataLoss: a rank file is missing, truncated or inconsistent; JSON
  //     invalid or fields missing / of the wrong type / out of range.
  //   PermissionDenied / Internal: a file could not be opened or read
  //     (strerror).
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(
      const std::string& dir);

  const std::string& dir() const { return dir_; }
  const CheckpointMetadata& metadata() const { return metadata_; }

  // Names of the saved tensors (those of metadata.json), sorted.
  std::vector<std::string> tensor_names() const;
  // The tensor named `name`, or nullptr. Valid while the reader lives.
  const TensorInfo* FindTensor(const std::string& name) const;
  // Global shape / placements of tensor `name`.
  // Errors: NotFound (no such tensor; names the directory and the name).
  absl::StatusOr<std::vector<int64_t>> GlobalShape(
      const std::string& name) const;
  absl::StatusOr<std::vector<std::string>> Placements(
      const std::string& name) const;

  // Fills `out` (row-major, prod(box sizes) floats, shape [box[0].size(),
  // ..., box[N-1].size()]) with the region `box` (global index ranges per
  // dim) of tensor `name`, whose global shape the caller expects to be
  // `expected_global_shape`. Reads from every saved shard that overlaps the
  // region exactly the bytes it needs (pread at computed offsets, one read
  // per contiguous run: an innermost row segment or larger); each element is
  // read once, from the lowest rank that saved it. An empty box reads
  // nothing (`out` may then be null).
  // Errors (name the file, tensor and expected vs actual values):
  //   NotFound: no tensor `name` (names the directory and the name).
  //   InvalidArgument: global shape differs from `expected_global_shape`;
  //     box rank differs from the shape's or the box lies outside it; null
  //     `out` for a non-empty box.
  //   DataLoss: part of the region is in no saved shard (names the first
  //     uncovered box); a rank file changed size since Open, or a read came
  //     up short.
  //   NotFound / PermissionDenied / Internal: opening or reading a rank
  //     file failed (strerror).
  absl::Status ReadRegion(const std::string& name,
                          const std::vector<int64_t>& expected_global_shape,
                          const std::vector<Range>& box, float* out) const;

  // Human-readable summary (for `muonctl checkpoint inspect`): directory,
  // format version, step, world size, mesh, plan hash, then per tensor its
  // global shape and placements and per saved shard its rank, box and
  // bytes.
  void Describe(std::ostream& out) const;

 private:
  CheckpointReader() = default;

  std::string dir_;
  CheckpointMetadata metadata_;
  std::map<std::string, TensorInfo> tensors_;
  // Size in bytes of rank_<r>.safetensors as seen by Open (index = rank).
  std::vector<int64_t> file_sizes_;
};

}  // namespace muon

#endif  // MUON_CHECKPOINT_CHECKPOINT_H_
