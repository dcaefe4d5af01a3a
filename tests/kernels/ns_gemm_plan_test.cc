// Executes the GPU iteration's GEMM plan (kernels/cuda/ns_gemm_plan.h) with
// a column-major GEMM simulator in float64 on the CPU, buffer for buffer as
// kernels/cuda/newton_schulz_cuda.cu runs it on cuBLAS (strided batches,
// transposes by flags, beta on copies), and checks the result against
// NewtonSchulzReference. This verifies the layout logic of the CUDA path
// without a GPU; the arithmetic of cuBLAS itself is checked by
// gpu_newton_schulz_test on a GPU.
#include "kernels/cuda/ns_gemm_plan.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/newton_schulz.h"
#include "tests/kernels/ns_test_util.h"

namespace muon {
namespace kernels {
namespace cuda {
namespace {

using ::muon::kernels::testing::RandomMatrix;

struct Buffers {
  std::vector<double> x, x_next, gram, poly, q, tmp;
  std::vector<double>& Get(NsBuffer which) {
    switch (which) {
      case NsBuffer::kX:
        return x;
      case NsBuffer::kXNext:
        return x_next;
      case NsBuffer::kGram:
        return gram;
      case NsBuffer::kPoly:
        return poly;
      case NsBuffer::kQ:
        return q;
      case NsBuffer::kTmp:
        break;
    }
    return tmp;
  }
};

// cublasGemmStridedBatchedEx semantics, column-major, in double; checks the
// leading-dimension and extent rules cuBLAS imposes (cuBLAS returns
// CUBLAS_STATUS_INVALID_VALUE when they are broken).
void SimulateGemm(const NsGemm& g, int batch, Buffers* buffers) {
  const int rows_a = g.transpose_a ? g.k : g.m;  // Stored A is rows_a x cols_a.
  const int cols_a = g.transpose_a ? g.m : g.k;
  const int rows_b = g.transpose_b ? g.n : g.k;
  const int cols_b = g.transpose_b ? g.k : g.n;
  ASSERT_GE(g.lda, std::max(1, rows_a));
  ASSERT_GE(g.ldb, std::max(1, rows_b));
  ASSERT_GE(g.ldc, std::max(1, g.m));
  std::vector<double>& a = buffers->Get(g.a);
  std::vector<double>& b = buffers->Get(g.b);
  std::vector<double>& c = buffers->Get(g.c);
  ASSERT_NE(&a, &c);  // cuBLAS forbids C aliasing an input.
  ASSERT_NE(&b, &c);
  for (int e = 0; e < batch; ++e) {
    const int64_t oa = e * g.stride_a + g.offset_a;
    const int64_t ob = e * g.stride_b + g.offset_b;
    const int64_t oc = e * g.stride_c + g.offset_c;
    // Each matrix of the batch stays inside its buffer.
    ASSERT_LE(oa + int64_t{g.lda} * (cols_a - 1) + rows_a,
              static_cast<int64_t>(a.size()));
    ASSERT_LE(ob + int64_t{g.ldb} * (cols_b - 1) + rows_b,
              static_cast<int64_t>(b.size()));
    ASSERT_LE(oc + int64_t{g.ldc} * (g.n - 1) + g.m,
              static_cast<int64_t>(c.size()));
    for (int j = 0; j < g.n; ++j) {
      for (int i = 0; i < g.m; ++i) {
        double sum = 0.0;
        for (int p = 0; p < g.k; ++p) {
          const double av = g.transpose_a ? a[oa + p + int64_t{i} * g.lda]
                                          : a[oa + i + int64_t{p} * g.lda];
          const double bv = g.transpose_b ? b[ob + j + int64_t{p} * g.ldb]
                                          : b[ob + p + int64_t{j} * g.ldb];
          sum += av * bv;
        }
        // BLAS convention: with beta == 0, C is not read (NaN there does
        // not propagate).
        double& cv = c[oc + i + int64_t{j} * g.ldc];
        cv = g.beta == 0.0 ? g.alpha * sum : g.alpha * sum + g.beta * cv;
      }
    }
  }
}

// MirrorLowerTiles (newton_schulz_cuda.cu): every element of a tile below
// the diagonal of `c` (batch m x m matrices, column-major) copied from its
// mirror above.
void SimulateMirrorLowerTiles(std::vector<double>* c, int m, int edge,
                              int batch) {
  for (int e = 0; e < batch; ++e) {
    double* mat = c->data() + int64_t{e} * m * m;
    for (int col = 0; col < m; ++col) {
      for (int r = 0; r < m; ++r) {
        if (r / edge > col / edge)
          mat[r + int64_t{col} * m] = mat[col + int64_t{r} * m];
      }
    }
  }
}

// RunUpperOrWhole (newton_schulz_cuda.cu): the whole GEMM (tiles 0) or
// only its tiles on and above the diagonal (UpperTileGemms). Returns the
// tile edge, or g.m for the whole GEMM.
int SimulateUpperOrWhole(const NsGemm& g, int tiles, int batch,
                         Buffers* buffers) {
  if (tiles == 0) {
    SimulateGemm(g, batch, buffers);
    return g.m;
  }
  for (const NsGemm& t : UpperTileGemms(g, tiles)) {
    SimulateGemm(t, batch, buffers);
  }
  return SymmetricTileEdge(g.m, tiles);
}

// A symmetric product as newton_schulz_cuda.cu runs it: full (tiles 0) or
// its upper tiles and then the mirror copy.
void SimulateSymmetric(const NsGemm& g, int tiles, int batch,
                       Buffers* buffers) {
  const int edge = SimulateUpperOrWhole(g, tiles, batch, buffers);
  if (tiles != 0)
    SimulateMirrorLowerTiles(&buffers->Get(g.c), g.m, edge, batch);
}

// The normalised input (X = U / max(norm_scale ||U||_F, eps) per matrix)
// in fresh buffers whose scratch starts as NaN.
Buffers Normalised(const std::vector<double>& u, int batch, int64_t rows,
                   int64_t cols, const NewtonSchulzOptions& options) {
  const int64_t size = rows * cols;
  const int64_t m = std::min(rows, cols);
  Buffers buf;
  buf.x.resize(static_cast<size_t>(batch * size));
  buf.x_next.assign(buf.x.size(), NAN);
  buf.gram.assign(static_cast<size_t>(batch * m * m), NAN);
  buf.poly.assign(buf.gram.size(), NAN);
  buf.q.assign(buf.gram.size(), NAN);
  buf.tmp.assign(buf.gram.size(), NAN);
  for (int e = 0; e < batch; ++e) {
    double sum = 0.0;
    for (int64_t i = 0; i < size; ++i) sum += u[e * size + i] * u[e * size + i];
    const double denom =
        std::max(options.norm_scale * std::sqrt(sum), options.eps);
    for (int64_t i = 0; i < size; ++i) {
      buf.x[e * size + i] = u[e * size + i] / denom;
    }
  }
  return buf;
}

// NewtonSchulzBatched's standard sequence on `batch` row-major [rows, cols]
// matrices.
// `tiles`: the symmetric products in tiles (0: full GEMMs).
std::vector<double> RunPlan(const std::vector<double>& u, int batch,
                            int64_t rows, int64_t cols,
                            const NewtonSchulzOptions& options, int tiles = 0) {
  Buffers buf = Normalised(u, batch, rows, cols, options);
  for (int step = 0; step < NewtonSchulzIterations(options); ++step) {
    const NsStepPlan plan = PlanNewtonSchulzStep(
        rows, cols, NewtonSchulzCoefficients(options, step));
    SimulateSymmetric(plan.gram, tiles, batch, &buf);
    buf.poly = buf.gram;
    SimulateSymmetric(plan.poly, tiles, batch, &buf);
    buf.x_next = buf.x;
    SimulateGemm(plan.update, batch, &buf);
    std::swap(buf.x, buf.x_next);
  }
  return buf.x;
}

// Z = a I + b R + c R R into buf->poly from R in buf->gram, as
// newton_schulz_cuda.cu forms it: by default b R + c R R (beta = b on a
// copy of R), then a added to the diagonal; with `fp32_z`
// (FormGramPolynomialFp32) P = c R R (beta = 0; only the tiles on and
// above the diagonal when tiled, in buf->tmp, which holds nothing live
// then, filled with NaN first so that a read of an uncomputed tile
// shows), then Z = b R + a I + P with P below the diagonal tiles read from
// its mirror (GramPolynomialFinishKernel). `tiles` as SimulateSymmetric's.
void FormGramPolynomial(const NsGramPlan& plan,
                        const std::array<double, 3>& abc, int64_t m, int tiles,
                        int batch, bool fp32_z, Buffers* buf) {
  if (fp32_z) {
    NsGemm rr = plan.square;
    rr.beta = 0.0;
    rr.c = NsBuffer::kTmp;
    buf->tmp.assign(buf->gram.size(), NAN);
    const int64_t edge = SimulateUpperOrWhole(rr, tiles, batch, buf);
    for (int e = 0; e < batch; ++e) {
      const int64_t base = e * m * m;
      for (int64_t col = 0; col < m; ++col) {
        for (int64_t row = 0; row < m; ++row) {
          const int64_t at = base + row + col * m;
          const double p = row / edge > col / edge
                               ? buf->tmp[base + col + row * m]
                               : buf->tmp[at];
          buf->poly[at] =
              abc[1] * buf->gram[at] + (row == col ? abc[0] : 0.0) + p;
        }
      }
    }
    return;
  }
  buf->poly = buf->gram;
  SimulateSymmetric(plan.square, tiles, batch, buf);
  for (int e = 0; e < batch; ++e) {
    for (int64_t i = 0; i < m; ++i) buf->poly[e * m * m + i * m + i] += abc[0];
  }
}

// NewtonSchulzBatched's Gram sequence (GramIterations in
// newton_schulz_cuda.cu): copies, the diagonal kernel and the Q/tmp swap
// as the CUDA code does them. `gram_all`: every m x m product a symmetric
// product (SymmetricProducts::gram_all), else the first square only.
// `fp32_z`: Z formed as FormGramPolynomialFp32 forms it.
std::vector<double> RunGramPlan(const std::vector<double>& u, int batch,
                                int64_t rows, int64_t cols,
                                const NewtonSchulzOptions& options,
                                int tiles = 0, bool gram_all = false,
                                bool fp32_z = false) {
  const int products = gram_all ? tiles : 0;
  Buffers buf = Normalised(u, batch, rows, cols, options);
  const int64_t m = std::min(rows, cols);
  const int steps = NewtonSchulzIterations(options);
  const int every = options.gram_restart_every;
  for (int start = 0; start < steps; start += every) {
    const int len = std::min(every, steps - start);
    SimulateSymmetric(PlanGramNewtonSchulz(
                          rows, cols, NewtonSchulzCoefficients(options, start))
                          .gram,
                      tiles, batch, &buf);
    for (int j = 0; j < len; ++j) {
      const std::array<double, 3> abc =
          NewtonSchulzCoefficients(options, start + j);
      const NsGramPlan plan = PlanGramNewtonSchulz(rows, cols, abc);
      // R is symmetric element for element as X X^T (j = 0); R = Z R Z
      // is symmetric in exact arithmetic only, unless mirrored (gram_all).
      FormGramPolynomial(plan, abc, m, j == 0 ? tiles : products, batch, fp32_z,
                         &buf);
      if (j == 0) {
        buf.q = buf.poly;
      } else {
        SimulateSymmetric(plan.accumulate, products, batch, &buf);
        std::swap(buf.q, buf.tmp);
      }
      if (j + 1 < len) {
        SimulateSymmetric(plan.right, products, batch, &buf);
        SimulateSymmetric(plan.left, products, batch, &buf);
      }
    }
    SimulateGemm(PlanGramNewtonSchulz(rows, cols,
                                      NewtonSchulzCoefficients(options, start))
                     .apply,
                 batch, &buf);
    std::swap(buf.x, buf.x_next);
  }
  return buf.x;
}

TEST(NsGemmPlanTest, GramPlan_AllShapesAndRestarts_MatchesFloat64Reference) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 1}, {1, 17}, {17, 1}, {8, 8}, {12, 31}, {31, 12}, {40, 41}};
  for (int restart : {1, 2, 3, 5}) {
    for (NewtonSchulzOptions options :
         {NewtonSchulzOptions{}, PolarExpressSchedule()}) {
      options.method = NewtonSchulzMethod::kGram;
      options.gram_restart_every = restart;
      for (auto [rows, cols] : shapes) {
        constexpr int kBatch = 2;
        std::vector<double> u;
        std::vector<double> want;
        for (int e = 0; e < kBatch; ++e) {
          const std::vector<float> one =
              RandomMatrix(rows, cols, 90 + static_cast<uint32_t>(e));
          std::vector<double> one64(one.begin(), one.end());
          std::vector<double> ref(one.size());
          NewtonSchulzReference(one64.data(), rows, cols, options, ref.data());
          u.insert(u.end(), one64.begin(), one64.end());
          want.insert(want.end(), ref.begin(), ref.end());
        }
        // Full GEMMs, and every m x m product in mirrored tiles (3 and 7
        // per edge); Z formed by default and as the fp32-Z path does.
        for (auto [tiling, all, fp32_z] :
             {std::tuple<int, bool, bool>{0, false, false},
              {3, true, false},
              {7, true, false},
              {0, false, true},
              {7, true, true}}) {
          const std::vector<double> got =
              RunGramPlan(u, kBatch, rows, cols, options, tiling, all, fp32_z);
          ASSERT_EQ(got.size(), want.size());
          double max_diff = 0.0;
          for (size_t i = 0; i < got.size(); ++i) {
            ASSERT_TRUE(std::isfinite(got[i])) << rows << "x" << cols;
            max_diff = std::max(max_diff, std::abs(got[i] - want[i]));
          }
          // The same polynomial in another order, in float64: the Gram form
          // squares the conditioning, still ~1e-12 here; a wrong operand,
          // transpose or tile gives O(1).
          EXPECT_LE(max_diff, 1e-8)
              << rows << "x" << cols << " restart " << restart << " tiles "
              << tiling << " all " << all << " fp32_z " << fp32_z;
        }
      }
    }
  }
}

TEST(NsGemmPlanTest, GpuRunsGram_AutoPicksGramOnlyWhenItCostsFewerFlops) {
  // k = 5, restart 2: 12 m^2 n + 22 m^3 vs 20 m^2 n + 10 m^3.
  EXPECT_TRUE(GpuRunsGram(1024, 4096, 5, /*auto=*/2, 2));
  EXPECT_TRUE(GpuRunsGram(14336, 4096, 5, 2, 2));
  EXPECT_FALSE(GpuRunsGram(4096, 4096, 5, 2, 2));
  EXPECT_FALSE(GpuRunsGram(1000, 1500, 5, 2, 2));  // ratio 1.5: a tie
  EXPECT_TRUE(GpuRunsGram(1000, 1501, 5, 2, 2));
  EXPECT_TRUE(GpuRunsGram(8, 8, 5, /*gram=*/1, 2));
  EXPECT_FALSE(GpuRunsGram(8, 800, 5, /*standard=*/0, 2));
  EXPECT_DOUBLE_EQ(GpuNewtonSchulzFlops(1024, 4096, 5, true, 2),
                   12.0 * 1024 * 1024 * 4096 + 22.0 * 1024.0 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(GpuNewtonSchulzFlops(1024, 4096, 5, false, 2),
                   20.0 * 1024 * 1024 * 4096 + 10.0 * 1024.0 * 1024 * 1024);
}

TEST(NsGemmPlanTest, Plan_AllShapesAndSchedules_MatchesFloat64Reference) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 1}, {1, 17}, {17, 1}, {8, 8}, {12, 31}, {31, 12}, {40, 41}};
  for (const NewtonSchulzOptions& options :
       {NewtonSchulzOptions{}, PolarExpressSchedule(), QuinticSchedule(2)}) {
    for (auto [rows, cols] : shapes) {
      constexpr int kBatch = 3;
      const int64_t size = rows * cols;
      std::vector<double> u;
      std::vector<double> want;
      for (int e = 0; e < kBatch; ++e) {
        const std::vector<float> one =
            RandomMatrix(rows, cols, 80 + static_cast<uint32_t>(e));
        std::vector<double> one64(one.begin(), one.end());
        std::vector<double> ref(one.size());
        NewtonSchulzReference(one64.data(), rows, cols, options, ref.data());
        u.insert(u.end(), one64.begin(), one64.end());
        want.insert(want.end(), ref.begin(), ref.end());
      }
      const std::vector<double> got = RunPlan(u, kBatch, rows, cols, options);
      ASSERT_EQ(got.size(), want.size());
      double max_diff = 0.0;
      double max_ref = 0.0;
      for (size_t i = 0; i < got.size(); ++i) {
        // Unwritten scratch starts as NaN: any element the plan fails to
        // produce shows up here.
        ASSERT_TRUE(std::isfinite(got[i]))
            << rows << "x" << cols << " element " << i;
        max_diff = std::max(max_diff, std::abs(got[i] - want[i]));
        max_ref = std::max(max_ref, std::abs(want[i]));
      }
      // Same float64 arithmetic up to summation order and alpha/beta
      // placement: agreement to ~1e-13 relative; a transposed or mis-strided
      // operand gives O(1).
      EXPECT_LE(max_diff, 1e-10 * std::max(max_ref, 1.0))
          << rows << "x" << cols << " steps " << NewtonSchulzIterations(options)
          << " size " << size;
    }
  }
}

// The symmetric products cut into tiles (UpperTileGemms, then the mirror
// copy) give every element the same sum of the same products in the same
// order as the full GEMM: the whole iteration, standard and Gram, is
// bitwise the full-GEMM plan's, on tall, wide, square and degenerate
// shapes, for tile counts that divide m and that do not (empty tiles
// included).
TEST(NsGemmPlanTest, SymmetricTiles_BitwiseEqualToFullGemms) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 1}, {3, 17}, {17, 3}, {8, 8}, {12, 31}, {31, 12}, {40, 41}};
  const NewtonSchulzOptions options;
  NewtonSchulzOptions gram = options;
  gram.method = NewtonSchulzMethod::kGram;
  for (auto [rows, cols] : shapes) {
    constexpr int kBatch = 2;
    std::vector<double> u;
    for (int e = 0; e < kBatch; ++e) {
      const std::vector<float> one =
          RandomMatrix(rows, cols, 90 + static_cast<uint32_t>(e));
      u.insert(u.end(), one.begin(), one.end());
    }
    const std::vector<double> full = RunPlan(u, kBatch, rows, cols, options);
    const std::vector<double> full_gram =
        RunGramPlan(u, kBatch, rows, cols, gram);
    const std::vector<double> full_gram_fp32_z =
        RunGramPlan(u, kBatch, rows, cols, gram, 0, false, /*fp32_z=*/true);
    for (int tiles : {kSymmetricTiles, 3, 7}) {
      const std::vector<double> tiled =
          RunPlan(u, kBatch, rows, cols, options, tiles);
      const std::vector<double> tiled_gram =
          RunGramPlan(u, kBatch, rows, cols, gram, tiles);
      // Z in fp32: R R's upper tiles, then b R + a I added with the
      // lower tiles' R R read from their mirrors.
      const std::vector<double> tiled_gram_fp32_z = RunGramPlan(
          u, kBatch, rows, cols, gram, tiles, false, /*fp32_z=*/true);
      ASSERT_EQ(tiled.size(), full.size());
      for (size_t i = 0; i < full.size(); ++i) {
        ASSERT_TRUE(std::isfinite(tiled[i])) << rows << "x" << cols << " " << i;
        ASSERT_EQ(tiled[i], full[i])
            << rows << "x" << cols << " tiles " << tiles << " element " << i;
        ASSERT_EQ(tiled_gram[i], full_gram[i])
            << rows << "x" << cols << " tiles " << tiles << " element " << i;
        ASSERT_EQ(tiled_gram_fp32_z[i], full_gram_fp32_z[i])
            << rows << "x" << cols << " tiles " << tiles << " element " << i;
      }
    }
  }
}

TEST(NsGemmPlanTest, UpperTileGemms_TenOfSixteenTilesCoverTheUpperTriangle) {
  const NsStepPlan plan = PlanNewtonSchulzStep(4096, 14336, {3.4, -4.7, 2.0});
  const std::vector<NsGemm> tiles = UpperTileGemms(plan.gram, 4);
  ASSERT_EQ(tiles.size(), 10u);
  double flops = 0;
  for (const NsGemm& t : tiles) {
    EXPECT_EQ(t.m, 1024);
    EXPECT_EQ(t.n, 1024);
    EXPECT_EQ(t.k, plan.gram.k);
    // Row tile <= column tile: the tile's C offset is on or above the
    // diagonal.
    EXPECT_LE(t.offset_c % plan.gram.ldc, t.offset_c / plan.gram.ldc);
    flops += 2.0 * t.m * t.n * t.k;
  }
  EXPECT_DOUBLE_EQ(flops, 10.0 / 16.0 * 2.0 * 4096.0 * 4096.0 * 14336.0);
  EXPECT_FALSE(UsesSymmetricTiles(4095));
  EXPECT_TRUE(UsesSymmetricTiles(4096));
}

// The MUON_NS_SYMMETRIC* settings: unset means the defaults (batched, 8
// tiles, m >= 4096, every Gram product); each is read; a bad value is an error
// naming the variable and the value, and leaves the settings as they were.
TEST(NsGemmPlanTest, ParseSymmetricProducts_ReadsSettingsAndNamesBadValues) {
  SymmetricProducts p;
  p.tiles = 9;
  p.gram_all = false;
  EXPECT_EQ(ParseSymmetricProducts(nullptr, nullptr, nullptr, nullptr, &p), "");
  EXPECT_EQ(p.mode, SymmetricMode::kBatched);
  EXPECT_EQ(p.tiles, kSymmetricTiles);
  EXPECT_EQ(p.min_edge, kSymmetricMinEdge);
  EXPECT_TRUE(p.gram_all);
  EXPECT_EQ(p.TileGemms(), 36);
  p.gram_all = false;
  EXPECT_EQ(ParseSymmetricProducts("loop", "8", "1024", "all", &p), "");
  EXPECT_EQ(p.mode, SymmetricMode::kLoop);
  EXPECT_EQ(p.tiles, 8);
  EXPECT_EQ(p.min_edge, 1024);
  EXPECT_TRUE(p.gram_all);
  EXPECT_TRUE(p.Tiled(1024));
  EXPECT_FALSE(p.Tiled(1023));
  EXPECT_EQ(ParseSymmetricProducts("batched", "", "", "first", &p), "");
  EXPECT_EQ(p.mode, SymmetricMode::kBatched);
  EXPECT_FALSE(p.gram_all);
  EXPECT_EQ(ParseSymmetricProducts("full", "", "", "", &p), "");
  EXPECT_FALSE(p.Tiled(1 << 20));

  const SymmetricProducts before = p;
  EXPECT_EQ(ParseSymmetricProducts("diagonal", nullptr, nullptr, nullptr, &p),
            "MUON_NS_SYMMETRIC must be full, loop or batched, got 'diagonal'");
  EXPECT_EQ(ParseSymmetricProducts(nullptr, "17", nullptr, nullptr, &p),
            "MUON_NS_SYMMETRIC_TILES must be an integer in [2, 16], got '17'");
  EXPECT_EQ(ParseSymmetricProducts(nullptr, "4x", nullptr, nullptr, &p),
            "MUON_NS_SYMMETRIC_TILES must be an integer in [2, 16], got '4x'");
  EXPECT_EQ(ParseSymmetricProducts(nullptr, nullptr, "0", nullptr, &p),
            "MUON_NS_SYMMETRIC_MIN_EDGE must be an integer in [1, 2147483647], "
            "got '0'");
  EXPECT_EQ(ParseSymmetricProducts(nullptr, nullptr, nullptr, "most", &p),
            "MUON_NS_SYMMETRIC_GRAM must be first or all, got 'most'");
  EXPECT_EQ(p.mode, before.mode);
  EXPECT_EQ(p.tiles, before.tiles);
  EXPECT_EQ(p.min_edge, before.min_edge);
  EXPECT_EQ(p.gram_all, before.gram_all);
}

// MUON_NS_GRAM_RESTART_EVERY: unset is 0 (the options' own period), a
// value in [1, 64] is read, anything else is an error naming the variable
// that leaves the value as it was.
TEST(NsGemmPlanTest, ParseGramRestartEvery_ReadsPeriodAndNamesBadValues) {
  int every = 7;
  EXPECT_EQ(ParseGramRestartEvery(nullptr, &every), "");
  EXPECT_EQ(every, 0);
  EXPECT_EQ(ParseGramRestartEvery("3", &every), "");
  EXPECT_EQ(every, 3);
  for (const char* bad : {"0", "65", "2x", "-1"}) {
    EXPECT_EQ(ParseGramRestartEvery(bad, &every),
              std::string("MUON_NS_GRAM_RESTART_EVERY must be an integer in "
                          "[1, 64], got '") +
                  bad + "'");
    EXPECT_EQ(every, 3);
  }
}

}  // namespace
}  // namespace cuda
}  // namespace kernels
}  // namespace muon
