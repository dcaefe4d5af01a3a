// Gram Newton-Schulz (NewtonSchulzOptions::method = kGram) against the
// float64 reference of the standard iteration (the two are equal in exact
// arithmetic), determinism, option parsing and validation.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/newton_schulz.h"
#include "tests/kernels/ns_test_util.h"

namespace muon {
namespace kernels {
namespace {

using ::muon::kernels::testing::BitwiseEqual;
using ::muon::kernels::testing::FroRelError;
using ::muon::kernels::testing::MaxRelError;
using ::muon::kernels::testing::RandomMatrix;
using ::muon::kernels::testing::Reference;

// Error bounds of kGram (fp32) against the float64 reference, 5 quintic
// steps, uniform [-1, 1) inputs. Measured (tests/kernels/ns_gram_error.cc
// and this test's printout, OpenBLAS 0.3.21 Haswell and Cooperlake kernels,
// 2 threads), worst over 256x256, 256x1024, 1024x256, 1024x1024, 1024x4096,
// 4096x1024, 2048x2048 and this test's shapes, restart periods 1, 2, 3, 5:
//   ||O - O_64||_F / ||O_64||_F                 <= 1.8e-5 (r = 5, 200x200;
//                                                  r = 2: 3.5e-6)
//   ||O O^T - O_64 O_64^T||_F / ||O_64 O_64^T||_F <= 2.9e-5 (r = 5; r = 2:
//                                                  5.4e-6)
//   max |O - O_64| / max |O_64|                 <= 2.9e-5 (r = 5; r = 2:
//                                                  5.9e-6)
// (the standard iteration: 1.8e-6 / 2.9e-6 / 2.8e-6 on 256x256). The bounds
// leave about 3x over the worst (r = 5) measurement and stay 100x below a
// real fault (one step fewer or a wrong coefficient moves O by > 1e-2, see
// ns_test_util.h). The max-element bound is the standard kernel's 1e-4.
constexpr double kGramFroBound = 5e-5;
constexpr double kGramGramFroBound = 8e-5;
constexpr double kGramMaxBound = 1e-4;

NewtonSchulzOptions GramOptions(int every) {
  NewtonSchulzOptions options;
  options.method = NewtonSchulzMethod::kGram;
  options.gram_restart_every = every;
  return options;
}

std::vector<float> RunNs(const std::vector<float>& u, int64_t rows,
                         int64_t cols, const NewtonSchulzOptions& options,
                         NewtonSchulzWorkspace* workspace = nullptr) {
  std::vector<float> out(u.size(), -1.0f);
  const absl::Status status =
      NewtonSchulz(u.data(), rows, cols, options, out.data(), workspace);
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

// ||O O^T - W W^T||_F / ||W W^T||_F with O, W row-major [rows, cols] and the
// product over the longer dimension (m x m, m = min(rows, cols)).
double GramRelError(const std::vector<float>& o, const std::vector<double>& w,
                    int64_t rows, int64_t cols) {
  const bool tall = rows > cols;
  const int64_t m = std::min(rows, cols);
  const int64_t n = std::max(rows, cols);
  auto at = [&](const auto& v, int64_t i, int64_t k) -> double {
    return tall ? v[k * cols + i] : v[i * cols + k];
  };
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < m; ++j) {
      double got = 0.0, want = 0.0;
      for (int64_t k = 0; k < n; ++k) {
        got += at(o, i, k) * at(o, j, k);
        want += at(w, i, k) * at(w, j, k);
      }
      num += (got - want) * (got - want);
      den += want * want;
    }
  }
  return std::sqrt(num / den);
}

void ExpectGramMatchesReference(int64_t rows, int64_t cols, int every,
                                uint32_t seed) {
  SCOPED_TRACE(
      absl::StrCat(rows, "x", cols, " restart every ", every, " seed ", seed));
  const std::vector<float> u = RandomMatrix(rows, cols, seed);
  const std::vector<float> got = RunNs(u, rows, cols, GramOptions(every));
  const std::vector<double> want = Reference(u, rows, cols, {});
  const double fro = FroRelError(got, want);
  const double gram = GramRelError(got, want, rows, cols);
  const double max = MaxRelError(got, want);
  std::printf(
      "gram r=%d %lldx%lld seed %u: O fro %.3g, OOt fro %.3g, max %.3g\n",
      every, static_cast<long long>(rows), static_cast<long long>(cols), seed,
      fro, gram, max);
  EXPECT_LE(fro, kGramFroBound);
  EXPECT_LE(gram, kGramGramFroBound);
  EXPECT_LE(max, kGramMaxBound);
}

TEST(NewtonSchulzGramTest, Gram_WideTallSquare_MatchFloat64Reference) {
  for (int every : {1, 2, 3, 5}) {
    ExpectGramMatchesReference(128, 512, every, 1);
    ExpectGramMatchesReference(512, 128, every, 2);
    ExpectGramMatchesReference(200, 200, every, 3);
    ExpectGramMatchesReference(64, 700, every, 4);
  }
}

TEST(NewtonSchulzGramTest, Gram_SmallShapes_MatchFloat64Reference) {
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{1, 7}, {7, 1}, {2, 2}, {3, 17}, {33, 5}}) {
    ExpectGramMatchesReference(rows, cols, 2, 5);
  }
}

TEST(NewtonSchulzGramTest, Gram_SameInputTwice_BitwiseEqual) {
  const std::vector<float> u = RandomMatrix(96, 700, 7);
  NewtonSchulzWorkspace workspace;
  const std::vector<float> first =
      RunNs(u, 96, 700, GramOptions(2), &workspace);
  const std::vector<float> second =
      RunNs(u, 96, 700, GramOptions(2), &workspace);
  const std::vector<float> fresh = RunNs(u, 96, 700, GramOptions(2));
  EXPECT_TRUE(BitwiseEqual(first, second));
  EXPECT_TRUE(BitwiseEqual(first, fresh));
}

// With a restart every iteration, Gram NS re-forms R = X X^T each step,
// forms Z with the standard method's own polynomial code and applies Q = Z
// once: the standard iteration's operations, in its order.
TEST(NewtonSchulzGramTest, Gram_RestartEveryStep_BitwiseEqualsStandard) {
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{96, 700}, {700, 96}, {130, 130}, {1, 33}}) {
    const std::vector<float> u = RandomMatrix(rows, cols, 9);
    EXPECT_TRUE(BitwiseEqual(RunNs(u, rows, cols, GramOptions(1)),
                             RunNs(u, rows, cols, NewtonSchulzOptions())))
        << rows << "x" << cols;
  }
}

// kAuto: Gram exactly when it executes fewer FLOPs (k = 5, restart 2:
// long side > 2 x short side), and then bitwise the picked method.
TEST(NewtonSchulzGramTest, Auto_GramPastAspectTwo_BitwiseEqualsPickedMethod) {
  NewtonSchulzOptions auto_options;
  auto_options.method = NewtonSchulzMethod::kAuto;
  const struct {
    int64_t rows, cols;
    NewtonSchulzMethod expected;
  } cases[] = {{32, 160, NewtonSchulzMethod::kGram},
               {160, 32, NewtonSchulzMethod::kGram},
               {64, 129, NewtonSchulzMethod::kGram},
               {64, 128, NewtonSchulzMethod::kStandard},  // a tie
               {100, 100, NewtonSchulzMethod::kStandard},
               {90, 60, NewtonSchulzMethod::kStandard}};
  for (const auto& c : cases) {
    const NewtonSchulzMethod picked =
        ResolveNewtonSchulzMethod(c.rows, c.cols, auto_options);
    EXPECT_EQ(picked, c.expected) << c.rows << "x" << c.cols;
    NewtonSchulzOptions explicit_options;
    explicit_options.method = picked;
    EXPECT_EQ(NewtonSchulzExecutedFlops(c.rows, c.cols, auto_options),
              NewtonSchulzExecutedFlops(c.rows, c.cols, explicit_options));
    const std::vector<float> u = RandomMatrix(c.rows, c.cols, 10);
    EXPECT_TRUE(BitwiseEqual(RunNs(u, c.rows, c.cols, auto_options),
                             RunNs(u, c.rows, c.cols, explicit_options)))
        << c.rows << "x" << c.cols;
  }
  EXPECT_EQ(ResolveNewtonSchulzMethod(32, 160, GramOptions(2)),
            NewtonSchulzMethod::kGram);
  EXPECT_EQ(ResolveNewtonSchulzMethod(100, 100, GramOptions(2)),
            NewtonSchulzMethod::kGram);  // explicit methods are kept
}

// Reserve with Gram options holds the Gram iteration's two extra m x m
// buffers, so the call grows nothing; a standard Reserve does not, and an
// "auto" Reserve does only where auto picks Gram (80 x 24: 24^2 * 2 floats).
TEST(NewtonSchulzGramTest, Reserve_GramOptions_GramCallGrowsNothing) {
  const std::vector<float> u = RandomMatrix(80, 24, 21);
  NewtonSchulzWorkspace gram;
  gram.Reserve(80, 24, GramOptions(2));
  const int64_t reserved = gram.CapacityBytes();
  RunNs(u, 80, 24, GramOptions(2), &gram);
  EXPECT_EQ(gram.CapacityBytes(), reserved);

  NewtonSchulzWorkspace standard;
  standard.Reserve(80, 24, NewtonSchulzOptions());
  EXPECT_EQ(reserved - standard.CapacityBytes(),
            int64_t{2 * 24 * 24 * sizeof(float)});
  RunNs(u, 80, 24, GramOptions(2), &standard);
  EXPECT_EQ(standard.CapacityBytes(), reserved);

  NewtonSchulzOptions automatic;
  automatic.method = NewtonSchulzMethod::kAuto;
  NewtonSchulzWorkspace tall, square;
  tall.Reserve(80, 24, automatic);
  EXPECT_EQ(tall.CapacityBytes(), reserved);
  square.Reserve(24, 24, automatic);
  EXPECT_EQ(square.CapacityBytes(), int64_t{3 * 24 * 24 * sizeof(float)});
}

TEST(NewtonSchulzGramTest, Gram_ZeroSteps_EqualsStandardNormalisation) {
  const std::vector<float> u = RandomMatrix(40, 90, 8);
  NewtonSchulzOptions gram = GramOptions(2);
  gram.steps = 0;
  NewtonSchulzOptions standard;
  standard.steps = 0;
  EXPECT_TRUE(BitwiseEqual(RunNs(u, 40, 90, gram), RunNs(u, 40, 90, standard)));
}

TEST(NewtonSchulzGramTest, Gram_PolarExpressSchedule_MatchesReference) {
  NewtonSchulzOptions options = PolarExpressSchedule();
  options.method = NewtonSchulzMethod::kGram;
  const std::vector<float> u = RandomMatrix(128, 512, 9);
  const std::vector<float> got = RunNs(u, 128, 512, options);
  const std::vector<double> want = Reference(u, 128, 512, options);
  EXPECT_LE(FroRelError(got, want), kGramFroBound);
}

TEST(NewtonSchulzGramTest, ParseNewtonSchulzMethod_KnownNames_RoundTrip) {
  for (NewtonSchulzMethod method :
       {NewtonSchulzMethod::kStandard, NewtonSchulzMethod::kGram,
        NewtonSchulzMethod::kAuto}) {
    const absl::StatusOr<NewtonSchulzMethod> parsed =
        ParseNewtonSchulzMethod(NewtonSchulzMethodName(method));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, method);
  }
}

TEST(NewtonSchulzGramTest,
     ParseNewtonSchulzMethod_Unknown_ReturnsInvalidArgument) {
  const absl::StatusOr<NewtonSchulzMethod> parsed =
      ParseNewtonSchulzMethod("Gram");
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NewtonSchulzGramTest,
     ValidateNewtonSchulzOptions_RestartEveryZero_ReturnsInvalidArgument) {
  NewtonSchulzOptions options = GramOptions(0);
  EXPECT_EQ(ValidateNewtonSchulzOptions(options).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> u(4, 1.0f), out(4);
  EXPECT_EQ(NewtonSchulz(u.data(), 2, 2, options, out.data(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(NewtonSchulzGramTest, NewtonSchulzExecutedFlops_Gram_SumsBlocks) {
  // k = 5, restart 2: blocks 2, 2, 1: 3 * 3*m*m*n + (8 + 8 + 1) m^3.
  const double m = 1024, n = 4096;
  EXPECT_DOUBLE_EQ(NewtonSchulzExecutedFlops(1024, 4096, GramOptions(2)),
                   9.0 * m * m * n + 17.0 * m * m * m);
  EXPECT_DOUBLE_EQ(NewtonSchulzExecutedFlops(4096, 1024, GramOptions(5)),
                   3.0 * m * m * n + 29.0 * m * m * m);
}

}  // namespace
}  // namespace kernels
}  // namespace muon
