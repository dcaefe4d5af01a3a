#include "kernels/muon_update.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace muon {
namespace kernels {
namespace {

// ATen's scalar lerp (aten/src/ATen/native/Lerp.h) for float:
//   |w| < 0.5: self + w*(end - self);
//   otherwise: end - (end - self)*(1 - w).
inline float Lerp(float self, float end, float weight) {
  const float diff = end - self;
  return std::abs(weight) < 0.5f ? self + weight * diff
                                 : end - diff * (1.0f - weight);
}

inline float Widen(float x) { return x; }
inline float Widen(bf16_t x) { return Bf16ToFloat(x); }
// Stores a float result into a float (as is) or a bf16 buffer (rounded to
// nearest even, as torch's bf16 lerp_ rounds its fp32 result).
inline void Store(float* p, float v) { *p = v; }
inline void Store(bf16_t* p, float v) { *p = FloatToBf16(v); }

template <typename B, typename G>
void MomentumUpdateImpl(B* buf, const G* grad, int64_t n, double momentum) {
  const float w = static_cast<float>(1.0 - momentum);
  for (int64_t i = 0; i < n; ++i) {
    Store(&buf[i], Lerp(Widen(buf[i]), Widen(grad[i]), w));
  }
}

template <typename G, typename B>
void NesterovUpdateImpl(const G* grad, const B* buf, int64_t n, double momentum,
                        float* out) {
  const float w = static_cast<float>(momentum);
  for (int64_t i = 0; i < n; ++i) {
    out[i] = Lerp(Widen(grad[i]), Widen(buf[i]), w);
  }
}

// Exponent field all ones: NaN or +/-Inf. For fp32 that is
// (bits & 0x7fffffff) >= 0x7f800000, for bf16 (bits & 0x7fff) >= 0x7f80; a
// block is scanned with an unsigned max reduction (vectorizes: pmaxud).
inline uint32_t Magnitude(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits & 0x7fffffffu;
}
inline uint32_t Magnitude(bf16_t x) { return x & 0x7fffu; }
inline uint32_t NonFiniteFloor(const float*) { return 0x7f800000u; }
inline uint32_t NonFiniteFloor(const bf16_t*) { return 0x7f80u; }

template <typename T>
int64_t FirstNonFiniteImpl(const T* x, int64_t n) {
  constexpr int64_t kBlock = 4096;
  const uint32_t floor = NonFiniteFloor(x);
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t end = std::min(n, start + kBlock);
    // Eight independent lanes: the loop vectorizes even at -O2.
    uint32_t lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = start;
    for (; i + 8 <= end; i += 8) {
      for (int k = 0; k < 8; ++k) {
        lane[k] = std::max(lane[k], Magnitude(x[i + k]));
      }
    }
    uint32_t m = 0;
    for (; i < end; ++i) m = std::max(m, Magnitude(x[i]));
    for (int k = 0; k < 8; ++k) m = std::max(m, lane[k]);
    if (m < floor) continue;
    for (int64_t i = start; i < end; ++i) {
      if (Magnitude(x[i]) >= floor) return i;
    }
  }
  return -1;
}

}  // namespace

void Scale(float* x, int64_t n, float factor) {
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] * factor;
}

void Scale(bf16_t* x, int64_t n, float factor) {
  for (int64_t i = 0; i < n; ++i)
    x[i] = FloatToBf16(Bf16ToFloat(x[i]) * factor);
}

int64_t FirstNonFinite(const float* x, int64_t n) {
  return FirstNonFiniteImpl(x, n);
}

int64_t FirstNonFinite(const bf16_t* x, int64_t n) {
  return FirstNonFiniteImpl(x, n);
}

void MomentumUpdate(float* buf, const float* grad, int64_t n, double momentum) {
  MomentumUpdateImpl(buf, grad, n, momentum);
}

void MomentumUpdate(float* buf, const bf16_t* grad, int64_t n,
                    double momentum) {
  MomentumUpdateImpl(buf, grad, n, momentum);
}

void MomentumUpdate(bf16_t* buf, const float* grad, int64_t n,
                    double momentum) {
  MomentumUpdateImpl(buf, grad, n, momentum);
}

void MomentumUpdate(bf16_t* buf, const bf16_t* grad, int64_t n,
                    double momentum) {
  MomentumUpdateImpl(buf, grad, n, momentum);
}

void NesterovUpdate(const float* grad, const float* buf, int64_t n,
                    double momentum, float* out) {
  NesterovUpdateImpl(grad, buf, n, momentum, out);
}

void NesterovUpdate(const float* grad, const bf16_t* buf, int64_t n,
                    double momentum, float* out) {
  NesterovUpdateImpl(grad, buf, n, momentum, out);
}

void NesterovUpdate(const bf16_t* grad, const bf16_t* buf, int64_t n,
                    double momentum, float* out) {
  NesterovUpdateImpl(grad, buf, n, momentum, out);
}

void NesterovUpdate(const bf16_t* grad, const float* buf, int64_t n,
                    double momentum, float* out) {
  NesterovUpdateImpl(grad, buf, n, momentum, out);
}

double AdjustLr(double lr, AdjustLrFn fn, int64_t rows, int64_t cols) {
  const double r = static_cast<double>(rows);
  const double c = static_cast<double>(cols);
  double ratio = 1.0;
  switch (fn) {
    case AdjustLrFn::kOriginal:
      ratio = std::sqrt(std::max(1.0, r / c));
      break;
    case AdjustLrFn::kMatchRmsAdamW:
      ratio = 0.2 * std::sqrt(std::max(r, c));
      break;
    case AdjustLrFn::kSpectralNorm:
      return lr * std::sqrt(r / c);
  }
  return lr * ratio;
}

absl::StatusOr<AdjustLrFn> ParseAdjustLrFn(absl::string_view name) {
  if (name == "original") return AdjustLrFn::kOriginal;
  if (name == "match_rms_adamw") return AdjustLrFn::kMatchRmsAdamW;
  if (name == "spectral_norm") return AdjustLrFn::kSpectralNorm;
  return absl::InvalidArgumentError(
      absl::StrCat("adjust_lr_fn must be \"original\", \"match_rms_adamw\" or "
                   "\"spectral_norm\", got \"",
                   name, "\""));
}

absl::string_view AdjustLrFnName(AdjustLrFn fn) {
  switch (fn) {
    case AdjustLrFn::kMatchRmsAdamW:
      return "match_rms_adamw";
    case AdjustLrFn::kSpectralNorm:
      return "spectral_norm";
    case AdjustLrFn::kOriginal:
      break;
  }
  return "original";
}

void NorMuonNormalize(float* o, int64_t rows, int64_t cols, float* variance,
                      double beta2, double eps) {
  if (rows <= 0 || cols <= 0) return;
  const float w = static_cast<float>(1.0 - beta2);
  const float eps_f = static_cast<float>(eps);
  const float cols_f = static_cast<float>(cols);
  double before = 0;  // ||O||_F^2
  double after = 0;   // ||O / (sqrt(v) + eps)||_F^2
  for (int64_t i = 0; i < rows; ++i) {
    float* row = o + i * cols;
    double sq = 0;
    for (int64_t j = 0; j < cols; ++j) {
      sq += static_cast<double>(row[j]) * static_cast<double>(row[j]);
    }
    before += sq;
    const float mean_sq = static_cast<float>(sq) / cols_f;
    variance[i] = Lerp(variance[i], mean_sq, w);
    const float denom = std::sqrt(variance[i]) + eps_f;
    double row_after = 0;
    for (int64_t j = 0; j < cols; ++j) {
      row[j] = row[j] / denom;
      row_after += static_cast<double>(row[j]) * static_cast<double>(row[j]);
    }
    after += row_after;
  }
  const float norm_before = static_cast<float>(std::sqrt(before));
  const float norm_after =
      std::max(static_cast<float>(std::sqrt(after)), eps_f);
  const float scale = norm_before / norm_after;
  for (int64_t k = 0; k < rows * cols; ++k) o[k] = o[k] * scale;
}

void ApplyUpdate(float* param, const float* update, int64_t n, double lr,
                 double weight_decay, double adjusted_lr) {
  const float decay = static_cast<float>(1.0 - lr * weight_decay);
  const float alpha = static_cast<float>(-adjusted_lr);
  for (int64_t i = 0; i < n; ++i) {
    const float decayed = param[i] * decay;
    param[i] = decayed + alpha * update[i];
  }
}

void ApplyUpdate(bf16_t* param, const float* update, int64_t n, double lr,
                 double weight_decay, double adjusted_lr) {
  const float decay = static_cast<float>(1.0 - lr * weight_decay);
  const float alpha = static_cast<float>(-adjusted_lr);
  for (int64_t i = 0; i < n; ++i) {
    const float decayed =
        Bf16ToFloat(FloatToBf16(Bf16ToFloat(param[i]) * decay));
    param[i] = FloatToBf16(decayed + alpha * update[i]);
  }
}

}  // namespace kernels
}  // namespace muon
