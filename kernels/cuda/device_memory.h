// Small CUDA runtime helpers behind a plain C++ header, for tests, tools
// and the host-staged engine's callers: device buffers, copies, streams,
// timing and device names, all returning absl::Status. Default builds link
// stubs returning Unimplemented.
#ifndef MUON_KERNELS_CUDA_DEVICE_MEMORY_H_
#define MUON_KERNELS_CUDA_DEVICE_MEMORY_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "device/cuda_runtime.h"

namespace muon {
namespace kernels {
namespace cuda {

// Device memory from cudaMalloc on the current device, freed on
// destruction. Move-only. A default-constructed buffer holds nothing.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // Errors: InvalidArgument (bytes < 0); ResourceExhausted (cudaMalloc out
  // of memory); Unimplemented (built without CUDA); Internal.
  static absl::StatusOr<DeviceBuffer> Allocate(int64_t bytes);

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  int64_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  int64_t bytes_ = 0;
};

// Copies `bytes` host -> device / device -> host on `stream` (cudaStream_t
// as void*) and waits for the copy (and all earlier work on the stream).
// Errors: InvalidArgument (bytes < 0, null); Unimplemented; Internal (names
// the call and CUDA's message).
absl::Status CopyToDevice(void* device_dst, const void* host_src, int64_t bytes,
                          void* stream);
absl::Status CopyToHost(void* host_dst, const void* device_src, int64_t bytes,
                        void* stream);

// cudaStreamSynchronize: waits for the stream's work and reports errors of
// its asynchronous execution.
absl::Status SynchronizeStream(void* stream);

// A non-blocking stream on the current device (cudaStreamCreateWithFlags);
// DestroyStream synchronises it first.
absl::StatusOr<void*> CreateStream();
absl::Status DestroyStream(void* stream);

// Makes `device` current (cudaSetDevice).
absl::Status SetDevice(int device);

// cudaGetDeviceProperties: "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs)".
absl::StatusOr<std::string> DeviceDescription(int device);

// Milliseconds between two CUDA events recorded on `stream` around `fn`
// (which enqueues work on the same stream); waits for the stop event.
// Errors: fn's error; Unimplemented; Internal.
template <typename Fn>
absl::StatusOr<double> TimeOnStream(void* stream, Fn fn);

// The non-template part of TimeOnStream: an event pair.
class EventTimer {
 public:
  EventTimer() = default;
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  // Records the start event on `stream` (creates the events on first use).
  absl::Status Start(void* stream);
  // Records the stop event, waits for it, returns the elapsed milliseconds.
  absl::StatusOr<double> Stop();

 private:
  void* start_ = nullptr;  // cudaEvent_t. Owned.
  void* stop_ = nullptr;   // cudaEvent_t. Owned.
  void* stream_ = nullptr;
};

template <typename Fn>
absl::StatusOr<double> TimeOnStream(void* stream, Fn fn) {
  EventTimer timer;
  absl::Status status = timer.Start(stream);
  if (!status.ok()) return status;
  status = fn();
  if (!status.ok()) return status;
  return timer.Stop();
}

// The CUDA runtime error map is the device layer's (one for the project);
// a cuBLAS status (cublasStatus_t as int) maps the same way: OK for
// success; else ResourceExhausted (allocation failed), FailedPrecondition
// (not initialized, architecture mismatch, not supported), InvalidArgument
// (invalid value), Internal otherwise, with the message
// "<expr>: <name> (<code>): <cuBLAS's description>". Exposed for tests.
using ::muon::device::CudaErrorToStatus;
absl::Status CublasStatusToStatus(int cublas_status, const char* expr);

}  // namespace cuda
}  // namespace kernels
}  // namespace muon

#endif  // MUON_KERNELS_CUDA_DEVICE_MEMORY_H_
