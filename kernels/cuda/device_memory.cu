// CUDA runtime helpers of kernels/cuda/device_memory.h (nvcc).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/device_memory.h"

namespace muon {
namespace kernels {
namespace cuda {

absl::Status CublasStatusToStatus(int cublas_status, const char* expr) {
  const cublasStatus_t st = static_cast<cublasStatus_t>(cublas_status);
  if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string message =
      absl::StrCat(expr, ": ", cublasGetStatusName(st), " (", cublas_status,
                   "): ", cublasGetStatusString(st));
  switch (st) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(message);
    case CUBLAS_STATUS_NOT_INITIALIZED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_LICENSE_ERROR:
      return absl::FailedPreconditionError(message);
    case CUBLAS_STATUS_INVALID_VALUE:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) (void)cudaFree(data_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) (void)cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(int64_t bytes) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DeviceBuffer::Allocate: bytes must be >= 0, got ", bytes));
  }
  DeviceBuffer buffer;
  if (bytes == 0) return buffer;
  void* data = nullptr;
  MUON_CUDA_RETURN_IF_ERROR(cudaMalloc(&data, static_cast<size_t>(bytes)));
  buffer.data_ = data;
  buffer.bytes_ = bytes;
  return buffer;
}

namespace {

absl::Status CheckCopyArgs(const char* what, void* dst, const void* src,
                           int64_t bytes) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": bytes must be >= 0, got ", bytes));
  }
  if (bytes > 0 && (dst == nullptr || src == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": null pointer with bytes=", bytes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CopyToDevice(void* device_dst, const void* host_src, int64_t bytes,
                          void* stream) {
  MUON_CU_RETURN_IF_ERROR(
      CheckCopyArgs("CopyToDevice", device_dst, host_src, bytes));
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (bytes > 0) {
    MUON_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device_dst, host_src,
                                              static_cast<size_t>(bytes),
                                              cudaMemcpyHostToDevice, s));
  }
  MUON_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  return absl::OkStatus();
}

absl::Status CopyToHost(void* host_dst, const void* device_src, int64_t bytes,
                        void* stream) {
  MUON_CU_RETURN_IF_ERROR(
      CheckCopyArgs("CopyToHost", host_dst, device_src, bytes));
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (bytes > 0) {
    MUON_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_dst, device_src,
                                              static_cast<size_t>(bytes),
                                              cudaMemcpyDeviceToHost, s));
  }
  MUON_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  return absl::OkStatus();
}

absl::Status SynchronizeStream(void* stream) {
  MUON_CUDA_RETURN_IF_ERROR(
      cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  return absl::OkStatus();
}

absl::StatusOr<void*> CreateStream() {
  cudaStream_t stream = nullptr;
  MUON_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return static_cast<void*>(stream);
}

absl::Status DestroyStream(void* stream) {
  if (stream == nullptr) return absl::OkStatus();
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const cudaError_t sync = cudaStreamSynchronize(s);
  MUON_CUDA_RETURN_IF_ERROR(cudaStreamDestroy(s));
  MUON_CUDA_RETURN_IF_ERROR(sync);
  return absl::OkStatus();
}

absl::Status SetDevice(int device) {
  MUON_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  return absl::OkStatus();
}

absl::StatusOr<std::string> DeviceDescription(int device) {
  cudaDeviceProp prop;
  MUON_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));
  return absl::StrCat(prop.name, " (sm_", prop.major, prop.minor, ", ",
                      prop.multiProcessorCount, " SMs, ",
                      prop.totalGlobalMem >> 20, " MiB)");
}

EventTimer::~EventTimer() {
  if (start_ != nullptr)
    (void)cudaEventDestroy(static_cast<cudaEvent_t>(start_));
  if (stop_ != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(stop_));
}

absl::Status EventTimer::Start(void* stream) {
  if (start_ == nullptr) {
    cudaEvent_t start = nullptr;
    cudaEvent_t stop = nullptr;
    MUON_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
    start_ = start;
    MUON_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
    stop_ = stop;
  }
  stream_ = stream;
  MUON_CUDA_RETURN_IF_ERROR(cudaEventRecord(static_cast<cudaEvent_t>(start_),
                                            static_cast<cudaStream_t>(stream)));
  return absl::OkStatus();
}

absl::StatusOr<double> EventTimer::Stop() {
  if (start_ == nullptr) {
    return absl::FailedPreconditionError("EventTimer::Stop before Start");
  }
  const cudaEvent_t stop = static_cast<cudaEvent_t>(stop_);
  MUON_CUDA_RETURN_IF_ERROR(
      cudaEventRecord(stop, static_cast<cudaStream_t>(stream_)));
  MUON_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
  float ms = 0.0f;
  MUON_CUDA_RETURN_IF_ERROR(
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_), stop));
  return static_cast<double>(ms);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muon
