#include "kernels/newton_schulz.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/kernels/ns_test_util.h"

namespace muon {
namespace kernels {
namespace {

// Inputs, the error metric and the float64 reference (NewtonSchulzReference
// on the input widened to double) are the Newton-Schulz tests' shared ones.
using ::muon::kernels::testing::BitwiseEqual;
using ::muon::kernels::testing::MaxRelError;
using ::muon::kernels::testing::RandomMatrix;
using ::muon::kernels::testing::Reference;

// Error bound of the fp32 kernel against the float64 reference, as
// max_ij |O - O_ref| / max_ij |O_ref|, for the default options (5 steps).
//
// Why 1e-4: each step is three fp32 GEMMs whose elementwise relative error is
// about sqrt(K) * 2^-24 for random data (K <= ~1100 here: ~2e-6 worst case,
// usually far less since OpenBLAS accumulates in short blocks), plus the
// rounding of a, b, c to float (~1e-8). The quintic then amplifies a
// perturbation of a singular value by at most |p'(s)| <= a = 3.4445 per step
// near s = 0 and by less elsewhere, and the five steps compound to at most
// 3.4445^5 ~ 480 for the smallest singular values. A worst-case
// 2e-6 * 480 ~ 1e-3 is never approached because only a tiny part of the
// spectrum sits near 0 and the GEMM error is sqrt-like, not linear in K;
// measured errors on these sizes are 1.6e-7 .. 4.9e-6 (OpenBLAS 0.3.21,
// Cooperlake and Haswell kernels; each comparison prints its error and
// records it as the test property "rel_err_<rows>x<cols>"). 1e-4 leaves 20x
// headroom over the worst measured case for other OpenBLAS kernels and
// blockings, while real bugs are far above it (measured on 96x300: one step
// fewer 0.51, one more 0.58, a = 3.4 instead of 3.4445 0.18, c = 2.0
// instead of 2.0315 0.12).
constexpr double kMaxRelErr = 1e-4;

std::vector<float> Transpose(const std::vector<float>& m, int64_t rows,
                             int64_t cols) {
  std::vector<float> t(m.size());
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) t[j * rows + i] = m[i * cols + j];
  }
  return t;
}

bool AllFinite(const std::vector<float>& x) {
  return std::all_of(x.begin(), x.end(),
                     [](float v) { return std::isfinite(v); });
}

std::vector<float> RunNewtonSchulz(const std::vector<float>& u, int64_t rows,
                                   int64_t cols,
                                   const NewtonSchulzOptions& options = {},
                                   NewtonSchulzWorkspace* workspace = nullptr) {
  std::vector<float> out(u.size(), -1.0f);
  const absl::Status status =
      NewtonSchulz(u.data(), rows, cols, options, out.data(), workspace);
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

// Runs NS in fp32 and float64 on a random [rows, cols] matrix and checks the
// relative error, recording it in the test log.
void ExpectMatchesReference(int64_t rows, int64_t cols, uint32_t seed,
                            double bound = kMaxRelErr) {
  SCOPED_TRACE(absl::StrCat("shape ", rows, "x", cols, " seed ", seed));
  const std::vector<float> u = RandomMatrix(rows, cols, seed);
  const std::vector<float> got = RunNewtonSchulz(u, rows, cols);
  const std::vector<double> want = Reference(u, rows, cols, {});
  ASSERT_TRUE(AllFinite(got));
  const double err = MaxRelError(got, want);
  ::testing::Test::RecordProperty(absl::StrCat("rel_err_", rows, "x", cols),
                                  absl::StrCat(err));
  std::printf("NS %lldx%lld seed %u: max rel err %.3g\n",
              static_cast<long long>(rows), static_cast<long long>(cols), seed,
              err);
  EXPECT_LE(err, bound);
}

TEST(NewtonSchulzTest, NewtonSchulz_SquareMatrix_MatchesFloat64Reference) {
  ExpectMatchesReference(64, 64, 1);
  ExpectMatchesReference(128, 128, 2);
}

TEST(NewtonSchulzTest, NewtonSchulz_TallMatrix_MatchesFloat64Reference) {
  ExpectMatchesReference(200, 50, 3);
  ExpectMatchesReference(1100, 96, 4);  // K = 1100 crosses GEMM K-blocks.
}

TEST(NewtonSchulzTest, NewtonSchulz_WideMatrix_MatchesFloat64Reference) {
  ExpectMatchesReference(50, 200, 5);
  ExpectMatchesReference(96, 1100, 6);
}

TEST(NewtonSchulzTest, NewtonSchulz_RowVector_MatchesFloat64Reference) {
  ExpectMatchesReference(1, 300, 7);
  ExpectMatchesReference(1, 1, 8);
}

TEST(NewtonSchulzTest, NewtonSchulz_ColumnVector_MatchesFloat64Reference) {
  ExpectMatchesReference(300, 1, 9);
}

TEST(NewtonSchulzTest, NewtonSchulz_RandomSizes_MatchFloat64Reference) {
  std::mt19937 gen(2024);
  for (int i = 0; i < 6; ++i) {
    const int64_t rows = 1 + static_cast<int64_t>(gen() % 160);
    const int64_t cols = 1 + static_cast<int64_t>(gen() % 160);
    ExpectMatchesReference(rows, cols, 100 + i);
  }
}

// A 1 x N matrix has the single singular value 1 after normalisation, and each
// step maps it through p(s) = a s + b s^3 + c s^5: O = p^k(1) * u / ||u||.
TEST(NewtonSchulzTest, NewtonSchulz_RowVector_ScalesByQuinticOfOne) {
  const std::vector<float> u = {3.0f, -4.0f};  // ||u|| = 5.
  const NewtonSchulzOptions options;
  double s = 1.0;
  for (int i = 0; i < options.steps; ++i) {
    s = options.a * s + options.b * s * s * s + options.c * s * s * s * s * s;
  }
  const std::vector<float> got = RunNewtonSchulz(u, 1, 2, options);
  EXPECT_NEAR(got[0], s * 0.6, 1e-6);
  EXPECT_NEAR(got[1], s * -0.8, 1e-6);
}

TEST(NewtonSchulzTest, NewtonSchulz_SameInputTwice_BitwiseEqual) {
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{96, 1100}, {1100, 96}, {257, 257}}) {
    const std::vector<float> u = RandomMatrix(rows, cols, 11);
    NewtonSchulzWorkspace workspace;
    const std::vector<float> first =
        RunNewtonSchulz(u, rows, cols, {}, &workspace);
    const std::vector<float> second =
        RunNewtonSchulz(u, rows, cols, {}, &workspace);
    NewtonSchulzWorkspace fresh;
    const std::vector<float> third = RunNewtonSchulz(u, rows, cols, {}, &fresh);
    EXPECT_TRUE(BitwiseEqual(first, second)) << rows << "x" << cols;
    EXPECT_TRUE(BitwiseEqual(first, third)) << rows << "x" << cols;
  }
}

// A workspace grown by a larger matrix then reused for a smaller one (stale
// contents) gives the same bits as a fresh workspace.
TEST(NewtonSchulzTest, NewtonSchulz_ReusedWorkspace_BitwiseEqualToFresh) {
  NewtonSchulzWorkspace shared;
  shared.Reserve(300, 300);
  const int64_t reserved = shared.CapacityBytes();
  std::vector<float> big = RandomMatrix(300, 300, 12);
  RunNewtonSchulz(big, 300, 300, {}, &shared);
  const std::vector<float> u = RandomMatrix(40, 70, 13);
  const std::vector<float> reused = RunNewtonSchulz(u, 40, 70, {}, &shared);
  const std::vector<float> fresh = RunNewtonSchulz(u, 40, 70);
  EXPECT_TRUE(BitwiseEqual(reused, fresh));
  EXPECT_EQ(shared.CapacityBytes(), reserved);  // No growth after Reserve.
}

// The tall path works on V = X^T with transpose flags; NS of the explicit
// transpose runs the wide path. They compute the same products, but OpenBLAS
// packs and blocks the two flag combinations differently (and the norm sums
// the squares in another order), so bitwise equality does not hold in
// general. Measured on OpenBLAS 0.3.21: with the Cooperlake kernels 1100x96
// and 129x128 were bitwise equal but 200x50 was not; with the Haswell kernels
// none were. Both orientations must agree with the float64 result, so they
// agree with each other within the same bound; measured differences are
// ~2e-6 relative, the size of the fp32 rounding noise itself. The bound is
// asserted; the bitwise outcome is only printed.
TEST(NewtonSchulzTest, NewtonSchulz_TallMatrix_EqualsTransposeOfWide) {
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{200, 50}, {1100, 96}, {129, 128}}) {
    const std::vector<float> u = RandomMatrix(rows, cols, 14);
    const std::vector<float> tall = RunNewtonSchulz(u, rows, cols);
    const std::vector<float> wide =
        RunNewtonSchulz(Transpose(u, rows, cols), cols, rows);
    const std::vector<float> wide_back = Transpose(wide, cols, rows);
    const std::vector<double> wide_back64(wide_back.begin(), wide_back.end());
    const double diff = MaxRelError(tall, wide_back64);
    std::printf(
        "tall vs transpose(wide) %lldx%lld: bitwise %d, rel diff %.3g\n",
        static_cast<long long>(rows), static_cast<long long>(cols),
        BitwiseEqual(tall, wide_back) ? 1 : 0, diff);
    EXPECT_LE(diff, kMaxRelErr) << rows << "x" << cols;
  }
}

// steps = 0 is the normalisation alone: O = U / max(||U||_F, eps), one
// rounding of the float quotient (plus the rounding of the denominator to
// float), so within 2 float ulps (2 * 2^-24 relative) of the exact value.
TEST(NewtonSchulzTest, NewtonSchulz_ZeroSteps_OnlyNormalises) {
  const std::vector<float> u = RandomMatrix(33, 65, 15);
  NewtonSchulzOptions options;
  options.steps = 0;
  const std::vector<float> got = RunNewtonSchulz(u, 33, 65, options);
  double sum = 0.0;
  for (float v : u) sum += static_cast<double>(v) * v;
  const double norm = std::sqrt(sum);
  for (size_t i = 0; i < u.size(); ++i) {
    const double want = u[i] / norm;
    ASSERT_NEAR(got[i], want, 2.0 * std::ldexp(std::abs(want), -24)) << i;
  }
  const std::vector<double> ref = Reference(u, 33, 65, options);
  EXPECT_LE(MaxRelError(got, ref), 2.0 * std::ldexp(1.0, -24));
}

TEST(NewtonSchulzTest, NewtonSchulz_AllZeroMatrix_ReturnsZerosWithoutNaN) {
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{8, 8}, {12, 5}, {5, 12}, {1, 1}}) {
    const std::vector<float> u(static_cast<size_t>(rows * cols), 0.0f);
    const std::vector<float> got = RunNewtonSchulz(u, rows, cols);
    for (float v : got) ASSERT_EQ(v, 0.0f) << rows << "x" << cols;
  }
}

// Below eps the norm is clamped: a tiny matrix is divided by eps, not by its
// own norm (torch: norm().clamp(min=eps)).
TEST(NewtonSchulzTest, NewtonSchulz_NormBelowEps_DividesByEps) {
  const std::vector<float> u = {1e-9f, 0.0f, 0.0f, 0.0f};
  NewtonSchulzOptions options;
  options.steps = 0;
  const std::vector<float> got = RunNewtonSchulz(u, 2, 2, options);
  EXPECT_FLOAT_EQ(got[0], 1e-9f / static_cast<float>(1e-7));
  EXPECT_EQ(got[1], 0.0f);
}

TEST(NewtonSchulzTest, NewtonSchulz_NonPositiveShape_ReturnsInvalidArgument) {
  std::vector<float> u(4, 1.0f), out(4);
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{0, 4}, {4, 0}, {-1, 2}, {2, -3}}) {
    const absl::Status status =
        NewtonSchulz(u.data(), rows, cols, {}, out.data(), nullptr);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
        << rows << "x" << cols;
  }
}

TEST(NewtonSchulzTest, NewtonSchulz_NegativeSteps_ReturnsInvalidArgument) {
  std::vector<float> u(4, 1.0f), out(4);
  NewtonSchulzOptions options;
  options.steps = -1;
  const absl::Status status =
      NewtonSchulz(u.data(), 2, 2, options, out.data(), nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("steps"));
}

TEST(NewtonSchulzTest, NewtonSchulz_OverlappingOutput_ReturnsInvalidArgument) {
  std::vector<float> buffer(8, 1.0f);
  EXPECT_EQ(
      NewtonSchulz(buffer.data(), 2, 2, {}, buffer.data(), nullptr).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      NewtonSchulz(buffer.data(), 2, 2, {}, buffer.data() + 3, nullptr).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      NewtonSchulz(buffer.data(), 2, 2, {}, buffer.data() + 4, nullptr).ok());
}

TEST(NewtonSchulzFlopsTest, NewtonSchulzFlops_WideAndTall_UseMinAndMaxDims) {
  // m = 2, n = 3: 5 * (4*2*2*3 + 2*8) = 5 * 64 = 320.
  EXPECT_EQ(NewtonSchulzFlops(2, 3, 5), 320.0);
  EXPECT_EQ(NewtonSchulzFlops(3, 2, 5), 320.0);
  EXPECT_EQ(NewtonSchulzFlops(1024, 1024, 5), 5.0 * 6.0 * 1024 * 1024 * 1024);
  EXPECT_EQ(NewtonSchulzFlops(7, 9, 0), 0.0);
}

TEST(NewtonSchulzFlopsTest,
     NewtonSchulzExecutedFlops_CountsSyrkAsHalf_SquareAndWide) {
  NewtonSchulzOptions options;
  options.steps = 5;
  // k * (3*m*m*n + m^3).
  EXPECT_DOUBLE_EQ(NewtonSchulzExecutedFlops(2048, 2048, options),
                   5.0 * 4.0 * 2048.0 * 2048.0 * 2048.0);
  EXPECT_DOUBLE_EQ(NewtonSchulzExecutedFlops(4096, 1024, options),
                   NewtonSchulzExecutedFlops(1024, 4096, options));
  EXPECT_DOUBLE_EQ(NewtonSchulzExecutedFlops(1024, 4096, options),
                   5.0 * (3.0 * 1024 * 1024 * 4096 + 1024.0 * 1024 * 1024));
}

}  // namespace
}  // namespace kernels
}  // namespace muon
