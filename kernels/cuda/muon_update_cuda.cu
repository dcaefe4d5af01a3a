// Fused elementwise Muon kernels (kernels/cuda/muon_update_cuda.h), nvcc.
//
// Every float operation is an explicit round-to-nearest intrinsic, so the
// result does not depend on nvcc's -fmad contraction: kSeparate rounds each
// multiply and add (the CPU kernels' arithmetic, -ffp-contract=off) and
// kFused uses one fma where nvcc contracts torch's CUDA kernels.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "device/cuda_check.cuh"
#include "kernels/cuda/muon_update_cuda.h"
#include "kernels/cuda/vec4.cuh"

namespace muon {
namespace kernels {
namespace cuda {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t n) {
  return static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t{1} << 16)));
}

// ATen's lerp (aten/src/ATen/native/Lerp.h):
//   |w| < 0.5 ? self + w*(end - self) : end - (end - self)*(1 - w).
// nvcc contracts torch's expression to fma(w, diff, self) and
// fma(-diff, 1 - w, end).
template <bool kFma>
__device__ __forceinline__ float Lerp(float self, float end, float w) {
  const float diff = __fsub_rn(end, self);
  if (fabsf(w) < 0.5f) {
    return kFma ? __fmaf_rn(w, diff, self)
                : __fadd_rn(self, __fmul_rn(w, diff));
  }
  const float one_minus_w = __fsub_rn(1.0f, w);
  return kFma ? __fmaf_rn(-diff, one_minus_w, end)
              : __fsub_rn(end, __fmul_rn(diff, one_minus_w));
}

// c10::BFloat16's conversions, as kernels/bfloat16.h on the CPU: widening
// is exact; narrowing rounds to nearest even and keeps NaN quiet with its
// sign.
__device__ __forceinline__ float Bf16BitsToFloat(uint16_t x) {
  return __uint_as_float(static_cast<uint32_t>(x) << 16);
}
__device__ __forceinline__ uint16_t FloatToBf16Bits(float f) {
  const uint32_t bits = __float_as_uint(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  const uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

__device__ __forceinline__ float LoadFloat(float x) { return x; }
__device__ __forceinline__ float LoadFloat(uint16_t x) {
  return Bf16BitsToFloat(x);
}

// An element of type T from an fp32 value (bf16: FloatToBf16Bits).
template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ uint16_t FromFloat<uint16_t>(float v) {
  return FloatToBf16Bits(v);
}

template <typename T>
__device__ __forceinline__ void StoreFloat(T* p, float v) {
  *p = FromFloat<T>(v);
}

// BufT, GradT: float, or uint16_t holding bf16 bits (widened exactly, as
// kernels::MomentumUpdate's bf16 overloads; a bf16 buf rounded back).
template <bool kFma, typename BufT, typename GradT>
__global__ void MomentumKernel(BufT* buf, const GradT* grad, int64_t n,
                               float w) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
       i < n; i += stride) {
    StoreFloat(&buf[i], Lerp<kFma>(LoadFloat(buf[i]), LoadFloat(grad[i]), w));
  }
}

template <bool kFma, typename BufT, typename GradT>
__global__ void NesterovKernel(const BufT* __restrict__ buf,
                               const GradT* __restrict__ grad, int64_t n,
                               float w, float* __restrict__ update) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
       i < n; i += stride) {
    update[i] = Lerp<kFma>(LoadFloat(grad[i]), LoadFloat(buf[i]), w);
  }
}

// MomentumKernel over `groups` groups of four elements.
template <bool kFma, typename BufT, typename GradT>
__global__ void MomentumVec4Kernel(typename Vec4<BufT>::type* buf,
                                   const typename Vec4<GradT>::type* grad,
                                   int64_t groups, float w) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
       i < groups; i += stride) {
    typename Vec4<BufT>::type b = buf[i];
    const typename Vec4<GradT>::type g = grad[i];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      SetLane(b, k,
              FromFloat<BufT>(Lerp<kFma>(LoadFloat(GetLane(b, k)),
                                         LoadFloat(GetLane(g, k)), w)));
    }
    buf[i] = b;
  }
}

// NesterovKernel over `groups` groups of four elements.
template <bool kFma, typename BufT, typename GradT>
__global__ void NesterovVec4Kernel(
    const typename Vec4<BufT>::type* __restrict__ buf,
    const typename Vec4<GradT>::type* __restrict__ grad, int64_t groups,
    float w, float4* __restrict__ update) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
       i < groups; i += stride) {
    const typename Vec4<BufT>::type b = buf[i];
    const typename Vec4<GradT>::type g = grad[i];
    float4 u{};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      SetLane(
          u, k,
          Lerp<kFma>(LoadFloat(GetLane(g, k)), LoadFloat(GetLane(b, k)), w));
    }
    update[i] = u;
  }
}

template <typename BufT>
__global__ void WidenKernel(const BufT* __restrict__ buf, int64_t n,
                            float* __restrict__ update) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
       i < n; i += stride) {
    update[i] = LoadFloat(buf[i]);
  }
}

// *first = min(*first, base + i) over the i with a NaN or Inf at x[i]
// (x: the elements from index `base` on); *first starts at all ones (-1 as
// int64, the largest unsigned value).
template <typename T>
__global__ void FirstNonFiniteKernel(const T* x, int64_t n, int64_t base,
                                     unsigned long long* first) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
       i < n; i += stride) {
    if (!isfinite(LoadFloat(x[i]))) {
      atomicMin(first, static_cast<unsigned long long>(base + i));
    }
  }
}

// FirstNonFiniteKernel over `groups` groups of four elements from index 0
// (element k of group i is index 4 i + k; a group records its first).
template <typename T>
__global__ void FirstNonFiniteVec4Kernel(const typename Vec4<T>::type* x,
                                         int64_t groups,
                                         unsigned long long* first) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
       i < groups; i += stride) {
    const typename Vec4<T>::type v = x[i];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (!isfinite(LoadFloat(GetLane(v, k)))) {
        atomicMin(first, static_cast<unsigned long long>(4 * i + k));
        break;
      }
    }
  }
}

// One element of torch's param.mul_(decay).add_(update, alpha=alpha):
// fp32, decayed + alpha*update (contracted to fma by nvcc in torch's
// kernel); bf16, param * decay rounded to bf16, then the sum computed in
// fp32 and rounded again (a bf16 tensor's mul_ then add_).
template <bool kFma>
__device__ __forceinline__ float ApplyElem(float param, float update,
                                           float decay, float alpha) {
  const float decayed = __fmul_rn(param, decay);
  return kFma ? __fmaf_rn(alpha, update, decayed)
              : __fadd_rn(decayed, __fmul_rn(alpha, update));
}
template <bool kFma>
__device__ __forceinline__ uint16_t ApplyElem(uint16_t param, float update,
                                              float decay, float alpha) {
  const float decayed = Bf16BitsToFloat(
      FloatToBf16Bits(__fmul_rn(Bf16BitsToFloat(param), decay)));
  const float sum = kFma ? __fmaf_rn(alpha, update, decayed)
                         : __fadd_rn(decayed, __fmul_rn(alpha, update));
  return FloatToBf16Bits(sum);
}

// param[i] = ApplyElem(param[i], update[i]) for i in [0, n), one element
// per thread and step.
template <bool kFma, typename ParamT>
__global__ void DecayAndApplyKernel(ParamT* __restrict__ param,
                                    const float* __restrict__ update, int64_t n,
                                    float decay, float alpha) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
       i < n; i += stride) {
    param[i] = ApplyElem<kFma>(param[i], update[i], decay, alpha);
  }
}

// DecayAndApplyKernel over `groups` groups of four elements.
template <bool kFma, typename ParamT>
__global__ void DecayAndApplyVec4Kernel(
    typename Vec4<ParamT>::type* __restrict__ param,
    const float4* __restrict__ update, int64_t groups, float decay,
    float alpha) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
       i < groups; i += stride) {
    typename Vec4<ParamT>::type p = param[i];
    const float4 u = update[i];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      SetLane(p, k,
              ApplyElem<kFma>(GetLane(p, k), GetLane(u, k), decay, alpha));
    }
    param[i] = p;
  }
}

}  // namespace

namespace {

// Bytes of one element of `type`.
int64_t ElemBytes(Elem type) { return type == Elem::kBf16 ? 2 : 4; }

// Calls fn(buf, grad) with the pointers cast to float* or uint16_t* (bf16
// bits) as their element types say.
template <typename BufPtr, typename Fn>
void VisitElems(BufPtr buf, Elem buf_type, const void* grad, Elem grad_type,
                Fn&& fn) {
  using Void = std::remove_pointer_t<BufPtr>;  // void or const void
  auto with_grad = [&](auto* b) {
    if (grad_type == Elem::kBf16) {
      fn(b, static_cast<const uint16_t*>(grad));
    } else {
      fn(b, static_cast<const float*>(grad));
    }
  };
  if (buf_type == Elem::kBf16) {
    with_grad(static_cast<std::conditional_t<std::is_const_v<Void>,
                                             const uint16_t*, uint16_t*>>(buf));
  } else {
    with_grad(static_cast<
              std::conditional_t<std::is_const_v<Void>, const float*, float*>>(
        buf));
  }
}

__global__ void PackBf16Kernel(const float* __restrict__ src, int64_t src_ld,
                               int64_t rows, int64_t cols,
                               uint16_t* __restrict__ dst) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = FloatToBf16Bits(src[(i / cols) * src_ld + i % cols]);
  }
}

__global__ void UnpackBf16Kernel(const uint16_t* __restrict__ src, int64_t rows,
                                 int64_t cols, float* __restrict__ dst,
                                 int64_t dst_ld) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[(i / cols) * dst_ld + i % cols] = Bf16BitsToFloat(src[i]);
  }
}

__global__ void RoundToBf16Kernel(float* __restrict__ x, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] = Bf16BitsToFloat(FloatToBf16Bits(x[i]));
  }
}

__global__ void ScaleKernel(float* __restrict__ x, int64_t n, float factor) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] = __fmul_rn(x[i], factor);
  }
}

__global__ void ScaleBf16Kernel(uint16_t* __restrict__ x, int64_t n,
                                float factor) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] = FloatToBf16Bits(__fmul_rn(Bf16BitsToFloat(x[i]), factor));
  }
}

// The checks of PackBf16 and UnpackBf16.
absl::Status CheckBf16Block(const char* fn, const void* a, const void* b,
                            int64_t rows, int64_t cols, int64_t ld) {
  if (rows < 0 || cols < 0 || ld < cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        fn, ": rows ", rows, ", cols ", cols, ", leading dimension ", ld,
        "; need rows, cols >= 0 and a leading dimension >= cols"));
  }
  if (rows * cols > 0 && (a == nullptr || b == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat(fn, ": pointers must be non-null"));
  }
  return absl::OkStatus();
}

// Calls fn(std::true_type) for kFused, fn(std::false_type) for
// kSeparate: the kernels' kFma template argument as a value's type.
template <typename Fn>
void WithFma(FmaMode mode, Fn&& fn) {
  if (mode == FmaMode::kFused) {
    fn(std::true_type());
  } else {
    fn(std::false_type());
  }
}

// Enqueues MomentumKernel (in groups of four where buf and grad are
// aligned, InGroupsOfFour) over n elements on `s`.
template <typename B, typename G>
void LaunchMomentum(B* b, const G* g, int64_t n, float w, FmaMode mode,
                    cudaStream_t s) {
  using BV = typename Vec4<B>::type;
  using GV = typename Vec4<G>::type;
  WithFma(mode, [&](auto fma) {
    constexpr bool kFma = decltype(fma)::value;
    auto groups_of_four = [&](int64_t groups) {
      MomentumVec4Kernel<kFma, B, G><<<Blocks(groups), kThreads, 0, s>>>(
          reinterpret_cast<BV*>(b), reinterpret_cast<const GV*>(g), groups, w);
    };
    auto one_by_one = [&](int64_t done, int64_t count) {
      MomentumKernel<kFma, B, G>
          <<<Blocks(count), kThreads, 0, s>>>(b + done, g + done, count, w);
    };
    InGroupsOfFour(AlignedForFour<B>(b) && AlignedForFour<G>(g), n,
                   groups_of_four, one_by_one);
  });
}

// Enqueues NesterovKernel (in groups of four where buf, grad and update
// are aligned, InGroupsOfFour) over n elements on `s`.
template <typename B, typename G>
void LaunchNesterov(const B* b, const G* g, int64_t n, float w, float* update,
                    FmaMode mode, cudaStream_t s) {
  using BV = typename Vec4<B>::type;
  using GV = typename Vec4<G>::type;
  WithFma(mode, [&](auto fma) {
    constexpr bool kFma = decltype(fma)::value;
    auto groups_of_four = [&](int64_t groups) {
      NesterovVec4Kernel<kFma, B, G><<<Blocks(groups), kThreads, 0, s>>>(
          reinterpret_cast<const BV*>(b), reinterpret_cast<const GV*>(g),
          groups, w, reinterpret_cast<float4*>(update));
    };
    auto one_by_one = [&](int64_t done, int64_t count) {
      NesterovKernel<kFma, B, G><<<Blocks(count), kThreads, 0, s>>>(
          b + done, g + done, count, w, update + done);
    };
    InGroupsOfFour(AlignedForFour<B>(b) && AlignedForFour<G>(g) &&
                       AlignedForFour<float>(update),
                   n, groups_of_four, one_by_one);
  });
}

template <typename T>
absl::Status LaunchFirstNonFinite(const T* x, int64_t n, int64_t* first,
                                  void* stream) {
  if (n < 0 || first == nullptr || (n > 0 && x == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FirstNonFinite: n must be >= 0 and pointers non-null, got n = ", n));
  }
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  MUON_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(first, 0xff, sizeof(int64_t), s));
  if (n == 0) return absl::OkStatus();
  unsigned long long* at = reinterpret_cast<unsigned long long*>(first);
  auto groups_of_four = [&](int64_t groups) {
    FirstNonFiniteVec4Kernel<T><<<Blocks(groups), kThreads, 0, s>>>(
        reinterpret_cast<const typename Vec4<T>::type*>(x), groups, at);
  };
  auto one_by_one = [&](int64_t done, int64_t count) {
    FirstNonFiniteKernel<T>
        <<<Blocks(count), kThreads, 0, s>>>(x + done, count, done, at);
  };
  InGroupsOfFour(AlignedForFour<T>(x), n, groups_of_four, one_by_one);
  MUON_CUDA_RETURN_IF_LAUNCH_FAILED("FirstNonFiniteKernel");
  return absl::OkStatus();
}

}  // namespace

absl::Status Momentum(void* buf, Elem buf_type, const void* grad,
                      Elem grad_type, int64_t n, double momentum, FmaMode mode,
                      void* stream) {
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Momentum: n must be >= 0, got ", n));
  }
  if (n == 0) return absl::OkStatus();
  if (buf == nullptr || grad == nullptr) {
    return absl::InvalidArgumentError(
        "Momentum: buf and grad must be non-null");
  }
  // Each thread reads its grad elements while others write buf: only the
  // exact alias of one type (an element read and written by one thread)
  // is safe.
  const int64_t grad_bytes = n * ElemBytes(grad_type);
  if (!(buf == grad && buf_type == grad_type) &&
      BytesOverlap(buf, n * ElemBytes(buf_type), grad, grad_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Momentum: grad's ", grad_bytes, " bytes overlap buf's ", n,
        " elements (only grad == buf, of one type, may alias)"));
  }
  // As kernels::MomentumUpdate: the weight in double, rounded to float once.
  const float w = static_cast<float>(1.0 - momentum);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  VisitElems(buf, buf_type, grad, grad_type,
             [&](auto* b, auto* g) { LaunchMomentum(b, g, n, w, mode, s); });
  MUON_CUDA_RETURN_IF_LAUNCH_FAILED("MomentumKernel");
  return absl::OkStatus();
}

absl::Status FormUpdate(const void* buf, Elem buf_type, const void* grad,
                        Elem grad_type, int64_t n, double momentum,
                        bool nesterov, float* update, FmaMode mode,
                        void* stream) {
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("FormUpdate: n must be >= 0, got ", n));
  }
  if (n == 0) return absl::OkStatus();
  if (buf == nullptr || update == nullptr || (nesterov && grad == nullptr)) {
    return absl::InvalidArgumentError(
        "FormUpdate: buf, update and (with nesterov) grad must be non-null");
  }
  const int64_t update_bytes = n * int64_t{sizeof(float)};
  const bool over_buf =
      BytesOverlap(update, update_bytes, buf, n * ElemBytes(buf_type));
  if (over_buf || (nesterov && BytesOverlap(update, update_bytes, grad,
                                            n * ElemBytes(grad_type)))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FormUpdate: update must not alias buf or grad: its ", update_bytes,
        " bytes overlap ", over_buf ? "buf's" : "grad's", " ", n, " elements"));
  }
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (!nesterov) {
    if (buf_type == Elem::kBf16) {
      WidenKernel<uint16_t><<<Blocks(n), kThreads, 0, s>>>(
          static_cast<const uint16_t*>(buf), n, update);
    } else {
      MUON_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(update, buf, n * sizeof(float),
                                                cudaMemcpyDeviceToDevice, s));
    }
    MUON_CUDA_RETURN_IF_LAUNCH_FAILED("WidenKernel");
    return absl::OkStatus();
  }
  // As kernels::NesterovUpdate: w = (float)momentum.
  const float w = static_cast<float>(momentum);
  VisitElems(buf, buf_type, grad, grad_type, [&](auto* b, auto* g) {
    LaunchNesterov(b, g, n, w, update, mode, s);
  });
  MUON_CUDA_RETURN_IF_LAUNCH_FAILED("NesterovKernel");
  return absl::OkStatus();
}

absl::Status FirstNonFinite(const float* x, int64_t n, int64_t* first,
                            void* stream) {
  return LaunchFirstNonFinite(x, n, first, stream);
}

absl::Status FirstNonFiniteBf16(const uint16_t* x, int64_t n, int64_t* first,
                                void* stream) {
  return LaunchFirstNonFinite(x, n, first, stream);
}

namespace {

// DecayAndApply and DecayAndApplyBf16 (`what` names the one in errors):
// checks n >= 0, non-null pointers when n > 0 and an update not
// overlapping param, then enqueues DecayAndApply(Vec4)Kernel over
// param[0, n) on `stream` (InGroupsOfFour).
template <typename ParamT>
absl::Status DecayAndApplyOf(const char* what, ParamT* param,
                             const float* update, int64_t n, double lr,
                             double weight_decay, double adjusted_lr,
                             FmaMode mode, void* stream) {
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": n must be >= 0, got ", n));
  }
  if (n == 0) return absl::OkStatus();
  if (param == nullptr || update == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": param and update must be non-null"));
  }
  if (BytesOverlap(param, n * int64_t{sizeof(ParamT)}, update,
                   n * int64_t{sizeof(float)})) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": update must not overlap param"));
  }
  const float decay = static_cast<float>(1.0 - lr * weight_decay);
  const float alpha = static_cast<float>(-adjusted_lr);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  using PV = typename Vec4<ParamT>::type;
  WithFma(mode, [&](auto fma) {
    constexpr bool kFma = decltype(fma)::value;
    auto groups_of_four = [&](int64_t groups) {
      DecayAndApplyVec4Kernel<kFma, ParamT><<<Blocks(groups), kThreads, 0, s>>>(
          reinterpret_cast<PV*>(param), reinterpret_cast<const float4*>(update),
          groups, decay, alpha);
    };
    auto one_by_one = [&](int64_t done, int64_t count) {
      DecayAndApplyKernel<kFma, ParamT><<<Blocks(count), kThreads, 0, s>>>(
          param + done, update + done, count, decay, alpha);
    };
    InGroupsOfFour(
        AlignedForFour<ParamT>(param) && AlignedForFour<float>(update), n,
        groups_of_four, one_by_one);
  });
  if constexpr (std::is_same_v<ParamT, float>) {
    MUON_CUDA_RETURN_IF_LAUNCH_FAILED("DecayAndApplyKernel");
  } else {
    MUON_CUDA_RETURN_IF_LAUNCH_FAILED("DecayAndApplyKernel (bf16)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DecayAndApply(float* param, const float* update, int64_t n,
                           double lr, double weight_decay, double adjusted_lr,
                           FmaMode mode, void* stream) {
  return DecayAndApplyOf("DecayAndApply", param, update, n, lr, weight_decay,
                         adjusted_lr, mode, stream);
}

absl::Status DecayAndApplyBf16(uint16_t* param, const float* update, int64_t n,
                               double lr, double weight_decay,
                               double adjusted_lr, FmaMode mode, void* stream) {
  return DecayAndApplyOf("DecayAndApplyBf16", param, update, n, lr,
                         weight_decay, adjusted_lr, mode, stream);
}

absl::Status PackBf16(const float* src, int64_t src_ld, int64_t rows,
                      int64_t cols, uint16_t* dst, void* stream) {
  if (absl::Status s = CheckBf16Block("PackBf16", src, dst, rows, cols, src_ld);
      !s.ok()) {
    return s;
  }
  if (rows * cols == 0) return absl::OkStatus();
  PackBf16Kernel<<<Blocks(rows * cols), kThreads, 0,
                   static_cast<cudaStream_t>(stream)>>>(src, src_ld, rows, cols,
                                                        dst);
  MUON_CUDA_RETURN_IF_LAUNCH_FAILED("PackBf16Kernel");
  return absl::OkStatus();
}

absl::Status RoundToBf16(float* x, int64_t n, void* stream) {
  if (n < 0 || (n > 0 && x == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RoundToBf16: n must be >= 0 and x non-null, got n = ", n));
  }
  if (n == 0) return absl::OkStatus();
  RoundToBf16Kernel<<<Blocks(n), kThreads, 0,
                      static_cast<cudaStream_t>(stream)>>>(x, n);
  MUON_CUDA_RETURN_IF_LAUNCH_FAILED("RoundToBf16Kernel");
  return absl::OkStatus();
}

absl::Status Scale(void* x, Elem type, int64_t n, float factor, void* stream) {
  if (n < 0 || (n > 0 && x == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Scale: n must be >= 0 and x non-null, got n = ", n));
  }
  if (n == 0) return absl::OkStatus();
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (type == Elem::kBf16) {
    ScaleBf16Kernel<<<Blocks(n), kThreads, 0, s>>>(static_cast<uint16_t*>(x), n,
                                                   factor);
    MUON_CUDA_RETURN_IF_LAUNCH_FAILED("ScaleBf16Kernel");
  } else {
    ScaleKernel<<<Blocks(n), kThreads, 0, s>>>(static_cast<float*>(x), n,
                                               factor);
    MUON_CUDA_RETURN_IF_LAUNCH_FAILED("ScaleKernel");
  }
  return absl::OkStatus();
}

absl::Status UnpackBf16(const uint16_t* src, int64_t rows, int64_t cols,
                        float* dst, int64_t dst_ld, void* stream) {
  if (absl::Status s =
          CheckBf16Block("UnpackBf16", src, dst, rows, cols, dst_ld);
      !s.ok()) {
    return s;
  }
  if (rows * cols == 0) return absl::OkStatus();
  UnpackBf16Kernel<<<Blocks(rows * cols), kThreads, 0,
                     static_cast<cudaStream_t>(stream)>>>(src, rows, cols, dst,
                                                          dst_ld);
  MUON_CUDA_RETURN_IF_LAUNCH_FAILED("UnpackBf16Kernel");
  return absl::OkStatus();
}

namespace {

// Per row i: sq = sum_j o_ij^2 (float64, column order), v_i = lerp(v_i,
// float(sq) / cols, w), o_i. /= sqrt(v_i) + eps, after = sum_j o_ij^2 of
// the result (float64); sq and after go to the scratch.
__global__ void NorMuonRowsKernel(float* o, int64_t rows, int64_t cols,
                                  float* variance, float w, float eps,
                                  double* row_sq, double* row_after) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows) return;
  float* row = o + i * cols;
  double sq = 0;
  for (int64_t j = 0; j < cols; ++j) {
    const double x = static_cast<double>(row[j]);
    sq = __dadd_rn(sq, __dmul_rn(x, x));
  }
  row_sq[i] = sq;
  const float mean_sq =
      __fdiv_rn(__double2float_rn(sq), static_cast<float>(cols));
  const float v = Lerp<false>(variance[i], mean_sq, w);
  variance[i] = v;
  const float denom = __fadd_rn(__fsqrt_rn(v), eps);
  double after = 0;
  for (int64_t j = 0; j < cols; ++j) {
    const float y = __fdiv_rn(row[j], denom);
    row[j] = y;
    const double x = static_cast<double>(y);
    after = __dadd_rn(after, __dmul_rn(x, x));
  }
  row_after[i] = after;
}

// One thread: ||O||_F / max(||O'||_F, eps) from the row sums, added in row
// order as the host does.
__global__ void NorMuonScaleKernel(const double* row_sq,
                                   const double* row_after, int64_t rows,
                                   float eps, float* scale) {
  double before = 0, after = 0;
  for (int64_t i = 0; i < rows; ++i) {
    before = __dadd_rn(before, row_sq[i]);
    after = __dadd_rn(after, row_after[i]);
  }
  const float norm_before = __double2float_rn(__dsqrt_rn(before));
  // std::max(x, eps) as the host: x unless x < eps (a NaN stays NaN).
  const float x = __double2float_rn(__dsqrt_rn(after));
  const float norm_after = x < eps ? eps : x;
  *scale = __fdiv_rn(norm_before, norm_after);
}

__global__ void ScaleByKernel(float* o, int64_t n, const float* scale) {
  const float s = *scale;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       k < n; k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    o[k] = __fmul_rn(o[k], s);
  }
}

}  // namespace

int64_t NorMuonScratchBytes(int64_t rows) {
  return rows <= 0 ? 0
                   : 2 * rows * static_cast<int64_t>(sizeof(double)) +
                         static_cast<int64_t>(sizeof(float));
}

absl::Status NorMuonNormalize(float* o, int64_t rows, int64_t cols,
                              float* variance, double beta2, double eps,
                              void* scratch, void* stream) {
  if (rows < 0 || cols < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("NorMuonNormalize: rows and cols must be >= 0, got ", rows,
                     " x ", cols));
  }
  if (rows == 0 || cols == 0) return absl::OkStatus();  // as the host
  if (o == nullptr || variance == nullptr || scratch == nullptr) {
    return absl::InvalidArgumentError(
        "NorMuonNormalize: o, variance and scratch must be non-null");
  }
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  double* row_sq = static_cast<double*>(scratch);
  double* row_after = row_sq + rows;
  float* scale = reinterpret_cast<float*>(row_after + rows);
  const float w = static_cast<float>(1.0 - beta2);
  const float eps_f = static_cast<float>(eps);
  const int row_blocks = static_cast<int>((rows + kThreads - 1) / kThreads);
  NorMuonRowsKernel<<<row_blocks, kThreads, 0, s>>>(o, rows, cols, variance, w,
                                                    eps_f, row_sq, row_after);
  MUON_CUDA_RETURN_IF_LAUNCH_FAILED("NorMuonRowsKernel");
  NorMuonScaleKernel<<<1, 1, 0, s>>>(row_sq, row_after, rows, eps_f, scale);
  MUON_CUDA_RETURN_IF_LAUNCH_FAILED("NorMuonScaleKernel");
  ScaleByKernel<<<Blocks(rows * cols), kThreads, 0, s>>>(o, rows * cols, scale);
  MUON_CUDA_RETURN_IF_LAUNCH_FAILED("ScaleByKernel");
  return absl::OkStatus();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muon
