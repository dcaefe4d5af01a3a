// The host side of the elementwise CUDA kernels that move four elements
// per load and store (kernels/cuda/vec4.cuh): which pointers allow it, how
// n elements split into groups of four and a rest, and whether two byte
// ranges overlap (the kernels' __restrict__ arguments must not). Plain
// C++, tested on the CPU.
#ifndef MUON_KERNELS_CUDA_GROUPS_OF_FOUR_H_
#define MUON_KERNELS_CUDA_GROUPS_OF_FOUR_H_

#include <cstdint>

namespace muon {
namespace kernels {
namespace cuda {

// Whether p is aligned for a load of four elements of T at once (16 bytes
// for fp32, 8 for bf16 bits).
template <typename T>
inline bool AlignedForFour(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % (4 * sizeof(T)) == 0;
}

// Enqueues an elementwise operation over n elements: when `aligned`,
// groups_of_four(groups) over the first 4 * groups = 4 * (n / 4), then
// one_by_one(done, count) over the `count` elements from `done` (all n
// when not aligned); neither is called for no elements. Either way each
// element gets the same operations, so the same bits. The caller checks
// the launches afterwards.
template <typename GroupsFn, typename OneByOneFn>
inline void InGroupsOfFour(bool aligned, int64_t n, GroupsFn&& groups_of_four,
                           OneByOneFn&& one_by_one) {
  const int64_t groups = aligned ? n / 4 : 0;
  if (groups > 0) groups_of_four(groups);
  const int64_t done = groups * 4;
  if (done < n) one_by_one(done, n - done);
}

// Whether the byte ranges [x, x + x_bytes) and [y, y + y_bytes) share a
// byte (an empty range shares none). Any device's addresses: the
// pointers are compared, never read.
inline bool BytesOverlap(const void* x, int64_t x_bytes, const void* y,
                         int64_t y_bytes) {
  if (x_bytes <= 0 || y_bytes <= 0) return false;
  const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(x);
  const std::uintptr_t b = reinterpret_cast<std::uintptr_t>(y);
  return a < b + static_cast<std::uintptr_t>(y_bytes) &&
         b < a + static_cast<std::uintptr_t>(x_bytes);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muon

#endif  // MUON_KERNELS_CUDA_GROUPS_OF_FOUR_H_
