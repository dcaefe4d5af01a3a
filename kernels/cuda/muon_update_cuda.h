// Elementwise kernels of a Muon step on a CUDA device: the momentum step,
// the update U (Nesterov's look-ahead, or the buffer widened), and
// decoupled weight decay + update in one pass.
// The Frobenius normalisation kernel is part of NewtonSchulzBatched
// (kernels/cuda/newton_schulz_cuda.h).
//
// Plain C++ header: device pointers as float*, the stream as void* (a
// cudaStream_t; nullptr = legacy default stream). Work is enqueued
// asynchronously; default builds link stubs returning Unimplemented.
//
// Arithmetic is the CPU kernels' (kernels/muon_update.h), which follow
// torch.optim.Muon (torch/optim/_muon.py, PyTorch 2.9): ATen's lerp formula
// (aten/src/ATen/native/Lerp.h) and mul_ then add_(alpha=). Whether the
// multiply-adds are fused is a choice (FmaMode), made with explicit
// intrinsics (__fmul_rn/__fadd_rn vs __fmaf_rn) so nvcc's contraction
// (-fmad) cannot change it.
#ifndef MUON_KERNELS_CUDA_MUON_UPDATE_CUDA_H_
#define MUON_KERNELS_CUDA_MUON_UPDATE_CUDA_H_

#include <cstdint>

#include "absl/status/status.h"

namespace muon {
namespace kernels {
namespace cuda {

enum class FmaMode {
  // Every multiply and add rounded separately: bitwise equal to
  // kernels::MomentumUpdate / NesterovUpdate / ApplyUpdate on the CPU
  // (compiled with -ffp-contract=off).
  kSeparate,
  // a*b + c as one fused multiply-add, as nvcc compiles torch's CUDA lerp
  // and add(alpha=) kernels: bitwise equal to torch on the GPU; can differ
  // from kSeparate in the last bit(s) of some elements.
  kFused,
};

// Element type of a momentum buffer or gradient in device memory: float32,
// or bfloat16 bits (uint16_t; widened exactly, narrowed to nearest even).
enum class Elem { kFloat32, kBf16 };

// In one pass over n elements (device memory):
//   buf <- lerp(buf, grad, 1 - momentum)   (torch buf.lerp_)
// with w = (float)(1 - momentum) computed in double first, as
// kernels::MomentumUpdate; a bf16 buf is computed in fp32 and rounded.
// grad may alias buf when both have one type (then buf is unchanged).
// Errors:
//   InvalidArgument: n < 0, null pointers (with n > 0), grad overlapping
//     buf other than as that exact alias.
//   Unimplemented: built without CUDA. Internal: the launch failed (names
//     the kernel and cudaGetErrorString).
absl::Status Momentum(void* buf, Elem buf_type, const void* grad,
                      Elem grad_type, int64_t n, double momentum, FmaMode mode,
                      void* stream);

// In one pass over n elements (device memory), the update Newton-Schulz
// reads, in float32:
//   update <- nesterov ? lerp(grad, buf, momentum)   (torch grad.lerp)
//                      : buf
// with w = (float)momentum (kernels::NesterovUpdate). `grad` is unused
// (may be null) without nesterov; `update` (4 n bytes) may not overlap
// buf or (with nesterov) grad.
// Errors: as Momentum's, and InvalidArgument for overlapping memory.
absl::Status FormUpdate(const void* buf, Elem buf_type, const void* grad,
                        Elem grad_type, int64_t n, double momentum,
                        bool nesterov, float* update, FmaMode mode,
                        void* stream);

// Enqueues on `stream`: *first <- the smallest i in [0, n) with x[i] NaN
// or +-Inf, or -1 when there is none (kernels::FirstNonFinite's answer).
// `x` (float32, or bf16 bits for the Bf16 overload) and `first` (one
// int64) are device memory; read *first after the stream has reached it.
// Errors: InvalidArgument (n < 0, null pointers); Internal (launch).
absl::Status FirstNonFinite(const float* x, int64_t n, int64_t* first,
                            void* stream);
absl::Status FirstNonFiniteBf16(const uint16_t* x, int64_t n, int64_t* first,
                                void* stream);

// x[i] <- x[i] * factor for i in [0, n) on `stream`, `x` device memory
// of `type`: float32 one rounded multiply (__fmul_rn); bf16 bits widened
// exactly, multiplied so, rounded to nearest even (kernels::Scale's bits
// for non-NaN values; a NaN comes out as the canonical NaN).
// Errors: InvalidArgument (n < 0, null); Internal (launch).
absl::Status Scale(void* x, Elem type, int64_t n, float factor, void* stream);

// In one pass: param <- param * (float)(1 - lr*weight_decay)
//                       + (float)(-adjusted_lr) * update
// (the multiply by the decay rounded first, as torch's mul_ then
// add_(update, alpha=-adjusted_lr); kernels::ApplyUpdate).
//   param, update: float32 [n] in device memory; must not alias.
// Errors: InvalidArgument (n < 0, null, aliasing); Unimplemented; Internal.
absl::Status DecayAndApply(float* param, const float* update, int64_t n,
                           double lr, double weight_decay, double adjusted_lr,
                           FmaMode mode, void* stream);

// DecayAndApply on a bf16 parameter (`param`: device bf16 bits, n
// elements): param = bf16(bf16(param * decay) + alpha * update), each op
// in fp32 rounded to nearest even, as torch's mul_ then add_ on a bf16
// tensor (and kernels::ApplyUpdate's bf16 overload with kSeparate).
// Errors: InvalidArgument (n < 0, null, update overlapping param's 2 n
// bytes); Internal (launch).
absl::Status DecayAndApplyBf16(uint16_t* param, const float* update, int64_t n,
                               double lr, double weight_decay,
                               double adjusted_lr, FmaMode mode, void* stream);

// Narrows a [rows, cols] block of fp32 `src` (device memory, row stride
// `src_ld` floats) into `dst` (device memory, rows * cols bf16 bits,
// row-major packed), each value rounded to nearest even with NaN kept
// quiet (kernels::FloatToBf16's bits), on `stream`.
// Errors: InvalidArgument (negative sizes, src_ld < cols, null); Internal
// (launch).
absl::Status PackBf16(const float* src, int64_t src_ld, int64_t rows,
                      int64_t cols, uint16_t* dst, void* stream);

// x[i] <- the fp32 value of bf16(x[i]) (PackBf16's rounding), i in
// [0, n), x device memory, on `stream`.
// Errors: InvalidArgument (n < 0, null); Internal (launch).
absl::Status RoundToBf16(float* x, int64_t n, void* stream);

// Widens rows * cols packed bf16 bits `src` (device memory) exactly into a
// [rows, cols] block of fp32 `dst` (device memory, row stride `dst_ld`).
// Errors: as PackBf16.
absl::Status UnpackBf16(const uint16_t* src, int64_t rows, int64_t cols,
                        float* dst, int64_t dst_ld, void* stream);

// Bytes of device scratch NorMuonNormalize needs for `rows` rows: two
// float64 per row and one float32 (0 for rows <= 0).
int64_t NorMuonScratchBytes(int64_t rows);

// NorMuon's normalization of one row-major fp32 [rows, cols] update `o`
// with its row state `variance` (fp32 [rows]), both device memory, in
// place, on `stream` (Li et al., arXiv 2510.05491; microsoft/dion's
// NorMuon): kernels::NorMuonNormalize's arithmetic bit for bit. One thread
// per row sums that row's squares in float64 in column order, then the
// row sums are added in row order by one thread, and every operation is
// an explicit round-to-nearest intrinsic, so the host's order and
// rounding are kept (no tree reduction). `scratch`: device memory of
// NorMuonScratchBytes(rows) bytes, used until the work enqueued here
// ends.
// Errors: InvalidArgument (negative sizes, null pointers); Internal
// (launch).
absl::Status NorMuonNormalize(float* o, int64_t rows, int64_t cols,
                              float* variance, double beta2, double eps,
                              void* scratch, void* stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace muon

#endif  // MUON_KERNELS_CUDA_MUON_UPDATE_CUDA_H_
