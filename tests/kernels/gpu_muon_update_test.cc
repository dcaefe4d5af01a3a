// The fused momentum/Nesterov and decay/apply kernels on the GPU
// (kernels/cuda/muon_update_cuda.h) against the CPU kernels
// (kernels/muon_update.h). Every test skips, naming the reason, where no
// GPU is visible.
//
// kSeparate performs the CPU kernels' operations with the same roundings
// (each IEEE op correctly rounded on both sides, no contraction), so it must
// be BITWISE equal. kFused (torch's CUDA arithmetic: nvcc contracts
// self + w*diff and param*decay + alpha*u into fma) must be bitwise equal to
// the same formula with std::fmaf on the host (fmaf is correctly rounded),
// and differs from kSeparate only where the fused rounding does.
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/muon_update_cuda.h"
#include "kernels/muon_update.h"
#include "kernels/ns_engine.h"
#include "tests/gpu_test_util.h"
#include "tests/kernels/ns_test_util.h"

#define MUON_SKIP_WITHOUT_GPU()                                          \
  do {                                                                   \
    std::string reason;                                                  \
    MUON_SKIP_OR_FAIL_UNLESS_GPU(CudaDeviceCount(&reason) == 0, reason); \
  } while (0)

namespace muon {
namespace kernels {
namespace {

using ::muon::kernels::testing::BitwiseEqual;

// Values spread over many binades, signs mixed, plus exact zeros.
std::vector<float> Values(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) {
    const double mantissa = static_cast<double>(gen() >> 8) / (1 << 23) - 1.0;
    const int exponent = static_cast<int>(gen() % 40) - 30;
    x = static_cast<float>(std::ldexp(mantissa, exponent));
  }
  v[0] = 0.0f;
  return v;
}

// Copies host arrays to cuda:0 and back (blocking copies, ordered after
// the legacy default stream the kernels here run on).
struct Device {
  device::Runtime* runtime = ::muon::testing::CudaTestRuntime();
  std::vector<device::DeviceBuffer<float>> buffers;
  float* Upload(const std::vector<float>& host) {
    if (runtime == nullptr) return nullptr;
    absl::StatusOr<device::DeviceBuffer<float>> b =
        ::muon::testing::CopyToNewDeviceBuffer(runtime, host);
    EXPECT_TRUE(b.ok()) << b.status();
    if (!b.ok()) return nullptr;
    buffers.push_back(std::move(*b));
    return buffers.back().data();
  }
  std::vector<float> Download(const float* d, size_t n) {
    if (runtime == nullptr) return std::vector<float>(n);
    return ::muon::testing::CopyToHostVector(runtime, d,
                                             static_cast<int64_t>(n));
  }
};

float LerpFma(float self, float end, float w) {
  const float diff = end - self;
  return std::abs(w) < 0.5f ? std::fmaf(w, diff, self)
                            : std::fmaf(-diff, 1.0f - w, end);
}

constexpr int64_t kN = 100003;  // Not a multiple of the block size.

TEST(GpuMuonUpdateTest, MomentumFormUpdate_Separate_BitwiseEqualToCpuKernels) {
  MUON_SKIP_WITHOUT_GPU();
  // 0.95: the small-weight branch for the buffer, the large one for
  // Nesterov; 0.3 the other way round; 0.5 the boundary.
  for (double momentum : {0.95, 0.3, 0.5}) {
    for (bool nesterov : {true, false}) {
      const std::vector<float> grad = Values(kN, 71);
      std::vector<float> buf = Values(kN, 72);
      Device dev;
      float* d_buf = dev.Upload(buf);
      float* d_grad = dev.Upload(grad);
      float* d_update = dev.Upload(std::vector<float>(kN, NAN));
      ASSERT_TRUE(cuda::Momentum(d_buf, cuda::Elem::kFloat32, d_grad,
                                 cuda::Elem::kFloat32, kN, momentum,
                                 cuda::FmaMode::kSeparate, nullptr)
                      .ok());
      ASSERT_TRUE(cuda::FormUpdate(d_buf, cuda::Elem::kFloat32, d_grad,
                                   cuda::Elem::kFloat32, kN, momentum, nesterov,
                                   d_update, cuda::FmaMode::kSeparate, nullptr)
                      .ok());
      MomentumUpdate(buf.data(), grad.data(), kN, momentum);
      std::vector<float> update = buf;
      if (nesterov) {
        NesterovUpdate(grad.data(), buf.data(), kN, momentum, update.data());
      }
      EXPECT_TRUE(BitwiseEqual(dev.Download(d_buf, kN), buf))
          << momentum << " " << nesterov;
      EXPECT_TRUE(BitwiseEqual(dev.Download(d_update, kN), update))
          << momentum << " " << nesterov;
    }
  }
}

// `v` as elements of T: itself (float) or each rounded to bf16.
template <typename T>
std::vector<T> AsElems(const std::vector<float>& v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    std::vector<T> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = FloatToBf16(v[i]);
    return out;
  }
}

template <typename T>
cuda::Elem ElemOf() {
  return std::is_same_v<T, float> ? cuda::Elem::kFloat32 : cuda::Elem::kBf16;
}

// An element's fp32 value (bf16 widened exactly), and an fp32 value as an
// element of T (bf16 rounded to nearest even).
float Widen(float x) { return x; }
float Widen(bf16_t x) { return Bf16ToFloat(x); }
template <typename T>
T Narrow(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return FloatToBf16(x);
  }
}

// The momentum and Nesterov passes with buffer type B and gradient type G
// at the element offsets {buf, grad, update} into their buffers and n
// elements from there: every element bitwise the CPU kernels' (kSeparate)
// or the same lerps with std::fmaf (kFused), and the elements around the
// range untouched.
template <typename B, typename G>
void ExpectMomentumBitwiseAtOffsets(cuda::FmaMode mode, int64_t buf_off,
                                    int64_t grad_off, int64_t update_off,
                                    int64_t n) {
  constexpr int64_t kPad = 8;
  const double momentum = 0.95;
  const bool fused = mode == cuda::FmaMode::kFused;
  const std::vector<B> buf0 = AsElems<B>(Values(n + kPad, 81));
  const std::vector<G> grad = AsElems<G>(Values(n + kPad, 82));
  const std::string where = absl::StrCat(
      fused ? "fused" : "separate", " buf ", sizeof(B) == 2 ? "bf16" : "fp32",
      " grad ", sizeof(G) == 2 ? "bf16" : "fp32", " offsets ", buf_off, "/",
      grad_off, "/", update_off, " n ", n);
  device::Runtime* rt = ::muon::testing::CudaTestRuntime();
  ASSERT_NE(rt, nullptr);
  auto d_buf = ::muon::testing::CopyToNewDeviceBuffer(rt, buf0);
  auto d_grad = ::muon::testing::CopyToNewDeviceBuffer(rt, grad);
  auto d_update = ::muon::testing::CopyToNewDeviceBuffer(
      rt, std::vector<float>(n + kPad, NAN));
  ASSERT_TRUE(d_buf.ok() && d_grad.ok() && d_update.ok()) << where;
  // Offset 0 is aligned for the groups of four (cudaMalloc: 256 bytes).
  for (const void* p : {static_cast<const void*>(d_buf->data()),
                        static_cast<const void*>(d_grad->data()),
                        static_cast<const void*>(d_update->data())}) {
    ASSERT_EQ(reinterpret_cast<uintptr_t>(p) % 16, 0u) << where;
  }
  ASSERT_TRUE(cuda::Momentum(d_buf->data() + buf_off, ElemOf<B>(),
                             d_grad->data() + grad_off, ElemOf<G>(), n,
                             momentum, mode, nullptr)
                  .ok())
      << where;
  ASSERT_TRUE(cuda::FormUpdate(d_buf->data() + buf_off, ElemOf<B>(),
                               d_grad->data() + grad_off, ElemOf<G>(), n,
                               momentum, /*nesterov=*/true,
                               d_update->data() + update_off, mode, nullptr)
                  .ok())
      << where;
  std::vector<B> want_buf = buf0;
  std::vector<float> want_update(n + kPad, NAN);
  if (fused) {
    const float w_buf = static_cast<float>(1.0 - momentum);
    const float w_nest = static_cast<float>(momentum);
    for (int64_t i = 0; i < n; ++i) {
      B& b = want_buf[buf_off + i];
      const float g = Widen(grad[grad_off + i]);
      b = Narrow<B>(LerpFma(Widen(b), g, w_buf));
      want_update[update_off + i] = LerpFma(g, Widen(b), w_nest);
    }
  } else {  // the CPU kernels
    MomentumUpdate(want_buf.data() + buf_off, grad.data() + grad_off, n,
                   momentum);
    NesterovUpdate(grad.data() + grad_off, want_buf.data() + buf_off, n,
                   momentum, want_update.data() + update_off);
  }
  const std::vector<B> got_buf =
      ::muon::testing::CopyToHostVector(rt, d_buf->data(), n + kPad);
  if constexpr (std::is_same_v<B, float>) {
    EXPECT_TRUE(BitwiseEqual(got_buf, want_buf)) << where;
  } else {
    EXPECT_EQ(got_buf, want_buf) << where;
  }
  EXPECT_TRUE(BitwiseEqual(
      ::muon::testing::CopyToHostVector(rt, d_update->data(), n + kPad),
      want_update))
      << where;
}

// The momentum and Nesterov passes in groups of four (buffer, gradient
// and update aligned for the wide loads) and one by one (any of them not
// aligned), with 0-3 elements after the groups, for every pair of fp32
// and bf16 buffer and gradient, in both FMA modes: bitwise the CPU
// kernels (kSeparate) or the host's fmaf lerps (kFused).
TEST(GpuMuonUpdateTest,
     MomentumFormUpdate_AnyAlignmentAndDtypes_BitwiseCpuOrHostFma) {
  MUON_SKIP_WITHOUT_GPU();
  const std::vector<std::array<int64_t, 3>> offsets = {
      {0, 0, 0}, {1, 0, 0}, {0, 2, 0}, {0, 0, 3}, {2, 2, 2}, {3, 1, 2}};
  for (cuda::FmaMode mode : {cuda::FmaMode::kSeparate, cuda::FmaMode::kFused}) {
    for (const auto& [b, g, u] : offsets) {
      for (int64_t n : {1025, 1026, 1027, 1028}) {
        ExpectMomentumBitwiseAtOffsets<float, float>(mode, b, g, u, n);
        ExpectMomentumBitwiseAtOffsets<float, bf16_t>(mode, b, g, u, n);
        ExpectMomentumBitwiseAtOffsets<bf16_t, float>(mode, b, g, u, n);
        ExpectMomentumBitwiseAtOffsets<bf16_t, bf16_t>(mode, b, g, u, n);
      }
    }
  }
}

// The first non-finite index, scanned in groups of four (aligned) or one
// by one (unaligned) with 0-3 elements after the groups: for no bad value,
// one in a group, one in the tail, NaN and Inf, and several (the least
// wins), fp32 and bf16, the CPU kernel's answer.
TEST(GpuMuonUpdateTest, FirstNonFinite_AnyAlignment_SameIndexAsCpu) {
  MUON_SKIP_WITHOUT_GPU();
  device::Runtime* rt = ::muon::testing::CudaTestRuntime();
  ASSERT_NE(rt, nullptr);
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<std::vector<std::pair<int64_t, float>>> bad_sets = {
      {},
      {{5, NAN}},
      {{1026, inf}},
      {{9, -inf}, {3, NAN}},
      {{0, NAN}},
      {{1024, NAN}, {1025, inf}},
      {{5, NAN}, {1026, inf}}};  // one in the groups, one after them
  for (int64_t off : {0, 1, 2, 3}) {
    for (int64_t n : {1027, 1028}) {
      for (const auto& bad : bad_sets) {
        std::vector<float> x = Values(n + off, 83);
        for (const auto& [i, v] : bad) {
          if (i < n) x[off + i] = v;
        }
        const std::vector<bf16_t> x16 = AsElems<bf16_t>(x);
        const int64_t want = FirstNonFinite(x.data() + off, n);
        ASSERT_EQ(want, FirstNonFinite(x16.data() + off, n));
        auto d_x = ::muon::testing::CopyToNewDeviceBuffer(rt, x);
        auto d_x16 = ::muon::testing::CopyToNewDeviceBuffer(rt, x16);
        auto d_first = ::muon::testing::CopyToNewDeviceBuffer(
            rt, std::vector<int64_t>(2, 7));
        ASSERT_TRUE(d_x.ok() && d_x16.ok() && d_first.ok());
        ASSERT_TRUE(
            cuda::FirstNonFinite(d_x->data() + off, n, d_first->data(), nullptr)
                .ok());
        ASSERT_TRUE(cuda::FirstNonFiniteBf16(d_x16->data() + off, n,
                                             d_first->data() + 1, nullptr)
                        .ok());
        const std::vector<int64_t> got =
            ::muon::testing::CopyToHostVector(rt, d_first->data(), 2);
        EXPECT_EQ(got, (std::vector<int64_t>{want, want}))
            << "offset " << off << " n " << n << " bad values " << bad.size();
      }
    }
  }
}

TEST(GpuMuonUpdateTest, MomentumFormUpdate_Fused_BitwiseEqualToHostFma) {
  MUON_SKIP_WITHOUT_GPU();
  for (double momentum : {0.95, 0.3}) {
    const std::vector<float> grad = Values(kN, 73);
    std::vector<float> buf = Values(kN, 74);
    Device dev;
    float* d_buf = dev.Upload(buf);
    float* d_grad = dev.Upload(grad);
    float* d_update = dev.Upload(std::vector<float>(kN, NAN));
    ASSERT_TRUE(cuda::Momentum(d_buf, cuda::Elem::kFloat32, d_grad,
                               cuda::Elem::kFloat32, kN, momentum,
                               cuda::FmaMode::kFused, nullptr)
                    .ok());
    ASSERT_TRUE(cuda::FormUpdate(d_buf, cuda::Elem::kFloat32, d_grad,
                                 cuda::Elem::kFloat32, kN, momentum, true,
                                 d_update, cuda::FmaMode::kFused, nullptr)
                    .ok());
    std::vector<float> separate = buf;
    MomentumUpdate(separate.data(), grad.data(), kN, momentum);
    const float w_buf = static_cast<float>(1.0 - momentum);
    const float w_nest = static_cast<float>(momentum);
    std::vector<float> update(kN);
    for (int64_t i = 0; i < kN; ++i) {
      buf[i] = LerpFma(buf[i], grad[i], w_buf);
      update[i] = LerpFma(grad[i], buf[i], w_nest);
    }
    const std::vector<float> got = dev.Download(d_buf, kN);
    EXPECT_TRUE(BitwiseEqual(got, buf)) << momentum;
    EXPECT_TRUE(BitwiseEqual(dev.Download(d_update, kN), update)) << momentum;
    int64_t differ = 0;
    for (int64_t i = 0; i < kN; ++i) differ += got[i] != separate[i];
    std::printf("momentum %.2f: fused differs from separate in %lld of %lld\n",
                momentum, static_cast<long long>(differ),
                static_cast<long long>(kN));
  }
}

// NorMuon's normalization on cuda:0: the update and the row state bitwise
// the host kernel's (kernels::NorMuonNormalize), for a single element, a
// row, a column, uneven shapes and more rows than a block, over several
// calls (the row state carried, the scratch grown).
TEST(GpuMuonUpdateTest, NorMuonNormalize_BitwiseEqualToCpuKernel) {
  MUON_SKIP_WITHOUT_GPU();
  Device dev;
  std::vector<float> scratch_host(
      static_cast<size_t>(cuda::NorMuonScratchBytes(700) / 4 + 1));
  float* scratch = dev.Upload(scratch_host);
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {1, 257}, {300, 1}, {37, 53}, {700, 129}}) {
    std::vector<float> o = Values(rows * cols, 81);
    std::vector<float> v(static_cast<size_t>(rows), 0.0f);
    float* d_o = dev.Upload(o);
    float* d_v = dev.Upload(v);
    for (int call = 0; call < 3; ++call) {
      if (call > 0) {  // the next step's update, the same row state
        o = Values(rows * cols, 82 + call);
        ASSERT_TRUE(
            dev.runtime->CopyFromHost(d_o, o.data(), rows * cols * 4).ok());
      }
      ASSERT_TRUE(cuda::NorMuonNormalize(d_o, rows, cols, d_v, 0.95, 1e-8,
                                         scratch, nullptr)
                      .ok());
      NorMuonNormalize(o.data(), rows, cols, v.data(), 0.95, 1e-8);
      EXPECT_TRUE(BitwiseEqual(dev.Download(d_o, o.size()), o))
          << rows << " x " << cols << ", call " << call;
      EXPECT_TRUE(BitwiseEqual(dev.Download(d_v, v.size()), v))
          << rows << " x " << cols << ", call " << call;
    }
  }
}

TEST(GpuMuonUpdateTest, DecayAndApply_BothModes_MatchCpuAndHostFma) {
  MUON_SKIP_WITHOUT_GPU();
  const double lr = 0.02;
  const double weight_decay = 0.1;
  const double adjusted_lr =
      AdjustLr(lr, AdjustLrFn::kMatchRmsAdamW, 4096, 1024);
  const std::vector<float> update = Values(kN, 75);
  const std::vector<float> param0 = Values(kN, 76);
  for (cuda::FmaMode mode : {cuda::FmaMode::kSeparate, cuda::FmaMode::kFused}) {
    Device dev;
    float* d_param = dev.Upload(param0);
    float* d_update = dev.Upload(update);
    ASSERT_TRUE(cuda::DecayAndApply(d_param, d_update, kN, lr, weight_decay,
                                    adjusted_lr, mode, nullptr)
                    .ok());
    std::vector<float> want = param0;
    if (mode == cuda::FmaMode::kSeparate) {
      ApplyUpdate(want.data(), update.data(), kN, lr, weight_decay,
                  adjusted_lr);
    } else {
      const float decay = static_cast<float>(1.0 - lr * weight_decay);
      const float alpha = static_cast<float>(-adjusted_lr);
      for (int64_t i = 0; i < kN; ++i) {
        want[i] = std::fmaf(alpha, update[i], want[i] * decay);
      }
    }
    EXPECT_TRUE(BitwiseEqual(dev.Download(d_param, kN), want))
        << (mode == cuda::FmaMode::kFused ? "fused" : "separate");
  }
}

// The apply at every alignment of param and update (element offsets 0-3
// into the buffers: groups of four where both are aligned for the wide
// loads, one by one otherwise) and lengths that leave 0-3 elements after
// the groups, fp32 and bf16 parameters, both modes: every element bitwise
// the host's formula, and the elements around the range untouched.
TEST(GpuMuonUpdateTest, DecayAndApply_AnyAlignmentAndLength_BitwiseHost) {
  MUON_SKIP_WITHOUT_GPU();
  const double lr = 0.02, weight_decay = 0.1, adjusted_lr = 0.05;
  const float decay = static_cast<float>(1.0 - lr * weight_decay);
  const float alpha = static_cast<float>(-adjusted_lr);
  constexpr int64_t kLen = 4103;  // 4 * 1025 + 3
  const std::vector<float> update = Values(kLen + 8, 77);
  const std::vector<float> param0 = Values(kLen + 8, 78);
  const std::vector<bf16_t> param16 = AsElems<bf16_t>(param0);
  device::Runtime* rt = ::muon::testing::CudaTestRuntime();
  ASSERT_NE(rt, nullptr);
  for (cuda::FmaMode mode : {cuda::FmaMode::kSeparate, cuda::FmaMode::kFused}) {
    const bool fused = mode == cuda::FmaMode::kFused;
    for (int64_t p_off : {0, 1, 2, 3}) {
      for (int64_t u_off : {0, 1}) {
        for (int64_t n : {kLen - 3, kLen - 2, kLen - 1, kLen}) {
          const std::string where =
              absl::StrCat(fused ? "fused" : "separate", " param offset ",
                           p_off, " update offset ", u_off, " n ", n);
          auto d_update = ::muon::testing::CopyToNewDeviceBuffer(rt, update);
          auto d_param = ::muon::testing::CopyToNewDeviceBuffer(rt, param0);
          auto d_param16 = ::muon::testing::CopyToNewDeviceBuffer(rt, param16);
          ASSERT_TRUE(d_update.ok() && d_param.ok() && d_param16.ok());
          const float* u = d_update->data() + u_off;
          ASSERT_TRUE(cuda::DecayAndApply(d_param->data() + p_off, u, n, lr,
                                          weight_decay, adjusted_lr, mode,
                                          nullptr)
                          .ok())
              << where;
          ASSERT_TRUE(cuda::DecayAndApplyBf16(d_param16->data() + p_off, u, n,
                                              lr, weight_decay, adjusted_lr,
                                              mode, nullptr)
                          .ok())
              << where;
          std::vector<float> want = param0;
          std::vector<bf16_t> want16 = param16;
          if (fused) {
            for (int64_t i = 0; i < n; ++i) {
              const float ui = update[u_off + i];
              float& p = want[p_off + i];
              p = std::fmaf(alpha, ui, p * decay);
              bf16_t& q = want16[p_off + i];
              q = FloatToBf16(std::fmaf(
                  alpha, ui, Bf16ToFloat(FloatToBf16(Bf16ToFloat(q) * decay))));
            }
          } else {  // the CPU kernels
            ApplyUpdate(want.data() + p_off, update.data() + u_off, n, lr,
                        weight_decay, adjusted_lr);
            ApplyUpdate(want16.data() + p_off, update.data() + u_off, n, lr,
                        weight_decay, adjusted_lr);
          }
          EXPECT_TRUE(BitwiseEqual(
              ::muon::testing::CopyToHostVector(rt, d_param->data(), kLen + 8),
              want))
              << where;
          EXPECT_EQ(::muon::testing::CopyToHostVector(rt, d_param16->data(),
                                                      kLen + 8),
                    want16)
              << where;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kernels
}  // namespace muon
