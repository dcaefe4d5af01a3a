// The tiled products and Newton-Schulz give the same bits whatever the
// thread count (1, 2, 3, 4, 8, 16) and however many threads call at once;
// the tiled products are right against a float64 loop.
#include "kernels/blas_tiles.h"

#include <cblas.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/newton_schulz.h"
#include "tests/kernels/ns_test_util.h"

// Every allocation of the process, on any thread (the pool's workers
// included), counted while `g_counting` is set.
std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_allocations{0};

void* operator new(size_t size) {
  if (g_counting.load(std::memory_order_relaxed)) {
    g_allocations.fetch_add(1, std::memory_order_relaxed);
  }
  void* p = std::malloc(size == 0 ? 1 : size);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace muon {
namespace kernels {
namespace {

using ::muon::kernels::testing::BitwiseEqual;
using ::muon::kernels::testing::RandomMatrix;

constexpr int kThreadCounts[] = {1, 2, 3, 4, 8, 16};

struct Shape {
  int64_t rows, cols;
};

// The shapes of the report (tall, wide, square, several tiles, tiny) and
// one crossing tile edges in both dimensions.
const Shape kShapes[] = {{130, 48},   {48, 130}, {256, 256},
                         {1000, 300}, {2, 16},   {600, 520}};

// Restores the thread count a test changed.
class BlasTilesTest : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = ComputeThreads(); }
  void TearDown() override { ASSERT_TRUE(SetComputeThreads(saved_).ok()); }
  int saved_ = 1;
};

// op(A)[i, :] . op(B)[:, j] in float64, and the sum of the products'
// magnitudes, which bounds the fp32 rounding error.
struct Dot {
  double value = 0.0;
  double magnitude = 0.0;
};

Dot DotRef(bool ta, bool tb, const std::vector<float>& a, int lda,
           const std::vector<float>& b, int ldb, int i, int j, int k) {
  Dot d;
  for (int p = 0; p < k; ++p) {
    const double x = ta ? a[p * lda + i] : a[i * lda + p];
    const double y = tb ? b[j * ldb + p] : b[p * ldb + j];
    d.value += x * y;
    d.magnitude += std::abs(x * y);
  }
  return d;
}

// Higham's bound for a k-term fp32 dot product (Accuracy and Stability of
// Numerical Algorithms, 2nd ed., eq. 3.5): |error| <= gamma_k sum |x_p y_p|,
// gamma_k ~ k * 2^-24; then one rounding each for alpha, beta C and the sum.
double DotBound(int k, double alpha, const Dot& d, double beta_c) {
  const double u = std::ldexp(1.0, -24);
  const double scaled = std::abs(alpha) * d.magnitude;
  return (k + 3) * u * (scaled + std::abs(beta_c)) + 1e-30;
}

TEST_F(BlasTilesTest, TiledSgemmMatchesFloat64ForEveryTransposeAcrossTiles) {
  ASSERT_TRUE(SetComputeThreads(3).ok());
  const int m = 300, n = 530, k = 70;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const int lda = ta ? m : k;
      const int ldb = tb ? k : n;
      const std::vector<float> a = RandomMatrix(ta ? k : m, lda, 1);
      const std::vector<float> b = RandomMatrix(tb ? n : k, ldb, 2);
      std::vector<float> c = RandomMatrix(m, n, 3);
      const std::vector<float> c0 = c;
      TiledSgemm(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 2.0f,
                 c.data(), n);
      double worst = 0.0;  // Error over its bound.
      for (int i = 0; i < m; ++i) {
        for (int j = 0; j < n; ++j) {
          const Dot d = DotRef(ta, tb, a, lda, b, ldb, i, j, k);
          const double want = 0.5 * d.value + 2.0 * c0[i * n + j];
          worst = std::max(worst, std::abs(c[i * n + j] - want) /
                                      DotBound(k, 0.5, d, 2.0 * c0[i * n + j]));
        }
      }
      EXPECT_LE(worst, 1.0) << "ta=" << ta << " tb=" << tb;
    }
  }
}

TEST_F(BlasTilesTest, TiledSyrkUpperWritesTheUpperTriangleOnly) {
  ASSERT_TRUE(SetComputeThreads(4).ok());
  const int n = 520, k = 90;
  for (bool trans : {false, true}) {
    const int lda = trans ? n : k;
    const std::vector<float> a = RandomMatrix(trans ? k : n, lda, 4);
    std::vector<float> c(static_cast<size_t>(n) * n, -7.0f);
    TiledSyrkUpper(trans, n, k, 1.5f, a.data(), lda, 0.0f, c.data(), n);
    double worst = 0.0;  // Error over its bound.
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) {
        if (j < i) {
          ASSERT_EQ(c[i * n + j], -7.0f) << i << "," << j;
          continue;
        }
        const Dot d = DotRef(trans, !trans, a, lda, a, lda, i, j, k);
        worst = std::max(worst, std::abs(c[i * n + j] - 1.5 * d.value) /
                                    DotBound(k, 1.5, d, 0.0));
      }
    }
    EXPECT_LE(worst, 1.0) << "trans=" << trans;
  }
}

// NewtonSchulz's output at each thread count, per method and shape.
std::vector<float> Orthogonalize(const Shape& s, NewtonSchulzMethod method) {
  NewtonSchulzOptions options;
  options.method = method;
  const std::vector<float> u =
      RandomMatrix(s.rows, s.cols, static_cast<uint32_t>(s.rows * 7 + s.cols));
  std::vector<float> out(u.size());
  NewtonSchulzWorkspace ws;
  EXPECT_TRUE(
      NewtonSchulz(u.data(), s.rows, s.cols, options, out.data(), &ws).ok());
  return out;
}

TEST_F(BlasTilesTest, NewtonSchulzBitsAreTheSameForEveryThreadCount) {
  for (NewtonSchulzMethod method :
       {NewtonSchulzMethod::kStandard, NewtonSchulzMethod::kGram,
        NewtonSchulzMethod::kAuto}) {
    for (const Shape& s : kShapes) {
      ASSERT_TRUE(SetComputeThreads(1).ok());
      const std::vector<float> one = Orthogonalize(s, method);
      for (int threads : kThreadCounts) {
        ASSERT_TRUE(SetComputeThreads(threads).ok());
        EXPECT_TRUE(BitwiseEqual(Orthogonalize(s, method), one))
            << NewtonSchulzMethodName(method) << " " << s.rows << "x" << s.cols
            << " threads=" << threads;
      }
    }
  }
}

TEST_F(BlasTilesTest, ConcurrentCallersGetTheBitsOfOneCaller) {
  ASSERT_TRUE(SetComputeThreads(3).ok());
  const Shape s{600, 520};
  const std::vector<float> want = Orthogonalize(s, NewtonSchulzMethod::kAuto);
  std::vector<std::vector<float>> got(4);
  std::vector<std::thread> callers;
  for (size_t t = 0; t < got.size(); ++t) {
    callers.emplace_back(
        [&, t] { got[t] = Orthogonalize(s, NewtonSchulzMethod::kAuto); });
  }
  for (std::thread& c : callers) c.join();
  for (size_t t = 0; t < got.size(); ++t) {
    EXPECT_TRUE(BitwiseEqual(got[t], want)) << "caller " << t;
  }
}

TEST_F(BlasTilesTest, OpenBlasThreadCountSetByTheProgramBecomesOurs) {
  openblas_set_num_threads(5);
  const Shape s{256, 300};
  const std::vector<float> out =
      Orthogonalize(s, NewtonSchulzMethod::kStandard);
  EXPECT_EQ(ComputeThreads(), 5);
  // OpenBLAS itself is back at one thread: no product is split by it.
  EXPECT_EQ(openblas_get_num_threads(), 1);
  ASSERT_TRUE(SetComputeThreads(1).ok());
  EXPECT_TRUE(
      BitwiseEqual(Orthogonalize(s, NewtonSchulzMethod::kStandard), out));
}

TEST_F(BlasTilesTest, WarmTiledProductsAllocateNothingOnAnyThread) {
  ASSERT_TRUE(SetComputeThreads(3).ok());
  const int m = 600, n = 520, k = 64;
  const std::vector<float> a = RandomMatrix(m, k, 5);
  const std::vector<float> b = RandomMatrix(k, n, 6);
  std::vector<float> c(static_cast<size_t>(m) * n);
  std::vector<float> g(static_cast<size_t>(m) * m);
  // Warm-up: the workers start, OpenBLAS allocates its buffers.
  TiledSgemm(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f,
             c.data(), n);
  TiledSyrkUpper(false, m, k, 1.0f, a.data(), k, 0.0f, g.data(), m);
  g_allocations = 0;
  g_counting = true;
  for (int r = 0; r < 3; ++r) {
    TiledSgemm(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f,
               c.data(), n);
    TiledSyrkUpper(false, m, k, 1.0f, a.data(), k, 0.0f, g.data(), m);
  }
  g_counting = false;
  EXPECT_EQ(g_allocations.load(), 0);
}

TEST_F(BlasTilesTest, SetComputeThreadsRefusesCountsOutOfRange) {
  EXPECT_EQ(SetComputeThreads(0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SetComputeThreads(kMaxComputeThreads + 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ComputeThreads(), saved_);
}

TEST_F(BlasTilesTest, BlasCoreNameNamesTheKernelSet) {
  const std::string name = BlasCoreName();
  EXPECT_EQ(name.rfind(openblas_get_corename(), 0), 0u) << name;
  EXPECT_NE(name.find("OpenBLAS"), std::string::npos) << name;
}

}  // namespace
}  // namespace kernels
}  // namespace muon
