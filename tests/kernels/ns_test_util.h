// Shared helpers of the Newton-Schulz tests: deterministic inputs, error
// metrics, the float64 reference on float inputs, a CPU model of the GPU
// arithmetic, and the GPU error bounds with their justification.
#ifndef MUON_TESTS_KERNELS_NS_TEST_UTIL_H_
#define MUON_TESTS_KERNELS_NS_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/newton_schulz.h"
#include "kernels/ns_engine.h"

namespace muon {
namespace kernels {
namespace testing {

// Entries uniform in [-1, 1), from raw mt19937 bits (portable).
std::vector<float> RandomMatrix(int64_t rows, int64_t cols, uint32_t seed);

// max_ij |got - want| / max_ij |want| (the metric of newton_schulz_test);
// NaN when any difference is NaN.
double MaxRelError(const std::vector<float>& got,
                   const std::vector<double>& want);

// ||got - want||_F / ||want||_F.
double FroRelError(const std::vector<float>& got,
                   const std::vector<double>& want);

bool BitwiseEqual(const std::vector<float>& x, const std::vector<float>& y);

// NewtonSchulzReference on the float input widened to double.
std::vector<double> Reference(const std::vector<float>& u, int64_t rows,
                              int64_t cols, const NewtonSchulzOptions& options);

// A CPU model of the GPU iteration's rounding (kernels/cuda/
// newton_schulz_cuda.h), with OpenBLAS sgemm standing in for the tensor
// cores' exact products and fp32 accumulation:
//   kBf16: X, A, B rounded to bfloat16 (round to nearest even) after every
//          step that stores them; GEMM inputs are then exact in fp32.
//   kTf32: GEMM inputs rounded to tf32 (10-bit mantissa, nearest even),
//          the beta term and the outputs kept in fp32.
//   kFp32: plain fp32 (the CPU kernel's arithmetic).
// options.method kGram runs the Gram iteration as the GPU does (its R, Z,
// Q, T stored like A and B, Z's diagonal rounded once more after a is
// added); any other method the standard one.
// Used to derive and check the GPU error bounds without a GPU, and as the
// figure the GPU's bf16 error is compared with (ns_gram_error).
// `gram_fp32_z`: the Gram iteration forms Z = a I + b R + c R R in fp32
// and rounds it once (MUON_NS_GRAM_FP32_Z=1 on the GPU).
std::vector<float> EmulateGpuNewtonSchulz(const std::vector<float>& u,
                                          int64_t rows, int64_t cols,
                                          const NewtonSchulzOptions& options,
                                          GpuPrecision precision,
                                          bool gram_fp32_z = false);

// Prints "<what> <rows>x<cols>: standard S, Gram G, Gram with fp32 Z F":
// the relative Frobenius distances to the float64 iteration that the bf16
// Gram accuracy tests compare.
void PrintGramZErrors(const char* what, int64_t rows, int64_t cols,
                      double standard, double gram, double gram_fp32_z);

// Error bounds of the GPU iteration against the float64 reference, for
// matrices with min(rows, cols) >= 50 (see below for smaller ones).
//
// Why these numbers. The iteration amplifies a perturbation of a singular
// value by up to |p'(s)| per step (3.4445 near 0 for the quintic; 8.16 for
// Polar Express's first polynomial), so the final error is a multiple of the
// rounding unit u of the stored operands: fp32 u = 2^-24, tf32 inputs
// u = 2^-11 (~4.9e-4), bf16 storage u = 2^-8 (~3.9e-3) for every X, A, B.
// The CPU model above (EmulateGpuNewtonSchulz) measured, worst case over
// 128x128, 256x512, 512x256, 96x1100, 1100x96, 200x50, 384x384, 64x64, 3-10
// seeds each, quintic and Polar Express:
//   fp32: max 1.1e-5, Frobenius 3.9e-6        (CPU fp32 kernel itself)
//   tf32: max 9.2e-3, Frobenius 4.5e-3        (round-to-nearest inputs;
//         1.4e-2 / 6.2e-3 if the hardware truncated instead)
//   bf16: max 5.8e-2, Frobenius 2.1e-2        (Polar Express 1100x96 worst;
//         quintic max 3.6e-2)
// The bounds leave ~1.6-2x over the model's worst case (Frobenius) for
// accumulation-order and tensor-core rounding differences, while real bugs
// stay far above them: float64 reference of Polar Express with norm_scale 1
// instead of 1.02 differs by 0.077-0.105 (Frobenius), the quintic with a =
// 3.4 instead of 3.4445 by 0.043-0.215, Polar Express with two iterations
// swapped by 0.41-8.7, one step fewer ~0.5 (tests/kernels/
// ns_precision_model_test.cc asserts both directions on the CPU).
//
// Why two metrics. The max-element metric (as the CPU test uses) is
// dominated by a few elements tied to the smallest singular values; it
// stays the check for fp32 (1e-4, the CPU kernel's bound and reasoning).
// For bf16 and tf32 the Frobenius error measures the whole result and is
// the tighter, more stable check; the max bound catches a localised fault
// (a wrong tile gives errors ~1). A bf16 bound of 5e-2 of max|O_ref| would
// hold for the quintic (model 3.6e-2) but not for Polar Express (5.8e-2).
//
// Small or rank-1 matrices: when m is tiny the top singular value sits at
// ||X||_F, where Polar Express's polynomials are steep (|p'| ~ 16 at
// s = 1/1.02 for the first one); the model gives tf32 errors ~0.12 for
// 1x300 and bf16 ~0.16 for 2x2. Tests of small shapes use fp32 only.
struct ErrorBound {
  double max_rel;  // Of max|O_ref|.
  double fro_rel;  // Of ||O_ref||_F.
};
ErrorBound GpuErrorBound(GpuPrecision precision);

// Shapes (rows, cols) the GPU tests compare with the float64 reference;
// all have min(rows, cols) >= 50.
const std::vector<std::pair<int64_t, int64_t>>& GpuReferenceShapes();

// Shapes on which the bf16 Gram iteration with Z in fp32 (restart every
// 2) is asserted no farther from float64 than the standard iteration: on
// the GPU, and in the CPU model, which prints the margin there.
const std::vector<std::pair<int64_t, int64_t>>& GramFp32ZMarginShapes();

std::string PrecisionName(GpuPrecision precision);

}  // namespace testing
}  // namespace kernels
}  // namespace muon

#endif  // MUON_TESTS_KERNELS_NS_TEST_UTIL_H_
