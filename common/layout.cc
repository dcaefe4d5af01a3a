#include "common/layout.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/checked_math.h"
#include "common/status_macros.h"

namespace muon {

std::string Placement::ToString() const {
  switch (kind) {
    case Kind::kReplicate:
      return "Replicate()";
    case Kind::kShard:
      if (split_factor > 1) {
        return absl::StrCat("_StridedShard(dim=", dim, ", sf=", split_factor,
                            ")");
      }
      return absl::StrCat("Shard(", dim, ")");
    case Kind::kPartial:
      return "Partial()";
  }
  return "?";
}

absl::StatusOr<Placement> Placement::Parse(absl::string_view text) {
  absl::string_view t = absl::StripAsciiWhitespace(text);
  if (t == "Replicate()" || t == "Replicate" || t == "R") {
    return Placement::Replicate();
  }
  if (t == "Partial()" || t == "Partial" || t == "P") {
    return Placement::Partial();
  }
  absl::string_view inner = t;
  if ((absl::ConsumePrefix(&inner, "Shard(") ||
       absl::ConsumePrefix(&inner, "S(")) &&
      absl::ConsumeSuffix(&inner, ")")) {
    int d = 0;
    if (absl::SimpleAtoi(inner, &d) && d >= 0) return Placement::Shard(d);
  }
  inner = t;
  if (absl::ConsumePrefix(&inner, "_StridedShard(") &&
      absl::ConsumeSuffix(&inner, ")")) {
    // "dim=0, sf=2" or "0, 2" (torch's repr spells split_factor "sf").
    std::vector<absl::string_view> parts = absl::StrSplit(inner, ',');
    int d = -1, sf = 0;
    if (parts.size() == 2) {
      absl::string_view a = absl::StripAsciiWhitespace(parts[0]);
      absl::string_view b = absl::StripAsciiWhitespace(parts[1]);
      absl::ConsumePrefix(&a, "dim=");
      if (!absl::ConsumePrefix(&b, "sf=")) {
        absl::ConsumePrefix(&b, "split_factor=");
      }
      if (absl::SimpleAtoi(a, &d) && absl::SimpleAtoi(b, &sf) && d >= 0 &&
          sf >= 1 && sf <= kMaxWorldSize) {
        return Placement::StridedShard(d, sf);
      }
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown placement \"", text,
      "\": expected Replicate(), Shard(d), _StridedShard(dim=d, sf=k) or "
      "Partial()"));
}

Mesh Mesh::OneDim(int world_size, const std::string& name) {
  return Mesh{{name}, {world_size}};
}

int Mesh::world_size() const {
  // Checked: a mesh whose product overflows (3 x 1431655766) must not wrap
  // into a small world; Validate rejects it.
  std::optional<int64_t> w = CheckedProduct(sizes, kMaxWorldSize);
  return w.has_value() ? static_cast<int>(*w) : -1;
}

std::vector<int> Mesh::Coord(int rank) const {
  std::vector<int> coord(sizes.size());
  for (int d = ndim() - 1; d >= 0; --d) {
    coord[d] = rank % sizes[d];
    rank /= sizes[d];
  }
  return coord;
}

int Mesh::RankOf(const std::vector<int>& coord) const {
  int rank = 0;
  for (int d = 0; d < ndim(); ++d) rank = rank * sizes[d] + coord[d];
  return rank;
}

int Mesh::DimIndex(absl::string_view name) const {
  for (int d = 0; d < ndim(); ++d) {
    if (names[d] == name) return d;
  }
  return -1;
}

std::string Mesh::ToString() const {
  std::vector<std::string> parts;
  for (int d = 0; d < ndim(); ++d) {
    parts.push_back(absl::StrCat(names[d], "=", sizes[d]));
  }
  return parts.empty() ? "(single device)" : absl::StrJoin(parts, " x ");
}

absl::Status Mesh::Validate() const {
  if (names.size() != sizes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mesh has ", names.size(), " names but ", sizes.size(), " sizes"));
  }
  if (ndim() > kMaxMeshDims) {
    return absl::InvalidArgumentError(
        absl::StrCat("mesh ", ToString(), " has ", ndim(), " dims; at most ",
                     kMaxMeshDims, " are supported"));
  }
  std::set<std::string> seen;
  for (int d = 0; d < ndim(); ++d) {
    if (names[d].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh dim ", d, " has an empty name"));
    }
    if (!seen.insert(names[d]).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh dim name \"", names[d], "\" appears twice"));
    }
    if (sizes[d] < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mesh dim \"", names[d], "\" has size ", sizes[d], "; must be >= 1"));
    }
  }
  if (world_size() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mesh ", ToString(), " has more than ", kMaxWorldSize,
        " ranks (the product of its sizes is ",
        CheckedProduct(sizes).has_value() ? absl::StrCat(*CheckedProduct(sizes))
                                          : std::string("beyond int64"),
        "); the world size must be at most ", kMaxWorldSize));
  }
  return absl::OkStatus();
}

Range ChunkRange(int64_t n, int64_t parts, int64_t index) {
  // ceil(n / parts) without n + parts - 1, which overflows near INT64_MAX.
  const int64_t chunk = n / parts + (n % parts != 0 ? 1 : 0);
  // min(i * chunk, n) without forming i * chunk when it exceeds n (the
  // last chunk's end, 2 x 2^62 for n = INT64_MAX over 2, overflows):
  // i * chunk <= n exactly when i <= n / chunk.
  auto bound = [n, chunk](int64_t i) {
    return chunk == 0 || i <= n / chunk ? std::min(i * chunk, n) : n;
  };
  return Range{bound(index), bound(index + 1)};
}

absl::StatusOr<Box> LocalBox(int64_t rows, int64_t cols,
                             const std::vector<Placement>& placements,
                             const Mesh& mesh, const std::vector<int>& coord) {
  absl::StatusOr<std::vector<Range>> ranges =
      LocalRanges({rows, cols}, placements, mesh, coord);
  if (!ranges.ok()) return ranges.status();
  return Box{(*ranges)[0], (*ranges)[1]};
}

absl::StatusOr<std::vector<Box>> AllBoxes(
    int64_t rows, int64_t cols, const std::vector<Placement>& placements,
    const Mesh& mesh) {
  MUON_RETURN_IF_ERROR(mesh.Validate());
  std::vector<Box> boxes;
  boxes.reserve(mesh.world_size());
  for (int r = 0; r < mesh.world_size(); ++r) {
    absl::StatusOr<Box> box =
        LocalBox(rows, cols, placements, mesh, mesh.Coord(r));
    if (!box.ok()) return box.status();
    boxes.push_back(*box);
  }
  return boxes;
}

bool SubMesh::Contains(const std::vector<int>& coord) const {
  for (size_t i = 0; i < dims.size(); ++i) {
    if (coord[dims[i]] != coords[i]) return false;
  }
  return true;
}

absl::Status CheckStridedShards(const std::vector<Placement>& placements,
                                const Mesh& mesh) {
  for (int d = 0; d < static_cast<int>(placements.size()); ++d) {
    const Placement& p = placements[d];
    if (!p.is_strided()) continue;
    int64_t later = 1;
    for (int e = d + 1; e < static_cast<int>(placements.size()); ++e) {
      const Placement& q = placements[e];
      if (q.is_shard() && !q.is_strided() && q.dim == p.dim) {
        later *= mesh.sizes[e];
      }
    }
    if (later != p.split_factor) {
      return absl::InvalidArgumentError(absl::StrCat(
          p.ToString(), " on mesh dim \"", mesh.names[d],
          "\": the split factor must be the product of the sizes of the later "
          "mesh dims that Shard(",
          p.dim, ") (", later,
          " here), as FSDP2 over tensor parallelism makes it"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Range>> LocalRanges(
    const std::vector<int64_t>& shape, const std::vector<Placement>& placements,
    const Mesh& mesh, const std::vector<int>& coord, const SubMesh& sub_mesh) {
  if (static_cast<int>(placements.size()) != mesh.ndim()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "got ", placements.size(), " placements for a ", mesh.ndim(),
        "-D mesh (", mesh.ToString(), "); need one per mesh dim"));
  }
  std::vector<Range> ranges;
  for (int64_t n : shape) ranges.push_back(Range{0, n});
  MUON_RETURN_IF_ERROR(CheckStridedShards(placements, mesh));
  // Shard(d) in mesh order, then _StridedShard(d, k) in mesh order (they
  // chunk what the later mesh dims left).
  std::vector<int> order;
  for (int d = 0; d < mesh.ndim(); ++d) {
    if (!placements[d].is_strided()) order.push_back(d);
  }
  for (int d = 0; d < mesh.ndim(); ++d) {
    if (placements[d].is_strided()) order.push_back(d);
  }
  for (int d : order) {
    const Placement& p = placements[d];
    if (p.kind == Placement::Kind::kPartial) {
      return absl::InvalidArgumentError(
          absl::StrCat("Partial() placement on mesh dim \"", mesh.names[d],
                       "\" is not supported: reduce the pending sum first "
                       "(e.g. redistribute to Replicate() or Shard(d))"));
    }
    if (p.kind != Placement::Kind::kShard) continue;
    if (p.dim < 0 || p.dim >= static_cast<int>(shape.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("Shard(", p.dim, ") on mesh dim \"", mesh.names[d],
                       "\" is out of range for a ", shape.size(), "-D tensor"));
    }
    Range& r = ranges[p.dim];
    const Range sub = ChunkRange(r.size(), mesh.sizes[d], coord[d]);
    r = Range{r.begin + sub.begin, r.begin + sub.end};
  }
  if (!sub_mesh.Contains(coord)) {
    for (Range& r : ranges) r = Range{0, 0};
  }
  return ranges;
}

absl::Status CheckRowSplits(const std::vector<int64_t>& shape,
                            const std::vector<int64_t>& row_splits) {
  if (row_splits.empty()) return absl::OkStatus();
  const std::string splits =
      absl::StrCat("[", absl::StrJoin(row_splits, ", "), "]");
  if (shape.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("row splits ", splits, " need a 2-D parameter, not [",
                     absl::StrJoin(shape, ", "), "]"));
  }
  if (static_cast<int64_t>(row_splits.size()) > kMaxExperts) {
    return absl::InvalidArgumentError(
        absl::StrCat("row splits: ", row_splits.size(), " blocks (at most ",
                     kMaxExperts, ")"));
  }
  int64_t sum = 0;
  for (int64_t n : row_splits) {
    if (n < 1 || n > shape[0]) {
      return absl::InvalidArgumentError(
          absl::StrCat("row splits ", splits, " hold a block of ", n,
                       " rows (each must be in [1, ", shape[0], "])"));
    }
    sum += n;
  }
  if (sum != shape[0]) {
    return absl::InvalidArgumentError(
        absl::StrCat("row splits ", splits, " sum to ", sum,
                     " rows but the parameter has ", shape[0]));
  }
  return absl::OkStatus();
}

Range RowsInBlock(const Range& rows, int64_t block_begin, int64_t block_end) {
  const int64_t lo = std::max(rows.begin, block_begin);
  const int64_t hi = std::min(rows.end, block_end);
  if (lo >= hi) return Range{0, 0};
  return Range{lo - block_begin, hi - block_begin};
}

namespace {

// ParamMatrices of a 2-D parameter split into row blocks.
absl::StatusOr<std::vector<MatrixBoxes>> RowBlockMatrices(
    const std::vector<int64_t>& shape, const std::vector<Placement>& placements,
    const Mesh& mesh, const SubMesh& sub_mesh,
    const std::vector<int64_t>& row_splits) {
  const int64_t blocks = static_cast<int64_t>(row_splits.size());
  if (!CheckedProduct({blocks, int64_t{mesh.world_size()}}, kMaxMatrixRankBoxes)
           .has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("row splits: ", blocks, " blocks over ", mesh.world_size(),
                     " ranks exceed ", kMaxMatrixRankBoxes, " blocks x ranks"));
  }
  std::vector<std::vector<Box>> boxes(blocks,
                                      std::vector<Box>(mesh.world_size()));
  for (int r = 0; r < mesh.world_size(); ++r) {
    absl::StatusOr<std::vector<Range>> ranges =
        LocalRanges(shape, placements, mesh, mesh.Coord(r), sub_mesh);
    if (!ranges.ok()) return ranges.status();
    const Range cols = (*ranges)[1];
    int64_t begin = 0;
    for (int64_t b = 0; b < blocks; ++b) {
      const Range rows =
          RowsInBlock((*ranges)[0], begin, begin + row_splits[b]);
      if (rows.size() > 0 && cols.size() > 0) boxes[b][r] = Box{rows, cols};
      begin += row_splits[b];
    }
  }
  std::vector<MatrixBoxes> out(blocks);
  for (int64_t b = 0; b < blocks; ++b) {
    out[b].slice = static_cast<int>(b);
    out[b].rows = row_splits[b];
    out[b].cols = shape[1];
    out[b].boxes = BoxList(std::move(boxes[b]));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<MatrixBoxes>> ParamMatrices(
    const std::vector<int64_t>& shape, const std::vector<Placement>& placements,
    const Mesh& mesh, const SubMesh& sub_mesh,
    const std::vector<int64_t>& row_splits) {
  if (shape.size() != 2 && shape.size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("a ", shape.size(),
                     "-D tensor is neither a matrix nor a 3-D expert "
                     "stack"));
  }
  // Every size below is bounded before anything is allocated from it.
  MUON_RETURN_IF_ERROR(mesh.Validate());
  for (int64_t n : shape) {
    if (n < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shape [", absl::StrJoin(shape, ", "), "] has a negative dim"));
    }
  }
  const bool stack = shape.size() == 3;
  const int64_t experts = stack ? shape[0] : 1;
  if (experts > kMaxExperts ||
      !CheckedProduct(shape, kMaxParamElements).has_value() ||
      !CheckedProduct({experts, int64_t{mesh.world_size()}},
                      kMaxMatrixRankBoxes)
           .has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape [", absl::StrJoin(shape, ", "), "] over the mesh ",
                     mesh.ToString(), " exceeds the limits: at most ",
                     kMaxExperts, " experts, ", kMaxParamElements,
                     " elements, ", kMaxMatrixRankBoxes, " experts x ranks"));
  }
  if (!row_splits.empty()) {
    MUON_RETURN_IF_ERROR(CheckRowSplits(shape, row_splits));
    return RowBlockMatrices(shape, placements, mesh, sub_mesh, row_splits);
  }
  std::vector<std::vector<Box>> boxes(experts,
                                      std::vector<Box>(mesh.world_size()));
  for (int r = 0; r < mesh.world_size(); ++r) {
    absl::StatusOr<std::vector<Range>> ranges =
        LocalRanges(shape, placements, mesh, mesh.Coord(r), sub_mesh);
    if (!ranges.ok()) return ranges.status();
    const Range rows = (*ranges)[stack ? 1 : 0];
    const Range cols = (*ranges)[stack ? 2 : 1];
    const Range held = stack ? (*ranges)[0] : Range{0, rows.size() > 0 ? 1 : 0};
    for (int64_t e = held.begin; e < held.end; ++e) {
      boxes[e][r] = Box{rows, cols};
    }
  }
  std::vector<MatrixBoxes> out(experts);
  for (int64_t e = 0; e < experts; ++e) {
    out[e].slice = static_cast<int>(e);
    out[e].rows = shape[stack ? 1 : 0];
    out[e].cols = shape[stack ? 2 : 1];
    // Slices held alike (a stack not split over experts) share one list.
    out[e].boxes = e > 0 && boxes[e] == out[e - 1].boxes.vec()
                       ? out[e - 1].boxes
                       : BoxList(std::move(boxes[e]));
  }
  return out;
}

BoxList::BoxList() {
  static const auto* const kEmpty = new std::shared_ptr<const std::vector<Box>>(
      std::make_shared<const std::vector<Box>>());
  boxes_ = *kEmpty;
}

BoxList::BoxList(std::vector<Box> boxes)
    : boxes_(std::make_shared<const std::vector<Box>>(std::move(boxes))) {}

void CopyRegion(const float* src, const Box& src_holds, float* dst,
                const Box& dst_holds, const Box& region) {
  const int64_t n = region.cols.size();
  if (n <= 0) return;
  const int64_t src_ld = src_holds.cols.size();
  const int64_t dst_ld = dst_holds.cols.size();
  for (int64_t i = region.rows.begin; i < region.rows.end; ++i) {
    const float* s = src + (i - src_holds.rows.begin) * src_ld +
                     (region.cols.begin - src_holds.cols.begin);
    float* d = dst + (i - dst_holds.rows.begin) * dst_ld +
               (region.cols.begin - dst_holds.cols.begin);
    std::memcpy(d, s, n * sizeof(float));
  }
}

std::string ShapeToString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::vector<int64_t> BoxShape(const std::vector<Range>& box) {
  std::vector<int64_t> sizes;
  sizes.reserve(box.size());
  for (const Range& r : box) sizes.push_back(r.size());
  return sizes;
}

int64_t BoxNumel(const std::vector<Range>& box) {
  int64_t n = 1;
  for (const Range& r : box) n *= r.size();
  return n;
}

std::string BoxToString(const std::vector<Range>& box) {
  std::vector<std::string> parts;
  parts.reserve(box.size());
  for (const Range& r : box) parts.push_back(absl::StrCat(r.begin, ":", r.end));
  return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
}

bool IntersectBoxes(const std::vector<Range>& a, const std::vector<Range>& b,
                    std::vector<Range>* out) {
  out->resize(a.size());
  for (size_t d = 0; d < a.size(); ++d) {
    (*out)[d].begin = std::max(a[d].begin, b[d].begin);
    (*out)[d].end = std::min(a[d].end, b[d].end);
    if ((*out)[d].begin >= (*out)[d].end) return false;
  }
  return true;
}

void SubtractBox(const std::vector<Range>& u, const std::vector<Range>& i,
                 std::vector<std::vector<Range>>* out) {
  std::vector<Range> rest = u;
  for (size_t d = 0; d < u.size(); ++d) {
    if (rest[d].begin < i[d].begin) {
      std::vector<Range> piece = rest;
      piece[d] = {rest[d].begin, i[d].begin};
      out->push_back(std::move(piece));
    }
    if (i[d].end < rest[d].end) {
      std::vector<Range> piece = rest;
      piece[d] = {i[d].end, rest[d].end};
      out->push_back(std::move(piece));
    }
    rest[d] = i[d];
  }
}

}  // namespace muon
