// Grounds the GPU error bounds (GpuErrorBound, tests/kernels/ns_test_util.h)
// on this machine, without a GPU: a CPU model of the GPU iteration's
// rounding (bf16 storage / tf32 GEMM inputs, fp32 accumulation) must stay
// inside the bounds with margin, and known bugs must fall outside them.
#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/newton_schulz.h"
#include "kernels/ns_engine.h"
#include "tests/kernels/ns_test_util.h"

namespace muon {
namespace kernels {
namespace {

using ::muon::kernels::testing::EmulateGpuNewtonSchulz;
using ::muon::kernels::testing::ErrorBound;
using ::muon::kernels::testing::FroRelError;
using ::muon::kernels::testing::GpuErrorBound;
using ::muon::kernels::testing::GpuReferenceShapes;
using ::muon::kernels::testing::GramFp32ZMarginShapes;
using ::muon::kernels::testing::MaxRelError;
using ::muon::kernels::testing::PrecisionName;
using ::muon::kernels::testing::PrintGramZErrors;
using ::muon::kernels::testing::RandomMatrix;
using ::muon::kernels::testing::Reference;

// The model must use at most this fraction of a bound, leaving room for the
// hardware's accumulation order and tensor-core rounding.
constexpr double kModelShare = 0.75;

TEST(PrecisionModelTest, EmulatedGpuArithmetic_WithinGpuBoundsWithMargin) {
  for (const NewtonSchulzOptions& options :
       {NewtonSchulzOptions{}, PolarExpressSchedule()}) {
    const char* schedule = options.coefficients.empty() ? "quintic" : "pe";
    for (auto [rows, cols] : GpuReferenceShapes()) {
      const std::vector<float> u = RandomMatrix(rows, cols, 41);
      const std::vector<double> ref = Reference(u, rows, cols, options);
      for (GpuPrecision precision :
           {GpuPrecision::kBf16, GpuPrecision::kTf32, GpuPrecision::kFp32}) {
        const std::vector<float> got =
            EmulateGpuNewtonSchulz(u, rows, cols, options, precision);
        const double max_err = MaxRelError(got, ref);
        const double fro_err = FroRelError(got, ref);
        const ErrorBound bound = GpuErrorBound(precision);
        std::printf(
            "model %s %s %lldx%lld: max %.3g (bound %.3g) fro %.3g "
            "(bound %.3g)\n",
            schedule, PrecisionName(precision).c_str(),
            static_cast<long long>(rows), static_cast<long long>(cols), max_err,
            bound.max_rel, fro_err, bound.fro_rel);
        ::testing::Test::RecordProperty(
            absl::StrCat("model_", schedule, "_", PrecisionName(precision), "_",
                         rows, "x", cols),
            absl::StrCat(max_err, " ", fro_err));
        EXPECT_LE(max_err, kModelShare * bound.max_rel)
            << schedule << " " << PrecisionName(precision) << " " << rows << "x"
            << cols;
        EXPECT_LE(fro_err, kModelShare * bound.fro_rel)
            << schedule << " " << PrecisionName(precision) << " " << rows << "x"
            << cols;
      }
    }
  }
}

// The model is not trivially exact: reduced precision costs accuracy in the
// expected order (fp32 << tf32 << bf16).
TEST(PrecisionModelTest, EmulatedGpuArithmetic_ErrorsOrderedByPrecision) {
  const std::vector<float> u = RandomMatrix(128, 128, 42);
  const NewtonSchulzOptions options;
  const std::vector<double> ref = Reference(u, 128, 128, options);
  const double bf16 = FroRelError(
      EmulateGpuNewtonSchulz(u, 128, 128, options, GpuPrecision::kBf16), ref);
  const double tf32 = FroRelError(
      EmulateGpuNewtonSchulz(u, 128, 128, options, GpuPrecision::kTf32), ref);
  const double fp32 = FroRelError(
      EmulateGpuNewtonSchulz(u, 128, 128, options, GpuPrecision::kFp32), ref);
  EXPECT_LT(fp32, 1e-5);
  EXPECT_GT(tf32, 10 * fp32);
  EXPECT_GT(bf16, 2 * tf32);
}

// The bounds detect real bugs: each perturbed float64 result is outside the
// loosest (bf16) Frobenius bound, on every reference shape.
TEST(PrecisionModelTest, KnownBugs_ExceedLoosestBound) {
  const double bound = GpuErrorBound(GpuPrecision::kBf16).fro_rel;
  for (auto [rows, cols] : GpuReferenceShapes()) {
    const std::vector<float> u = RandomMatrix(rows, cols, 43);
    const NewtonSchulzOptions pe = PolarExpressSchedule();
    const std::vector<double> pe_ref = Reference(u, rows, cols, pe);
    const NewtonSchulzOptions quintic;
    const std::vector<double> quintic_ref = Reference(u, rows, cols, quintic);

    NewtonSchulzOptions no_scale = pe;
    no_scale.norm_scale = 1.0;
    NewtonSchulzOptions swapped = pe;
    std::swap(swapped.coefficients[3], swapped.coefficients[4]);
    NewtonSchulzOptions fewer = quintic;
    fewer.steps = 4;
    NewtonSchulzOptions wrong_b = quintic;
    wrong_b.b = -4.6;
    const std::vector<std::pair<const char*, double>> bugs = {
        {"pe norm_scale 1",
         FroRelError(EmulateGpuNewtonSchulz(u, rows, cols, no_scale,
                                            GpuPrecision::kFp32),
                     pe_ref)},
        {"pe swapped iterations",
         FroRelError(EmulateGpuNewtonSchulz(u, rows, cols, swapped,
                                            GpuPrecision::kFp32),
                     pe_ref)},
        {"quintic 4 steps",
         FroRelError(
             EmulateGpuNewtonSchulz(u, rows, cols, fewer, GpuPrecision::kFp32),
             quintic_ref)},
        {"quintic b = -4.6",
         FroRelError(EmulateGpuNewtonSchulz(u, rows, cols, wrong_b,
                                            GpuPrecision::kFp32),
                     quintic_ref)},
    };
    for (const auto& [bug, err] : bugs) {
      std::printf("%s %lldx%lld: fro %.3g (bound %.3g)\n", bug,
                  static_cast<long long>(rows), static_cast<long long>(cols),
                  err, bound);
      EXPECT_GT(err, bound) << bug << " " << rows << "x" << cols;
    }
  }
}

// The bf16 Gram iteration (restart every 2) as the GPU runs it by default
// rounds b R + c R R, then Z again after a is added to the diagonal: that
// lands it farther from the float64 iteration than the standard one, and
// forming Z in fp32 with one rounding (MUON_NS_GRAM_FP32_Z) lands it no
// farther, on the shapes GramBf16Fp32Z_NoFartherFromFloat64ThanStandard
// measures on a GPU (printed: the margins that test relies on).
TEST(PrecisionModelTest,
     EmulatedBf16Gram_Fp32ZNoFartherThanStandard_DoubleRoundedZFarther) {
  NewtonSchulzOptions gram;
  gram.method = NewtonSchulzMethod::kGram;
  for (auto [rows, cols] : GramFp32ZMarginShapes()) {
    const std::vector<float> u = RandomMatrix(rows, cols, 1);
    const std::vector<double> ref = Reference(u, rows, cols, {});
    const auto error = [&](const NewtonSchulzOptions& options, bool fp32_z) {
      return FroRelError(EmulateGpuNewtonSchulz(u, rows, cols, options,
                                                GpuPrecision::kBf16, fp32_z),
                         ref);
    };
    const double standard = error({}, false);
    const double gram_default = error(gram, false);
    const double gram_fp32_z = error(gram, true);
    PrintGramZErrors("model bf16", rows, cols, standard, gram_default,
                     gram_fp32_z);
    EXPECT_GT(gram_default, standard) << rows << "x" << cols;
    EXPECT_LE(gram_fp32_z, standard) << rows << "x" << cols;
  }
}

}  // namespace
}  // namespace kernels
}  // namespace muon
