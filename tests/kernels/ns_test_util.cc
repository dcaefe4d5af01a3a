#include "tests/kernels/ns_test_util.h"

#include <cblas.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/newton_schulz.h"
#include "kernels/ns_engine.h"

namespace muon {
namespace kernels {
namespace testing {
namespace {

uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

float FromBits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

// Rounds a finite float to `keep` mantissa bits, nearest even.
float RoundMantissa(float x, int drop_bits) {
  const uint32_t u = Bits(x);
  const uint32_t half = (uint32_t{1} << (drop_bits - 1)) - 1;
  const uint32_t lsb = (u >> drop_bits) & 1u;
  const uint32_t mask = ~((uint32_t{1} << drop_bits) - 1);
  return FromBits((u + half + lsb) & mask);
}

float ToBf16(float x) { return RoundMantissa(x, 16); }
float ToTf32(float x) { return RoundMantissa(x, 13); }

}  // namespace

std::vector<float> RandomMatrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<float> m(static_cast<size_t>(rows * cols));
  for (float& v : m) {
    v = static_cast<float>(static_cast<double>(gen() >> 8) / (1 << 23) - 1.0);
  }
  return m;
}

double MaxRelError(const std::vector<float>& got,
                   const std::vector<double>& want) {
  double max_diff = 0.0;
  double max_ref = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double diff = std::abs(got[i] - want[i]);
    // std::max would drop a NaN; an error must not.
    if (std::isnan(diff)) return diff;
    max_diff = std::max(max_diff, diff);
    max_ref = std::max(max_ref, std::abs(want[i]));
  }
  return max_ref > 0.0 ? max_diff / max_ref : max_diff;
}

double FroRelError(const std::vector<float>& got,
                   const std::vector<double>& want) {
  double diff = 0.0;
  double ref = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = got[i] - want[i];
    diff += d * d;
    ref += want[i] * want[i];
  }
  return ref > 0.0 ? std::sqrt(diff / ref) : std::sqrt(diff);
}

bool BitwiseEqual(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() &&
         std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

std::vector<double> Reference(const std::vector<float>& u, int64_t rows,
                              int64_t cols,
                              const NewtonSchulzOptions& options) {
  std::vector<double> u64(u.begin(), u.end());
  std::vector<double> out(u.size());
  NewtonSchulzReference(u64.data(), rows, cols, options, out.data());
  return out;
}

std::vector<float> EmulateGpuNewtonSchulz(const std::vector<float>& u,
                                          int64_t rows, int64_t cols,
                                          const NewtonSchulzOptions& options,
                                          GpuPrecision precision) {
  const bool tall = rows > cols;
  const int m = static_cast<int>(std::min(rows, cols));
  const int n = static_cast<int>(std::max(rows, cols));
  const bool bf16 = precision == GpuPrecision::kBf16;
  const bool tf32 = precision == GpuPrecision::kTf32;
  auto store = [&](std::vector<float>& v) {
    if (bf16) {
      for (float& x : v) x = ToBf16(x);
    }
  };
  auto input = [&](const std::vector<float>& v) {
    std::vector<float> r = v;
    if (tf32) {
      for (float& x : r) x = ToTf32(x);
    }
    return r;
  };
  // X (m x n) row-major, explicitly transposed when tall.
  std::vector<float> x(static_cast<size_t>(m) * n);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      (tall ? x[j * n + i] : x[i * n + j]) = u[i * cols + j];
    }
  }
  double sum = 0.0;
  for (float v : u) sum += static_cast<double>(v) * v;
  const float denom = static_cast<float>(
      std::max(options.norm_scale * std::sqrt(sum), options.eps));
  for (float& v : x) v = v / denom;
  store(x);
  std::vector<float> gram(static_cast<size_t>(m) * m);
  std::vector<float> poly(gram.size());
  std::vector<float> x_next(x.size());
  for (int step = 0; step < NewtonSchulzIterations(options); ++step) {
    const std::array<double, 3> abc = NewtonSchulzCoefficients(options, step);
    const std::vector<float> xi = input(x);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, m, n, 1.0f,
                xi.data(), n, xi.data(), n, 0.0f, gram.data(), m);
    store(gram);
    const std::vector<float> gi = input(gram);
    poly = gram;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, m, m,
                static_cast<float>(abc[2]), gi.data(), m, gi.data(), m,
                static_cast<float>(abc[1]), poly.data(), m);
    store(poly);
    const std::vector<float> pi = input(poly);
    x_next = x;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, m, 1.0f,
                pi.data(), m, xi.data(), n, static_cast<float>(abc[0]),
                x_next.data(), n);
    store(x_next);
    x.swap(x_next);
  }
  std::vector<float> out(u.size());
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      out[i * cols + j] = tall ? x[j * n + i] : x[i * n + j];
    }
  }
  return out;
}

ErrorBound GpuErrorBound(GpuPrecision precision) {
  switch (precision) {
    case GpuPrecision::kBf16:
      return {1e-1, 4e-2};
    case GpuPrecision::kTf32:
      return {3e-2, 1e-2};
    case GpuPrecision::kFp32:
      break;
  }
  return {1e-4, 1e-4};
}

const std::vector<std::pair<int64_t, int64_t>>& GpuReferenceShapes() {
  static const auto* shapes = new std::vector<std::pair<int64_t, int64_t>>{
      {128, 128}, {256, 512}, {512, 256}, {96, 1100}, {1100, 96}, {200, 50}};
  return *shapes;
}

std::string PrecisionName(GpuPrecision precision) {
  switch (precision) {
    case GpuPrecision::kBf16:
      return "bf16";
    case GpuPrecision::kTf32:
      return "tf32";
    case GpuPrecision::kFp32:
      break;
  }
  return "fp32";
}

}  // namespace testing
}  // namespace kernels
}  // namespace muon
