// The buckets of one rank's Muon step, compiled once from the coordinator's
// plan and the rank's matrices: per bucket, the matrices this rank holds a
// part of, their owners, the exchanges of both directions
// (client/exchange_plan.h), the Newton-Schulz batches of the matrices this
// rank owns, and where each matrix's buffers lie in a bucket slot. Pure
// layout math: no device memory and no communication. The step executor
// (client/step_executor.h) allocates the slots and runs the step over them.
//
// A bucket's slot (float32 elements from the slot's start):
//   1. per matrix of the bucket, in plan order: this rank's box of U (only
//      with BucketLayoutOptions::form_update), then its box of O;
//   2. per owned matrix this rank holds whole, in plan order, its full U,
//      only for a custom gather or the bf16 exchange (otherwise it
//      orthogonalizes straight from its box of U into its box of O);
//   3. per group of the other owned matrices (same [rows, cols], in order
//      of first appearance): the group's full U one after another, then
//      its full O (one batched Newton-Schulz call serves the group), then,
//      with row state, each matrix's full row state (rows floats) unless
//      this rank holds all of its rows.
#ifndef MUON_CLIENT_BUCKET_LAYOUT_H_
#define MUON_CLIENT_BUCKET_LAYOUT_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "client/exchange_plan.h"
#include "common/layout.h"
#include "muon/v1/coordinator.pb.h"

namespace muon {

// One matrix this rank knows (a 2-D parameter, or one expert slice of a
// 3-D stack), as seen from this rank.
struct MatrixGeometry {
  std::string param;    // parameter name (plan's MatrixPlan.param)
  int param_index = 0;  // index in the optimizer's parameter list
  int slice = 0;        // expert index (0 for 2-D)
  int64_t rows = 0;     // global [rows, cols] of the matrix
  int64_t cols = 0;
  // Offset, in elements, of this rank's part of the matrix inside the
  // parameter's local data (non-zero for later expert slices).
  int64_t offset = 0;
  // Offset, in rows, of this rank's rows of the matrix inside the
  // parameter's local row state (NorMuon's second moment: one float per
  // local row, expert slices one after another).
  int64_t row_offset = 0;
  std::vector<Box> boxes;  // box held by each rank (index = rank)
};

// The whole matrix, [0, rows) x [0, cols).
Box FullBox(const MatrixGeometry& g);
// Whether `rank` holds all of g (boxes[rank] is the full box), or all of
// its rows (RowStateBox of its box is the full column). Requires
// 0 <= rank < g.boxes.size().
bool HoldsWhole(const MatrixGeometry& g, int rank);
bool HoldsAllRows(const MatrixGeometry& g, int rank);

// What the slots must make room for, from the executor's options.
struct BucketLayoutOptions {
  // This rank's box of U is formed in the slot (Nesterov, or a bf16
  // momentum buffer widened), not read in place.
  bool form_update = false;
  // A custom gather function writes an owner's full U into the slot, even
  // for a matrix the owner holds whole.
  bool custom_gather = false;
  // The exchanges carry bf16, two values per 4-byte word (the split sizes
  // are counted in words); the owner rounds its full U in the slot.
  bool bf16_exchange = false;
  // An owner transform's row state (one float per row) travels with each
  // matrix: to the owner with the gather and back with the redistribute.
  bool row_state = false;
  // Same-shape owned matrices in the slot share one Newton-Schulz call (a
  // strided-batched cuBLAS GEMM on CUDA). False: one call per matrix, as
  // one device holding every matrix whole makes them. cuBLAS promises the
  // same bits only for the same batch count, so CUDA's fp32 mode, whose
  // results are bitwise one device's, runs one matrix per call (the slot
  // placement is the same either way).
  bool batch_same_shape = true;
};

// Newton-Schulz calls of one bucket on this rank: `count` matrices of one
// shape starting at local matrix `first`. In the slot (`in_slot`), the
// group's full U and full O each lie one after another, so one batched call
// serves the group (strided-batched cuBLAS on CUDA); a matrix this rank
// holds whole is its own call on its own buffers.
struct NsBatch {
  int first = 0;
  int count = 1;
  bool in_slot = false;
  std::vector<int> members;  // the local matrices, in slot order
};

// One bucket of the plan, from this rank's side.
struct LocalBucket {
  int index = 0;              // the plan's Bucket.index
  std::vector<int> matrices;  // local matrix ids in plan order (known ones)
  std::vector<int> owners;    // owner of each
  std::vector<int> owned;     // local matrices this rank orthogonalizes
  std::vector<NsBatch> ns_batches;  // the owned matrices, grouped
  Exchange gather;                  // shards of U -> owners' full U
  Exchange redistribute;            // owners' full O -> holders' shards
};

// Largest sizes over the buckets, for the preallocated buffers.
struct BufferSizes {
  // Elements (float32 words; bf16 exchange: words of two values) of the
  // largest send and receive of one all-to-all(v), and of the largest
  // bucket slot.
  int64_t max_send = 0;
  int64_t max_recv = 0;
  int64_t max_bucket_elems = 0;
  // The distinct [rows, cols] of the matrices this rank orthogonalizes,
  // with the largest Newton-Schulz batch of each: the kernels reserve for
  // each (their buffers grow to the largest need of each, not to max
  // rows x max cols: 4096x11008 and 11008x4096 together need 4096 x
  // 11008, not 11008^2).
  std::map<std::pair<int64_t, int64_t>, int64_t> owned_shapes;
};

class BucketLayout {
 public:
  // Compiles the buckets of `plan` (in its order) for `rank` of a world of
  // `world_size`, over this rank's matrices `geometry` (each with
  // world_size boxes; the caller checks it; 0 <= rank < world_size). The
  // plan may hold matrices
  // this rank does not have (other pipeline stages): they are skipped, and
  // their buckets keep zero split sizes.
  // Errors: InvalidArgument when a bucket's index is not its position in
  // the plan, a bucket names a matrix outside the plan, a plan matrix's
  // owner is out of range, holds no shard of it, or has
  // another shape than this rank's, or the plan does not cover every local
  // matrix exactly once (names the matrix and parameter).
  static absl::StatusOr<BucketLayout> Compile(
      int rank, int world_size, const v1::Plan& plan,
      const std::vector<MatrixGeometry>& geometry,
      const BucketLayoutOptions& options);

  const std::vector<LocalBucket>& buckets() const { return buckets_; }
  const BufferSizes& sizes() const { return sizes_; }
  // Elements of one bucket slot (the largest bucket's).
  int64_t slot_elems() const { return sizes_.max_bucket_elems; }
  // Local matrix m's position in buckets().
  int bucket_of(int m) const { return bucket_of_[m]; }
  // Offsets, in elements from its bucket slot's start, of local matrix m's
  // buffers (-1: not in the slot): the owner's full U and O, this rank's
  // box of U (meaningful only with form_update; otherwise equal to
  // local_o_offset) and of O, and the owner's full row state.
  int64_t full_u_offset(int m) const { return u_offset_[m]; }
  int64_t full_o_offset(int m) const { return o_offset_[m]; }
  int64_t local_u_offset(int m) const { return local_u_offset_[m]; }
  int64_t local_o_offset(int m) const { return local_o_offset_[m]; }
  int64_t row_state_offset(int m) const { return v_offset_[m]; }

 private:
  BucketLayout(int rank, int world_size, const BucketLayoutOptions& options)
      : rank_(rank), world_size_(world_size), options_(options) {}

  // Compile's steps. CompileBucket appends bucket `bp` as this rank sees
  // it (local_id: a matrix's local id by (param, slice)) and counts each
  // local matrix it names in *seen. Errors: InvalidArgument (an index
  // other than its position, a matrix outside the plan; CheckPlanMatrix's).
  absl::Status CompileBucket(
      const v1::Plan& plan, const v1::Bucket& bp,
      const std::vector<MatrixGeometry>& geometry,
      const std::map<std::pair<std::string, int>, int>& local_id,
      std::vector<int>* seen);
  absl::Status CheckPlanMatrix(const v1::Plan& plan, int plan_index,
                               const MatrixGeometry& g) const;
  // Adds local matrix m, orthogonalized by `owner`, to bucket *b (which
  // becomes buckets_[buckets_.size()]): its shards in the gather and the
  // redistribute, and its row state with them.
  void AddToBucket(const std::vector<MatrixGeometry>& geometry, int m,
                   int owner, LocalBucket* b);
  // Lays out b's slot (the file comment's order), fills b->ns_batches and
  // sizes_.owned_shapes; returns the slot's elements.
  int64_t PlaceInSlot(const std::vector<MatrixGeometry>& geometry,
                      LocalBucket* b);
  // PlaceInSlot's part 1; returns its elements.
  int64_t PlaceLocalBoxes(const std::vector<MatrixGeometry>& geometry,
                          const LocalBucket& b);
  // PlaceInSlot's part 2 (*elems grows), and the groups of part 3, by
  // shape in order of first appearance.
  std::vector<std::vector<int>> GroupOwnedByShape(
      const std::vector<MatrixGeometry>& geometry, LocalBucket* b,
      int64_t* elems);

  int rank_;
  int world_size_;
  BucketLayoutOptions options_;
  std::vector<LocalBucket> buckets_;
  BufferSizes sizes_;
  std::vector<int> bucket_of_;  // per local matrix
  std::vector<int64_t> u_offset_;
  std::vector<int64_t> o_offset_;
  std::vector<int64_t> local_u_offset_;
  std::vector<int64_t> local_o_offset_;
  std::vector<int64_t> v_offset_;
};

}  // namespace muon

#endif  // MUON_CLIENT_BUCKET_LAYOUT_H_
