// NsEngine on the CPU, ParseGpuPrecision, and the CUDA entry points where no
// GPU is visible (default build: Unimplemented; --config=cuda build on a
// machine without a GPU: FailedPrecondition with CUDA's reason).
#include "kernels/ns_engine.h"

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/newton_schulz_cuda.h"
#include "kernels/newton_schulz.h"
#include "kernels/staged_ns_engine.h"
#include "tests/kernels/ns_test_util.h"

namespace muon {
namespace kernels {
namespace {

using ::muon::kernels::testing::BitwiseEqual;
using ::muon::kernels::testing::RandomMatrix;
using ::testing::HasSubstr;

TEST(ParseGpuPrecisionTest, ParseGpuPrecision_KnownNames) {
  EXPECT_EQ(*ParseGpuPrecision("bf16"), GpuPrecision::kBf16);
  EXPECT_EQ(*ParseGpuPrecision("tf32"), GpuPrecision::kTf32);
  EXPECT_EQ(*ParseGpuPrecision("fp32"), GpuPrecision::kFp32);
}

TEST(ParseGpuPrecisionTest, ParseGpuPrecision_Unknown_ReturnsInvalidArgument) {
  for (const char* name : {"BF16", "fp16", "", "float32"}) {
    const absl::StatusOr<GpuPrecision> parsed = ParseGpuPrecision(name);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument)
        << name;
    EXPECT_THAT(std::string(parsed.status().message()),
                HasSubstr(std::string("\"") + name + "\""));
  }
}

TEST(CpuNsEngineTest, Orthogonalize_EqualsNewtonSchulzBitwise) {
  std::unique_ptr<NsEngine> engine = MakeCpuNsEngine();
  EXPECT_EQ(engine->name(), "cpu/openblas");
  ASSERT_TRUE(engine->Reserve(300, 200, {}).ok());
  for (const NewtonSchulzOptions& options :
       {NewtonSchulzOptions{}, PolarExpressSchedule()}) {
    for (auto [rows, cols] :
         {std::pair<int64_t, int64_t>{96, 300}, {300, 96}, {64, 64}}) {
      const std::vector<float> u = RandomMatrix(rows, cols, 31);
      std::vector<float> got(u.size()), want(u.size());
      ASSERT_TRUE(
          engine->Orthogonalize(u.data(), rows, cols, options, got.data())
              .ok());
      ASSERT_TRUE(
          NewtonSchulz(u.data(), rows, cols, options, want.data(), nullptr)
              .ok());
      EXPECT_TRUE(BitwiseEqual(got, want)) << rows << "x" << cols;
    }
  }
}

TEST(CpuNsEngineTest, Orthogonalize_BadArguments_ReturnInvalidArgument) {
  std::unique_ptr<NsEngine> engine = MakeCpuNsEngine();
  std::vector<float> u(6, 1.0f), out(6);
  EXPECT_EQ(engine->Orthogonalize(u.data(), 0, 6, {}, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  NewtonSchulzOptions negative;
  negative.steps = -2;
  EXPECT_EQ(engine->Orthogonalize(u.data(), 2, 3, negative, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->Orthogonalize(u.data(), 2, 3, {}, u.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->Reserve(-1, 3, {}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->Reserve(3, 0, {}).code(),
            absl::StatusCode::kInvalidArgument);
}

// Where no GPU is visible, CudaDeviceCount says why and MakeCudaNsEngine
// fails with the build's code: Unimplemented without CUDA, else
// FailedPrecondition naming the device count and CUDA's message.
TEST(CudaNsEngineTest, MakeCudaNsEngine_NoGpu_ReturnsBuildSpecificError) {
  std::string reason;
  if (CudaDeviceCount(&reason) > 0) {
    GTEST_SKIP() << "a GPU is visible; gpu_newton_schulz_test covers it";
  }
  EXPECT_FALSE(reason.empty());
  std::printf("CudaDeviceCount: 0 (%s)\n", reason.c_str());
  const absl::StatusOr<std::unique_ptr<NsEngine>> engine =
      MakeCudaNsEngine(0, GpuPrecision::kBf16);
  if (cuda::BuiltWithCuda()) {
    EXPECT_EQ(engine.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(engine.status().message()),
                HasSubstr("device count 0"));
    EXPECT_THAT(std::string(engine.status().message()), HasSubstr(reason));
  } else {
    // The device layer's reason (device::CudaDeviceCount).
    EXPECT_THAT(reason, ::testing::AllOf(HasSubstr("built without CUDA"),
                                         HasSubstr("--config=cuda")));
    EXPECT_EQ(engine.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(std::string(engine.status().message()),
                HasSubstr("built without CUDA"));
  }
  // A null reason is allowed.
  EXPECT_EQ(CudaDeviceCount(), 0);
}

}  // namespace
}  // namespace kernels
}  // namespace muon
