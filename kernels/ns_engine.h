// Where a rank runs Newton-Schulz: the step executor orthogonalizes through
// this interface, so the same data path serves the CPU (OpenBLAS) and a GPU
// (cuBLAS). The GPU engine is host-staged (kernels/staged_ns_engine.h): U
// comes from and O goes to host memory (copies in and out around the
// cuBLAS iteration), so the transport stays Gloo and several rank
// processes can share one GPU.
//
// Thread-compatible: one thread uses an engine at a time.
#ifndef MUON_KERNELS_NS_ENGINE_H_
#define MUON_KERNELS_NS_ENGINE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "device/cuda_runtime.h"
#include "kernels/newton_schulz.h"

namespace muon {
namespace kernels {

// Arithmetic of the GPU iteration: bf16 inputs with fp32 accumulation
// (default, as torch.optim.Muon's bfloat16 iteration), tf32, or fp32.
enum class GpuPrecision { kBf16, kTf32, kFp32 };

// Parses "bf16", "tf32", "fp32". Errors: InvalidArgument naming the value.
absl::StatusOr<GpuPrecision> ParseGpuPrecision(const std::string& name);

// "bf16", "tf32" or "fp32".
absl::string_view GpuPrecisionName(GpuPrecision precision);

class NsEngine {
 public:
  virtual ~NsEngine() = default;
  // O = NS_k(U) for a row-major float32 [rows, cols] matrix in HOST memory
  // (see kernels::NewtonSchulz for the iteration). `out` may not alias `u`.
  // Errors: InvalidArgument (shapes, options); Internal / Unavailable from
  // the device (naming the CUDA or cuBLAS call and its message).
  virtual absl::Status Orthogonalize(const float* u, int64_t rows, int64_t cols,
                                     const NewtonSchulzOptions& options,
                                     float* out) = 0;
  // Grows scratch space to fit a [rows, cols] matrix (either orientation)
  // under `options` (the method they resolve to on this shape: kGram needs
  // more) so that Orthogonalize with those options does not allocate for it
  // afterwards. Buffers only grow: call once per shape to fit all of them
  // (each buffer ends at the largest need over the calls).
  // Errors: InvalidArgument (a size < 1, or options ValidateNewtonSchulzOptions
  // refuses); Internal / ResourceExhausted from the device.
  virtual absl::Status Reserve(int64_t rows, int64_t cols,
                               const NewtonSchulzOptions& options) = 0;
  // "cpu/openblas" or "cuda:<device>/<precision>".
  virtual std::string name() const = 0;
};

// The OpenBLAS engine (kernels::NewtonSchulz in fp32).
std::unique_ptr<NsEngine> MakeCpuNsEngine();

// Number of visible CUDA devices (the device layer's count); 0 when built
// without CUDA or without a GPU (`reason` then says why).
using ::muon::device::CudaDeviceCount;

}  // namespace kernels
}  // namespace muon

#endif  // MUON_KERNELS_NS_ENGINE_H_
