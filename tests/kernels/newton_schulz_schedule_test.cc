// Coefficient schedules as data (NewtonSchulzOptions::coefficients,
// norm_scale): the quintic as an explicit list, Polar Express, parsing,
// validation and FLOP counts.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/newton_schulz.h"
#include "tests/kernels/ns_test_util.h"

namespace muon {
namespace kernels {
namespace {

using ::muon::kernels::testing::BitwiseEqual;
using ::muon::kernels::testing::MaxRelError;
using ::muon::kernels::testing::RandomMatrix;
using ::muon::kernels::testing::Reference;
using ::testing::HasSubstr;

// The fp32 kernel's bound against float64 (newton_schulz_test.cc explains
// 1e-4). Polar Express amplifies rounding more (first polynomial's slope at
// 0 is 8.16 vs 3.4445, product of the five slopes ~990 vs ~480): measured
// 2.8e-6 .. 1.1e-5 on 64x64 .. 96x1100 and 2.8e-5 on a 1x300 vector (the
// steepest case: its one singular value sits at 1/1.02 where the first
// polynomial's slope is ~16), still under 1e-4.
constexpr double kMaxRelErr = 1e-4;

std::vector<float> RunNs(const std::vector<float>& u, int64_t rows,
                         int64_t cols, const NewtonSchulzOptions& options) {
  std::vector<float> out(u.size(), -1.0f);
  const absl::Status status =
      NewtonSchulz(u.data(), rows, cols, options, out.data(), nullptr);
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

const std::vector<std::pair<int64_t, int64_t>>& Shapes() {
  static const auto* shapes = new std::vector<std::pair<int64_t, int64_t>>{
      {64, 64}, {200, 50}, {50, 200}, {96, 1100}, {1, 300}, {300, 1}};
  return *shapes;
}

TEST(CoefficientScheduleTest,
     QuinticSchedule_ExplicitList_BitwiseEqualToDefault) {
  for (auto [rows, cols] : Shapes()) {
    const std::vector<float> u = RandomMatrix(rows, cols, 21);
    const std::vector<float> scalar =
        RunNs(u, rows, cols, NewtonSchulzOptions{});
    const std::vector<float> list = RunNs(u, rows, cols, QuinticSchedule(5));
    EXPECT_TRUE(BitwiseEqual(scalar, list)) << rows << "x" << cols;
    // The float64 reference follows the list the same way.
    const std::vector<double> ref_scalar =
        Reference(u, rows, cols, NewtonSchulzOptions{});
    const std::vector<double> ref_list =
        Reference(u, rows, cols, QuinticSchedule(5));
    EXPECT_EQ(ref_scalar, ref_list) << rows << "x" << cols;
  }
}

TEST(CoefficientScheduleTest,
     QuinticSchedule_OtherStepCounts_MatchScalarSteps) {
  const std::vector<float> u = RandomMatrix(40, 70, 22);
  for (int steps : {0, 1, 3, 7}) {
    NewtonSchulzOptions scalar;
    scalar.steps = steps;
    EXPECT_TRUE(BitwiseEqual(RunNs(u, 40, 70, scalar),
                             RunNs(u, 40, 70, QuinticSchedule(steps))))
        << steps;
  }
}

// A non-empty list overrides `steps` (and the scalar a, b, c).
TEST(CoefficientScheduleTest, ExplicitList_OverridesStepsAndScalars) {
  const std::vector<float> u = RandomMatrix(30, 45, 23);
  NewtonSchulzOptions options = QuinticSchedule(5);
  options.steps = 1;
  options.a = 100.0;
  options.b = -100.0;
  options.c = 100.0;
  EXPECT_TRUE(BitwiseEqual(RunNs(u, 30, 45, options),
                           RunNs(u, 30, 45, NewtonSchulzOptions{})));
  EXPECT_EQ(NewtonSchulzIterations(options), 5);
  // steps < 0 is only an error without a list.
  options.steps = -1;
  EXPECT_TRUE(ValidateNewtonSchulzOptions(options).ok());
}

// Iterations may differ: a two-entry list equals one step of each triple
// run in sequence (the second step's input is the first step's output,
// normalised by an eps-clamped norm that is ~1 here: compare through the
// float64 reference, where norm_scale and eps do not hide a reordering).
TEST(CoefficientScheduleTest, ExplicitList_AppliesEntriesInOrder) {
  const std::vector<double> u = {3.0, -4.0};  // ||u|| = 5, s0 = 1.
  NewtonSchulzOptions options;
  options.coefficients = {{2.0, -1.5, 0.5}, {3.0, -2.0, 0.25}};
  std::vector<double> out(2);
  NewtonSchulzReference(u.data(), 1, 2, options, out.data());
  double s = 1.0;
  s = 2.0 * s - 1.5 * s * s * s + 0.5 * std::pow(s, 5);   // 1.0
  s = 3.0 * s - 2.0 * s * s * s + 0.25 * std::pow(s, 5);  // 1.25
  EXPECT_NEAR(out[0], 0.6 * s, 1e-15);
  EXPECT_NEAR(out[1], -0.8 * s, 1e-15);
}

TEST(PolarExpressTest, PolarExpressSchedule_HasPublishedCoefficients) {
  const NewtonSchulzOptions pe = PolarExpressSchedule();
  ASSERT_EQ(pe.coefficients.size(), 5u);
  EXPECT_EQ(NewtonSchulzIterations(pe), 5);
  EXPECT_EQ(pe.norm_scale, 1.02);
  EXPECT_EQ(pe.eps, 1e-7);
  const std::array<double, 3> first = {8.156554524902461, -22.48329292557795,
                                       15.878769915207462};
  const std::array<double, 3> last = {2.3465413258596377, -1.7097828382687081,
                                      0.42323551169305323};
  EXPECT_EQ(pe.coefficients.front(), first);
  EXPECT_EQ(pe.coefficients.back(), last);
}

// A 1 x N matrix has one singular value, s0 = ||u|| / (1.02 ||u||) = 1/1.02
// after Polar Express's normalisation; iteration i maps it through
// p_i(s) = a_i s + b_i s^3 + c_i s^5, so O = p_5(...p_1(s0)) * u / ||u||.
// This pins the order of the list and where norm_scale enters.
TEST(PolarExpressTest, RowVector_ScalesByComposedPolynomials) {
  const NewtonSchulzOptions pe = PolarExpressSchedule();
  double s = 1.0 / 1.02;
  for (const std::array<double, 3>& abc : pe.coefficients) {
    s = abc[0] * s + abc[1] * s * s * s + abc[2] * std::pow(s, 5);
  }
  const std::vector<double> u = {3.0, -4.0};
  std::vector<double> ref(2);
  NewtonSchulzReference(u.data(), 1, 2, pe, ref.data());
  EXPECT_NEAR(ref[0], 0.6 * s, 1e-13);
  EXPECT_NEAR(ref[1], -0.8 * s, 1e-13);
  const std::vector<float> got = RunNs({3.0f, -4.0f}, 1, 2, pe);
  EXPECT_NEAR(got[0], 0.6 * s, kMaxRelErr * std::abs(s));
  EXPECT_NEAR(got[1], -0.8 * s, kMaxRelErr * std::abs(s));
}

TEST(PolarExpressTest, NewtonSchulz_PolarExpress_MatchesFloat64Reference) {
  const NewtonSchulzOptions pe = PolarExpressSchedule();
  for (auto [rows, cols] : Shapes()) {
    const std::vector<float> u = RandomMatrix(rows, cols, 24);
    const double err =
        MaxRelError(RunNs(u, rows, cols, pe), Reference(u, rows, cols, pe));
    std::printf("Polar Express fp32 %lldx%lld: max rel err %.3g\n",
                static_cast<long long>(rows), static_cast<long long>(cols),
                err);
    ::testing::Test::RecordProperty(
        absl::StrCat("pe_rel_err_", rows, "x", cols), absl::StrCat(err));
    EXPECT_LE(err, kMaxRelErr) << rows << "x" << cols;
  }
}

// ||O O^T - I||_F / sqrt(m) for O [m, n], m <= n: the RMS distance of O's
// singular values (squared) from 1.
double OrthogonalityDefect(const std::vector<double>& o, int64_t m, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < m; ++j) {
      double dot = 0.0;
      for (int64_t k = 0; k < n; ++k) dot += o[i * n + k] * o[j * n + k];
      const double d = dot - (i == j ? 1.0 : 0.0);
      sum += d * d;
    }
  }
  return std::sqrt(sum / static_cast<double>(m));
}

// On a well-conditioned matrix (64 x 256 with i.i.d. entries: singular
// values within a factor ~3 of each other, Marchenko-Pastur), Polar Express
// drives every singular value close to 1, while the quintic by design
// leaves them spread (torch's docstring: S' ~ Uniform(0.5, 1.5)). Computed
// in float64 so the property is the schedules', not the rounding's.
TEST(PolarExpressTest, PolarExpress_WellConditioned_MoreOrthogonalThanQuintic) {
  const int64_t m = 64;
  const int64_t n = 256;
  const std::vector<float> u = RandomMatrix(m, n, 25);
  const double pe =
      OrthogonalityDefect(Reference(u, m, n, PolarExpressSchedule()), m, n);
  const double quintic5 =
      OrthogonalityDefect(Reference(u, m, n, QuinticSchedule(5)), m, n);
  const double quintic3 =
      OrthogonalityDefect(Reference(u, m, n, QuinticSchedule(3)), m, n);
  const double input =
      OrthogonalityDefect(Reference(u, m, n, QuinticSchedule(0)), m, n);
  std::printf(
      "||O O^T - I||_F / sqrt(m): normalised input %.3g, quintic x3 %.3g, "
      "quintic x5 %.3g, Polar Express %.3g\n",
      input, quintic3, quintic5, pe);
  // Measured (OpenBLAS-free float64): input 0.98, quintic x3 0.37, quintic
  // x5 0.38, Polar Express 0.19 (singular values within ~10% of 1).
  EXPECT_LT(quintic3, input);
  EXPECT_LT(pe, quintic3);
  EXPECT_LT(pe, 0.6 * quintic5);
}

TEST(CoefficientScheduleTest, ParseCoefficientSchedule_KnownNames) {
  absl::StatusOr<NewtonSchulzOptions> quintic =
      ParseCoefficientSchedule("quintic");
  ASSERT_TRUE(quintic.ok()) << quintic.status();
  ASSERT_EQ(quintic->coefficients.size(), 5u);
  const std::array<double, 3> keller = {3.4445, -4.7750, 2.0315};
  EXPECT_EQ(quintic->coefficients[0], keller);
  EXPECT_EQ(quintic->norm_scale, 1.0);
  absl::StatusOr<NewtonSchulzOptions> pe =
      ParseCoefficientSchedule("polar_express");
  ASSERT_TRUE(pe.ok()) << pe.status();
  EXPECT_EQ(pe->coefficients, PolarExpressSchedule().coefficients);
  EXPECT_EQ(pe->norm_scale, 1.02);
}

TEST(CoefficientScheduleTest,
     CoefficientScheduleFor_QuinticTakesTheOptimizersCoefficients) {
  const NewtonSchulzOptions quintic =
      CoefficientScheduleFor(CoefficientSchedule::kQuintic, 2.0, -1.5, 0.5, 3);
  EXPECT_TRUE(quintic.coefficients.empty());
  EXPECT_EQ(quintic.a, 2.0);
  EXPECT_EQ(quintic.b, -1.5);
  EXPECT_EQ(quintic.c, 0.5);
  EXPECT_EQ(quintic.steps, 3);
  const NewtonSchulzOptions pe = CoefficientScheduleFor(
      CoefficientSchedule::kPolarExpress, 2.0, -1.5, 0.5, 3);
  EXPECT_EQ(pe.coefficients, PolarExpressSchedule().coefficients);
  for (const char* name : {"quintic", "polar_express"}) {
    absl::StatusOr<CoefficientSchedule> parsed =
        ParseCoefficientScheduleName(name);
    ASSERT_TRUE(parsed.ok()) << name;
    EXPECT_EQ(CoefficientScheduleName(*parsed), name);
  }
  EXPECT_EQ(ParseCoefficientScheduleName("cubic").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CoefficientScheduleTest,
     ParseCoefficientSchedule_Unknown_ReturnsInvalidArgument) {
  for (const char* name : {"Quintic", "polar-express", "", "cubic"}) {
    absl::StatusOr<NewtonSchulzOptions> parsed = ParseCoefficientSchedule(name);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument)
        << name;
    EXPECT_THAT(std::string(parsed.status().message()),
                HasSubstr(absl::StrCat("\"", name, "\"")));
  }
}

TEST(CoefficientScheduleTest,
     Validate_BadFields_ReturnInvalidArgumentNamingThem) {
  NewtonSchulzOptions nan_coefficient = QuinticSchedule(3);
  nan_coefficient.coefficients[2][1] = std::nan("");
  NewtonSchulzOptions zero_scale;
  zero_scale.norm_scale = 0.0;
  NewtonSchulzOptions inf_scale;
  inf_scale.norm_scale = INFINITY;
  NewtonSchulzOptions negative_eps;
  negative_eps.eps = -1.0;
  const std::vector<std::pair<NewtonSchulzOptions, std::string>> cases = {
      {nan_coefficient, "iteration 2"},
      {zero_scale, "norm_scale"},
      {inf_scale, "norm_scale"},
      {negative_eps, "eps"}};
  for (const auto& [options, field] : cases) {
    const absl::Status status = ValidateNewtonSchulzOptions(options);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(std::string(status.message()), HasSubstr(field));
    std::vector<float> u(4, 1.0f), out(4);
    EXPECT_EQ(NewtonSchulz(u.data(), 2, 2, options, out.data(), nullptr).code(),
              absl::StatusCode::kInvalidArgument)
        << field;
  }
}

// norm_scale divides the normalised matrix: with steps = 0 the output is
// u / (norm_scale * ||u||).
TEST(CoefficientScheduleTest, NormScale_ZeroSteps_DividesByScaledNorm) {
  NewtonSchulzOptions options;
  options.steps = 0;
  options.norm_scale = 2.0;
  const std::vector<float> got = RunNs({3.0f, -4.0f}, 1, 2, options);
  EXPECT_EQ(got[0], 0.3f);
  EXPECT_EQ(got[1], -0.4f);
}

TEST(NewtonSchulzFlopsTest, NewtonSchulzFlops_Options_CountScheduleLength) {
  // m = 2, n = 3: one iteration is 4*2*2*3 + 2*8 = 64 FLOPs.
  EXPECT_EQ(NewtonSchulzFlops(2, 3, NewtonSchulzOptions{}), 320.0);
  EXPECT_EQ(NewtonSchulzFlops(3, 2, QuinticSchedule(3)), 192.0);
  EXPECT_EQ(NewtonSchulzFlops(2, 3, PolarExpressSchedule()), 320.0);
  NewtonSchulzOptions list = QuinticSchedule(2);
  list.steps = 9;  // Ignored: the list has 2 entries.
  EXPECT_EQ(NewtonSchulzFlops(2, 3, list), 128.0);
  EXPECT_EQ(NewtonSchulzFlops(1024, 4096, PolarExpressSchedule()),
            NewtonSchulzFlops(1024, 4096, 5));
}

}  // namespace
}  // namespace kernels
}  // namespace muon
