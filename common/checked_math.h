// Checked int64 arithmetic for products of sizes (mesh world size, numel,
// bytes), and the documented input limits every spec, manifest and file is
// checked against before anything is allocated from it.
//
// Thread-safety: pure functions and constants.
#ifndef MUON_COMMON_CHECKED_MATH_H_
#define MUON_COMMON_CHECKED_MATH_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>

namespace muon {

// Input limits (see README "Failure handling and security"). They are far
// above any real job and low enough that every derived size (bytes, FLOPs,
// per-rank tables) fits in int64 and in memory.
//
// Ranks in a mesh (the product of its sizes): 262,144, twice the largest
// job measured (131,072 ranks x 100,000 matrices planned in docs/scale.md).
// Beyond it, paths that keep one entry per rank (a manifest each when
// ranks send full manifests, the plan's per-rank loads) grow past what
// was measured.
inline constexpr int64_t kMaxWorldSize = int64_t{1} << 18;
// Dims of a device mesh.
inline constexpr int kMaxMeshDims = 8;
// Parameters in one job spec or one rank's manifest.
inline constexpr int64_t kMaxParams = int64_t{1} << 20;
// Experts (slices) in one 3-D expert stack.
inline constexpr int64_t kMaxExperts = int64_t{1} << 16;
// Elements of one parameter (all slices of a stack): 2^40 fp32 values is
// 4 TiB, so its byte count (x 4) and a matrix's NS FLOPs cannot overflow.
inline constexpr int64_t kMaxParamElements = int64_t{1} << 40;
// Per-rank boxes the planner keeps: matrices x world size (32 bytes each,
// plus a ParamManifest per rank and parameter when a spec is expanded).
// 2^21 (e.g. 1,024 ranks x 2,048 matrices); the time and memory measured
// at and beyond it are in docs/scale.md ("The size bound").
inline constexpr int64_t kMaxMatrixRankBoxes = int64_t{1} << 21;
// Bytes of one parameter or tensor name (a job spec's, a rank manifest's,
// a safetensors header's): the plan copies a name into every matrix's
// entry and names each slice of a stack "name[e]", so an unbounded name
// multiplies by up to kMaxExperts; `muonctl spec` also matches names with
// std::regex, whose libstdc++ matcher recurses per character.
inline constexpr size_t kMaxTensorNameBytes = 4096;
// Bytes of all matrix names of one job, as the plan keeps them: each
// parameter's name once per matrix, a stack's slices as "name[e]" (counted
// as the name plus kMatrixNameSuffixBytes). 2^30: 2^24 matrices (a job
// planned with shared boxes) named in 64 bytes each. Without it, 2^24
// expert slices of one 4 KiB name would make 64 GiB of names.
inline constexpr int64_t kMaxJobNameBytes = int64_t{1} << 30;
// The "[e]" of a slice's name, counted for every matrix: e < 2^40 has at
// most 13 digits.
inline constexpr int64_t kMatrixNameSuffixBytes = 15;

// a * b, or nullopt when it overflows int64.
inline std::optional<int64_t> CheckedMul(int64_t a, int64_t b) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

// a + b, or nullopt when it overflows int64.
inline std::optional<int64_t> CheckedAdd(int64_t a, int64_t b) {
  int64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) return std::nullopt;
  return out;
}

// Product of `values` (1 when empty), or nullopt when any partial product
// overflows int64 or exceeds `limit`. Values must be >= 0 for the limit to
// mean anything; a 0 makes the product 0 (still checked up to it).
template <typename Range>
std::optional<int64_t> CheckedProduct(const Range& values,
                                      int64_t limit = INT64_MAX) {
  int64_t out = 1;
  for (auto v : values) {
    std::optional<int64_t> next = CheckedMul(out, static_cast<int64_t>(v));
    if (!next.has_value() || *next > limit) return std::nullopt;
    out = *next;
  }
  return out;
}

inline std::optional<int64_t> CheckedProduct(
    std::initializer_list<int64_t> values, int64_t limit = INT64_MAX) {
  return CheckedProduct<std::initializer_list<int64_t>>(values, limit);
}

}  // namespace muon

#endif  // MUON_COMMON_CHECKED_MATH_H_
