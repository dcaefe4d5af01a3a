#include "tests/kernels/ns_test_util.h"

#include <cblas.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
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

namespace {

// The GPU iteration's storage and GEMM-input rounding in `precision`
// (EmulateGpuNewtonSchulz's comment), with sgemm for the products.
class GpuArithmetic {
 public:
  explicit GpuArithmetic(GpuPrecision precision) : precision_(precision) {}
  // A buffer written by the iteration: rounded to bf16 in kBf16.
  void Store(std::vector<float>& v) const {
    if (precision_ != GpuPrecision::kBf16) return;
    for (float& x : v) x = ToBf16(x);
  }
  // C = alpha * A op(B) + beta * C, row-major, A m x k, op(B) k x n (B
  // transposed when `trans_b`), GEMM inputs rounded to tf32 in kTf32; C
  // is then stored (Store).
  void Gemm(bool trans_b, int m, int n, int k, float alpha,
            const std::vector<float>& a, const std::vector<float>& b,
            float beta, std::vector<float>& c) const {
    const std::vector<float> ai = Input(a);
    const std::vector<float> bi = Input(b);
    cblas_sgemm(CblasRowMajor, CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, ai.data(),
                k, bi.data(), trans_b ? k : n, beta, c.data(), n);
    Store(c);
  }

 private:
  std::vector<float> Input(const std::vector<float>& v) const {
    std::vector<float> r = v;
    if (precision_ == GpuPrecision::kTf32) {
      for (float& x : r) x = ToTf32(x);
    }
    return r;
  }
  const GpuPrecision precision_;
};

// The standard iteration on X (m x n), as newton_schulz_cuda.cu runs it:
// A = X X^T; B = b A + c A A (beta on a copy of A); X = a X + B X.
void EmulateStandard(const GpuArithmetic& gpu, int m, int n,
                     const NewtonSchulzOptions& options,
                     std::vector<float>& x) {
  std::vector<float> gram(static_cast<size_t>(m) * m), poly, x_next;
  for (int step = 0; step < NewtonSchulzIterations(options); ++step) {
    const std::array<double, 3> abc = NewtonSchulzCoefficients(options, step);
    gpu.Gemm(/*trans_b=*/true, m, m, n, 1.0f, x, x, 0.0f, gram);
    poly = gram;
    gpu.Gemm(false, m, m, m, static_cast<float>(abc[2]), gram, gram,
             static_cast<float>(abc[1]), poly);
    x_next = x;
    gpu.Gemm(false, m, n, m, 1.0f, poly, x, static_cast<float>(abc[0]), x_next);
    x.swap(x_next);
  }
}

// Z = a I + b R + c R R into z: as newton_schulz_cuda.cu forms it by
// default, b R + c R R stored, then a added to the diagonal and stored
// again; or, with `fp32_z`, P = c R R by an sgemm, then b R, + a on the
// diagonal, + P, all in fp32, and stored once.
void EmulateGramPolynomial(const GpuArithmetic& gpu, int m,
                           const std::array<double, 3>& abc, bool fp32_z,
                           const std::vector<float>& r, std::vector<float>& z) {
  const float a = static_cast<float>(abc[0]);
  const float b = static_cast<float>(abc[1]);
  const float c = static_cast<float>(abc[2]);
  if (fp32_z) {
    std::vector<float> p(r.size());
    GpuArithmetic(GpuPrecision::kFp32).Gemm(false, m, m, m, c, r, r, 0.0f, p);
    z.resize(r.size());
    for (size_t i = 0; i < z.size(); ++i) {
      float v = b * r[i];
      if (i % (static_cast<size_t>(m) + 1) == 0) v += a;  // on the diagonal
      z[i] = v + p[i];
    }
  } else {
    z = r;  // the beta term's input
    gpu.Gemm(false, m, m, m, c, r, r, b, z);
    for (int i = 0; i < m; ++i) z[static_cast<size_t>(i) * m + i] += a;
  }
  gpu.Store(z);
}

// Gram Newton-Schulz on X (m x n), as newton_schulz_cuda.cu runs it, per
// restart block: R = X X^T; per iteration Z (EmulateGramPolynomial), Q = Z
// or Q = Q Z, and unless last T = R Z, R = Z T; then X = Q X.
void EmulateGram(const GpuArithmetic& gpu, int m, int n,
                 const NewtonSchulzOptions& options, bool fp32_z,
                 std::vector<float>& x) {
  const size_t mm = static_cast<size_t>(m) * m;
  std::vector<float> r(mm), z(mm), q(mm), t(mm), x_next(x.size());
  const int steps = NewtonSchulzIterations(options);
  const int every = std::max(options.gram_restart_every, 1);
  for (int start = 0; start < steps; start += every) {
    const int len = std::min(every, steps - start);
    gpu.Gemm(/*trans_b=*/true, m, m, n, 1.0f, x, x, 0.0f, r);
    for (int j = 0; j < len; ++j) {
      EmulateGramPolynomial(
          gpu, m, NewtonSchulzCoefficients(options, start + j), fp32_z, r, z);
      if (j == 0) {
        q = z;
      } else {
        gpu.Gemm(false, m, m, m, 1.0f, q, z, 0.0f, t);
        q.swap(t);
      }
      if (j + 1 < len) {
        gpu.Gemm(false, m, m, m, 1.0f, r, z, 0.0f, t);
        gpu.Gemm(false, m, m, m, 1.0f, z, t, 0.0f, r);
      }
    }
    gpu.Gemm(false, m, n, m, 1.0f, q, x, 0.0f, x_next);
    x.swap(x_next);
  }
}

}  // namespace

std::vector<float> EmulateGpuNewtonSchulz(const std::vector<float>& u,
                                          int64_t rows, int64_t cols,
                                          const NewtonSchulzOptions& options,
                                          GpuPrecision precision,
                                          bool gram_fp32_z) {
  const bool tall = rows > cols;
  const int m = static_cast<int>(std::min(rows, cols));
  const int n = static_cast<int>(std::max(rows, cols));
  const GpuArithmetic gpu(precision);
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
  gpu.Store(x);
  if (options.method == NewtonSchulzMethod::kGram) {
    EmulateGram(gpu, m, n, options, gram_fp32_z, x);
  } else {
    EmulateStandard(gpu, m, n, options, x);
  }
  std::vector<float> out(u.size());
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      out[i * cols + j] = tall ? x[j * n + i] : x[i * n + j];
    }
  }
  return out;
}

void PrintGramZErrors(const char* what, int64_t rows, int64_t cols,
                      double standard, double gram, double gram_fp32_z) {
  std::printf("%s %lldx%lld: standard %.3e, Gram %.3e, Gram with fp32 Z %.3e\n",
              what, static_cast<long long>(rows), static_cast<long long>(cols),
              standard, gram, gram_fp32_z);
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

const std::vector<std::pair<int64_t, int64_t>>& GramFp32ZMarginShapes() {
  static const auto* shapes =
      new std::vector<std::pair<int64_t, int64_t>>{{256, 1024}, {1024, 256}};
  return *shapes;
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
