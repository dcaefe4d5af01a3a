// The CUDA implementation of the device package: streams (non-blocking
// cudaStream_t), events (cudaEvent_t without timing), cudaMalloc memory, and
// the one map from a CUDA runtime error to an absl::Status. A plain C++
// header: the .cu file behind it is the only one here that includes CUDA
// headers (compiled by nvcc with --config=cuda; stubs otherwise).
#ifndef MUON_DEVICE_CUDA_RUNTIME_H_
#define MUON_DEVICE_CUDA_RUNTIME_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace muon {
namespace device {

class Runtime;
class Stream;

// The process-wide runtime of CUDA device `ordinal` (created on first use;
// its streams, events and allocations are made with that device current).
// Errors: Unimplemented (built without --config=cuda); FailedPrecondition
// (ordinal outside [0, CudaDeviceCount()), naming both).
absl::StatusOr<Runtime*> CudaRuntime(int ordinal);

// Makes CUDA device `ordinal` current on the calling thread for the
// guard's lifetime and restores the previous one on destruction
// (c10::cuda::CUDAGuard), so that a library call never changes the
// trainer's current device. Without CUDA: a no-op whose status() is
// Unimplemented.
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int ordinal);
  ~CudaDeviceGuard();
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;
  // The error of making `ordinal` current (CudaErrorToStatus), else OK.
  absl::Status status() const;

 private:
  int previous_ = -1;  // the device current before; -1 = unknown
  int error_ = 0;      // cudaError_t of cudaSetDevice
};

// Visible CUDA devices (cudaGetDeviceCount); 0 without CUDA or a GPU, and
// then `reason` (if given) says why.
int CudaDeviceCount(std::string* reason = nullptr);

// The device's name, compute capability, multiprocessor count and memory
// (cudaGetDeviceProperties), for benchmark and test output:
// "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 81008 MiB)".
// Errors: Unimplemented (built without --config=cuda); the CUDA error
// (InvalidArgument for an ordinal that is not a visible device).
absl::StatusOr<std::string> CudaDeviceDescription(int ordinal);

// The scheduling priority of a CUDA stream (cudaStreamGetPriority): lower
// numbers are scheduled first; 0 for Runtime::CreateStream's streams, the
// device's greatest priority (a negative number on sm_70 and newer) for
// CreateHighPriorityStream's.
// Errors: InvalidArgument (a host stream, naming it); Unimplemented
// (built without --config=cuda); the CUDA error.
absl::StatusOr<int> CudaStreamPriority(Stream* stream);

// A CUDA runtime error code (cudaError_t as int) as a Status: OK for
// cudaSuccess; else ResourceExhausted (out of memory), FailedPrecondition
// (no device, driver too old), InvalidArgument (invalid value), Internal
// otherwise, with the message "<expr>: <name> (<code>): <CUDA's text>".
absl::Status CudaErrorToStatus(int cuda_error, const char* expr);

}  // namespace device
}  // namespace muon

#endif  // MUON_DEVICE_CUDA_RUNTIME_H_
