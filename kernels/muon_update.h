// Elementwise parts of a Muon step on the CPU, fp32: momentum buffer update,
// Nesterov look-ahead, learning-rate adjustment and the decoupled weight
// decay + update. Matches torch.optim.Muon (torch/optim/_muon.py, PyTorch
// 2.9) `_single_tensor_muon` and `_adjust_lr`.
//
// All loops are plain sequential scalar code compiled without floating-point
// contraction (-ffp-contract=off), so the bits do not depend on the compiler
// fusing multiply-adds. Note: PyTorch's vectorized CPU kernels (AVX2/AVX-512
// builds) and CUDA kernels use fused multiply-add for lerp and add(alpha=);
// those may differ from these in the last bit of some elements.
#ifndef MUON_KERNELS_MUON_UPDATE_H_
#define MUON_KERNELS_MUON_UPDATE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/bfloat16.h"

namespace muon {
namespace kernels {

// Momentum buffer update B <- lerp(B, G, 1 - momentum), in place.
//   buf:  float32 [n], the momentum buffer, updated in place.
//   grad: float32 [n], the gradient; may alias buf (then buf is unchanged).
//   momentum: the Muon momentum mu (dimensionless, usually in [0, 1)).
// Matches torch `buf.lerp_(grad, 1 - momentum)` with torch's scalar lerp
// formula (ATen `lerp` in Lerp.h): w = (float)(1 - momentum) (1 - momentum
// computed in double, as Python does), diff = grad - buf,
//   |w| < 0.5 ? buf + w*diff : grad - diff*(1 - w)   (float arithmetic).
void MomentumUpdate(float* buf, const float* grad, int64_t n, double momentum);

// MomentumUpdate with a bfloat16 gradient (grad: bf16 [n]). Each gradient
// value is widened to float exactly, then the fp32 arithmetic above runs
// unchanged: the result equals MomentumUpdate on the widened gradient.
void MomentumUpdate(float* buf, const bf16_t* grad, int64_t n, double momentum);

// MomentumUpdate with a bfloat16 momentum buffer (buf: bf16 [n], as
// torch.optim.Muon keeps it for a bf16 parameter): each value is widened
// exactly, the fp32 arithmetic above runs, and the result is rounded to
// nearest even (torch's bf16 `lerp_`, which computes in float and
// narrows). The gradient is fp32 or bf16.
void MomentumUpdate(bf16_t* buf, const float* grad, int64_t n, double momentum);
void MomentumUpdate(bf16_t* buf, const bf16_t* grad, int64_t n,
                    double momentum);

// Index of the first non-finite value (NaN, +Inf or -Inf) of x[0, n), or
// -1 when every value is finite. Read-only: one pass over x (a bit test of
// the exponent field, OR-reduced over blocks so that it vectorizes; the
// index is searched only inside the first bad block), reading n * 4 bytes
// (fp32) or n * 2 bytes (bf16). Muon::Step runs it on every gradient before
// the momentum pass, which writes the buffer: a separate read-only scan is
// what keeps the state unchanged when a gradient is bad. Its cost next to
// the momentum pass is in docs/benchmarks.md ("The finite scan").
int64_t FirstNonFinite(const float* x, int64_t n);
int64_t FirstNonFinite(const bf16_t* x, int64_t n);

// Nesterov look-ahead U <- lerp(G, B, momentum), out of place.
//   grad, buf: float32 [n]; out: float32 [n], may alias grad or buf.
// Matches torch `grad.lerp(buf, momentum)` with the same formula as
// MomentumUpdate and w = (float)momentum.
void NesterovUpdate(const float* grad, const float* buf, int64_t n,
                    double momentum, float* out);
// NesterovUpdate with a bfloat16 gradient, widened exactly (as above).
void NesterovUpdate(const bf16_t* grad, const float* buf, int64_t n,
                    double momentum, float* out);
// NesterovUpdate with a bfloat16 momentum buffer, widened exactly; `out`
// stays float32 (not rounded to bf16 as torch's bf16 `grad.lerp` is: the
// exchange and Newton-Schulz decide their own precision).
void NesterovUpdate(const float* grad, const bf16_t* buf, int64_t n,
                    double momentum, float* out);
void NesterovUpdate(const bf16_t* grad, const bf16_t* buf, int64_t n,
                    double momentum, float* out);

// How the learning rate is scaled by the matrix shape (torch.optim.Muon's
// `adjust_lr_fn`).
enum class AdjustLrFn {
  // "original": lr * sqrt(max(1, rows / cols)) (Keller Jordan's Muon).
  kOriginal,
  // "match_rms_adamw": lr * 0.2 * sqrt(max(rows, cols)) (Moonshot's Muon is
  // Scalable for LLM Training, matching AdamW's update RMS).
  kMatchRmsAdamW,
  // "spectral_norm": lr * sqrt(rows / cols), rows = fan_out, cols = fan_in
  // (the spectral condition of Yang, Simon and Bernstein, "A Spectral
  // Condition for Feature Learning", arXiv 2310.17813: from spectral norm 1
  // to RMS operator norm 1; microsoft/dion's adjust_lr_spectral_norm, its
  // default). Unlike "original" it also shrinks wide matrices' steps.
  kSpectralNorm,
};

// Adjusted learning rate for a matrix of GLOBAL shape [rows, cols] (never the
// local shard's). Matches torch.optim.Muon `_adjust_lr` in double, operation
// for operation: ratio = sqrt(max(1, rows / cols)) or
// 0.2 * sqrt(max(rows, cols)); returns lr * ratio. "spectral_norm" is
// dion's lr * sqrt(rows / cols) in double. Units: those of lr.
// Precondition: rows >= 1, cols >= 1.
double AdjustLr(double lr, AdjustLrFn fn, int64_t rows, int64_t cols);

// Parses the spelling of an AdjustLrFn: torch's "original" and
// "match_rms_adamw", dion's "spectral_norm" (exact, case-sensitive).
// Errors:
//   InvalidArgument: any other value (the message quotes it).
absl::StatusOr<AdjustLrFn> ParseAdjustLrFn(absl::string_view name);

// "original", "match_rms_adamw" or "spectral_norm".
absl::string_view AdjustLrFnName(AdjustLrFn fn);

// NorMuon's neuron-wise normalization of one orthogonalized update, in
// place (Li et al., "NorMuon: Making Muon more efficient and scalable",
// arXiv 2510.05491, Algorithm 1; microsoft/dion's
// _normuon_normalization_core, whose Frobenius-norm rescale it follows):
//   n0   = ||O||_F
//   v_i <- lerp(v_i, mean_j O_ij^2, 1 - beta2)      (per row i: a neuron)
//   O_ij <- O_ij / (sqrt(v_i) + eps)
//   O    <- O * (n0 / max(||O||_F, eps))
//   o:        float32 [rows, cols] row-major, the update NS_k(U).
//   variance: float32 [rows], the second-moment state v of the matrix's
//             rows (zeros before the first step), updated in place.
//   beta2:    in [0, 1); eps > 0 (dion: 1e-8 for both uses).
// Sums of squares accumulate in double over rows in order (deterministic:
// the same bits wherever it runs); the lerp is ATen's scalar formula in
// float, as MomentumUpdate's; every other operation is one float operation
// per element. The paper scales the result by 0.2 * sqrt(rows * cols) /
// ||O||_F instead of the rescale to n0; with AdjustLrFn::kMatchRmsAdamW the
// two agree up to how far ||NS_k(U)||_F is from sqrt(min(rows, cols)).
// No-op when rows or cols is 0.
void NorMuonNormalize(float* o, int64_t rows, int64_t cols, float* variance,
                      double beta2, double eps);

// x[i] <- x[i] * factor for i in [0, n), in place: one float multiply per
// element (float32), or each bf16 value widened exactly, multiplied in
// float and rounded to nearest even (kernels::FloatToBf16), as torch's
// `x.mul_(factor)` on a bf16 tensor with a float factor. QK-clip's row
// scaling (Kimi K2's MuonClip, arXiv 2507.20534, Algorithm 1).
void Scale(float* x, int64_t n, float factor);
void Scale(bf16_t* x, int64_t n, float factor);

// Decoupled weight decay and the Muon update, in place:
//   param *= (float)(1 - lr * weight_decay);
//   param += (float)(-adjusted_lr) * update;
//   param, update: float32 [n]; update is O = NS_k(U), may not alias param.
//   lr: the unadjusted learning rate (weight decay uses it, as torch does);
//   adjusted_lr: AdjustLr(lr, ...).
// Matches torch `param.mul_(1 - lr * weight_decay)` then
// `param.add_(update, alpha=-adjusted_lr)`: scalars computed in double then
// cast to float once; elementwise float arithmetic, two roundings per
// element (the multiply is rounded before the add).
void ApplyUpdate(float* param, const float* update, int64_t n, double lr,
                 double weight_decay, double adjusted_lr);

// ApplyUpdate on a bfloat16 parameter (param: bf16 [n], updated in place;
// update: float32 [n]). As PyTorch does for a bf16 tensor, each of the two
// in-place ops computes in float and rounds its result to bf16 (round to
// nearest even): p = bf16(float(p) * decay); p = bf16(float(p) + alpha * O).
void ApplyUpdate(bf16_t* param, const float* update, int64_t n, double lr,
                 double weight_decay, double adjusted_lr);

}  // namespace kernels
}  // namespace muon

#endif  // MUON_KERNELS_MUON_UPDATE_H_
