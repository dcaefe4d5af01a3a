// The kernels of a step's data path on one device, behind one interface so
// that one step executor serves the host and CUDA: the region copies that
// pack and unpack exchange buffers, Newton-Schulz, and weight decay +
// apply. Each is called in a stream's order, from inside
// device::Stream::Launch on the stream it is given:
//   host: computes at once on the calling thread (the host stream's own);
//   CUDA: enqueues on stream->native_handle() and returns without waiting.
// Every pointer is memory of this interface's device().
//
// Thread-compatible: one stream uses an instance at a time.
#ifndef MUON_KERNELS_STEP_KERNELS_H_
#define MUON_KERNELS_STEP_KERNELS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/layout.h"
#include "device/device.h"
#include "device/stream.h"
#include "kernels/bfloat16.h"
#include "kernels/newton_schulz.h"
#include "kernels/ns_engine.h"

namespace muon {
namespace kernels {

// Element type of a parameter or gradient a kernel reads or writes.
enum class ParamDType { kFloat32, kBFloat16 };

// Bytes of one element of `dtype` (4 or 2).
inline int64_t ParamDTypeSize(ParamDType dtype) {
  return dtype == ParamDType::kBFloat16 ? 2 : 4;
}

class StepKernels {
 public:
  virtual ~StepKernels() = default;

  virtual device::Device device() const = 0;
  // "cpu/openblas", "cuda:0/bf16", ...
  virtual std::string name() const = 0;

  // Copies `region` of a row-major fp32 matrix stored as `src` (holding box
  // `src_holds`) into `dst` (holding box `dst_holds`); both boxes contain
  // the region (common/layout.h CopyRegion's contract). region.numel()
  // floats move; the CUDA copy is one cudaMemcpy2DAsync.
  // Errors: the CUDA error (host: none).
  virtual absl::Status CopyRegion(device::Stream* stream, const float* src,
                                  const Box& src_holds, float* dst,
                                  const Box& dst_holds, const Box& region) = 0;

  // The bf16 exchange's pack: `region` of fp32 `src` (holding
  // `src_holds`) into `dst` as region.numel() bf16 values, row-major
  // packed, each rounded to nearest even with NaN kept quiet
  // (kernels::FloatToBf16: c10::BFloat16's narrowing). Both pointers are
  // memory of device().
  // Errors: the CUDA error (host: none).
  virtual absl::Status PackRegionBf16(device::Stream* stream, const float* src,
                                      const Box& src_holds, bf16_t* dst,
                                      const Box& region) = 0;

  // The bf16 exchange's unpack: region.numel() packed bf16 values `src`
  // widened exactly into `region` of fp32 `dst` (holding `dst_holds`).
  // Errors: the CUDA error (host: none).
  virtual absl::Status UnpackRegionBf16(device::Stream* stream,
                                        const bf16_t* src, const Box& region,
                                        float* dst, const Box& dst_holds) = 0;

  // x[i] <- the fp32 value of bf16(x[i]) for i in [0, n), rounded as
  // PackRegionBf16 (the bf16 exchange rounds the owner's Newton-Schulz
  // output so that every holder applies the same values). `x` is memory
  // of device().
  // Errors: InvalidArgument (n < 0, null); the CUDA error.
  virtual absl::Status RoundToBf16(device::Stream* stream, float* x,
                                   int64_t n) = 0;

  // out[i] = NS_k(u[i]) for `batch` row-major fp32 [rows, cols] matrices
  // stored one after another (matrix i at u + i * rows * cols; the same for
  // out): kernels::NewtonSchulz's iteration, torch.optim.Muon's
  // _zeropower_via_newtonschulz. Host: one matrix after another (the
  // engine's bits); CUDA: one strided-batched cuBLAS iteration
  // (NewtonSchulzBatched). batch * kernels::NewtonSchulzFlops FLOPs. `out`
  // may not overlap `u`.
  // Errors: InvalidArgument (shapes, batch < 1, options); the device's
  // errors.
  virtual absl::Status Orthogonalize(device::Stream* stream, const float* u,
                                     int64_t batch, int64_t rows, int64_t cols,
                                     const NewtonSchulzOptions& options,
                                     float* out) = 0;

  // Grows the scratch of Orthogonalize to fit `batch` matrices [rows,
  // cols] (either orientation) run with `options` (its method decides the
  // scratch on CUDA) so that a step allocates nothing. Call once per shape
  // with its largest batch.
  virtual absl::Status Reserve(int64_t batch, int64_t rows, int64_t cols,
                               const NewtonSchulzOptions& options) = 0;

  // Bytes of device() memory the kernels' scratch holds now (CUDA: the
  // Newton-Schulz iteration's buffers, NsCudaContext::ScratchBytes, not
  // cuBLAS's workspace, plus NorMuonNormalize's row sums; host: 0, the CPU
  // engine's scratch is its own host memory).
  virtual int64_t ScratchBytes() const { return 0; }

  // NorMuon's normalization (kernels::NorMuonNormalize) of one row-major
  // fp32 [rows, cols] update `o`, in place, with its row state `variance`
  // (float32 [rows], updated in place). Both are memory of device().
  // CUDA: the host's bits (each operation rounded as the host's, the
  // float64 row sums added in the host's order), on `stream`; calls are
  // ordered on one stream (they share a scratch). Errors: InvalidArgument
  // (negative sizes, null pointers); the CUDA error.
  virtual absl::Status NorMuonNormalize(device::Stream* stream, float* o,
                                        int64_t rows, int64_t cols,
                                        float* variance, double beta2,
                                        double eps) = 0;

  // torch.optim.Muon's momentum step, elementwise over n elements
  // (torch/optim/_muon.py: buf.lerp_(grad, 1 - momentum);
  // kernels::MomentumUpdate): buf <- lerp(buf, grad, 1 - momentum).
  // `buf` is fp32 or bf16 (`buf_dtype`; bf16 computed in fp32 and rounded
  // to nearest even, as torch's bf16 lerp_), `grad` fp32 or bf16
  // (`grad_dtype`, widened exactly). Host: bitwise kernels::MomentumUpdate.
  // CUDA: with GpuPrecision::kFp32 each multiply and add rounded
  // separately (the host's bits), else fused multiply-adds (torch's CUDA
  // lerp, as nvcc contracts it). grad may alias buf only as the same
  // memory of the same dtype (then buf is unchanged).
  // Errors: InvalidArgument (n < 0, null pointers; CUDA: grad overlapping
  // buf otherwise); the CUDA error.
  virtual absl::Status Momentum(device::Stream* stream, void* buf,
                                ParamDType buf_dtype, const void* grad,
                                ParamDType grad_dtype, int64_t n,
                                double momentum) = 0;

  // The update U a step orthogonalizes, from the momentum buffer after
  // Momentum, into fp32 `update` (n elements, not aliasing buf or grad):
  //   nesterov: U = lerp(grad, buf, momentum) (torch's grad.lerp(buf,
  //             momentum); kernels::NesterovUpdate), in fp32;
  //   else:     U = buf, widened exactly (`grad` unused, may be null).
  // Dtypes and rounding as Momentum's.
  // Errors: InvalidArgument (n < 0, null pointers); the CUDA error.
  virtual absl::Status FormUpdate(device::Stream* stream, const void* buf,
                                  ParamDType buf_dtype, const void* grad,
                                  ParamDType grad_dtype, int64_t n,
                                  double momentum, bool nesterov,
                                  float* update) = 0;

  // *first <- the smallest index i in [0, n) with x[i] NaN or +-Inf, or -1
  // (kernels::FirstNonFinite). `x` (fp32 or bf16) and `first` (one int64)
  // are memory of device(): the host writes *first at once; CUDA enqueues
  // a reduction, so read *first after the stream has reached it.
  // Errors: InvalidArgument (n < 0, null pointers); the CUDA error.
  virtual absl::Status FirstNonFinite(device::Stream* stream, const void* x,
                                      ParamDType dtype, int64_t n,
                                      int64_t* first) = 0;

  // x[i] <- x[i] * factor for i in [0, n), in place, `x` fp32 or bf16
  // (`dtype`) memory of device(): QK-clip's row scaling. Host: bitwise
  // kernels::Scale; CUDA: the same operations (one rounded fp32 multiply;
  // bf16 widened, multiplied, rounded to nearest even), so the same bits
  // for every non-NaN value (a NaN stays NaN; CUDA returns the canonical
  // NaN where the host may keep the input's sign and payload).
  // Errors: InvalidArgument (n < 0, null with n > 0); the CUDA error.
  virtual absl::Status Scale(device::Stream* stream, void* x, ParamDType dtype,
                             int64_t n, float factor) = 0;

  // Copies `bytes` bytes from `src` to `dst`, both memory of device(), in
  // the stream's order (CUDA: cudaMemcpyAsync). They may not overlap.
  // Errors: InvalidArgument (bytes < 0, null pointers); the CUDA error.
  virtual absl::Status Copy(device::Stream* stream, void* dst, const void* src,
                            int64_t bytes) = 0;

  // torch.optim.Muon's decoupled weight decay and update, elementwise over
  // n elements: param = param * (1 - lr * weight_decay) - adjusted_lr *
  // update (bf16 params: each op computed in fp32 and rounded to nearest
  // even, as kernels::ApplyUpdate). `update` is fp32.
  // Errors: the CUDA error (host: none).
  virtual absl::Status DecayAndApply(device::Stream* stream, void* param,
                                     ParamDType dtype, const float* update,
                                     int64_t n, double lr, double weight_decay,
                                     double adjusted_lr) = 0;
};

// StepKernels::Scale's argument check, the same on every device:
// InvalidArgument for n < 0, or a null `x` with elements.
inline absl::Status CheckScaleArguments(const void* x, int64_t n) {
  if (n < 0 || (n > 0 && x == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Scale: n must be >= 0 and x non-null, got n = ", n));
  }
  return absl::OkStatus();
}

// StepKernels::NorMuonNormalize's argument check, the same on every device:
// InvalidArgument for negative sizes, or null pointers with elements.
inline absl::Status CheckNorMuonArguments(const float* o, int64_t rows,
                                          int64_t cols, const float* variance) {
  if (rows < 0 || cols < 0 ||
      (rows * cols > 0 && (o == nullptr || variance == nullptr))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NorMuonNormalize: rows and cols must be >= 0 with non-null o and "
        "variance, got [",
        rows, ", ", cols, "]"));
  }
  return absl::OkStatus();
}

// The host kernels: common/layout.h's CopyRegion, `engine`'s Newton-Schulz
// (not owned; outlives the kernels) and kernels::ApplyUpdate. Bitwise what
// the CPU path computed before streams.
std::unique_ptr<StepKernels> MakeHostStepKernels(NsEngine* engine);

// The CUDA kernels of device `ordinal`: cudaMemcpy2DAsync,
// kernels/cuda's NewtonSchulzBatched (cuBLAS in `precision`) bound to
// `compute_stream` (a CUDA stream of that device, not owned; nullptr = no
// Newton-Schulz: Orthogonalize and Reserve return FailedPrecondition, the
// elementwise kernels take any stream of the device), and kernels/cuda's
// elementwise kernels (kSeparate rounding with kFp32, fused multiply-adds
// otherwise).
// Errors: Unimplemented (built without --config=cuda); FailedPrecondition
// (no such device); InvalidArgument (`compute_stream` is not a CUDA stream
// of that device).
absl::StatusOr<std::unique_ptr<StepKernels>> MakeCudaStepKernels(
    int ordinal, device::Stream* compute_stream, GpuPrecision precision);

}  // namespace kernels
}  // namespace muon

#endif  // MUON_KERNELS_STEP_KERNELS_H_
