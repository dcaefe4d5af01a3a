// The GEMM sequence of one Newton-Schulz iteration on a column-major BLAS
// (cuBLAS), as data: which buffers, transposes, sizes, leading dimensions,
// batch strides and alpha/beta. Plain header-only C++ shared by the CUDA
// implementation (kernels/cuda/newton_schulz_cuda.cu) and a CPU test that
// executes the plan with a column-major GEMM simulator
// (tests/kernels/ns_gemm_plan_test.cc), so the layout logic is checked
// without a GPU.
//
// Layout. U, X and O are row-major [rows, cols]; a column-major BLAS reads
// such a buffer as its transpose. With m = min(rows, cols), n = max:
//   wide (rows <= cols): the buffer is Xc = X^T (n x m, ld n):
//     A  = X X^T          = Xc^T Xc             gemm(T, N, m, m, n)
//     X' = a X + B X  <=> Xc' = a Xc + Xc B^T     gemm(N, T, n, m, m)
//   tall (rows > cols): the buffer is Xc = X (m x n, ld m) (X = U^T):
//     A  = Xc Xc^T                              gemm(N, T, m, m, n)
//     X' = a X + B X                            gemm(N, N, m, n, m)
// and B = b*A + c*A*A is gemm(N, N, m, m, m) on the m x m buffers either
// way (beta = b on a copy of A; X' likewise starts as a copy of X with
// beta = a). The result lands in the input's layout: no transposes.
#ifndef MUON_KERNELS_CUDA_NS_GEMM_PLAN_H_
#define MUON_KERNELS_CUDA_NS_GEMM_PLAN_H_

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace muon {
namespace kernels {
namespace cuda {

// The buffers of the iteration (each a strided batch of matrices).
enum class NsBuffer {
  kX,      // Current X: batch * rows*cols elements.
  kXNext,  // Next X (holds a copy of X before the update GEMM).
  kGram,   // A (Gram: R): batch * m*m.
  kPoly,   // B (holds a copy of A before the polynomial GEMM); Gram: Z.
  kQ,      // Gram only: the accumulated polynomial Q, batch * m*m.
  kTmp,    // Gram only: the product Q Z or R Z, batch * m*m.
};

// C = alpha * op(A) op(B) + beta * C, column-major, `transpose_*` true for
// op = transpose; buffer i of the batch at base + i * stride (elements).
struct NsGemm {
  bool transpose_a;
  bool transpose_b;
  int m;
  int n;
  int k;
  double alpha;
  NsBuffer a;
  int lda;
  int64_t stride_a;
  NsBuffer b;
  int ldb;
  int64_t stride_b;
  double beta;
  NsBuffer c;
  int ldc;
  int64_t stride_c;
  // Where each operand starts inside its buffer's matrix (elements; a
  // tile of a symmetric product, UpperTileGemms).
  int64_t offset_a = 0;
  int64_t offset_b = 0;
  int64_t offset_c = 0;
};

// One iteration: gram (A = X X^T), then copy kGram -> kPoly and poly
// (B = b*A + c*A*A), then copy kX -> kXNext and update (X' = a*X + B*X);
// the caller then swaps kX and kXNext.
struct NsStepPlan {
  NsGemm gram;
  NsGemm poly;
  NsGemm update;
};

// The plan for a [rows, cols] matrix (rows, cols in [1, INT_MAX]) and the
// iteration's (a, b, c).
inline NsStepPlan PlanNewtonSchulzStep(int64_t rows, int64_t cols,
                                       const std::array<double, 3>& abc) {
  const bool tall = rows > cols;
  const int m = static_cast<int>(std::min(rows, cols));
  const int n = static_cast<int>(std::max(rows, cols));
  const int64_t mn = rows * cols;
  const int64_t mm = static_cast<int64_t>(m) * m;
  NsStepPlan plan;
  // clang-format off
  // Each: {transpose_a, transpose_b, m, n, k, alpha,
  //        A, lda, stride_a,   B, ldb, stride_b,   beta, C, ldc, stride_c}.
  if (tall) {
    plan.gram   = {false, true,  m, m, n, 1.0,
                   NsBuffer::kX,    m, mn,  NsBuffer::kX,    m, mn,
                   0.0,    NsBuffer::kGram,  m, mm};
    plan.update = {false, false, m, n, m, 1.0,
                   NsBuffer::kPoly, m, mm,  NsBuffer::kX,    m, mn,
                   abc[0], NsBuffer::kXNext, m, mn};
  } else {
    plan.gram   = {true,  false, m, m, n, 1.0,
                   NsBuffer::kX,    n, mn,  NsBuffer::kX,    n, mn,
                   0.0,    NsBuffer::kGram,  m, mm};
    plan.update = {false, true,  n, m, m, 1.0,
                   NsBuffer::kX,    n, mn,  NsBuffer::kPoly, m, mm,
                   abc[0], NsBuffer::kXNext, n, mn};
  }
  plan.poly     = {false, false, m, m, m, abc[2],
                   NsBuffer::kGram, m, mm,  NsBuffer::kGram, m, mm,
                   abc[1], NsBuffer::kPoly,  m, mm};
  // clang-format on
  return plan;
}

// Gram Newton-Schulz (Dao AI Lab, "Gram Newton-Schulz: A Fast,
// Hardware-Aware Newton-Schulz Algorithm for Muon", 2026; the CPU
// kernels::NewtonSchulz with NewtonSchulzMethod::kGram). With
// Z_i = a I + b R_i + c R_i^2, R_i = X_i X_i^T, all Z_i commute with R_i, so
// per restart block of L iterations:
//   R = X X^T;                                  `gram` (kX -> kGram)
//   for j < L:
//     Z = b R + c R R, then Z += a I;           copy kGram -> kPoly, `square`,
//                                               a diagonal kernel
//     Q = Z (j = 0, a copy) or Q = Q Z;          `accumulate` (-> kTmp, then
//                                               kTmp and kQ swap)
//     j < L-1: R = Z (R Z);                      `right` (-> kTmp), `left`
//   X' = Q X;                                   `apply` (kQ, kX -> kXNext)
// The m x m matrices are column-major buffers of the matrices themselves
// (the products of symmetric and commuting matrices need no transposes);
// only `gram` and `apply` depend on the layout of X, as in NsStepPlan.
struct NsGramPlan {
  NsGemm gram;
  NsGemm square;
  NsGemm accumulate;
  NsGemm right;
  NsGemm left;
  NsGemm apply;
};

// The Gram plan for a [rows, cols] matrix (rows, cols in [1, INT_MAX]) and
// one iteration's (a, b, c) (`square` carries b and c; a is added to Z's
// diagonal by the caller).
inline NsGramPlan PlanGramNewtonSchulz(int64_t rows, int64_t cols,
                                       const std::array<double, 3>& abc) {
  const NsStepPlan standard = PlanNewtonSchulzStep(rows, cols, abc);
  const bool tall = rows > cols;
  const int m = static_cast<int>(std::min(rows, cols));
  const int n = static_cast<int>(std::max(rows, cols));
  const int64_t mn = rows * cols;
  const int64_t mm = static_cast<int64_t>(m) * m;
  NsGramPlan plan;
  plan.gram = standard.gram;
  // clang-format off
  plan.square     = {false, false, m, m, m, abc[2],
                     NsBuffer::kGram, m, mm,  NsBuffer::kGram, m, mm,
                     abc[1], NsBuffer::kPoly, m, mm};
  plan.accumulate = {false, false, m, m, m, 1.0,
                     NsBuffer::kQ,    m, mm,  NsBuffer::kPoly, m, mm,
                     0.0,    NsBuffer::kTmp,  m, mm};
  plan.right      = {false, false, m, m, m, 1.0,
                     NsBuffer::kGram, m, mm,  NsBuffer::kPoly, m, mm,
                     0.0,    NsBuffer::kTmp,  m, mm};
  plan.left       = {false, false, m, m, m, 1.0,
                     NsBuffer::kPoly, m, mm,  NsBuffer::kTmp,  m, mm,
                     0.0,    NsBuffer::kGram, m, mm};
  if (tall) {
    // Xc = X (m x n, ld m): X' = Q X.
    plan.apply    = {false, false, m, n, m, 1.0,
                     NsBuffer::kQ,    m, mm,  NsBuffer::kX,    m, mn,
                     0.0,    NsBuffer::kXNext, m, mn};
  } else {
    // Xc = X^T (n x m, ld n): Xc' = Xc Q^T.
    plan.apply    = {false, true,  n, m, m, 1.0,
                     NsBuffer::kX,    n, mn,  NsBuffer::kQ,    m, mm,
                     0.0,    NsBuffer::kXNext, n, mn};
  }
  // clang-format on
  return plan;
}

// Symmetric products. A = X X^T, and b*A + c*A*A for an A symmetric
// element for element (the standard `poly`; Gram's `square` on R = X X^T,
// the first of a restart block) are symmetric element for element: C_ij
// and C_ji are sums of the same products in the same order. Gram's other
// products (Z R Z, Q Z, and the squares of such R) are symmetric in exact
// arithmetic only (SymmetricProducts::gram_all). Cut the m x m output into
// kSymmetricTiles x kSymmetricTiles tiles (SymmetricTileEdge): the
// tiles on and above the diagonal are GEMMs of their own (36 of 64 for 8
// tiles: 56% of the FLOPs), and every tile below the diagonal is the
// transpose of its mirror (MirrorLowerTiles, a copy). cuBLAS has no bf16
// SYRK; this is the block-triangular product flash-muon's symmetric kernel
// and Dao AI Lab's Gram Newton-Schulz (2026) exploit, with plain GEMMs.
inline constexpr int kSymmetricTiles = 8;
// Below this m the tiles do not pay on an H200 (bf16, 5 iterations,
// batched tiles): a 2048 x 2048 matrix takes 0.57 ms in 4 x 4 tiles
// against 0.47 ms in full GEMMs; at 4096 x 4096 both take 2.98 ms, and
// 4096 x 14336 and 8192 x 8192 gain 13% and 20% (docs/benchmarks.md).
inline constexpr int64_t kSymmetricMinEdge = 4096;
// The most tiles per edge a SymmetricProducts may ask for (136 tile GEMMs).
inline constexpr int kMaxSymmetricTiles = 16;

// How the iteration runs a symmetric product (above).
enum class SymmetricMode {
  kFull,     // One full GEMM.
  kLoop,     // One GEMM per tile on and above the diagonal, in turn.
  kBatched,  // Those tiles as one pointer-array batched GEMM per tile size
             // (cublasGemmBatchedEx): all tiles in one launch, so that small
             // tiles still fill the GPU.
};

struct SymmetricProducts {
  SymmetricMode mode = SymmetricMode::kBatched;
  int tiles = kSymmetricTiles;           // Tiles per edge, [2, 16].
  int64_t min_edge = kSymmetricMinEdge;  // Tiles once m >= min_edge.
  // Gram Newton-Schulz: whether every m x m product runs as a symmetric
  // product (Z = b R + c R R, Q Z, R Z and Z (R Z) are products of
  // symmetric, commuting matrices: symmetric in exact arithmetic; their
  // tiles above the diagonal are computed and mirrored, so the results are
  // symmetric element for element), or only the block's first square (R =
  // X X^T, symmetric element for element), so that the iteration is
  // bitwise the full-GEMM one. On an H200, 4096 x 14336 in bf16 takes
  // 5.34 ms with all against 5.53 ms with the first only, equally near a
  // float64 run (docs/benchmarks.md).
  bool gram_all = true;
  // Whether a product with an m x m output is cut into tiles.
  bool Tiled(int64_t m) const {
    return mode != SymmetricMode::kFull && m >= min_edge;
  }
  // The tile GEMMs of one such product (36 for 8 tiles).
  int TileGemms() const { return tiles * (tiles + 1) / 2; }
};

// Whether the iteration cuts its symmetric products of an m x m output
// into tiles by default.
inline bool UsesSymmetricTiles(int64_t m) {
  return SymmetricProducts().Tiled(m);
}

// A setting `name` (an environment variable) as a whole decimal integer
// in [lo, hi] into *value; null or empty leaves *value. Returns an empty
// string, or the error naming the setting, the range and the text.
inline std::string ParseEnvInteger(const char* name, const char* text,
                                   int64_t lo, int64_t hi, int64_t* value) {
  if (text == nullptr || *text == '\0') return "";
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text, &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) {
    return std::string(name) + " must be an integer in [" + std::to_string(lo) +
           ", " + std::to_string(hi) + "], got '" + text + "'";
  }
  *value = v;
  return "";
}

// The Gram iteration's restart period from MUON_NS_GRAM_RESTART_EVERY
// (`text`; null or empty: 0, the options' NewtonSchulzOptions::
// gram_restart_every), in [1, 64]: for measuring other restart schedules
// on a GPU without rebuilding. Returns an empty string and sets *out, or
// the error (and leaves *out).
inline std::string ParseGramRestartEvery(const char* text, int* out) {
  int64_t v = 0;
  const std::string error =
      ParseEnvInteger("MUON_NS_GRAM_RESTART_EVERY", text, 1, 64, &v);
  if (error.empty()) *out = static_cast<int>(v);
  return error;
}

// Reads a SymmetricProducts from its four settings, each null or empty
// for its default: `mode` "full", "loop" or "batched"; `tiles`
// an integer in [2, kMaxSymmetricTiles]; `min_edge` an integer >= 1;
// `gram` "first" or "all" (gram_all) (the environment variables
// MUON_NS_SYMMETRIC, MUON_NS_SYMMETRIC_TILES, MUON_NS_SYMMETRIC_MIN_EDGE
// and MUON_NS_SYMMETRIC_GRAM, for tuning and benchmarks). Returns an empty
// string and sets *out, or the error naming the setting and its value (and
// leaves *out as it was).
inline std::string ParseSymmetricProducts(const char* mode, const char* tiles,
                                          const char* min_edge,
                                          const char* gram,
                                          SymmetricProducts* out) {
  SymmetricProducts p;
  const std::string m = mode == nullptr ? "" : mode;
  if (m == "full") {
    p.mode = SymmetricMode::kFull;
  } else if (m == "loop") {
    p.mode = SymmetricMode::kLoop;
  } else if (m == "batched") {
    p.mode = SymmetricMode::kBatched;
  } else if (!m.empty()) {
    return "MUON_NS_SYMMETRIC must be full, loop or batched, got '" + m + "'";
  }
  const std::string g = gram == nullptr ? "" : gram;
  if (g == "all") {
    p.gram_all = true;
  } else if (g == "first") {
    p.gram_all = false;
  } else if (!g.empty()) {
    return "MUON_NS_SYMMETRIC_GRAM must be first or all, got '" + g + "'";
  }
  int64_t t = p.tiles;
  std::string error = ParseEnvInteger("MUON_NS_SYMMETRIC_TILES", tiles, 2,
                                      kMaxSymmetricTiles, &t);
  if (!error.empty()) return error;
  p.tiles = static_cast<int>(t);
  error = ParseEnvInteger("MUON_NS_SYMMETRIC_MIN_EDGE", min_edge, 1, INT32_MAX,
                          &p.min_edge);
  if (!error.empty()) return error;
  *out = p;
  return "";
}

// The tile edge of an m x m output cut into `tiles` x `tiles` (>= 1):
// ceil(m / tiles) rounded up to a multiple of 8 elements, so that every
// tile's operands start 16-byte aligned (bf16) when the matrices do, as
// cuBLAS's tensor-core kernels want (the last tiles may then be smaller or
// empty).
inline int SymmetricTileEdge(int m, int tiles) {
  const int edge = (m + std::max(tiles, 1) - 1) / std::max(tiles, 1);
  return (edge + 7) / 8 * 8;
}

// Tile (i, j) of g's m x m output (g.m == g.n; op(A) is m x k, op(B)
// k x m; tile edge `edge`): g with its transposes, leading dimensions,
// strides, alpha and beta, its operands offset to the tile's rows of op(A)
// and columns of op(B), and C to the tile. False, *t untouched, for an
// empty tile (past the edge of m).
inline bool TileGemm(const NsGemm& g, int edge, int i, int j, NsGemm* t) {
  const int r0 = i * edge, c0 = j * edge;
  if (r0 >= g.m || c0 >= g.n) return false;
  *t = g;
  t->m = std::min(edge, g.m - r0);
  t->n = std::min(edge, g.n - c0);
  // Rows r0.. of op(A): A's rows, or A's columns when transposed.
  t->offset_a = g.offset_a + (g.transpose_a ? int64_t{r0} * g.lda : r0);
  // Columns c0.. of op(B): B's columns, or B's rows when transposed.
  t->offset_b = g.offset_b + (g.transpose_b ? c0 : int64_t{c0} * g.ldb);
  t->offset_c = g.offset_c + r0 + int64_t{c0} * g.ldc;
  return true;
}

// The GEMMs of the tiles on and above the diagonal of g's output, row
// tile i <= column tile j (TileGemm), into *out (cleared first; its
// capacity is kept, so a caller that keeps the vector allocates once).
// Empty tiles (m < tiles) are left out.
inline void UpperTileGemms(const NsGemm& g, int tiles,
                           std::vector<NsGemm>* out) {
  const int edge = SymmetricTileEdge(g.m, tiles);
  out->clear();
  NsGemm t;
  for (int j = 0; j < tiles; ++j) {
    for (int i = 0; i <= j; ++i) {
      if (TileGemm(g, edge, i, j, &t)) out->push_back(t);
    }
  }
}

inline std::vector<NsGemm> UpperTileGemms(const NsGemm& g, int tiles) {
  std::vector<NsGemm> out;
  UpperTileGemms(g, tiles, &out);
  return out;
}

// FLOPs of the GPU iteration on one [rows, cols] matrix counting every
// product as a full GEMM (the symmetric tiles, above, cut A = X X^T and
// the polynomial's product by 44% once m >= kSymmetricMinEdge; counted
// in full here, so GpuRunsGram keeps its 1.5 ratio): standard k * (4 m^2 n + 2
// m^3); Gram, per restart block of L iterations, 4 m^2 n + (8L - 6) m^3 (gram
// and apply 2 m^2 n each; L squares, L - 1 accumulations and 2(L - 1) R updates
// of 2 m^3).
inline double GpuNewtonSchulzFlops(int64_t rows, int64_t cols, int steps,
                                   bool gram, int restart_every) {
  const double m = static_cast<double>(std::min(rows, cols));
  const double n = static_cast<double>(std::max(rows, cols));
  if (!gram) return steps * (4.0 * m * m * n + 2.0 * m * m * m);
  const int every = std::max(restart_every, 1);
  double flops = 0.0;
  for (int start = 0; start < steps; start += every) {
    const int len = std::min(every, steps - start);
    flops += 4.0 * m * m * n + (8.0 * len - 6.0) * m * m * m;
  }
  return flops;
}

// Whether the GPU iteration runs Gram for `method` (kAuto: when it executes
// fewer FLOPs than the standard one by GpuNewtonSchulzFlops; with k = 5 and
// a restart every 2, 12 m^2 n + 22 m^3 against 20 m^2 n + 10 m^3: once the
// long side exceeds 1.5 times the short one).
// `method` is 0 standard, 1 gram, 2 auto (NewtonSchulzMethod's order).
inline bool GpuRunsGram(int64_t rows, int64_t cols, int steps, int method,
                        int restart_every) {
  if (method != 2) return method == 1;
  return GpuNewtonSchulzFlops(rows, cols, steps, true, restart_every) <
         GpuNewtonSchulzFlops(rows, cols, steps, false, restart_every);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muon

#endif  // MUON_KERNELS_CUDA_NS_GEMM_PLAN_H_
