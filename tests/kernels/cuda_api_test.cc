// Parts of the CUDA device API that run without a GPU in --config=cuda
// builds: argument checks that precede any CUDA call, and the conversion of
// CUDA / cuBLAS result codes to absl::Status. In default builds (stubs)
// each test skips with "built without CUDA".
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "device/cuda_runtime.h"
#include "device/memory.h"
#include "device/runtime.h"
#include "device/stream.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/muon_update_cuda.h"
#include "kernels/cuda/newton_schulz_cuda.h"
#include "kernels/ns_engine.h"
#include "tests/gpu_test_util.h"

#define MUON_SKIP_WITHOUT_CUDA_BUILD()                 \
  MUON_SKIP_OR_FAIL_UNLESS_GPU(!cuda::BuiltWithCuda(), \
                               "built without CUDA: build with --config=cuda")

namespace muon {
namespace kernels {
namespace {

using ::testing::HasSubstr;

// Memory for a call that passes the argument checks and goes on to CUDA:
// a device buffer of `count` floats where a GPU is visible (the call then
// runs there, and must succeed), else `host` (no device: CUDA refuses the
// call, but not for overlap). A kernel launched on host stack memory
// would fault on a GPU (an illegal address poisons the process's CUDA
// context) or, with HMM, write the stack after the test returned.
struct CallMemory {
  bool on_gpu = false;
  device::Runtime* runtime = nullptr;
  device::DeviceBuffer<float> device;
  float* data = nullptr;
};

CallMemory MemoryForCall(float* host, int64_t count) {
  CallMemory m;
  m.data = host;
  if (device::CudaDeviceCount() == 0) return m;
  absl::StatusOr<device::Runtime*> runtime = device::CudaRuntime(0);
  EXPECT_TRUE(runtime.ok()) << runtime.status();
  if (!runtime.ok()) return m;
  absl::StatusOr<device::DeviceBuffer<float>> buffer =
      device::DeviceBuffer<float>::Allocate((*runtime)->allocator(), count);
  EXPECT_TRUE(buffer.ok()) << buffer.status();
  if (!buffer.ok()) return m;
  m.on_gpu = true;
  m.runtime = *runtime;
  m.device = *std::move(buffer);
  m.data = m.device.data();
  return m;
}

// The outcome of a call MemoryForCall placed: on a GPU it ran and the
// device finished it without error; else it was refused, but not with
// `not_for` in its message.
void ExpectRanOrRefusedNotFor(const CallMemory& m, const absl::Status& status,
                              const std::string& not_for) {
  if (m.on_gpu) {
    EXPECT_TRUE(status.ok()) << status;
    absl::StatusOr<std::unique_ptr<device::Stream>> legacy =
        m.runtime->WrapStream(nullptr, "legacy default");
    ASSERT_TRUE(legacy.ok()) << legacy.status();
    EXPECT_TRUE((*legacy)->Synchronize(absl::Minutes(1)).ok());
    return;
  }
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()),
              ::testing::Not(HasSubstr(not_for)));
}

// Values of cudaError_t / cublasStatus_t (driver_types.h, cublas_api.h;
// this file is compiled by gcc without CUDA headers).
constexpr int kCudaErrorInvalidValue = 1;
constexpr int kCudaErrorMemoryAllocation = 2;
constexpr int kCudaErrorInsufficientDriver = 35;
constexpr int kCudaErrorNoDevice = 100;
constexpr int kCudaErrorLaunchFailure = 719;
constexpr int kCublasStatusAllocFailed = 3;
constexpr int kCublasStatusInvalidValue = 7;
constexpr int kCublasStatusArchMismatch = 8;
constexpr int kCublasStatusExecutionFailed = 13;

TEST(CudaStatusTest, CudaErrorToStatus_KeepsExpressionNameAndMessage) {
  MUON_SKIP_WITHOUT_CUDA_BUILD();
  EXPECT_TRUE(device::CudaErrorToStatus(0, "cudaFree(p)").ok());
  const absl::Status oom = device::CudaErrorToStatus(kCudaErrorMemoryAllocation,
                                                     "cudaMalloc(&p, n)");
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(oom.message()), HasSubstr("cudaMalloc(&p, n)"));
  EXPECT_THAT(std::string(oom.message()),
              HasSubstr("cudaErrorMemoryAllocation (2)"));
  EXPECT_THAT(std::string(oom.message()), HasSubstr("out of memory"));
  EXPECT_EQ(device::CudaErrorToStatus(kCudaErrorNoDevice, "x").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(device::CudaErrorToStatus(kCudaErrorInsufficientDriver, "x").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(device::CudaErrorToStatus(kCudaErrorInvalidValue, "x").code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status launch =
      device::CudaErrorToStatus(kCudaErrorLaunchFailure, "k<<<...>>>");
  EXPECT_EQ(launch.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(launch.message()),
              HasSubstr("cudaErrorLaunchFailure"));
}

TEST(CudaStatusTest, CublasStatusToStatus_KeepsExpressionNameAndMessage) {
  MUON_SKIP_WITHOUT_CUDA_BUILD();
  EXPECT_TRUE(cuda::CublasStatusToStatus(0, "cublasCreate(&h)").ok());
  const absl::Status alloc =
      cuda::CublasStatusToStatus(kCublasStatusAllocFailed, "cublasCreate(&h)");
  EXPECT_EQ(alloc.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(alloc.message()), HasSubstr("cublasCreate(&h)"));
  EXPECT_THAT(std::string(alloc.message()),
              HasSubstr("CUBLAS_STATUS_ALLOC_FAILED (3)"));
  const absl::Status invalid = cuda::CublasStatusToStatus(
      kCublasStatusInvalidValue, "cublasGemmEx(...)");
  EXPECT_EQ(invalid.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(invalid.message()),
              HasSubstr("CUBLAS_STATUS_INVALID_VALUE"));
  EXPECT_EQ(cuda::CublasStatusToStatus(kCublasStatusArchMismatch, "x").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(
      cuda::CublasStatusToStatus(kCublasStatusExecutionFailed, "x").code(),
      absl::StatusCode::kInternal);
}

TEST(CudaApiTest, NewtonSchulzBatched_BadArguments_ReturnInvalidArgument) {
  MUON_SKIP_WITHOUT_CUDA_BUILD();
  float dummy[8] = {};
  EXPECT_EQ(cuda::NewtonSchulzBatched(nullptr, dummy, 1, 2, 2, {},
                                      GpuPrecision::kBf16, dummy + 4)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CudaApiTest, FusedKernels_BadArguments_ReturnInvalidArgument) {
  MUON_SKIP_WITHOUT_CUDA_BUILD();
  float buf[4] = {};
  float grad[4] = {};
  constexpr auto kF32 = cuda::Elem::kFloat32;
  // The update would overwrite the buffer it reads.
  const absl::Status alias =
      cuda::FormUpdate(buf, kF32, grad, kF32, 4, 0.95, true, buf,
                       cuda::FmaMode::kSeparate, nullptr);
  EXPECT_EQ(alias.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(alias.message()), HasSubstr("alias"));
  // Partly overlapping, not equal: an fp32 update of 4 elements (16 bytes)
  // from a bf16 buffer's third element, or from the gradient's second.
  alignas(16) uint16_t buf16[8] = {};
  const absl::Status partial_buf = cuda::FormUpdate(
      buf16, cuda::Elem::kBf16, grad, kF32, 4, 0.95, true,
      reinterpret_cast<float*>(buf16 + 2), cuda::FmaMode::kSeparate, nullptr);
  EXPECT_EQ(partial_buf.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(partial_buf.message()),
              HasSubstr("its 16 bytes overlap buf's 4 elements"));
  alignas(16) float grad8[8] = {};
  const absl::Status partial_grad =
      cuda::FormUpdate(buf, kF32, grad8, kF32, 4, 0.95, true, grad8 + 1,
                       cuda::FmaMode::kSeparate, nullptr);
  EXPECT_EQ(partial_grad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(partial_grad.message()), HasSubstr("grad's"));
  // Without nesterov the gradient is not read: overlapping it is allowed
  // (the call goes on to CUDA). buf at [0, 4), the gradient at [4, 8),
  // the update at [5, 9).
  float unread_host[12] = {};
  const CallMemory unread = MemoryForCall(unread_host, 12);
  const absl::Status unread_grad =
      cuda::FormUpdate(unread.data, kF32, unread.data + 4, kF32, 4, 0.95, false,
                       unread.data + 5, cuda::FmaMode::kSeparate, nullptr);
  ExpectRanOrRefusedNotFor(unread, unread_grad, "alias");
  // The gradient one element into the buffer, or the buffer's bytes read
  // as bf16: refused before any CUDA call.
  const absl::Status shifted = cuda::Momentum(
      grad8, kF32, grad8 + 1, kF32, 4, 0.95, cuda::FmaMode::kSeparate, nullptr);
  EXPECT_EQ(shifted.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(shifted.message()),
              HasSubstr("Momentum: grad's 16 bytes overlap buf's 4 elements"));
  const absl::Status retyped =
      cuda::Momentum(grad8, kF32, grad8, cuda::Elem::kBf16, 4, 0.95,
                     cuda::FmaMode::kSeparate, nullptr);
  EXPECT_EQ(retyped.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(retyped.message()),
              HasSubstr("grad's 8 bytes overlap"));
  EXPECT_EQ(cuda::Momentum(buf, kF32, grad, kF32, -1, 0.95,
                           cuda::FmaMode::kSeparate, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::Momentum(buf, kF32, nullptr, kF32, 4, 0.95,
                           cuda::FmaMode::kSeparate, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::DecayAndApply(buf, buf + 1, 2, 0.1, 0.1, 0.1,
                                cuda::FmaMode::kFused, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  // A bf16 parameter of 4 elements spans 8 bytes: an update starting
  // inside them is refused before any CUDA call.
  alignas(16) uint16_t param16[8] = {};
  const absl::Status overlap16 = cuda::DecayAndApplyBf16(
      param16, reinterpret_cast<const float*>(param16 + 2), 4, 0.1, 0.1, 0.1,
      cuda::FmaMode::kFused, nullptr);
  EXPECT_EQ(overlap16.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(overlap16.message()),
              HasSubstr("DecayAndApplyBf16: update must not overlap param"));
  // Its last byte is param16[3]'s: an update from param16 + 4 on does not
  // overlap (the call goes on to CUDA). The parameter's 4 bf16 values at
  // bytes [0, 8), the update's 4 floats at [8, 24).
  alignas(16) float adjacent_host[6] = {};
  const CallMemory adjacent = MemoryForCall(adjacent_host, 6);
  uint16_t* adjacent_param = reinterpret_cast<uint16_t*>(adjacent.data);
  const absl::Status adjacent16 = cuda::DecayAndApplyBf16(
      adjacent_param, reinterpret_cast<const float*>(adjacent_param + 4), 4,
      0.1, 0.1, 0.1, cuda::FmaMode::kFused, nullptr);
  ExpectRanOrRefusedNotFor(adjacent, adjacent16, "overlap");
  const absl::Status last_byte16 = cuda::DecayAndApplyBf16(
      param16, reinterpret_cast<const float*>(param16 + 3), 4, 0.1, 0.1, 0.1,
      cuda::FmaMode::kFused, nullptr);
  EXPECT_THAT(std::string(last_byte16.message()), HasSubstr("overlap"));
  // n = 0 is a no-op, even with null pointers.
  EXPECT_TRUE(cuda::DecayAndApply(nullptr, nullptr, 0, 0.1, 0.1, 0.1,
                                  cuda::FmaMode::kFused, nullptr)
                  .ok());
}

// The Newton-Schulz context takes a CUDA runtime and a stream of that
// device: null ones, or the host's, are refused by name before any CUDA
// call (so this runs without a GPU in --config=cuda builds).
TEST(CudaApiTest, NsCudaContextCreate_NullOrHostRuntime_InvalidArgument) {
  MUON_SKIP_WITHOUT_CUDA_BUILD();
  EXPECT_EQ(cuda::NsCudaContext::Create(nullptr, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  device::Runtime* host = device::HostRuntime();
  absl::StatusOr<std::unique_ptr<device::Stream>> stream =
      host->CreateStream("host");
  ASSERT_TRUE(stream.ok()) << stream.status();
  const absl::Status status =
      cuda::NsCudaContext::Create(host, stream->get()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("cpu"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("\"host\""));
}

// In default builds every entry point is a stub naming the fix.
TEST(CudaApiTest, Stubs_WithoutCuda_ReturnUnimplemented) {
  if (cuda::BuiltWithCuda()) GTEST_SKIP() << "built with CUDA";
  const absl::Status status =
      cuda::NsCudaContext::Create(nullptr, nullptr).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("build with --config=cuda"));
  // Device memory comes from the device layer, which has no CUDA runtime.
  EXPECT_EQ(device::CudaRuntime(0).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(cuda::DecayAndApply(nullptr, nullptr, 0, 0, 0, 0,
                                cuda::FmaMode::kFused, nullptr)
                .code(),
            absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace kernels
}  // namespace muon
