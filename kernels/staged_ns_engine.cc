#include "kernels/staged_ns_engine.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "device/cuda_runtime.h"
#include "device/memory.h"
#include "device/runtime.h"
#include "device/stream.h"
#include "kernels/cuda/newton_schulz_cuda.h"
#include "kernels/newton_schulz.h"
#include "kernels/step_kernels.h"

namespace muon {
namespace kernels {
namespace {

// How long Orthogonalize waits for one matrix's iteration: generous (an
// 8192 x 8192 fp32 iteration takes well under a second on an H100), so
// that only a hung device reports DeadlineExceeded.
constexpr absl::Duration kIterationTimeout = absl::Minutes(5);

// State: created (stream, kernels) -> [Reserve] -> Orthogonalize ... ->
// destroyed (the kernels synchronise the stream before the buffers go).
class CudaNsEngine final : public NsEngine {
 public:
  CudaNsEngine(device::Runtime* runtime, std::unique_ptr<device::Stream> stream,
               std::unique_ptr<StepKernels> kernels)
      : runtime_(runtime),
        stream_(std::move(stream)),
        kernels_(std::move(kernels)) {}

  absl::Status Orthogonalize(const float* u, int64_t rows, int64_t cols,
                             const NewtonSchulzOptions& options,
                             float* out) override {
    if (rows < 1 || cols < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CudaNsEngine::Orthogonalize: matrix shape must be positive, got "
          "rows=",
          rows, " cols=", cols));
    }
    if (absl::Status s = ValidateNewtonSchulzOptions(options); !s.ok()) {
      return s;
    }
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
    if (absl::Status s = Reserve(rows, cols, options); !s.ok()) return s;
    // The blocking copy in is not ordered after the stream: wait for it
    // (idle after a successful call; a failed one may have left work that
    // reads the buffer).
    if (absl::Status s = stream_->Synchronize(kIterationTimeout); !s.ok()) {
      return s;
    }
    if (absl::Status s = runtime_->CopyFromHost(u_.data(), u, bytes); !s.ok()) {
      return s;
    }
    if (absl::Status s = kernels_->Orthogonalize(
            stream_.get(), u_.data(), 1, rows, cols, options, out_.data());
        !s.ok()) {
      return s;
    }
    // Reports the iteration's asynchronous errors too.
    if (absl::Status s = stream_->Synchronize(kIterationTimeout); !s.ok()) {
      return s;
    }
    return runtime_->CopyToHost(out, out_.data(), bytes);
  }

  absl::Status Reserve(int64_t rows, int64_t cols,
                       const NewtonSchulzOptions& options) override {
    if (rows < 1 || cols < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CudaNsEngine::Reserve: sizes must be positive, got rows=", rows,
          " cols=", cols));
    }
    if (absl::Status s = ValidateNewtonSchulzOptions(options); !s.ok()) {
      return s;
    }
    const int64_t elems = rows * cols;
    if (u_.size() < elems) {
      if (absl::Status s = stream_->Synchronize(kIterationTimeout); !s.ok()) {
        return s;
      }
      u_ = device::DeviceBuffer<float>();
      out_ = device::DeviceBuffer<float>();
      absl::StatusOr<device::DeviceBuffer<float>> u =
          device::DeviceBuffer<float>::Allocate(runtime_->allocator(), elems);
      if (!u.ok()) return u.status();
      absl::StatusOr<device::DeviceBuffer<float>> out =
          device::DeviceBuffer<float>::Allocate(runtime_->allocator(), elems);
      if (!out.ok()) return out.status();
      u_ = std::move(*u);
      out_ = std::move(*out);
    }
    return kernels_->Reserve(1, rows, cols, options);
  }

  std::string name() const override { return kernels_->name(); }

 private:
  device::Runtime* const runtime_;  // Not owned; process-wide.
  const std::unique_ptr<device::Stream> stream_;
  device::DeviceBuffer<float> u_;    // U on the device: float32 [rows, cols].
  device::DeviceBuffer<float> out_;  // O on the device: float32 [rows, cols].
  // Declared last, destroyed first: its Newton-Schulz context synchronises
  // the stream before the buffers and the stream go.
  const std::unique_ptr<StepKernels> kernels_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<NsEngine>> MakeCudaNsEngine(
    int device, GpuPrecision precision) {
  if (!cuda::BuiltWithCuda()) {
    return absl::UnimplementedError(
        absl::StrCat("MakeCudaNsEngine(device ", device,
                     "): built without CUDA: build with --config=cuda"));
  }
  std::string reason;
  const int count = device::CudaDeviceCount(&reason);
  if (count == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "MakeCudaNsEngine: no GPU visible (device count 0): ", reason));
  }
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MakeCudaNsEngine: device must be in [0, ", count, "), got ", device));
  }
  absl::StatusOr<device::Runtime*> runtime = device::CudaRuntime(device);
  if (!runtime.ok()) return runtime.status();
  absl::StatusOr<std::unique_ptr<device::Stream>> stream =
      (*runtime)->CreateStream(absl::StrCat("cuda:", device, " ns_engine"));
  if (!stream.ok()) return stream.status();
  absl::StatusOr<std::unique_ptr<StepKernels>> kernels =
      MakeCudaStepKernels(device, stream->get(), precision);
  if (!kernels.ok()) return kernels.status();
  return std::unique_ptr<NsEngine>(
      new CudaNsEngine(*runtime, *std::move(stream), *std::move(kernels)));
}

}  // namespace kernels
}  // namespace muon
