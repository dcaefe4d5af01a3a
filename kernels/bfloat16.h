// bfloat16 <-> float32 conversions on the CPU (the bf16 storage format of
// PyTorch's torch.bfloat16: the upper 16 bits of an IEEE-754 binary32).
//
// float -> bf16 rounds to nearest, ties to even, as PyTorch's
// c10::BFloat16 (c10/util/BFloat16.h, round_to_nearest_even) does; NaN stays
// a (quiet) NaN with its sign. bf16 -> float is exact.
#ifndef MUON_KERNELS_BFLOAT16_H_
#define MUON_KERNELS_BFLOAT16_H_

#include <cstdint>
#include <cstring>

namespace muon {
namespace kernels {

// The bits of a bf16 value.
using bf16_t = uint16_t;

// Exact widening: the bf16 bits become the upper half of a float.
inline float Bf16ToFloat(bf16_t x) {
  const uint32_t bits = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Round to nearest even (c10::BFloat16's round_to_nearest_even).
inline bf16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep sign, make quiet
    return static_cast<bf16_t>((bits >> 16) | 0x0040u);
  }
  const uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<bf16_t>((bits + rounding_bias) >> 16);
}

}  // namespace kernels
}  // namespace muon

#endif  // MUON_KERNELS_BFLOAT16_H_
