// Shared by the GPU tests: a test that needs a GPU skips without one, naming
// why, and fails instead when the environment sets MUON_REQUIRE_GPU=1.
// tools/device_checks.sh sets it on the GPU machine, where "no GPU" means a
// broken setup (the bundle loaded the wrong libcudart, or found no libcuda)
// that would otherwise report green. Under `bazel test` pass it with
// --test_env=MUON_REQUIRE_GPU=1 (bazel clears the environment).
#ifndef MUON_TESTS_GPU_TEST_UTIL_H_
#define MUON_TESTS_GPU_TEST_UTIL_H_

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "device/cuda_runtime.h"
#include "device/memory.h"
#include "device/runtime.h"
#include "gtest/gtest.h"

namespace muon {
namespace testing {

// True when MUON_REQUIRE_GPU is "1".
inline bool GpuRequired() {
  const char* value = std::getenv("MUON_REQUIRE_GPU");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

// The runtime of cuda:`ordinal` (device::CudaRuntime); on error records a
// test failure and returns nullptr. Call after the GPU skip macros.
inline device::Runtime* CudaTestRuntime(int ordinal = 0) {
  absl::StatusOr<device::Runtime*> runtime = device::CudaRuntime(ordinal);
  if (!runtime.ok()) {
    ADD_FAILURE() << runtime.status();
    return nullptr;
  }
  return *runtime;
}

// A new buffer of `runtime`'s device holding `host`'s elements
// (Runtime::CopyFromHost: blocking, ordered after CUDA's legacy default
// stream only). Errors: the allocator's; the copy's.
template <typename T>
absl::StatusOr<device::DeviceBuffer<T>> CopyToNewDeviceBuffer(
    device::Runtime* runtime, const std::vector<T>& host) {
  absl::StatusOr<device::DeviceBuffer<T>> buffer =
      device::DeviceBuffer<T>::Allocate(runtime->allocator(),
                                        static_cast<int64_t>(host.size()));
  if (!buffer.ok()) return buffer.status();
  absl::Status copied =
      runtime->CopyFromHost(buffer->data(), host.data(),
                            static_cast<int64_t>(host.size() * sizeof(T)));
  if (!copied.ok()) return copied;
  return std::move(*buffer);
}

// `count` elements of `runtime`'s device memory at `src` as a host vector
// (Runtime::CopyToHost: blocking, ordered after CUDA's legacy default
// stream only: synchronize other streams first). On error records a test
// failure and returns zeros.
template <typename T>
std::vector<T> CopyToHostVector(device::Runtime* runtime, const T* src,
                                int64_t count) {
  std::vector<T> host(static_cast<size_t>(count));
  const absl::Status status =
      runtime->CopyToHost(host.data(), src, count * int64_t{sizeof(T)});
  EXPECT_TRUE(status.ok()) << status;
  return host;
}

}  // namespace testing
}  // namespace muon

// Skips (or, with MUON_REQUIRE_GPU=1, fails) the calling test when
// `unavailable` is true; `reason` (streamable) says why. `unavailable` is
// evaluated before `reason`.
#define MUON_SKIP_OR_FAIL_UNLESS_GPU(unavailable, reason)            \
  do {                                                               \
    if (unavailable) {                                               \
      if (::muon::testing::GpuRequired()) {                          \
        GTEST_FAIL() << "MUON_REQUIRE_GPU=1 but no GPU: " << reason; \
      }                                                              \
      GTEST_SKIP() << "no GPU: " << reason;                          \
    }                                                                \
  } while (0)

// The same for "no CUDA device is visible" (device::CudaDeviceCount, which
// says why: no GPU, no driver, or a build without --config=cuda).
#define MUON_SKIP_OR_FAIL_UNLESS_CUDA_DEVICE()                      \
  do {                                                              \
    std::string muon_no_gpu_reason_;                                \
    MUON_SKIP_OR_FAIL_UNLESS_GPU(                                   \
        ::muon::device::CudaDeviceCount(&muon_no_gpu_reason_) == 0, \
        muon_no_gpu_reason_);                                       \
  } while (0)

#endif  // MUON_TESTS_GPU_TEST_UTIL_H_
