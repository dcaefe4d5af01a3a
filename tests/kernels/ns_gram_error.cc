// Measures the fp32 error of kernels::NewtonSchulz (standard and Gram
// Newton-Schulz with several restart periods) against a float64 reference
// computed with cblas_dgemm (the same iteration as NewtonSchulzReference,
// fast enough for 2048x2048 and 1024x4096). Prints, per size and method:
//   O err:     ||O - O_64||_F / ||O_64||_F
//   OOt err:   ||O O^T - O_64 O_64^T||_F / ||O_64 O_64^T||_F  (m x m)
//   max rel:   max |O - O_64| / max |O_64|  (newton_schulz_test's metric)
//   bf16 model: O err of the CPU model of the GPU's bf16 iteration
//              (EmulateGpuNewtonSchulz: bf16 storage of every buffer, fp32
//              accumulation), i.e. what the GPU's bf16 error would be if
//              storage rounding were its only source
//              (tools/ns_accuracy.py measures the GPU's)
//   fp32 Z:    the same with the Gram iteration's Z = a I + b R + c R R
//              formed in fp32 and rounded once (MUON_NS_GRAM_FP32_Z=1)
// Inputs: entries uniform in [-1, 1) (tests/kernels/ns_test_util.h), seed 1.
// The figures in docs/benchmarks.md and the bounds of
// newton_schulz_gram_test.cc come from this program.
//
// Usage: ns_gram_error [RxC ...]   (default 256x256 256x1024 1024x1024
//                                   1024x4096 4096x1024 2048x2048)
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/newton_schulz.h"
#include "tests/kernels/ns_test_util.h"

namespace {

using ::muon::kernels::NewtonSchulzMethod;
using ::muon::kernels::NewtonSchulzOptions;

// Float64 NS on X (m x n row-major, m <= n), in place.
void ReferenceDgemm(std::vector<double>& x, int m, int n,
                    const NewtonSchulzOptions& options) {
  double sum = 0.0;
  for (double v : x) sum += v * v;
  const double denom =
      std::max(std::sqrt(sum) * options.norm_scale, options.eps);
  for (double& v : x) v /= denom;
  std::vector<double> a(static_cast<size_t>(m) * m), b(a.size()), y(x.size());
  const int k = muon::kernels::NewtonSchulzIterations(options);
  for (int i = 0; i < k; ++i) {
    const auto abc = muon::kernels::NewtonSchulzCoefficients(options, i);
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, m, n, 1.0, x.data(),
                n, x.data(), n, 0.0, a.data(), m);
    b = a;
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, m, m, abc[2],
                a.data(), m, a.data(), m, abc[1], b.data(), m);
    y = x;
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, m, 1.0,
                b.data(), m, x.data(), n, abc[0], y.data(), n);
    x.swap(y);
  }
}

std::vector<double> GramOf(const std::vector<double>& x, int m, int n) {
  std::vector<double> g(static_cast<size_t>(m) * m);
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, m, n, 1.0, x.data(),
              n, x.data(), n, 0.0, g.data(), m);
  return g;
}

double FroRel(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

double MaxRel(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    num = std::max(num, std::fabs(got[i] - want[i]));
    den = std::max(den, std::fabs(want[i]));
  }
  return num / den;
}

// `a` (rows x cols row-major) as the m x n X in double, transposed when
// tall.
std::vector<double> AsMxN(const std::vector<float>& a, int rows, int cols) {
  const int n = std::max(rows, cols);
  std::vector<double> x(a.size());
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j) {
      const double v = a[static_cast<size_t>(i) * cols + j];
      if (rows > cols) {
        x[static_cast<size_t>(j) * n + i] = v;
      } else {
        x[static_cast<size_t>(i) * n + j] = v;
      }
    }
  }
  return x;
}

struct Variant {
  const char* name;
  NewtonSchulzMethod method;
  int every;
};

constexpr Variant kVariants[] = {
    {"standard", NewtonSchulzMethod::kStandard, 1},
    {"gram/r1", NewtonSchulzMethod::kGram, 1},
    {"gram/r2", NewtonSchulzMethod::kGram, 2},
    {"gram/r3", NewtonSchulzMethod::kGram, 3},
    {"gram/r5", NewtonSchulzMethod::kGram, 5},
};

// One size's rows: each variant's fp32 kernel against the float64 x (m x
// n, already iterated), and the bf16 model of the GPU iteration. False when
// the kernel fails.
bool PrintSize(const std::string& size, int rows, int cols,
               const std::vector<float>& u, const std::vector<double>& x) {
  const int m = std::min(rows, cols);
  const int n = std::max(rows, cols);
  const std::vector<double> want_gram = GramOf(x, m, n);
  for (const Variant& v : kVariants) {
    NewtonSchulzOptions options;
    options.method = v.method;
    options.gram_restart_every = v.every;
    std::vector<float> out(u.size());
    if (!muon::kernels::NewtonSchulz(u.data(), rows, cols, options, out.data(),
                                     nullptr)
             .ok()) {
      std::fprintf(stderr, "NewtonSchulz failed\n");
      return false;
    }
    const std::vector<double> got = AsMxN(out, rows, cols);
    double model[2];
    for (bool fp32_z : {false, true}) {
      model[fp32_z ? 1 : 0] =
          FroRel(AsMxN(muon::kernels::testing::EmulateGpuNewtonSchulz(
                           u, rows, cols, options,
                           muon::kernels::GpuPrecision::kBf16, fp32_z),
                       rows, cols),
                 x);
    }
    std::printf("%-10s %-10s %10.2e %10.2e %10.2e %12.3e %12.3e\n",
                size.c_str(), v.name, FroRel(got, x),
                FroRel(GramOf(got, m, n), want_gram), MaxRel(got, x), model[0],
                model[1]);
    std::fflush(stdout);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(argv[i]);
  if (sizes.empty()) {
    sizes = {"256x256",   "256x1024",  "1024x1024",
             "1024x4096", "4096x1024", "2048x2048"};
  }
  const char* ct = std::getenv("OPENBLAS_CORETYPE");
  std::printf("OpenBLAS core: %s | OPENBLAS_CORETYPE=%s | threads %d\n",
              openblas_get_corename(), ct != nullptr ? ct : "(unset)",
              openblas_get_num_threads());
  std::printf("%-10s %-10s %10s %10s %10s %12s %12s\n", "size", "method",
              "O err", "OOt err", "max rel", "bf16 model", "fp32 Z");
  for (const std::string& size : sizes) {
    const int rows = std::atoi(size.c_str());
    const int cols = std::atoi(size.c_str() + size.find('x') + 1);
    const std::vector<float> u =
        muon::kernels::testing::RandomMatrix(rows, cols, 1);
    std::vector<double> x = AsMxN(u, rows, cols);
    ReferenceDgemm(x, std::min(rows, cols), std::max(rows, cols),
                   NewtonSchulzOptions());
    if (!PrintSize(size, rows, cols, u, x)) return 1;
  }
  return 0;
}
