// The CUDA StepKernels (kernels/step_kernels.h), nvcc.
#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "device/cuda_check.cuh"
#include "device/cuda_runtime.h"
#include "device/memory.h"
#include "device/runtime.h"
#include "kernels/cuda/muon_update_cuda.h"
#include "kernels/cuda/newton_schulz_cuda.h"
#include "kernels/step_kernels.h"

namespace muon {
namespace kernels {
namespace {

cuda::Elem ElemOf(ParamDType dtype) {
  return dtype == ParamDType::kBFloat16 ? cuda::Elem::kBf16
                                        : cuda::Elem::kFloat32;
}

class CudaStepKernels final : public StepKernels {
 public:
  // `ns` may be null: no Newton-Schulz.
  CudaStepKernels(int ordinal, GpuPrecision precision,
                  std::unique_ptr<cuda::NsCudaContext> ns)
      : ordinal_(ordinal),
        precision_(precision),
        fma_(precision == GpuPrecision::kFp32 ? cuda::FmaMode::kSeparate
                                              : cuda::FmaMode::kFused),
        ns_(std::move(ns)) {}

  device::Device device() const override {
    return device::Device::Cuda(ordinal_);
  }
  std::string name() const override {
    const char* p = precision_ == GpuPrecision::kBf16   ? "bf16"
                    : precision_ == GpuPrecision::kTf32 ? "tf32"
                                                        : "fp32";
    return absl::StrCat("cuda:", ordinal_, "/", p);
  }

  absl::Status CopyRegion(device::Stream* stream, const float* src,
                          const Box& src_holds, float* dst,
                          const Box& dst_holds, const Box& region) override {
    if (region.empty()) return absl::OkStatus();
    const int64_t src_cols = src_holds.cols.size();
    const int64_t dst_cols = dst_holds.cols.size();
    const float* from = src +
                        (region.rows.begin - src_holds.rows.begin) * src_cols +
                        (region.cols.begin - src_holds.cols.begin);
    float* to = dst + (region.rows.begin - dst_holds.rows.begin) * dst_cols +
                (region.cols.begin - dst_holds.cols.begin);
    MUON_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
        to, dst_cols * sizeof(float), from, src_cols * sizeof(float),
        region.cols.size() * sizeof(float), region.rows.size(),
        cudaMemcpyDeviceToDevice,
        static_cast<cudaStream_t>(stream->native_handle())));
    return absl::OkStatus();
  }

  absl::Status PackRegionBf16(device::Stream* stream, const float* src,
                              const Box& src_holds, bf16_t* dst,
                              const Box& region) override {
    const int64_t ld = src_holds.cols.size();
    const float* from = src + (region.rows.begin - src_holds.rows.begin) * ld +
                        (region.cols.begin - src_holds.cols.begin);
    return cuda::PackBf16(from, ld, region.rows.size(), region.cols.size(), dst,
                          stream->native_handle());
  }

  absl::Status NorMuonNormalize(device::Stream* stream, float* o, int64_t rows,
                                int64_t cols, float* variance, double beta2,
                                double eps) override {
    if (absl::Status s = CheckNorMuonArguments(o, rows, cols, variance);
        !s.ok()) {
      return s;
    }
    if (rows * cols == 0) return absl::OkStatus();
    const int64_t bytes = cuda::NorMuonScratchBytes(rows);
    if (normuon_scratch_.bytes() < bytes) {
      // The old scratch may still be read by work on the stream.
      if (normuon_scratch_.bytes() > 0) {
        if (absl::Status s = stream->Synchronize(absl::Minutes(30)); !s.ok()) {
          return s;
        }
      }
      absl::StatusOr<device::Runtime*> runtime = device::CudaRuntime(ordinal_);
      if (!runtime.ok()) return runtime.status();
      absl::StatusOr<device::DeviceMemory> scratch =
          device::DeviceMemory::Allocate((*runtime)->allocator(), bytes);
      if (!scratch.ok()) return scratch.status();
      normuon_scratch_ = *std::move(scratch);
    }
    return cuda::NorMuonNormalize(o, rows, cols, variance, beta2, eps,
                                  normuon_scratch_.data(),
                                  stream->native_handle());
  }

  absl::Status RoundToBf16(device::Stream* stream, float* x,
                           int64_t n) override {
    return cuda::RoundToBf16(x, n, stream->native_handle());
  }

  absl::Status UnpackRegionBf16(device::Stream* stream, const bf16_t* src,
                                const Box& region, float* dst,
                                const Box& dst_holds) override {
    const int64_t ld = dst_holds.cols.size();
    float* to = dst + (region.rows.begin - dst_holds.rows.begin) * ld +
                (region.cols.begin - dst_holds.cols.begin);
    return cuda::UnpackBf16(src, region.rows.size(), region.cols.size(), to, ld,
                            stream->native_handle());
  }

  absl::Status Orthogonalize(device::Stream* stream, const float* u,
                             int64_t batch, int64_t rows, int64_t cols,
                             const NewtonSchulzOptions& options,
                             float* out) override {
    if (ns_ == nullptr) return NoNewtonSchulz();
    if (stream->native_handle() != ns_->stream()->native_handle()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CUDA Newton-Schulz on cuda:", ordinal_, " is bound to its compute ",
          "stream, not stream \"", stream->name(), "\""));
    }
    return cuda::NewtonSchulzBatched(ns_.get(), u, batch, rows, cols, options,
                                     precision_, out);
  }

  absl::Status Reserve(int64_t batch, int64_t rows, int64_t cols,
                       const NewtonSchulzOptions& options) override {
    if (ns_ == nullptr) return NoNewtonSchulz();
    return ns_->Reserve(batch, rows, cols, precision_, options);
  }

  int64_t ScratchBytes() const override {
    return (ns_ == nullptr ? 0 : ns_->ScratchBytes()) +
           normuon_scratch_.bytes();
  }

  absl::Status Momentum(device::Stream* stream, void* buf, ParamDType buf_dtype,
                        const void* grad, ParamDType grad_dtype, int64_t n,
                        double momentum) override {
    return cuda::Momentum(buf, ElemOf(buf_dtype), grad, ElemOf(grad_dtype), n,
                          momentum, fma_, stream->native_handle());
  }

  absl::Status FormUpdate(device::Stream* stream, const void* buf,
                          ParamDType buf_dtype, const void* grad,
                          ParamDType grad_dtype, int64_t n, double momentum,
                          bool nesterov, float* update) override {
    return cuda::FormUpdate(buf, ElemOf(buf_dtype), grad, ElemOf(grad_dtype), n,
                            momentum, nesterov, update, fma_,
                            stream->native_handle());
  }

  absl::Status Scale(device::Stream* stream, void* x, ParamDType dtype,
                     int64_t n, float factor) override {
    if (absl::Status s = CheckScaleArguments(x, n); !s.ok()) return s;
    return cuda::Scale(x, ElemOf(dtype), n, factor, stream->native_handle());
  }

  absl::Status FirstNonFinite(device::Stream* stream, const void* x,
                              ParamDType dtype, int64_t n,
                              int64_t* first) override {
    void* s = stream->native_handle();
    if (dtype == ParamDType::kBFloat16) {
      return cuda::FirstNonFiniteBf16(static_cast<const uint16_t*>(x), n, first,
                                      s);
    }
    return cuda::FirstNonFinite(static_cast<const float*>(x), n, first, s);
  }

  absl::Status Copy(device::Stream* stream, void* dst, const void* src,
                    int64_t bytes) override {
    if (absl::Status s = device::CheckCopyArguments("Copy", dst, src, bytes);
        !s.ok()) {
      return s;
    }
    if (bytes == 0) return absl::OkStatus();
    MUON_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice,
        static_cast<cudaStream_t>(stream->native_handle())));
    return absl::OkStatus();
  }

  absl::Status DecayAndApply(device::Stream* stream, void* param,
                             ParamDType dtype, const float* update, int64_t n,
                             double lr, double weight_decay,
                             double adjusted_lr) override {
    void* s = stream->native_handle();
    if (dtype == ParamDType::kBFloat16) {
      return cuda::DecayAndApplyBf16(static_cast<uint16_t*>(param), update, n,
                                     lr, weight_decay, adjusted_lr, fma_, s);
    }
    return cuda::DecayAndApply(static_cast<float*>(param), update, n, lr,
                               weight_decay, adjusted_lr, fma_, s);
  }

 private:
  absl::Status NoNewtonSchulz() const {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA step kernels of cuda:", ordinal_,
                     " were made without a compute stream: no Newton-Schulz"));
  }

  const int ordinal_;
  const GpuPrecision precision_;
  const cuda::FmaMode fma_;
  const std::unique_ptr<cuda::NsCudaContext> ns_;
  // NorMuonNormalize's row sums, grown to the most rows seen. Calls that
  // share it are ordered on one stream (the owner's compute stream).
  device::DeviceMemory normuon_scratch_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<StepKernels>> MakeCudaStepKernels(
    int ordinal, device::Stream* compute_stream, GpuPrecision precision) {
  if (compute_stream == nullptr) {
    std::string reason;
    if (ordinal < 0 || ordinal >= device::CudaDeviceCount(&reason)) {
      return absl::FailedPreconditionError(
          absl::StrCat("CUDA step kernels for cuda:", ordinal,
                       ": no such device (", reason, ")"));
    }
    return std::unique_ptr<StepKernels>(
        new CudaStepKernels(ordinal, precision, nullptr));
  }
  if (compute_stream->device() != device::Device::Cuda(ordinal)) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA step kernels for cuda:", ordinal,
                     ": the compute stream \"", compute_stream->name(),
                     "\" is on ", compute_stream->device().ToString()));
  }
  absl::StatusOr<device::Runtime*> runtime = device::CudaRuntime(ordinal);
  if (!runtime.ok()) return runtime.status();
  absl::StatusOr<std::unique_ptr<cuda::NsCudaContext>> ns =
      cuda::NsCudaContext::Create(*runtime, compute_stream);
  if (!ns.ok()) return ns.status();
  return std::unique_ptr<StepKernels>(
      new CudaStepKernels(ordinal, precision, *std::move(ns)));
}

}  // namespace kernels
}  // namespace muon
