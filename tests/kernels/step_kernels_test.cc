// The elementwise StepKernels the optimizer runs on the caller's stream
// (momentum + Nesterov, the finite scan, copies): the host kernels equal
// kernels/muon_update.h bit for bit; the CUDA kernels with GpuPrecision
// kFp32 equal the host kernels bit for bit (each multiply and add rounded
// separately) and find the same first non-finite index (skipped without a
// GPU; fails with MUON_REQUIRE_GPU=1).
#include "kernels/step_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "device/memory.h"
#include "device/runtime.h"
#include "gtest/gtest.h"
#include "kernels/bfloat16.h"
#include "kernels/cuda/muon_update_cuda.h"
#include "kernels/muon_update.h"
#include "kernels/ns_engine.h"
#include "tests/gpu_test_util.h"

namespace muon {
namespace kernels {
namespace {

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<bf16_t> ToBf16(const std::vector<float>& v) {
  std::vector<bf16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = FloatToBf16(v[i]);
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

constexpr int64_t kN = 1000;
constexpr double kMomentum = 0.95;

TEST(HostStepKernelsTest, MomentumAndFormUpdate_BitwiseMuonUpdateKernels) {
  std::unique_ptr<StepKernels> k = MakeHostStepKernels(nullptr);
  const std::vector<float> g32 = Random(kN, 1);
  const std::vector<bf16_t> g16 = ToBf16(Random(kN, 2));
  for (bool nesterov : {false, true}) {
    std::vector<float> buf = Random(kN, 3), update(kN, 0.0f);
    std::vector<float> ref_buf = buf, ref_update(kN, 0.0f);
    for (bool bf16_grad : {false, true}) {
      const void* g = bf16_grad ? static_cast<const void*>(g16.data())
                                : static_cast<const void*>(g32.data());
      const ParamDType gt =
          bf16_grad ? ParamDType::kBFloat16 : ParamDType::kFloat32;
      ASSERT_TRUE(k->Momentum(nullptr, buf.data(), ParamDType::kFloat32, g, gt,
                              kN, kMomentum)
                      .ok());
      ASSERT_TRUE(k->FormUpdate(nullptr, buf.data(), ParamDType::kFloat32, g,
                                gt, kN, kMomentum, nesterov, update.data())
                      .ok());
      if (bf16_grad) {
        MomentumUpdate(ref_buf.data(), g16.data(), kN, kMomentum);
        NesterovUpdate(g16.data(), ref_buf.data(), kN, kMomentum,
                       ref_update.data());
      } else {
        MomentumUpdate(ref_buf.data(), g32.data(), kN, kMomentum);
        NesterovUpdate(g32.data(), ref_buf.data(), kN, kMomentum,
                       ref_update.data());
      }
      if (!nesterov) ref_update = ref_buf;
      EXPECT_TRUE(SameBits(buf, ref_buf));
      EXPECT_TRUE(SameBits(update, ref_update));
    }
  }
  float buf = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(
      k->Momentum(nullptr, &buf, ParamDType::kFloat32, nullptr,
                  ParamDType::kFloat32, 1, kMomentum)));
  EXPECT_TRUE(absl::IsInvalidArgument(
      k->FormUpdate(nullptr, &buf, ParamDType::kFloat32, nullptr,
                    ParamDType::kFloat32, 1, kMomentum, true, &buf)));
}

TEST(HostStepKernelsTest, Bf16MomentumBuffer_RoundsTorchLerpAndWidensForU) {
  // A bf16 buffer (torch.optim.Muon keeps the parameter's dtype): each
  // momentum step is the fp32 lerp rounded to nearest even; U is formed in
  // fp32 from the rounded buffer.
  std::unique_ptr<StepKernels> k = MakeHostStepKernels(nullptr);
  const std::vector<float> g32 = Random(kN, 5);
  std::vector<bf16_t> buf = ToBf16(Random(kN, 6));
  std::vector<float> wide(kN), update(kN), plain(kN);
  for (int64_t i = 0; i < kN; ++i) wide[i] = Bf16ToFloat(buf[i]);
  ASSERT_TRUE(k->Momentum(nullptr, buf.data(), ParamDType::kBFloat16,
                          g32.data(), ParamDType::kFloat32, kN, kMomentum)
                  .ok());
  MomentumUpdate(wide.data(), g32.data(), kN, kMomentum);
  int changed = 0;
  for (int64_t i = 0; i < kN; ++i) {
    ASSERT_EQ(buf[i], FloatToBf16(wide[i])) << i;
    changed += Bf16ToFloat(buf[i]) != wide[i];
  }
  EXPECT_GT(changed, kN / 2);  // the rounding is real
  ASSERT_TRUE(k->FormUpdate(nullptr, buf.data(), ParamDType::kBFloat16,
                            g32.data(), ParamDType::kFloat32, kN, kMomentum,
                            true, update.data())
                  .ok());
  std::vector<float> rounded(kN), ref(kN);
  for (int64_t i = 0; i < kN; ++i) rounded[i] = Bf16ToFloat(buf[i]);
  NesterovUpdate(g32.data(), rounded.data(), kN, kMomentum, ref.data());
  EXPECT_TRUE(SameBits(update, ref));
  ASSERT_TRUE(k->FormUpdate(nullptr, buf.data(), ParamDType::kBFloat16, nullptr,
                            ParamDType::kFloat32, kN, kMomentum, false,
                            plain.data())
                  .ok());
  EXPECT_TRUE(SameBits(plain, rounded));
}

TEST(HostStepKernelsTest, FirstNonFinite_FirstIndexOrMinusOne) {
  std::unique_ptr<StepKernels> k = MakeHostStepKernels(nullptr);
  std::vector<float> x = Random(kN, 4);
  int64_t first = 7;
  ASSERT_TRUE(
      k->FirstNonFinite(nullptr, x.data(), ParamDType::kFloat32, kN, &first)
          .ok());
  EXPECT_EQ(first, -1);
  x[900] = std::numeric_limits<float>::infinity();
  x[321] = std::nanf("");
  ASSERT_TRUE(
      k->FirstNonFinite(nullptr, x.data(), ParamDType::kFloat32, kN, &first)
          .ok());
  EXPECT_EQ(first, 321);
  const std::vector<bf16_t> b = ToBf16(x);
  ASSERT_TRUE(
      k->FirstNonFinite(nullptr, b.data(), ParamDType::kBFloat16, kN, &first)
          .ok());
  EXPECT_EQ(first, 321);
  EXPECT_TRUE(absl::IsInvalidArgument(
      k->FirstNonFinite(nullptr, x.data(), ParamDType::kFloat32, -1, &first)));
}

TEST(HostStepKernelsTest, Copy_CopiesBytes_BadArgumentsRefused) {
  std::unique_ptr<StepKernels> k = MakeHostStepKernels(nullptr);
  const std::vector<float> src = Random(16, 5);
  std::vector<float> dst(16, 0.0f);
  ASSERT_TRUE(k->Copy(nullptr, dst.data(), src.data(), 64).ok());
  EXPECT_TRUE(SameBits(dst, src));
  EXPECT_TRUE(k->Copy(nullptr, nullptr, nullptr, 0).ok());
  EXPECT_TRUE(
      absl::IsInvalidArgument(k->Copy(nullptr, dst.data(), nullptr, 4)));
}

// A [6, 5] matrix holding box rows [2, 8) x cols [1, 6); the region rows
// [3, 6) x cols [2, 5) packs to 9 bf16 values, row-major, each
// FloatToBf16 of its element; unpacking them into a zeroed copy restores
// exactly those elements widened and leaves the rest zero.
const Box kHolds{Range{2, 8}, Range{1, 6}};
const Box kRegion{Range{3, 6}, Range{2, 5}};

TEST(HostStepKernelsTest, PackUnpackRegionBf16_RoundsRegionToNearestEven) {
  std::unique_ptr<StepKernels> k = MakeHostStepKernels(nullptr);
  std::vector<float> m = Random(kHolds.numel(), 5);
  m[(3 - 2) * 5 + (2 - 1)] = 1.0f + 0x1p-8f;  // a tie: rounds to even, 1
  std::vector<bf16_t> packed(kRegion.numel(), 0xffff);
  ASSERT_TRUE(
      k->PackRegionBf16(nullptr, m.data(), kHolds, packed.data(), kRegion)
          .ok());
  EXPECT_EQ(packed[0], FloatToBf16(1.0f));
  std::vector<float> back(kHolds.numel(), 0.0f);
  ASSERT_TRUE(
      k->UnpackRegionBf16(nullptr, packed.data(), kRegion, back.data(), kHolds)
          .ok());
  int64_t i = 0;
  for (int64_t r = kHolds.rows.begin; r < kHolds.rows.end; ++r) {
    for (int64_t c = kHolds.cols.begin; c < kHolds.cols.end; ++c, ++i) {
      const bool inside = r >= kRegion.rows.begin && r < kRegion.rows.end &&
                          c >= kRegion.cols.begin && c < kRegion.cols.end;
      EXPECT_EQ(back[i], inside ? Bf16ToFloat(FloatToBf16(m[i])) : 0.0f)
          << "row " << r << " col " << c;
    }
  }
}

TEST(HostStepKernelsTest, RoundToBf16_EachValueToItsBf16) {
  std::unique_ptr<StepKernels> k = MakeHostStepKernels(nullptr);
  std::vector<float> x = Random(kN, 6);
  const std::vector<float> before = x;
  ASSERT_TRUE(k->RoundToBf16(nullptr, x.data(), kN).ok());
  for (int64_t i = 0; i < kN; ++i) {
    ASSERT_EQ(x[i], Bf16ToFloat(FloatToBf16(before[i]))) << i;
    // Relative error at most 2^-9 (round to nearest, 8 significant bits).
    ASSERT_LE(std::fabs(x[i] - before[i]), std::ldexp(std::fabs(before[i]), -8))
        << i;
  }
  EXPECT_TRUE(absl::IsInvalidArgument(k->RoundToBf16(nullptr, x.data(), -1)));
}

TEST(HostStepKernelsTest, Scale_OneRoundedMultiplyPerElement) {
  std::unique_ptr<StepKernels> k = MakeHostStepKernels(nullptr);
  const float factor = static_cast<float>(1.0 / 3);
  const std::vector<float> before = Random(kN, 9);
  std::vector<float> x = before;
  ASSERT_TRUE(
      k->Scale(nullptr, x.data(), ParamDType::kFloat32, kN, factor).ok());
  for (int64_t i = 0; i < kN; ++i) {
    // The float product of the two floats, rounded once: what the double
    // product rounds to (a float product is exact in double).
    ASSERT_EQ(x[i], static_cast<float>(static_cast<double>(before[i]) *
                                       static_cast<double>(factor)))
        << i;
  }
  // bf16, worked by hand: 3 * 0.33333334f = 1.0000000298 -> 1.0f -> bf16
  // 0x3F80; 1 * 0.33333334f -> bf16 0x3EAB (0.333984375: the 8-bit
  // significand 1.0101010|1010... rounds up).
  std::vector<bf16_t> b = {FloatToBf16(3.0f), FloatToBf16(1.0f)};
  ASSERT_TRUE(
      k->Scale(nullptr, b.data(), ParamDType::kBFloat16, 2, factor).ok());
  EXPECT_EQ(b[0], 0x3F80);
  EXPECT_EQ(b[1], 0x3EAB);
  EXPECT_TRUE(absl::IsInvalidArgument(
      k->Scale(nullptr, x.data(), ParamDType::kFloat32, -1, factor)));
  EXPECT_TRUE(absl::IsInvalidArgument(
      k->Scale(nullptr, nullptr, ParamDType::kFloat32, 1, factor)));
  EXPECT_TRUE(k->Scale(nullptr, nullptr, ParamDType::kFloat32, 0, factor).ok());
}

// A batch whose output starts inside its input past the first matrix
// (out = u + rows*cols) passed the per-matrix check and wrote matrix 0's
// O over matrix 1's U before reading it. The whole batch is checked, as
// the CUDA kernel checks it: refused, the input unchanged.
TEST(HostStepKernelsTest, Orthogonalize_BatchOutputOverlappingInput_Refused) {
  std::unique_ptr<NsEngine> engine = MakeCpuNsEngine();
  std::unique_ptr<StepKernels> k = MakeHostStepKernels(engine.get());
  constexpr int64_t kRows = 4, kCols = 6, kSize = kRows * kCols;
  std::vector<float> buf = Random(3 * kSize, 11);
  const std::vector<float> before = buf;
  const absl::Status overlap = k->Orthogonalize(nullptr, buf.data(), 2, kRows,
                                                kCols, {}, buf.data() + kSize);
  EXPECT_TRUE(absl::IsInvalidArgument(overlap)) << overlap;
  EXPECT_NE(overlap.message().find("overlaps"), std::string::npos) << overlap;
  EXPECT_TRUE(SameBits(buf, before));
  // Disjoint: each matrix's O is its own (the batch of two equals two
  // calls of one).
  std::vector<float> two(2 * kSize), one(2 * kSize);
  ASSERT_TRUE(
      k->Orthogonalize(nullptr, buf.data(), 2, kRows, kCols, {}, two.data())
          .ok());
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(k->Orthogonalize(nullptr, buf.data() + i * kSize, 1, kRows,
                                 kCols, {}, one.data() + i * kSize)
                    .ok());
  }
  EXPECT_TRUE(SameBits(two, one));
  EXPECT_TRUE(absl::IsInvalidArgument(k->Orthogonalize(
      nullptr, buf.data(), INT64_MAX / 2, kRows, kCols, {}, two.data())));
}

// The CUDA kernels of cuda:0 on a stream, against the host kernels.
class CudaStepKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MUON_SKIP_OR_FAIL_UNLESS_CUDA_DEVICE();
    absl::StatusOr<device::Runtime*> rt =
        device::GetRuntime(device::Device::Cuda(0));
    ASSERT_TRUE(rt.ok()) << rt.status();
    rt_ = *rt;
    absl::StatusOr<std::unique_ptr<device::Stream>> s =
        rt_->CreateStream("test");
    ASSERT_TRUE(s.ok()) << s.status();
    stream_ = *std::move(s);
    absl::StatusOr<std::unique_ptr<StepKernels>> k =
        MakeCudaStepKernels(0, nullptr, GpuPrecision::kFp32);
    ASSERT_TRUE(k.ok()) << k.status();
    kernels_ = *std::move(k);
  }

  template <typename T>
  device::DeviceBuffer<T> ToDevice(const std::vector<T>& v) {
    device::DeviceBuffer<T> d = *device::DeviceBuffer<T>::Allocate(
        rt_->allocator(), static_cast<int64_t>(v.size()));
    EXPECT_TRUE(rt_->CopyFromHost(d.data(), v.data(), d.bytes()).ok());
    return d;
  }
  template <typename T>
  std::vector<T> ToHost(const device::DeviceBuffer<T>& d) {
    EXPECT_TRUE(stream_->Synchronize(absl::Seconds(60)).ok());
    std::vector<T> v(d.size());
    EXPECT_TRUE(rt_->CopyToHost(v.data(), d.data(), d.bytes()).ok());
    return v;
  }

  device::Runtime* rt_ = nullptr;
  std::unique_ptr<device::Stream> stream_;
  std::unique_ptr<StepKernels> kernels_;
};

TEST_F(CudaStepKernelsTest, Fp32Precision_MomentumAndFormUpdateBitwiseHost) {
  std::unique_ptr<StepKernels> host = MakeHostStepKernels(nullptr);
  const std::vector<float> g32 = Random(kN, 1);
  const std::vector<bf16_t> g16 = ToBf16(Random(kN, 2));
  for (bool bf16 : {false, true}) {
    // fp32 buffer.
    std::vector<float> buf = Random(kN, 3), update(kN, 0.0f);
    device::DeviceBuffer<float> d_buf = ToDevice(buf);
    device::DeviceBuffer<float> d_update = ToDevice(update);
    device::DeviceBuffer<float> d_g32 = ToDevice(g32);
    device::DeviceBuffer<bf16_t> d_g16 = ToDevice(g16);
    const ParamDType dt = bf16 ? ParamDType::kBFloat16 : ParamDType::kFloat32;
    const void* g = bf16 ? static_cast<const void*>(g16.data()) : g32.data();
    const void* d_g =
        bf16 ? static_cast<const void*>(d_g16.data()) : d_g32.data();
    ASSERT_TRUE(host->Momentum(nullptr, buf.data(), ParamDType::kFloat32, g, dt,
                               kN, kMomentum)
                    .ok());
    ASSERT_TRUE(host->FormUpdate(nullptr, buf.data(), ParamDType::kFloat32, g,
                                 dt, kN, kMomentum, true, update.data())
                    .ok());
    ASSERT_TRUE(kernels_
                    ->Momentum(stream_.get(), d_buf.data(),
                               ParamDType::kFloat32, d_g, dt, kN, kMomentum)
                    .ok());
    ASSERT_TRUE(kernels_
                    ->FormUpdate(stream_.get(), d_buf.data(),
                                 ParamDType::kFloat32, d_g, dt, kN, kMomentum,
                                 true, d_update.data())
                    .ok());
    EXPECT_TRUE(SameBits(ToHost(d_buf), buf)) << "bf16 grad: " << bf16;
    EXPECT_TRUE(SameBits(ToHost(d_update), update)) << "bf16 grad: " << bf16;
    // bf16 buffer (the parameter's dtype, as torch keeps it).
    std::vector<bf16_t> buf16 = ToBf16(Random(kN, 4));
    device::DeviceBuffer<bf16_t> d_buf16 = ToDevice(buf16);
    ASSERT_TRUE(host->Momentum(nullptr, buf16.data(), ParamDType::kBFloat16, g,
                               dt, kN, kMomentum)
                    .ok());
    ASSERT_TRUE(host->FormUpdate(nullptr, buf16.data(), ParamDType::kBFloat16,
                                 g, dt, kN, kMomentum, true, update.data())
                    .ok());
    ASSERT_TRUE(kernels_
                    ->Momentum(stream_.get(), d_buf16.data(),
                               ParamDType::kBFloat16, d_g, dt, kN, kMomentum)
                    .ok());
    ASSERT_TRUE(kernels_
                    ->FormUpdate(stream_.get(), d_buf16.data(),
                                 ParamDType::kBFloat16, d_g, dt, kN, kMomentum,
                                 true, d_update.data())
                    .ok());
    EXPECT_EQ(ToHost(d_buf16), buf16) << "bf16 grad: " << bf16;
    EXPECT_TRUE(SameBits(ToHost(d_update), update)) << "bf16 grad: " << bf16;
  }
}

TEST_F(CudaStepKernelsTest, FirstNonFinite_SameIndexAsHost) {
  std::vector<float> x = Random(100000, 4);
  device::DeviceBuffer<int64_t> first = ToDevice(std::vector<int64_t>{7});
  device::DeviceBuffer<float> d_clean = ToDevice(x);
  ASSERT_TRUE(kernels_
                  ->FirstNonFinite(stream_.get(), d_clean.data(),
                                   ParamDType::kFloat32, x.size(), first.data())
                  .ok());
  EXPECT_EQ(ToHost(first)[0], -1);
  x[90000] = std::numeric_limits<float>::infinity();
  x[54321] = std::nanf("");
  x[77777] = -std::numeric_limits<float>::infinity();
  device::DeviceBuffer<float> d_x = ToDevice(x);
  ASSERT_TRUE(kernels_
                  ->FirstNonFinite(stream_.get(), d_x.data(),
                                   ParamDType::kFloat32, x.size(), first.data())
                  .ok());
  EXPECT_EQ(ToHost(first)[0], 54321);
  device::DeviceBuffer<bf16_t> d_b = ToDevice(ToBf16(x));
  ASSERT_TRUE(kernels_
                  ->FirstNonFinite(stream_.get(), d_b.data(),
                                   ParamDType::kBFloat16, x.size(),
                                   first.data())
                  .ok());
  EXPECT_EQ(ToHost(first)[0], 54321);
}

TEST_F(CudaStepKernelsTest, Bf16PackUnpackAndRound_BitwiseHost) {
  std::unique_ptr<StepKernels> host = MakeHostStepKernels(nullptr);
  const std::vector<float> m = Random(kHolds.numel(), 7);
  std::vector<bf16_t> packed(kRegion.numel());
  ASSERT_TRUE(
      host->PackRegionBf16(nullptr, m.data(), kHolds, packed.data(), kRegion)
          .ok());
  device::DeviceBuffer<float> d_m = ToDevice(m);
  device::DeviceBuffer<bf16_t> d_packed =
      ToDevice(std::vector<bf16_t>(kRegion.numel(), 0));
  ASSERT_TRUE(kernels_
                  ->PackRegionBf16(stream_.get(), d_m.data(), kHolds,
                                   d_packed.data(), kRegion)
                  .ok());
  EXPECT_EQ(ToHost(d_packed), packed);
  std::vector<float> back(kHolds.numel(), 0.0f);
  ASSERT_TRUE(host->UnpackRegionBf16(nullptr, packed.data(), kRegion,
                                     back.data(), kHolds)
                  .ok());
  device::DeviceBuffer<float> d_back =
      ToDevice(std::vector<float>(kHolds.numel(), 0.0f));
  ASSERT_TRUE(kernels_
                  ->UnpackRegionBf16(stream_.get(), d_packed.data(), kRegion,
                                     d_back.data(), kHolds)
                  .ok());
  EXPECT_TRUE(SameBits(ToHost(d_back), back));
  std::vector<float> x = Random(kN, 8);
  device::DeviceBuffer<float> d_x = ToDevice(x);
  ASSERT_TRUE(host->RoundToBf16(nullptr, x.data(), kN).ok());
  ASSERT_TRUE(kernels_->RoundToBf16(stream_.get(), d_x.data(), kN).ok());
  EXPECT_TRUE(SameBits(ToHost(d_x), x));
}

// QK-clip's row scaling: the host's bits, fp32 and bf16.
TEST_F(CudaStepKernelsTest, Scale_BitwiseHost) {
  std::unique_ptr<StepKernels> host = MakeHostStepKernels(nullptr);
  const float factor = static_cast<float>(std::pow(0.37, 0.5));
  std::vector<float> x = Random(kN, 10);
  std::vector<bf16_t> b = ToBf16(Random(kN, 11));
  device::DeviceBuffer<float> d_x = ToDevice(x);
  device::DeviceBuffer<bf16_t> d_b = ToDevice(b);
  ASSERT_TRUE(
      host->Scale(nullptr, x.data(), ParamDType::kFloat32, kN, factor).ok());
  ASSERT_TRUE(
      host->Scale(nullptr, b.data(), ParamDType::kBFloat16, kN, factor).ok());
  ASSERT_TRUE(
      kernels_
          ->Scale(stream_.get(), d_x.data(), ParamDType::kFloat32, kN, factor)
          .ok());
  ASSERT_TRUE(
      kernels_
          ->Scale(stream_.get(), d_b.data(), ParamDType::kBFloat16, kN, factor)
          .ok());
  EXPECT_TRUE(SameBits(ToHost(d_x), x));
  EXPECT_EQ(ToHost(d_b), b);
  EXPECT_TRUE(absl::IsInvalidArgument(kernels_->Scale(
      stream_.get(), d_x.data(), ParamDType::kFloat32, -1, factor)));
}

// NorMuon's normalization through the CUDA StepKernels: the host's bits
// (update and row state), with its row sums' scratch counted in
// ScratchBytes, grown to the most rows seen and never shrunk.
TEST_F(CudaStepKernelsTest, NorMuonNormalize_BitwiseHost_ScratchCounted) {
  std::unique_ptr<StepKernels> host = MakeHostStepKernels(nullptr);
  EXPECT_EQ(kernels_->ScratchBytes(), 0);
  int64_t most_rows = 0;
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{37, 53}, {700, 129}, {10, 300}}) {
    std::vector<float> o = Random(rows * cols, 12);
    std::vector<float> v(static_cast<size_t>(rows), 0.0f);
    device::DeviceBuffer<float> d_o = ToDevice(o);
    device::DeviceBuffer<float> d_v = ToDevice(v);
    ASSERT_TRUE(host->NorMuonNormalize(nullptr, o.data(), rows, cols, v.data(),
                                       0.95, 1e-8)
                    .ok());
    ASSERT_TRUE(kernels_
                    ->NorMuonNormalize(stream_.get(), d_o.data(), rows, cols,
                                       d_v.data(), 0.95, 1e-8)
                    .ok());
    EXPECT_TRUE(SameBits(ToHost(d_o), o)) << rows << " x " << cols;
    EXPECT_TRUE(SameBits(ToHost(d_v), v)) << rows << " x " << cols;
    most_rows = std::max(most_rows, rows);
    EXPECT_EQ(kernels_->ScratchBytes(), cuda::NorMuonScratchBytes(most_rows))
        << rows << " x " << cols;
  }
}

TEST_F(CudaStepKernelsTest, WithoutComputeStream_NoNewtonSchulz) {
  float x = 0;
  const absl::Status s = kernels_->Orthogonalize(stream_.get(), &x, 1, 1, 1,
                                                 NewtonSchulzOptions(), &x);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
}

}  // namespace
}  // namespace kernels
}  // namespace muon
