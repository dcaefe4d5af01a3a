// The host-staged cuBLAS NsEngine (kernels/ns_engine.h)
// for --config=cuda builds, nvcc. Default builds take both from
// kernels/ns_engine.cc (Unimplemented / 0).
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "device/cuda_runtime.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/newton_schulz_cuda.h"
#include "kernels/newton_schulz.h"
#include "kernels/ns_engine.h"

namespace muon {
namespace kernels {
namespace {

const char* PrecisionName(GpuPrecision precision) {
  switch (precision) {
    case GpuPrecision::kBf16:
      return "bf16";
    case GpuPrecision::kTf32:
      return "tf32";
    case GpuPrecision::kFp32:
      return "fp32";
  }
  return "?";
}

// Copies U to the device, runs NewtonSchulzBatched (batch 1) on a stream of
// its own, copies O back and waits. Device buffers grow only (Reserve).
//
// State: created (context, stream) -> [Reserve] -> Orthogonalize ... ->
// destroyed (stream synchronised, then freed).
class CudaNsEngine final : public NsEngine {
 public:
  static absl::StatusOr<std::unique_ptr<NsEngine>> Create(
      int device, GpuPrecision precision) {
    auto engine =
        std::unique_ptr<CudaNsEngine>(new CudaNsEngine(device, precision));
    device::CudaDeviceGuard device_guard(device);
    if (!device_guard.status().ok()) return device_guard.status();
    absl::StatusOr<void*> stream = cuda::CreateStream();
    if (!stream.ok()) return stream.status();
    engine->stream_ = *stream;
    absl::StatusOr<std::unique_ptr<cuda::NsCudaContext>> ctx =
        cuda::NsCudaContext::Create(device, engine->stream_);
    if (!ctx.ok()) return ctx.status();
    engine->ctx_ = std::move(*ctx);
    return std::unique_ptr<NsEngine>(std::move(engine));
  }

  ~CudaNsEngine() override {
    device::CudaDeviceGuard device_guard(device_);
    ctx_.reset();  // Synchronises the stream before freeing.
    u_ = cuda::DeviceBuffer();
    out_ = cuda::DeviceBuffer();
    (void)cuda::DestroyStream(stream_);
  }

  absl::Status Orthogonalize(const float* u, int64_t rows, int64_t cols,
                             const NewtonSchulzOptions& options,
                             float* out) override {
    if (rows < 1 || cols < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CudaNsEngine::Orthogonalize: matrix shape must be positive, got "
          "rows=",
          rows, " cols=", cols));
    }
    MUON_CU_RETURN_IF_ERROR(ValidateNewtonSchulzOptions(options));
    if (u == nullptr || out == nullptr) {
      return absl::InvalidArgumentError(
          "CudaNsEngine::Orthogonalize: u and out must be non-null");
    }
    const int64_t bytes = rows * cols * int64_t{sizeof(float)};
    const uintptr_t a = reinterpret_cast<uintptr_t>(u);
    const uintptr_t b = reinterpret_cast<uintptr_t>(out);
    const uintptr_t n = static_cast<uintptr_t>(bytes);
    if (a < b + n && b < a + n) {
      return absl::InvalidArgumentError(
          "CudaNsEngine::Orthogonalize: out must not overlap u");
    }
    MUON_CU_RETURN_IF_ERROR(Reserve(rows, cols));
    MUON_CU_RETURN_IF_ERROR(cuda::CopyToDevice(u_.data(), u, bytes, stream_));
    MUON_CU_RETURN_IF_ERROR(
        cuda::NewtonSchulzBatched(ctx_.get(), u_.as<float>(), 1, rows, cols,
                                  options, precision_, out_.as<float>()));
    // Waits for the iteration: reports its asynchronous errors too.
    MUON_CU_RETURN_IF_ERROR(cuda::CopyToHost(out, out_.data(), bytes, stream_));
    return absl::OkStatus();
  }

  absl::Status Reserve(int64_t rows, int64_t cols) override {
    if (rows < 1 || cols < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CudaNsEngine::Reserve: sizes must be positive, got rows=", rows,
          " cols=", cols));
    }
    device::CudaDeviceGuard device_guard(device_);
    if (!device_guard.status().ok()) return device_guard.status();
    const int64_t bytes = rows * cols * int64_t{sizeof(float)};
    if (u_.bytes() < bytes) {
      MUON_CU_RETURN_IF_ERROR(cuda::SynchronizeStream(stream_));
      u_ = cuda::DeviceBuffer();
      out_ = cuda::DeviceBuffer();
      absl::StatusOr<cuda::DeviceBuffer> u =
          cuda::DeviceBuffer::Allocate(bytes);
      if (!u.ok()) return u.status();
      absl::StatusOr<cuda::DeviceBuffer> out =
          cuda::DeviceBuffer::Allocate(bytes);
      if (!out.ok()) return out.status();
      u_ = std::move(*u);
      out_ = std::move(*out);
    }
    return ctx_->Reserve(1, rows, cols, precision_);
  }

  std::string name() const override {
    return absl::StrCat("cuda:", device_, "/", PrecisionName(precision_));
  }

 private:
  CudaNsEngine(int device, GpuPrecision precision)
      : device_(device), precision_(precision) {}

  const int device_;
  const GpuPrecision precision_;
  void* stream_ = nullptr;  // cudaStream_t. Owned.
  std::unique_ptr<cuda::NsCudaContext> ctx_;
  cuda::DeviceBuffer u_;    // U on the device: float32 [rows, cols].
  cuda::DeviceBuffer out_;  // O on the device: float32 [rows, cols].
};

}  // namespace

absl::StatusOr<std::unique_ptr<NsEngine>> MakeCudaNsEngine(
    int device, GpuPrecision precision) {
  std::string reason;
  const int count = CudaDeviceCount(&reason);
  if (count == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "MakeCudaNsEngine: no GPU visible (device count 0): ", reason));
  }
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MakeCudaNsEngine: device must be in [0, ", count, "), got ", device));
  }
  return CudaNsEngine::Create(device, precision);
}

}  // namespace kernels
}  // namespace muon
