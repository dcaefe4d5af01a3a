// CUDA runtime result -> absl::Status at the call site, keeping the failing
// expression's text, its place in the source and CUDA's own message (as
// XLA's TF_RETURN_IF_ERROR over a cudaError_t). The one set of CUDA error
// macros of the project: the device layer's CUDA implementation and the
// CUDA kernels use it. nvcc-only: includes CUDA headers; never include it
// from a file compiled by gcc through Bazel.
#ifndef MUON_DEVICE_CUDA_CHECK_CUH_
#define MUON_DEVICE_CUDA_CHECK_CUH_

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "device/cuda_runtime.h"

namespace muon {
namespace device {
namespace internal {

// cudaGetLastError() (which also clears it) as a Status naming `what`.
inline absl::Status LaunchStatus(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return absl::OkStatus();
  return CudaErrorToStatus(static_cast<int>(err), what);
}

}  // namespace internal
}  // namespace device
}  // namespace muon

#define MUON_CU_STRINGIFY_INNER_(x) #x
#define MUON_CU_STRINGIFY_(x) MUON_CU_STRINGIFY_INNER_(x)
#define MUON_CU_WHERE_ __FILE__ ":" MUON_CU_STRINGIFY_(__LINE__) ": "

// Returns a Status (CudaErrorToStatus: "<file>:<line>: <expr>: <name>
// (<code>): <CUDA's text>") from the enclosing function when `expr` (a
// cudaError_t) is not cudaSuccess; clears CUDA's last-error slot so that
// later calls do not report a non-sticky error again.
#define MUON_CUDA_RETURN_IF_ERROR(expr)                            \
  do {                                                             \
    const cudaError_t muon_cuda_err_ = (expr);                     \
    if (muon_cuda_err_ != cudaSuccess) {                           \
      (void)cudaGetLastError();                                    \
      return ::muon::device::CudaErrorToStatus(                    \
          static_cast<int>(muon_cuda_err_), MUON_CU_WHERE_ #expr); \
    }                                                              \
  } while (0)

// After a kernel launch: reports launch errors (bad configuration, no
// kernel image for this GPU) naming the kernel (a string literal).
#define MUON_CUDA_RETURN_IF_LAUNCH_FAILED(kernel_name)            \
  MUON_CU_RETURN_IF_ERROR(::muon::device::internal::LaunchStatus( \
      MUON_CU_WHERE_ "launch of " kernel_name))

// Returns the Status `expr` from the enclosing function when not OK.
#define MUON_CU_RETURN_IF_ERROR(expr)                  \
  do {                                                 \
    ::absl::Status muon_cu_status_ = (expr);           \
    if (!muon_cu_status_.ok()) return muon_cu_status_; \
  } while (0)

#endif  // MUON_DEVICE_CUDA_CHECK_CUH_
