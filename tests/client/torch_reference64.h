// Independent float64 formulations of torch.optim.Muon's pieces
// (torch/optim/_muon.py, PyTorch 2.9), plain loops, for tests that check
// the optimizer against them: _adjust_lr and _zeropower_via_newtonschulz.
#ifndef MUON_TESTS_CLIENT_TORCH_REFERENCE64_H_
#define MUON_TESTS_CLIENT_TORCH_REFERENCE64_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "client/muon.h"
#include "kernels/muon_update.h"

namespace muon {
namespace testing {

// torch.optim.Muon._adjust_lr, in double as Python computes it.
inline double ExpectedAdjustedLr(double lr, kernels::AdjustLrFn fn,
                                 int64_t rows, int64_t cols) {
  const double a = static_cast<double>(rows);
  const double b = static_cast<double>(cols);
  if (fn == kernels::AdjustLrFn::kOriginal) {
    return lr * std::sqrt(std::max(1.0, a / b));
  }
  if (fn == kernels::AdjustLrFn::kSpectralNorm) {
    return lr * std::sqrt(a / b);  // dion's adjust_lr_spectral_norm
  }
  return lr * (0.2 * std::sqrt(std::max(a, b)));
}

// torch.optim.Muon's _zeropower_via_newtonschulz in float64, plain loops:
//   X = G (transposed when rows > cols); X /= max(||X||_F, eps)
//   ns_steps times: A = X X^T; B = b A + c A A; X = a X + B X
//   transposed back.
inline std::vector<double> TorchZeropower64(const std::vector<double>& g,
                                            int64_t rows, int64_t cols,
                                            const MuonOptions& o) {
  const bool tall = rows > cols;
  const int64_t m = tall ? cols : rows;  // X is [m, n], m <= n
  const int64_t n = tall ? rows : cols;
  std::vector<double> x(m * n);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      x[tall ? j * n + i : i * n + j] = g[i * cols + j];
    }
  }
  double sum = 0.0;
  for (double v : x) sum += v * v;
  const double norm = std::max(std::sqrt(sum), o.eps);
  for (double& v : x) v /= norm;
  std::vector<double> a(m * m), b(m * m), bx(m * n);
  for (int k = 0; k < o.ns_steps; ++k) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < m; ++j) {
        double dot = 0.0;
        for (int64_t l = 0; l < n; ++l) dot += x[i * n + l] * x[j * n + l];
        a[i * m + j] = dot;
      }
    }
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < m; ++j) {
        double aa = 0.0;
        for (int64_t l = 0; l < m; ++l) aa += a[i * m + l] * a[l * m + j];
        b[i * m + j] = o.ns_b * a[i * m + j] + o.ns_c * aa;
      }
    }
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0.0;
        for (int64_t l = 0; l < m; ++l) dot += b[i * m + l] * x[l * n + j];
        bx[i * n + j] = dot;
      }
    }
    for (int64_t i = 0; i < m * n; ++i) x[i] = o.ns_a * x[i] + bx[i];
  }
  std::vector<double> out(rows * cols);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      out[i * cols + j] = x[tall ? j * n + i : i * n + j];
    }
  }
  return out;
}

}  // namespace testing
}  // namespace muon

#endif  // MUON_TESTS_CLIENT_TORCH_REFERENCE64_H_
