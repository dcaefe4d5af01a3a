// The host-staged CUDA NsEngine: U is copied from host memory to the
// device, orthogonalized there by the CUDA StepKernels (cuBLAS
// Newton-Schulz, kernels/cuda/newton_schulz_cuda.h) on a stream of the
// engine's own, and O is copied back, so that a rank whose parameters and
// transport are on the host (Gloo) can still run Newton-Schulz on a GPU,
// and several rank processes can share one GPU.
#ifndef MUON_KERNELS_STAGED_NS_ENGINE_H_
#define MUON_KERNELS_STAGED_NS_ENGINE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/ns_engine.h"

namespace muon {
namespace kernels {

// The host-staged engine on CUDA device `device` in `precision`. Each
// Orthogonalize call copies U in (device::Runtime::CopyFromHost), runs
// the iteration on the engine's stream, waits for it and copies O out
// (Runtime::CopyToHost): it returns once `out` holds the result. Device
// buffers (from the device's allocator) only grow. name() is
// "cuda:<device>/<precision>".
// Errors: Unimplemented (built without --config=cuda); FailedPrecondition
// (no GPU visible: names the device count and CUDA's message);
// InvalidArgument (device outside [0, device count), naming both); the
// CUDA or cuBLAS error of creating the stream or the cuBLAS handle.
absl::StatusOr<std::unique_ptr<NsEngine>> MakeCudaNsEngine(
    int device, GpuPrecision precision);

}  // namespace kernels
}  // namespace muon

#endif  // MUON_KERNELS_STAGED_NS_ENGINE_H_
