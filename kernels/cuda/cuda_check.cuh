// CUDA / cuBLAS result -> absl::Status at the call site, keeping the failing
// expression's text and the library's own message (as XLA's
// XLA_NCCL_STATUS does). nvcc-only: includes CUDA headers; never include it
// from a file compiled by gcc through Bazel.
#ifndef MUON_KERNELS_CUDA_CUDA_CHECK_CUH_
#define MUON_KERNELS_CUDA_CUDA_CHECK_CUH_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "kernels/cuda/device_memory.h"

namespace muon {
namespace kernels {
namespace cuda {
namespace internal {

// cudaGetLastError() (which also clears it) as a Status naming `what`.
inline absl::Status LaunchStatus(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return absl::OkStatus();
  return CudaErrorToStatus(static_cast<int>(err), what);
}

}  // namespace internal
}  // namespace cuda
}  // namespace kernels
}  // namespace muon

#define MUON_CU_STRINGIFY_INNER_(x) #x
#define MUON_CU_STRINGIFY_(x) MUON_CU_STRINGIFY_INNER_(x)
#define MUON_CU_WHERE_ __FILE__ ":" MUON_CU_STRINGIFY_(__LINE__) ": "

// Returns a Status from the enclosing function when `expr` (a cudaError_t)
// is not cudaSuccess; clears CUDA's sticky last-error slot for non-sticky
// errors so later calls do not report it again.
#define MUON_CUDA_RETURN_IF_ERROR(expr)                            \
  do {                                                             \
    const cudaError_t muon_cuda_err_ = (expr);                     \
    if (muon_cuda_err_ != cudaSuccess) {                           \
      (void)cudaGetLastError();                                    \
      return ::muon::kernels::cuda::CudaErrorToStatus(             \
          static_cast<int>(muon_cuda_err_), MUON_CU_WHERE_ #expr); \
    }                                                              \
  } while (0)

// The same for a cublasStatus_t.
#define MUON_CUBLAS_RETURN_IF_ERROR(expr)                           \
  do {                                                              \
    const cublasStatus_t muon_cublas_st_ = (expr);                  \
    if (muon_cublas_st_ != CUBLAS_STATUS_SUCCESS) {                 \
      return ::muon::kernels::cuda::CublasStatusToStatus(           \
          static_cast<int>(muon_cublas_st_), MUON_CU_WHERE_ #expr); \
    }                                                               \
  } while (0)

// After a kernel launch: reports launch errors (bad configuration, no
// kernel image for this GPU) naming the kernel (a string literal).
#define MUON_CUDA_RETURN_IF_LAUNCH_FAILED(kernel_name)                   \
  MUON_CU_RETURN_IF_ERROR(::muon::kernels::cuda::internal::LaunchStatus( \
      MUON_CU_WHERE_ "launch of " kernel_name))

// Returns the Status `expr` from the enclosing function when not OK.
#define MUON_CU_RETURN_IF_ERROR(expr)                  \
  do {                                                 \
    ::absl::Status muon_cu_status_ = (expr);           \
    if (!muon_cu_status_.ok()) return muon_cu_status_; \
  } while (0)

#endif  // MUON_KERNELS_CUDA_CUDA_CHECK_CUH_
