// Shard layout math shared by the coordinator, the client and muonctl:
// DTensor placements over a device mesh, torch.chunk shard sizes, and the
// box (row range x column range) of a 2-D matrix that a rank holds.
#ifndef MUON_COMMON_LAYOUT_H_
#define MUON_COMMON_LAYOUT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muon {

// DTensor placement of a tensor on one mesh dim.
struct Placement {
  enum class Kind { kReplicate, kShard, kPartial };
  Kind kind = Kind::kReplicate;
  int dim = 0;  // tensor dim, for kShard only
  // kShard only: 1 for Shard(d); K > 1 for DTensor's _StridedShard(d,
  // split_factor=K), the placement FSDP2 gives its mesh dim when it shards
  // a tensor dim that tensor parallelism (a later mesh dim) already
  // sharded: this mesh dim chunks the tensor dim after the later mesh dims
  // that shard it (whose sizes multiply to K), i.e. FSDP2 chunks the
  // TP-local shard (torch/distributed/tensor/placement_types.py).
  int split_factor = 1;

  static Placement Replicate() { return {Kind::kReplicate, 0}; }
  static Placement Shard(int d) { return {Kind::kShard, d}; }
  static Placement StridedShard(int d, int split_factor) {
    return {Kind::kShard, d, split_factor};
  }
  static Placement Partial() { return {Kind::kPartial, 0}; }
  bool is_shard() const { return kind == Kind::kShard; }
  bool is_strided() const { return kind == Kind::kShard && split_factor > 1; }
  bool is_replicate() const { return kind == Kind::kReplicate; }

  // "Replicate()", "Shard(0)", "_StridedShard(dim=0, sf=2)", "Partial()".
  std::string ToString() const;
  // Parses DTensor spelling: "Replicate()", "Replicate", "R", "Shard(d)",
  // "S(d)", "_StridedShard(dim=d, sf=k)" (also "_StridedShard(d, k)"),
  // "Partial()". Errors: InvalidArgument naming the text.
  static absl::StatusOr<Placement> Parse(absl::string_view text);

  friend bool operator==(const Placement& a, const Placement& b) {
    return a.kind == b.kind &&
           (a.kind != Kind::kShard ||
            (a.dim == b.dim && a.split_factor == b.split_factor));
  }
  friend bool operator!=(const Placement& a, const Placement& b) {
    return !(a == b);
  }
};

// Ordered named mesh dims; ranks laid out row-major (the last dim varies
// fastest), as torch.distributed.DeviceMesh(torch.arange(world).view(...)).
struct Mesh {
  std::vector<std::string> names;
  std::vector<int> sizes;

  // A 1-D mesh of `world_size` ranks named `name`.
  static Mesh OneDim(int world_size, const std::string& name = "dp_shard");
  int ndim() const { return static_cast<int>(sizes.size()); }
  // Product of the sizes (1 for a 0-D mesh), computed with checked
  // arithmetic; -1 when it exceeds kMaxWorldSize (common/checked_math.h)
  // or overflows. Validate rejects such a mesh.
  int world_size() const;
  // Coordinate of `rank`; requires 0 <= rank < world_size().
  std::vector<int> Coord(int rank) const;
  // Inverse of Coord.
  int RankOf(const std::vector<int>& coord) const;
  // Index of the dim named `name`, or -1.
  int DimIndex(absl::string_view name) const;
  // "dp_shard=4" or "tp=2 x dp_shard=4".
  std::string ToString() const;
  // Errors: InvalidArgument when a size is < 1, names repeat or are empty,
  // there are more than kMaxMeshDims dims, or the world size exceeds
  // kMaxWorldSize (the message names the mesh and the product).
  absl::Status Validate() const;

  friend bool operator==(const Mesh& a, const Mesh& b) {
    return a.names == b.names && a.sizes == b.sizes;
  }
  friend bool operator!=(const Mesh& a, const Mesh& b) { return !(a == b); }
};

// Half-open index range [begin, end).
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  friend bool operator==(const Range& a, const Range& b) {
    return a.begin == b.begin && a.end == b.end;
  }
};

// "[10, 7]" for a shape.
std::string ShapeToString(const std::vector<int64_t>& shape);

// N-D boxes: one Range per tensor dim, the global indices a shard covers
// (a checkpoint's saved shards, a region read back).
//
// The sizes per dim of `box`.
std::vector<int64_t> BoxShape(const std::vector<Range>& box);
// Elements of `box` (1 for 0 dims). Call only on boxes checked against a
// shape whose element count fits int64.
int64_t BoxNumel(const std::vector<Range>& box);
// "[0:4, 2:6]".
std::string BoxToString(const std::vector<Range>& box);
// a ∩ b into `out` (same dims); false when it is empty.
bool IntersectBoxes(const std::vector<Range>& a, const std::vector<Range>& b,
                    std::vector<Range>* out);
// Appends u \ i (i inside u) to `out` as at most 2 x dims disjoint boxes.
void SubtractBox(const std::vector<Range>& u, const std::vector<Range>& i,
                 std::vector<std::vector<Range>>* out);

// Chunk `index` of a dimension of `n` elements split in `parts`, as
// torch.chunk / DTensor Shard: chunk = ceil(n / parts); chunk i covers
// [min(i*chunk, n), min((i+1)*chunk, n)), so the last chunks may be smaller
// or empty. Requires n >= 0, parts >= 1 and 0 <= index < parts; exact for
// every such int64 (no intermediate overflows, n = INT64_MAX included).
Range ChunkRange(int64_t n, int64_t parts, int64_t index);

// The part of a 2-D [rows, cols] matrix one rank holds, row-major.
struct Box {
  Range rows;
  Range cols;
  int64_t numel() const { return rows.size() * cols.size(); }
  bool empty() const { return numel() == 0; }
  friend bool operator==(const Box& a, const Box& b) {
    return a.rows == b.rows && a.cols == b.cols;
  }
  // For absl::Hash (absl::flat_hash_set<Box>).
  template <typename H>
  friend H AbslHashValue(H h, const Box& b) {
    return H::combine(std::move(h), b.rows.begin, b.rows.end, b.cols.begin,
                      b.cols.end);
  }
};

// The boxes of one matrix, index = rank, behind a shared immutable vector:
// matrices with the same shape, placements and sub-mesh share one list, so a
// job of M matrices over R ranks keeps (distinct layouts x R) boxes instead
// of M x R. Reads like a const std::vector<Box>.
class BoxList {
 public:
  using value_type = Box;
  using const_iterator = std::vector<Box>::const_iterator;
  using iterator = const_iterator;
  using size_type = size_t;

  BoxList();
  BoxList(std::vector<Box> boxes);  // NOLINT: implicit, as a vector
  const Box& operator[](size_t rank) const { return (*boxes_)[rank]; }
  size_t size() const { return boxes_->size(); }
  bool empty() const { return boxes_->empty(); }
  std::vector<Box>::const_iterator begin() const { return boxes_->begin(); }
  std::vector<Box>::const_iterator end() const { return boxes_->end(); }
  const std::vector<Box>& vec() const { return *boxes_; }
  operator const std::vector<Box>&() const { return *boxes_; }  // NOLINT
  // Equal for lists sharing storage (a cache key for per-layout results).
  const void* id() const { return boxes_.get(); }

 private:
  std::shared_ptr<const std::vector<Box>> boxes_;
};

// The box of a [rows, cols] matrix held at mesh coordinate `coord` under
// `placements` (one per mesh dim). Several mesh dims sharding the same
// tensor dim nest left to right (DTensor's default order).
// Errors: InvalidArgument when placements.size() != mesh.ndim(), a Shard dim
// is not 0 or 1, or a placement is Partial.
absl::StatusOr<Box> LocalBox(int64_t rows, int64_t cols,
                             const std::vector<Placement>& placements,
                             const Mesh& mesh, const std::vector<int>& coord);

// Boxes of every rank (index = rank) for the matrix; see LocalBox.
// Errors: also InvalidArgument when the mesh is invalid (Mesh::Validate).
absl::StatusOr<std::vector<Box>> AllBoxes(
    int64_t rows, int64_t cols, const std::vector<Placement>& placements,
    const Mesh& mesh);

// Ownership restriction of a parameter (pp stage, ep owner): it lives only
// on ranks whose coordinate on mesh dim dims[i] equals coords[i]. Empty =
// every rank.
struct SubMesh {
  std::vector<int> dims;
  std::vector<int> coords;
  bool Contains(const std::vector<int>& coord) const;
  bool empty() const { return dims.empty(); }
};

// Checks every _StridedShard(d, k) in `placements` (one per mesh dim): k
// must be the product of the sizes of the later mesh dims that Shard(d)
// (FSDP2 over tensor parallelism's placement; the only use supported).
// Errors: InvalidArgument naming the placement, mesh dim and expected k.
absl::Status CheckStridedShards(const std::vector<Placement>& placements,
                                const Mesh& mesh);

// Ranges of every tensor dim held at mesh coordinate `coord` for a tensor
// of `shape` (any rank >= 1) under `placements` (one per mesh dim); all
// ranges empty when `coord` lies outside `sub_mesh`. Shard(d) needs
// d < shape.size(); nesting as LocalBox.
// Errors: InvalidArgument (placements count, Shard dim out of range,
// Partial).
absl::StatusOr<std::vector<Range>> LocalRanges(
    const std::vector<int64_t>& shape, const std::vector<Placement>& placements,
    const Mesh& mesh, const std::vector<int>& coord,
    const SubMesh& sub_mesh = {});

// One matrix of a parameter, as the planner and the step executor see it:
// a 2-D parameter is one matrix; a 3-D expert stack [experts, rows, cols]
// is one matrix per expert slice.
struct MatrixBoxes {
  int slice = 0;  // expert index, or row block index (0 for 2-D)
  int64_t rows = 0;
  int64_t cols = 0;
  // Box of the slice each rank holds (index = rank); empty when the rank
  // holds none of it (outside the sub-mesh, or another expert shard).
  // Slices with the same boxes share one list.
  BoxList boxes;
};

// The matrices of a parameter of `shape` ([rows, cols] or [experts, rows,
// cols]) with each rank's box. For 3-D stacks, Shard(0) splits experts
// (expert parallelism: a slice lives whole on its ep group and is never
// gathered across ep); Shard(1)/Shard(2) split rows/cols.
// Errors: InvalidArgument (not 2-D or 3-D; an invalid mesh; a negative
// dim; more than kMaxExperts experts, kMaxParamElements elements or
// kMaxMatrixRankBoxes experts x ranks, common/checked_math.h; see
// LocalRanges). Nothing is allocated before these checks.
// `row_splits` (2-D only; empty = none): the matrix is blocks of rows,
// block b rows [sum of the splits before b, + row_splits[b]), each its own
// matrix (slice b, [row_splits[b], cols]) with each rank's box the part of
// its rows inside the block, in the block's coordinates: per-head or fused
// QKV orthogonalization (microsoft/dion's num_heads and split_sizes).
// Errors also: InvalidArgument when the splits do not sum to the rows, one
// is < 1, there are more than kMaxExperts, or the shape is 3-D.
absl::StatusOr<std::vector<MatrixBoxes>> ParamMatrices(
    const std::vector<int64_t>& shape, const std::vector<Placement>& placements,
    const Mesh& mesh, const SubMesh& sub_mesh = {},
    const std::vector<int64_t>& row_splits = {});

// Checks `row_splits` against a parameter `shape` (as ParamMatrices).
absl::Status CheckRowSplits(const std::vector<int64_t>& shape,
                            const std::vector<int64_t>& row_splits);

// The rows [begin, end) of `rows` inside block [block_begin, block_end),
// in the block's coordinates (empty when they do not meet).
Range RowsInBlock(const Range& rows, int64_t block_begin, int64_t block_end);

// Copies box `src_box` of a row-major matrix stored as `src` (whose own box
// is `src_holds`) into `dst` laid out as box `dst_holds`, for the overlap
// region `region` (which both must contain). Pure index math, no allocation.
void CopyRegion(const float* src, const Box& src_holds, float* dst,
                const Box& dst_holds, const Box& region);

}  // namespace muon

#endif  // MUON_COMMON_LAYOUT_H_
