// Shared by the GPU tests: a test that needs a GPU skips without one, naming
// why, and fails instead when the environment sets MUON_REQUIRE_GPU=1.
// tools/device_checks.sh sets it on the GPU machine, where "no GPU" means a
// broken setup (the bundle loaded the wrong libcudart, or found no libcuda)
// that would otherwise report green. Under `bazel test` pass it with
// --test_env=MUON_REQUIRE_GPU=1 (bazel clears the environment).
#ifndef MUON_TESTS_GPU_TEST_UTIL_H_
#define MUON_TESTS_GPU_TEST_UTIL_H_

#include <cstdlib>
#include <cstring>
#include <string>

#include "device/cuda_runtime.h"
#include "gtest/gtest.h"

namespace muon {
namespace testing {

// True when MUON_REQUIRE_GPU is "1".
inline bool GpuRequired() {
  const char* value = std::getenv("MUON_REQUIRE_GPU");
  return value != nullptr && std::strcmp(value, "1") == 0;
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
