// Elementwise CUDA kernels in groups of four elements: one aligned 16-byte
// (fp32) or 8-byte (bf16) load or store per group instead of four, for the
// memory-bound passes of the step and of Newton-Schulz. A kernel in groups
// makes the same operations per element as its one-by-one version, so
// both give the same bits; InGroupsOfFour (kernels/cuda/groups_of_four.h)
// runs the groups where the pointers allow and the rest one by one.
// Included by the .cu files only (nvcc).
#ifndef MUON_KERNELS_CUDA_VEC4_CUH_
#define MUON_KERNELS_CUDA_VEC4_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/groups_of_four.h"

namespace muon {
namespace kernels {
namespace cuda {

// Four consecutive elements in one aligned load or store: float4 for
// fp32, uint2 for bf16 bits (uint16_t; two 32-bit words of two bf16 each,
// the element at the lower address in a word's low half).
template <typename T>
struct Vec4;
template <>
struct Vec4<float> {
  using type = float4;
};
template <>
struct Vec4<uint16_t> {
  using type = uint2;
};

// Element k (0-3, a constant once unrolled) of a group of four.
__device__ __forceinline__ float GetLane(const float4& v, int k) {
  return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}
__device__ __forceinline__ uint16_t GetLane(const uint2& v, int k) {
  const uint32_t word = k < 2 ? v.x : v.y;
  return static_cast<uint16_t>((k & 1) != 0 ? word >> 16 : word & 0xffffu);
}
__device__ __forceinline__ void SetLane(float4& v, int k, float x) {
  if (k == 0) {
    v.x = x;
  } else if (k == 1) {
    v.y = x;
  } else if (k == 2) {
    v.z = x;
  } else {
    v.w = x;
  }
}
__device__ __forceinline__ void SetLane(uint2& v, int k, uint16_t x) {
  uint32_t& word = k < 2 ? v.x : v.y;
  word = (k & 1) != 0 ? (word & 0xffffu) | (static_cast<uint32_t>(x) << 16)
                      : (word & 0xffff0000u) | x;
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muon

#endif  // MUON_KERNELS_CUDA_VEC4_CUH_
