#include "kernels/newton_schulz.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/blas_tiles.h"

namespace muon {
namespace kernels {
namespace {

template <typename T>
void GrowTo(std::vector<T>& v, int64_t n) {
  if (n > 0 && static_cast<int64_t>(v.size()) < n) {
    v.resize(static_cast<size_t>(n));
  }
}

// Frobenius norm of n floats, squares summed in double in index order (each
// square of a float is exact in double), so the result is deterministic.
double FrobeniusNorm(const float* x, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    sum += v * v;
  }
  return std::sqrt(sum);
}

// Keller Jordan's quintic, torch.optim.Muon's defaults.
constexpr std::array<double, 3> kQuintic = {3.4445, -4.7750, 2.0315};

// Polar Express, safety factor 2e-2, cushion 2 (arXiv:2505.16932; the list in
// modded-nanogpt's train_gpt.py `polar_express_coeffs`).
constexpr std::array<std::array<double, 3>, 5> kPolarExpress = {{
    {8.156554524902461, -22.48329292557795, 15.878769915207462},
    {4.042929935166739, -2.808917465908714, 0.5000178451051316},
    {3.8916678022926607, -2.772484153217685, 0.5060648178503393},
    {3.285753657755655, -2.3681294933425376, 0.46449024233003106},
    {2.3465413258596377, -1.7097828382687081, 0.42323551169305323},
}};

// Polar Express normalises by (1 + safety factor) * ||X||_F.
constexpr double kPolarExpressNormScale = 1.02;

// C = alpha * X X^T + beta * C on the upper triangle of the m x m row-major C
// (ssyrk, m*m*n FLOPs), where X is m x n stored row-major with leading
// dimension ld, or, when `tall`, stored as V = X^T ([n, m], leading dimension
// ld) so that X X^T = V^T V. C's strict lower triangle is not touched.
void SyrkUpper(bool tall, int m, int n, float alpha, const float* x, int ld,
               float beta, float* c) {
  TiledSyrkUpper(tall, m, n, alpha, x, ld, beta, c, m);
}

// Copies the upper triangle of the m x m row-major matrix c onto its strict
// lower triangle in 16 x 16 tiles, in a fixed order. The column reads stride
// 4m bytes, a power of two for the usual m, so wider tiles evict themselves
// from the L1 cache: 16 x 16 measured 2x faster than 64 x 64 at m = 2048
// (2.8 ms vs 5.9 ms). Plain copies: the result is a function of the upper
// triangle's bits only, whatever the thread count.
void MirrorUpper(float* c, int m) {
  constexpr int kTile = 16;
  for (int i0 = 0; i0 < m; i0 += kTile) {
    const int i1 = std::min(i0 + kTile, m);
    for (int j0 = 0; j0 <= i0; j0 += kTile) {
      const int j1 = std::min(j0 + kTile, m);
      for (int i = i0; i < i1; ++i) {
        float* row = c + static_cast<int64_t>(i) * m;
        const int jend = std::min(j1, i);
        for (int j = j0; j < jend; ++j) {
          row[j] = c[static_cast<int64_t>(j) * m + i];
        }
      }
    }
  }
}

// P = a I + b G + c G G for the symmetric m x m row-major G (full), written
// in full to P (m x m, not aliasing G): the upper triangle of c G G =
// c G^T G by ssyrk (m^3 FLOPs; the transposed form measured 2-4% faster
// than G G^T with OpenBLAS 0.3.21), then b G + a I added to the upper
// triangle row by row and the result mirrored. Upper element (i, j) is
// fl(S_ij + fl(b G_ij)), plus a on the diagonal, where S_ij is c (G G)_ij as
// ssyrk rounds it (built with -ffp-contract=off: no fused multiply-adds of
// our own): the same bits in every process for the same G and OpenBLAS
// configuration. (One tiled pass doing both measured 1.7x slower than the
// two passes.)
void SymmetricPolynomial(const float* g, int m, float a, float b, float c,
                         float* p) {
  TiledSyrkUpper(/*trans=*/true, m, m, c, g, m, 0.0f, p, m);
  for (int i = 0; i < m; ++i) {
    float* p_row = p + static_cast<int64_t>(i) * m;
    const float* g_row = g + static_cast<int64_t>(i) * m;
    for (int j = i; j < m; ++j) p_row[j] += b * g_row[j];
    p_row[i] += a;
  }
  MirrorUpper(p, m);
}

// Y = P X for the m x m P (sgemm, beta = 0, 2*m*m*n FLOPs). X and Y are
// m x n row-major with leading dimension ld, or, when `tall`, stored
// transposed ([n, m]): then Y^T = X^T P^T. (ssymm on P's upper triangle,
// which would save the mirror, measured 10% slower than sgemm with OpenBLAS
// 0.3.21's Haswell kernels at 2048x2048 and equal with its autodetected
// ones.)
void ApplyPoly(bool tall, int m, int n, const float* p, const float* x, int ld,
               float* y) {
  if (tall) {
    TiledSgemm(/*trans_a=*/false, /*trans_b=*/true, n, m, m, 1.0f, x, ld, p, m,
               0.0f, y, ld);
  } else {
    TiledSgemm(/*trans_a=*/false, /*trans_b=*/false, m, n, m, 1.0f, p, m, x, ld,
               0.0f, y, ld);
  }
}

// X / max(norm_scale * ||U||_F, eps) into x (size floats), the division in
// float as torch's div_ does.
void Normalise(const float* u, int64_t size, const NewtonSchulzOptions& options,
               float* x) {
  const float denom = static_cast<float>(
      std::max(options.norm_scale * FrobeniusNorm(u, size), options.eps));
  for (int64_t i = 0; i < size; ++i) x[i] = u[i] / denom;
}

// The kGram evaluation of NewtonSchulz (see its comment in the header). X is
// m x n (stored transposed when `tall`, leading dimension ld); out and
// x_buf hold rows*cols floats, r, z, q, t m*m floats each.
void GramNewtonSchulz(const float* u, bool tall, int m, int n, int ld,
                      const NewtonSchulzOptions& options, float* out,
                      float* x_buf, float* r, float* z, float* q, float* t) {
  const int steps = NewtonSchulzIterations(options);
  const int every = options.gram_restart_every;
  const int blocks = (steps + every - 1) / every;
  const int64_t size = static_cast<int64_t>(m) * n;
  const int64_t mm = static_cast<int64_t>(m) * m;
  // One X update per block: start where the last one lands in out.
  float* x = (blocks % 2 == 0) ? out : x_buf;
  float* x_next = (blocks % 2 == 0) ? x_buf : out;
  Normalise(u, size, options, x);
  for (int start = 0; start < steps; start += every) {
    const int len = std::min(every, steps - start);
    // R = X X^T.
    SyrkUpper(tall, m, n, 1.0f, x, ld, 0.0f, r);
    MirrorUpper(r, m);
    for (int j = 0; j < len; ++j) {
      const std::array<double, 3> abc =
          NewtonSchulzCoefficients(options, start + j);
      // Z = a I + b R + c R R.
      SymmetricPolynomial(r, m, static_cast<float>(abc[0]),
                          static_cast<float>(abc[1]),
                          static_cast<float>(abc[2]), z);
      // Q = Q Z (Q = Z for the block's first iteration).
      if (j == 0) {
        std::memcpy(q, z, static_cast<size_t>(mm) * sizeof(float));
      } else {
        TiledSgemm(false, false, m, m, m, 1.0f, q, m, z, m, 0.0f, t, m);
        std::swap(q, t);
      }
      if (j + 1 < len) {
        // R = Z (R Z), symmetric in exact arithmetic: keep the upper
        // triangle and mirror it so that the next ssyrk sees R = R^T.
        TiledSgemm(false, false, m, m, m, 1.0f, r, m, z, m, 0.0f, t, m);
        TiledSgemm(false, false, m, m, m, 1.0f, z, m, t, m, 0.0f, r, m);
        MirrorUpper(r, m);
      }
    }
    // X = Q X (V = X^T: V' = V Q^T).
    ApplyPoly(tall, m, n, q, x, ld, x_next);
    std::swap(x, x_next);
  }
  assert(x == out);
}

}  // namespace

int NewtonSchulzIterations(const NewtonSchulzOptions& options) {
  return options.coefficients.empty()
             ? options.steps
             : static_cast<int>(options.coefficients.size());
}

std::array<double, 3> NewtonSchulzCoefficients(
    const NewtonSchulzOptions& options, int i) {
  assert(i >= 0 && i < NewtonSchulzIterations(options));
  if (options.coefficients.empty()) return {options.a, options.b, options.c};
  return options.coefficients[static_cast<size_t>(i)];
}

NewtonSchulzOptions QuinticSchedule(int steps) {
  NewtonSchulzOptions options;
  options.steps = steps;
  options.coefficients.assign(static_cast<size_t>(std::max(steps, 0)),
                              kQuintic);
  return options;
}

NewtonSchulzOptions PolarExpressSchedule() {
  NewtonSchulzOptions options;
  options.coefficients.assign(kPolarExpress.begin(), kPolarExpress.end());
  options.steps = static_cast<int>(options.coefficients.size());
  options.norm_scale = kPolarExpressNormScale;
  return options;
}

absl::StatusOr<NewtonSchulzOptions> ParseCoefficientSchedule(
    absl::string_view name) {
  absl::StatusOr<CoefficientSchedule> schedule =
      ParseCoefficientScheduleName(name);
  if (!schedule.ok()) return schedule.status();
  return *schedule == CoefficientSchedule::kQuintic ? QuinticSchedule(5)
                                                    : PolarExpressSchedule();
}

absl::StatusOr<CoefficientSchedule> ParseCoefficientScheduleName(
    absl::string_view name) {
  if (name == "quintic") return CoefficientSchedule::kQuintic;
  if (name == "polar_express") return CoefficientSchedule::kPolarExpress;
  return absl::InvalidArgumentError(absl::StrCat(
      "coefficient schedule must be \"quintic\" or \"polar_express\", got \"",
      name, "\""));
}

absl::string_view CoefficientScheduleName(CoefficientSchedule schedule) {
  return schedule == CoefficientSchedule::kPolarExpress ? "polar_express"
                                                        : "quintic";
}

NewtonSchulzOptions CoefficientScheduleFor(CoefficientSchedule schedule,
                                           double a, double b, double c,
                                           int steps) {
  if (schedule == CoefficientSchedule::kPolarExpress) {
    return PolarExpressSchedule();
  }
  NewtonSchulzOptions options;
  options.a = a;
  options.b = b;
  options.c = c;
  options.steps = steps;
  return options;
}

absl::StatusOr<NewtonSchulzMethod> ParseNewtonSchulzMethod(
    absl::string_view name) {
  if (name == "standard") return NewtonSchulzMethod::kStandard;
  if (name == "gram") return NewtonSchulzMethod::kGram;
  if (name == "auto") return NewtonSchulzMethod::kAuto;
  return absl::InvalidArgumentError(absl::StrCat(
      "Newton-Schulz method must be \"standard\", \"gram\" or \"auto\", got \"",
      name, "\""));
}

absl::string_view NewtonSchulzMethodName(NewtonSchulzMethod method) {
  switch (method) {
    case NewtonSchulzMethod::kGram:
      return "gram";
    case NewtonSchulzMethod::kAuto:
      return "auto";
    case NewtonSchulzMethod::kStandard:
      break;
  }
  return "standard";
}

absl::Status ValidateNewtonSchulzOptions(const NewtonSchulzOptions& options) {
  if (options.coefficients.empty() && options.steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NewtonSchulz: steps must be >= 0, got steps=", options.steps));
  }
  const int k = NewtonSchulzIterations(options);
  for (int i = 0; i < k; ++i) {
    const std::array<double, 3> abc = NewtonSchulzCoefficients(options, i);
    if (!std::isfinite(abc[0]) || !std::isfinite(abc[1]) ||
        !std::isfinite(abc[2])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "NewtonSchulz: coefficients of iteration ", i,
          " must be finite, got (", abc[0], ", ", abc[1], ", ", abc[2], ")"));
    }
  }
  if (!std::isfinite(options.norm_scale) || !(options.norm_scale > 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("NewtonSchulz: norm_scale must be finite and > 0, got ",
                     options.norm_scale));
  }
  if (!std::isfinite(options.eps) || options.eps < 0.0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NewtonSchulz: eps must be finite and >= 0, got ", options.eps));
  }
  if (options.method != NewtonSchulzMethod::kStandard &&
      options.method != NewtonSchulzMethod::kGram &&
      options.method != NewtonSchulzMethod::kAuto) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NewtonSchulz: unknown method ", static_cast<int>(options.method)));
  }
  if (options.gram_restart_every < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("NewtonSchulz: gram_restart_every must be >= 1, got ",
                     options.gram_restart_every));
  }
  return absl::OkStatus();
}

void NewtonSchulzWorkspace::Reserve(int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  const int64_t m = std::min(rows, cols);
  GrowTo(x_, rows * cols);
  GrowTo(gram_, m * m);
  GrowTo(poly_, m * m);
}

void NewtonSchulzWorkspace::Reserve(int64_t rows, int64_t cols,
                                    const NewtonSchulzOptions& options) {
  Reserve(rows, cols);
  if (rows <= 0 || cols <= 0 ||
      ResolveNewtonSchulzMethod(rows, cols, options) !=
          NewtonSchulzMethod::kGram) {
    return;
  }
  const int64_t m = std::min(rows, cols);
  GrowTo(q_, m * m);
  GrowTo(tmp_, m * m);
}

int64_t NewtonSchulzWorkspace::CapacityBytes() const {
  return static_cast<int64_t>((x_.capacity() + gram_.capacity() +
                               poly_.capacity() + q_.capacity() +
                               tmp_.capacity()) *
                              sizeof(float));
}

namespace {

// NewtonSchulz's argument checks (its errors).
absl::Status CheckNewtonSchulzArguments(const float* u, int64_t rows,
                                        int64_t cols,
                                        const NewtonSchulzOptions& options,
                                        const float* out) {
  if (rows < 1 || cols < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NewtonSchulz: matrix shape must be positive, got rows=", rows,
        " cols=", cols));
  }
  if (rows > INT_MAX || cols > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NewtonSchulz: dimension exceeds the 32-bit cblas interface, got rows=",
        rows, " cols=", cols));
  }
  if (absl::Status status = ValidateNewtonSchulzOptions(options);
      !status.ok()) {
    return status;
  }
  if (u == nullptr || out == nullptr) {
    return absl::InvalidArgumentError(
        "NewtonSchulz: u and out must be non-null");
  }
  const int64_t size = rows * cols;
  const uintptr_t u_begin = reinterpret_cast<uintptr_t>(u);
  const uintptr_t out_begin = reinterpret_cast<uintptr_t>(out);
  const uintptr_t bytes = static_cast<uintptr_t>(size) * sizeof(float);
  if (out_begin < u_begin + bytes && u_begin < out_begin + bytes) {
    return absl::InvalidArgumentError("NewtonSchulz: out must not overlap u");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status NewtonSchulz(const float* u, int64_t rows, int64_t cols,
                          const NewtonSchulzOptions& options, float* out,
                          NewtonSchulzWorkspace* workspace) {
  if (absl::Status s = CheckNewtonSchulzArguments(u, rows, cols, options, out);
      !s.ok()) {
    return s;
  }
  const int64_t size = rows * cols;
  NewtonSchulzWorkspace local;
  NewtonSchulzWorkspace* ws = workspace != nullptr ? workspace : &local;
  ws->Reserve(rows, cols, options);

  // Work on X (m x n, m <= n). When rows > cols the buffers hold V = X^T as a
  // row-major [rows, cols] matrix, i.e. the input's own layout, and every
  // product is rewritten with transpose flags:
  //   A = X X^T         = V^T V          (Trans, NoTrans)
  //   X' = a X + B X    <=> V' = a V + V B^T  (NoTrans, Trans)
  // so the final buffer already has the output's layout.
  const bool tall = rows > cols;
  const int m = static_cast<int>(std::min(rows, cols));
  const int n = static_cast<int>(std::max(rows, cols));
  // Leading dimension of the stored matrix (row-major [rows, cols]).
  const int ld = static_cast<int>(cols);

  const int steps = NewtonSchulzIterations(options);
  if (ResolveNewtonSchulzMethod(rows, cols, options) ==
      NewtonSchulzMethod::kGram) {
    GramNewtonSchulz(u, tall, m, n, ld, options, out, ws->x_.data(),
                     ws->gram_.data(), ws->poly_.data(), ws->q_.data(),
                     ws->tmp_.data());
    return absl::OkStatus();
  }
  // Ping-pong between out and the workspace buffer. Each step writes the
  // other buffer, so start where the last step lands in out: no final copy.
  float* x = (steps % 2 == 0) ? out : ws->x_.data();
  float* x_next = (steps % 2 == 0) ? ws->x_.data() : out;
  float* gram = ws->gram_.data();
  float* poly = ws->poly_.data();

  // X = U / max(norm_scale * ||U||_F, eps).
  Normalise(u, size, options, x);
  for (int step = 0; step < steps; ++step) {
    const std::array<double, 3> abc = NewtonSchulzCoefficients(options, step);
    // A = X X^T (m x m): ssyrk writes the upper triangle (m*m*n FLOPs), the
    // lower one is mirrored (A is read in full by the next ssyrk).
    SyrkUpper(tall, m, n, 1.0f, x, ld, 0.0f, gram);
    MirrorUpper(gram, m);
    // P = a I + b A + c A A (m^3 FLOPs), then X' = P X = a X + (b A + c A A) X
    // (2*m*m*n FLOPs), PyTorch's addmm pair with a folded into P's diagonal.
    SymmetricPolynomial(gram, m, static_cast<float>(abc[0]),
                        static_cast<float>(abc[1]), static_cast<float>(abc[2]),
                        poly);
    ApplyPoly(tall, m, n, poly, x, ld, x_next);
    std::swap(x, x_next);
  }
  assert(x == out);
  return absl::OkStatus();
}

namespace {

// NewtonSchulzReference's X: U (rows x cols, row-major) as a wide m x n
// row-major copy (transposed when tall), divided by max(norm_scale *
// ||U||_F, eps).
std::vector<double> ReferenceInput(const double* u, int64_t rows, int64_t cols,
                                   const NewtonSchulzOptions& options) {
  const bool tall = rows > cols;
  const int64_t m = std::min(rows, cols);
  const int64_t n = std::max(rows, cols);
  std::vector<double> x(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const double v = u[i * cols + j];
      if (tall) {
        x[j * n + i] = v;
      } else {
        x[i * n + j] = v;
      }
    }
  }
  double sum = 0.0;
  for (double v : x) sum += v * v;
  const double denom =
      std::max(options.norm_scale * std::sqrt(sum), options.eps);
  for (double& v : x) v /= denom;
  return x;
}

// One float64 iteration X' = a X + (b A + c A A) X with A = X X^T, X m x n
// row-major; `gram` and `poly` are m x m scratch.
void ReferenceStep(const std::array<double, 3>& abc, int64_t m, int64_t n,
                   const std::vector<double>& x, std::vector<double>* gram_v,
                   std::vector<double>* poly_v, std::vector<double>* x_next) {
  const double ca = abc[0];
  const double cb = abc[1];
  const double cc = abc[2];
  std::vector<double>& gram = *gram_v;
  std::vector<double>& poly = *poly_v;
  // A = X X^T.
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < m; ++j) {
      double s = 0.0;
      const double* xi = &x[i * n];
      const double* xj = &x[j * n];
      for (int64_t k = 0; k < n; ++k) s += xi[k] * xj[k];
      gram[i * m + j] = s;
    }
  }
  // B = b*A + c*A*A.
  for (int64_t i = 0; i < m; ++i) {
    double* pi = &poly[i * m];
    for (int64_t j = 0; j < m; ++j) pi[j] = cb * gram[i * m + j];
    for (int64_t k = 0; k < m; ++k) {
      const double g = cc * gram[i * m + k];
      const double* gk = &gram[k * m];
      for (int64_t j = 0; j < m; ++j) pi[j] += g * gk[j];
    }
  }
  // X' = a*X + B*X.
  for (int64_t i = 0; i < m; ++i) {
    double* yi = &(*x_next)[i * n];
    const double* xi = &x[i * n];
    for (int64_t j = 0; j < n; ++j) yi[j] = ca * xi[j];
    for (int64_t k = 0; k < m; ++k) {
      const double p = poly[i * m + k];
      const double* xk = &x[k * n];
      for (int64_t j = 0; j < n; ++j) yi[j] += p * xk[j];
    }
  }
}

}  // namespace

void NewtonSchulzReference(const double* u, int64_t rows, int64_t cols,
                           const NewtonSchulzOptions& options, double* out) {
  assert(rows >= 1 && cols >= 1 && ValidateNewtonSchulzOptions(options).ok());
  const int steps = NewtonSchulzIterations(options);
  const bool tall = rows > cols;
  const int64_t m = std::min(rows, cols);
  const int64_t n = std::max(rows, cols);
  // X (m x n) as an explicit row-major copy, transposed when tall.
  std::vector<double> x = ReferenceInput(u, rows, cols, options);
  std::vector<double> gram(static_cast<size_t>(m * m));
  std::vector<double> poly(static_cast<size_t>(m * m));
  std::vector<double> x_next(static_cast<size_t>(m * n));
  for (int step = 0; step < steps; ++step) {
    ReferenceStep(NewtonSchulzCoefficients(options, step), m, n, x, &gram,
                  &poly, &x_next);
    x.swap(x_next);
  }
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      out[i * cols + j] = tall ? x[j * n + i] : x[i * n + j];
    }
  }
}

double NewtonSchulzFlops(int64_t rows, int64_t cols, int steps) {
  const double m = static_cast<double>(std::min(rows, cols));
  const double n = static_cast<double>(std::max(rows, cols));
  return steps * (4.0 * m * m * n + 2.0 * m * m * m);
}

double NewtonSchulzFlops(int64_t rows, int64_t cols,
                         const NewtonSchulzOptions& options) {
  return NewtonSchulzFlops(rows, cols, NewtonSchulzIterations(options));
}

namespace {

// NewtonSchulzExecutedFlops of one concrete method (kStandard or kGram).
double ExecutedFlops(int64_t rows, int64_t cols,
                     const NewtonSchulzOptions& options,
                     NewtonSchulzMethod method) {
  const double m = static_cast<double>(std::min(rows, cols));
  const double n = static_cast<double>(std::max(rows, cols));
  const int steps = NewtonSchulzIterations(options);
  if (method != NewtonSchulzMethod::kGram) {
    return steps * (3.0 * m * m * n + m * m * m);
  }
  const int every = std::max(options.gram_restart_every, 1);
  double flops = 0.0;
  for (int start = 0; start < steps; start += every) {
    const int len = std::min(every, steps - start);
    flops += 3.0 * m * m * n + (7.0 * len - 6.0) * m * m * m;
  }
  return flops;
}

}  // namespace

NewtonSchulzMethod ResolveNewtonSchulzMethod(
    int64_t rows, int64_t cols, const NewtonSchulzOptions& options) {
  if (options.method != NewtonSchulzMethod::kAuto) return options.method;
  return ExecutedFlops(rows, cols, options, NewtonSchulzMethod::kGram) <
                 ExecutedFlops(rows, cols, options,
                               NewtonSchulzMethod::kStandard)
             ? NewtonSchulzMethod::kGram
             : NewtonSchulzMethod::kStandard;
}

double NewtonSchulzExecutedFlops(int64_t rows, int64_t cols,
                                 const NewtonSchulzOptions& options) {
  return ExecutedFlops(rows, cols, options,
                       ResolveNewtonSchulzMethod(rows, cols, options));
}

}  // namespace kernels
}  // namespace muon
