// Newton-Schulz orthogonalization of one fp32 matrix on the CPU (OpenBLAS).
//
// This is the O <- NS_k(U) line of a Muon step: the semantics of
// torch.optim.Muon's `_zeropower_via_newtonschulz` (torch/optim/_muon.py,
// PyTorch 2.9) computed in float32 instead of bfloat16, on cblas_ssyrk /
// cblas_sgemm with the scalars folded into the products and transposes by
// GEMM flags (no transpose copies).
//
// Determinism: our own reduction (the norm) is sequential in index order and
// every product goes through kernels/blas_tiles.h (fixed output tiles, each
// one single-threaded OpenBLAS call over the whole inner dimension), so the
// output bits are a function of the input bits, the options and the OpenBLAS
// build and core type (OPENBLAS_CORETYPE or autodetection; BlasCoreName())
// only, whatever the thread count (ComputeThreads(), OPENBLAS_NUM_THREADS)
// of either process. The Haswell and Cooperlake kernels on the same CPU
// still give different last bits (measured), so processes that must agree
// bitwise (an owner rank and a single-device reference) must run the same
// core type. Note `bazel test` clears the environment, so a test
// autodetects the core even where the shell sets OPENBLAS_CORETYPE.
#ifndef MUON_KERNELS_NEWTON_SCHULZ_H_
#define MUON_KERNELS_NEWTON_SCHULZ_H_

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muon {
namespace kernels {

// How NewtonSchulz evaluates the iteration (the polynomials are the same).
enum class NewtonSchulzMethod {
  // X <- p(X X^T) X on the m x n matrix every iteration (torch's order of
  // operations, with symmetric products).
  kStandard,
  // Gram Newton-Schulz (Dao AI Lab, "Gram Newton-Schulz: A Fast,
  // Hardware-Aware Newton-Schulz Algorithm for Muon", 2026,
  // tridao.me/blog/2026/gram-newton-schulz): iterate on the m x m Gram
  // matrix and multiply X once per restart block; cheaper when n >> m, see
  // NewtonSchulz.
  kGram,
  // Per matrix, whichever of kStandard and kGram executes fewer FLOPs
  // (NewtonSchulzExecutedFlops; kStandard on a tie): with k = 5 and a
  // restart every 2, kGram once the long side exceeds twice the short one
  // (9m^2n + 17m^3 vs 15m^2n + 5m^3). See ResolveNewtonSchulzMethod.
  kAuto,
};

// Coefficients and iteration count of the quintic Newton-Schulz iteration
// X <- a*X + b*(X X^T) X + c*(X X^T)^2 X. Defaults are torch.optim.Muon's.
//
// The coefficient schedule is data: either the scalar (a, b, c) repeated
// `steps` times (the default, torch.optim.Muon's behaviour), or one (a, b, c)
// per iteration in `coefficients` (Polar Express and other tuned schedules;
// see QuinticSchedule, PolarExpressSchedule, ParseCoefficientSchedule).
struct NewtonSchulzOptions {
  // Linear coefficient (Keller Jordan's quintic).
  double a = 3.4445;
  // Cubic coefficient.
  double b = -4.7750;
  // Quintic coefficient.
  double c = 2.0315;
  // Lower clamp of the Frobenius norm before normalisation; keeps an
  // all-zero matrix finite (torch: `norm().clamp(min=eps)`).
  double eps = 1e-7;
  // Number of iterations k (>= 0). 0 means "normalise only". Ignored when
  // `coefficients` is non-empty.
  int steps = 5;
  // Per-iteration coefficients: iteration i uses coefficients[i] = (a, b, c)
  // and k = coefficients.size(). Empty (the default): a, b, c above repeated
  // `steps` times, bit for bit the same as an explicit list of that triple.
  std::vector<std::array<double, 3>> coefficients;
  // The normalisation divides by max(norm_scale * ||X||_F, eps) (> 0, finite).
  // 1.0 is torch.optim.Muon; Polar Express uses 1.02 so that rounding cannot
  // push the top singular value above 1 (outside the interval its
  // polynomials were fitted on).
  double norm_scale = 1.0;
  // Evaluation order: standard (default) or Gram Newton-Schulz.
  NewtonSchulzMethod method = NewtonSchulzMethod::kStandard;
  // kGram only: re-form the Gram matrix from the current X after every this
  // many iterations (>= 1; 1 is the standard iteration's arithmetic in a
  // different order). 2 is the restart "at iteration 2" of the Dao AI Lab
  // write-up (and DeepSpeed's Gram NS); k = 5 then runs blocks of 2, 2, 1.
  int gram_restart_every = 2;
};

// Parses a method name: "standard", "gram" or "auto" (exact,
// case-sensitive).
// Errors:
//   InvalidArgument: any other name (the message quotes it).
absl::StatusOr<NewtonSchulzMethod> ParseNewtonSchulzMethod(
    absl::string_view name);

// "standard", "gram" or "auto".
absl::string_view NewtonSchulzMethodName(NewtonSchulzMethod method);

// The method NewtonSchulz runs on a [rows, cols] matrix: options.method,
// with kAuto resolved to the one of kStandard and kGram (with
// options.gram_restart_every) that executes fewer FLOPs, kStandard on a
// tie. Never returns kAuto.
NewtonSchulzMethod ResolveNewtonSchulzMethod(
    int64_t rows, int64_t cols, const NewtonSchulzOptions& options);

// Number of iterations k that `options` runs: coefficients.size() when the
// schedule is explicit, else steps.
int NewtonSchulzIterations(const NewtonSchulzOptions& options);

// (a, b, c) of iteration `i` (0 <= i < NewtonSchulzIterations(options)).
std::array<double, 3> NewtonSchulzCoefficients(
    const NewtonSchulzOptions& options, int i);

// Keller Jordan's quintic (3.4445, -4.7750, 2.0315) as an explicit
// `steps`-entry schedule (norm_scale 1, eps 1e-7). QuinticSchedule(5) gives
// the same bits as default-constructed options.
NewtonSchulzOptions QuinticSchedule(int steps = 5);

// Polar Express (Amsel, Persson, Musco, Gower, "The Polar Express: Optimal
// Matrix Sign Methods and Their Application to the Muon Algorithm", 2025,
// arXiv:2505.16932): five per-iteration degree-5 polynomials, each optimal
// (minimax) for the interval of singular values the previous ones leave,
// computed with safety factor 2e-2 and cushion 2, as used in modded-nanogpt's
// `polar_express` (KellerJordan/modded-nanogpt, train_gpt.py). The matrix is
// normalised by 1.02 * ||X||_F (norm_scale = 1.02; modded-nanogpt writes
// X / (||X||_F * (1 + 2e-2) + 1e-6); here eps stays a lower clamp, 1e-7).
// Unlike the quintic, it drives singular values close to 1.
NewtonSchulzOptions PolarExpressSchedule();

// Parses a schedule name: "quintic" (QuinticSchedule(5), torch's default) or
// "polar_express" (PolarExpressSchedule()). Exact, case-sensitive.
// Errors:
//   InvalidArgument: any other name (the message quotes it).
absl::StatusOr<NewtonSchulzOptions> ParseCoefficientSchedule(
    absl::string_view name);

// A named coefficient schedule.
enum class CoefficientSchedule {
  kQuintic,       // (a, b, c) repeated: torch.optim.Muon's iteration
  kPolarExpress,  // PolarExpressSchedule()
};

// Parses "quintic" or "polar_express" (exact, case-sensitive).
// Errors: InvalidArgument: any other name (the message quotes it).
absl::StatusOr<CoefficientSchedule> ParseCoefficientScheduleName(
    absl::string_view name);

// "quintic" or "polar_express".
absl::string_view CoefficientScheduleName(CoefficientSchedule schedule);

// The iteration an optimizer with torch.optim.Muon's ns_coefficients
// (a, b, c) and ns_steps runs under `schedule`: kQuintic is (a, b, c)
// repeated `steps` times (torch's `_zeropower_via_newtonschulz`);
// kPolarExpress is PolarExpressSchedule(), whatever a, b, c and steps.
NewtonSchulzOptions CoefficientScheduleFor(CoefficientSchedule schedule,
                                           double a, double b, double c,
                                           int steps);

// Checks what NewtonSchulz requires of the options alone.
// Errors:
//   InvalidArgument: steps < 0 with an empty schedule, a non-finite
//     coefficient (names the iteration), norm_scale not finite and > 0, or
//     eps not finite and >= 0, gram_restart_every < 1 (each names the field
//     and value).
absl::Status ValidateNewtonSchulzOptions(const NewtonSchulzOptions& options);

// Scratch buffers for NewtonSchulz, reused across calls so the hot path does
// not allocate after warm-up. Buffers only grow. Not thread-safe: use one
// workspace per thread. Holds rows*cols + 2*min(rows, cols)^2 floats after
// Reserve(rows, cols), and 2*min(rows, cols)^2 more after a Reserve or a
// call whose options resolve to kGram for that shape.
class NewtonSchulzWorkspace {
 public:
  NewtonSchulzWorkspace() = default;
  NewtonSchulzWorkspace(const NewtonSchulzWorkspace&) = delete;
  NewtonSchulzWorkspace& operator=(const NewtonSchulzWorkspace&) = delete;
  NewtonSchulzWorkspace(NewtonSchulzWorkspace&&) = default;
  NewtonSchulzWorkspace& operator=(NewtonSchulzWorkspace&&) = default;

  // Grows the buffers to fit a [rows, cols] matrix (either orientation)
  // under the standard iteration. Non-positive sizes are treated as 0
  // (nothing reserved).
  void Reserve(int64_t rows, int64_t cols);
  // As above, for the method `options` resolve to on this shape
  // (ResolveNewtonSchulzMethod): kGram also grows its two m x m buffers, so
  // that a kGram call on the shape allocates nothing.
  void Reserve(int64_t rows, int64_t cols, const NewtonSchulzOptions& options);

  // Bytes currently held by the buffers.
  int64_t CapacityBytes() const;

 private:
  friend absl::Status NewtonSchulz(const float* u, int64_t rows, int64_t cols,
                                   const NewtonSchulzOptions& options,
                                   float* out,
                                   NewtonSchulzWorkspace* workspace);
  std::vector<float> x_;     // Second ping-pong buffer for X: rows*cols.
  std::vector<float> gram_;  // A = X X^T: m*m, m = min(rows, cols).
  std::vector<float> poly_;  // B = b*A + c*A*A: m*m.
  std::vector<float> q_;     // kGram: accumulated polynomial Q: m*m.
  std::vector<float> tmp_;   // kGram: products Q Z and R Z: m*m.
};

// O = NS_k(U): approximately the orthogonal polar factor of U.
//   u:    row-major float32 [rows, cols], read only.
//   out:  row-major float32 [rows, cols]; must not overlap u.
//   workspace: scratch, grown as needed (Reserve first to avoid allocating
//          on the hot path); nullptr uses a temporary one (allocates).
// Matches torch.optim.Muon's `_zeropower_via_newtonschulz` in fp32:
//   X = U, viewed transposed (BLAS flags, no copy) when rows > cols;
//   X /= max(norm_scale * ||X||_F, eps)  (norm accumulated in double,
//        sequentially);
//   for each iteration i, (a, b, c) = NewtonSchulzCoefficients(options, i) {
//     A = X X^T;             (ssyrk: upper triangle, m*m*n FLOPs; then the
//                             lower triangle mirrored)
//     P = a I + b A + c A*A; (ssyrk, transposed form: A*A = A^T A since A is
//                             symmetric, m^3 FLOPs; b A + a I added to the
//                             upper triangle; then mirrored)
//     X = P X;               (one sgemm, beta = 0, 2*m*m*n FLOPs: torch's
//                             a*X + B*X with a folded into P's diagonal)
//   }
//   transpose back (by the same flags).
// The symmetric products follow the Gram Newton-Schulz write-up (Dao AI
// Lab, "Gram Newton-Schulz", 2026: symmetric GEMMs halve the X X^T and A*A
// work). The mirrors are sequential copies and the additions elementwise
// (built with -ffp-contract=off), so determinism is unchanged: the
// bits depend on the input, the options, the OpenBLAS build and core type
// only, not on the thread count. Relative error against NewtonSchulzReference
// (float64) stays below 1e-4 (tests/kernels/newton_schulz_test.cc). Cost:
// NewtonSchulzFlops(rows, cols, options) nominal FLOPs (the sgemm-only count
// torch runs); NewtonSchulzExecutedFlops the ones actually executed.
//
// options.method == kGram (Gram Newton-Schulz): with X_{i+1} = Z_i X_i,
// Z_i = a I + b R_i + c R_i^2 and R_i = X_i X_i^T, every Z_i is a
// polynomial in R_i, so the matrices commute and R_{i+1} = Z_i R_i Z_i.
// Per restart block of L = gram_restart_every iterations (the last block
// may be shorter):
//   R = X X^T;                              (ssyrk, m*m*n)
//   Q = I; for j < L {
//     Z = a I + b R + c R*R;                (ssyrk for R*R, m^3)
//     Q = Q Z;                              (sgemm, 2 m^3; j = 0: Q = Z)
//     if j < L-1: R = Z (R Z);              (two sgemm, 4 m^3)
//   }
//   X = Q X;                                (sgemm, 2*m*m*n)
// i.e. per block 3*m*m*n + (7L - 6)*m^3 FLOPs against L*(3*m*m*n + m^3)
// for kStandard: fewer when n is several times m (1024x4096, k = 5,
// restart 2: 5.7e10 vs 7.0e10; restart 5: 4.4e10), more for square ones
// (2048x2048, restart 2: 2.2e11 vs 1.7e11). Exact in exact
// arithmetic; in fp32 R's small eigenvalues lose relative accuracy (Gram
// squares the condition number), which the restart bounds. Measured
// against the float64 reference: docs/benchmarks.md and
// tests/kernels/newton_schulz_gram_test.cc.
// Errors:
//   InvalidArgument: rows < 1 or cols < 1 (names the value), options
//     rejected by ValidateNewtonSchulzOptions (e.g. steps < 0), a dimension
//     above INT_MAX (the cblas interface is 32-bit), u or out null, or u and
//     out overlapping.
absl::Status NewtonSchulz(const float* u, int64_t rows, int64_t cols,
                          const NewtonSchulzOptions& options, float* out,
                          NewtonSchulzWorkspace* workspace);

// The same iteration in float64 with plain loops and explicit transposes
// (no BLAS): the reference the fp32 kernel is tested against. Shapes as in
// NewtonSchulz (row-major [rows, cols], out must not overlap u). Slow
// (O(k * m^2 n) scalar loops): meant for tests and small matrices. Follows
// the coefficient schedule and norm_scale exactly as NewtonSchulz does.
// Preconditions (checked with assert only): rows >= 1, cols >= 1,
// ValidateNewtonSchulzOptions(options) is OK.
void NewtonSchulzReference(const double* u, int64_t rows, int64_t cols,
                           const NewtonSchulzOptions& options, double* out);

// FLOPs of NewtonSchulz on a [rows, cols] matrix: steps*(4*m*m*n + 2*m^3),
// m = min(rows, cols), n = max(rows, cols) (A = X X^T is 2*m*m*n, B is
// 2*m^3, B X is 2*m*m*n; elementwise work not counted).
double NewtonSchulzFlops(int64_t rows, int64_t cols, int steps);

// The same with k = NewtonSchulzIterations(options) (an explicit schedule's
// length, else options.steps).
double NewtonSchulzFlops(int64_t rows, int64_t cols,
                         const NewtonSchulzOptions& options);

// FLOPs NewtonSchulz actually executes on a [rows, cols] matrix, counting an
// ssyrk as half of the full product. kStandard: k * (3*m*m*n + m^3)
// (A = X X^T: m*m*n, A*A: m^3, B X: 2*m*m*n); 2048x2048, k = 5: 1.72e11
// (nominal 2.58e11). kGram: the sum over restart blocks of
// 3*m*m*n + (7L - 6)*m^3 (see NewtonSchulz). kAuto: the count of the method
// ResolveNewtonSchulzMethod picks. Elementwise work not counted.
double NewtonSchulzExecutedFlops(int64_t rows, int64_t cols,
                                 const NewtonSchulzOptions& options);

}  // namespace kernels
}  // namespace muon

#endif  // MUON_KERNELS_NEWTON_SCHULZ_H_
