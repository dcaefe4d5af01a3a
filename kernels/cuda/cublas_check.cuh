// cuBLAS result -> absl::Status at the call site, beside the CUDA runtime's
// macros of the device layer (device/cuda_check.cuh, included here).
// nvcc-only: includes CUDA headers; never include it from a file compiled
// by gcc through Bazel.
#ifndef MUON_KERNELS_CUDA_CUBLAS_CHECK_CUH_
#define MUON_KERNELS_CUDA_CUBLAS_CHECK_CUH_

#include <cublas_v2.h>

#include "absl/status/status.h"
#include "device/cuda_check.cuh"
#include "kernels/cuda/newton_schulz_cuda.h"

// Returns a Status (CublasStatusToStatus, kernels/cuda/newton_schulz_cuda.h)
// from the enclosing function when `expr` (a cublasStatus_t) is not
// CUBLAS_STATUS_SUCCESS, naming the file, line and expression.
#define MUON_CUBLAS_RETURN_IF_ERROR(expr)                           \
  do {                                                              \
    const cublasStatus_t muon_cublas_st_ = (expr);                  \
    if (muon_cublas_st_ != CUBLAS_STATUS_SUCCESS) {                 \
      return ::muon::kernels::cuda::CublasStatusToStatus(           \
          static_cast<int>(muon_cublas_st_), MUON_CU_WHERE_ #expr); \
    }                                                               \
  } while (0)

#endif  // MUON_KERNELS_CUDA_CUBLAS_CHECK_CUH_
