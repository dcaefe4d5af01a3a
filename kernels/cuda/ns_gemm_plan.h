// The GEMM sequence of one Newton-Schulz iteration on a column-major BLAS
// (cuBLAS), as data: which buffers, transposes, sizes, leading dimensions,
// batch strides and alpha/beta. Plain header-only C++ shared by the CUDA
// implementation (kernels/cuda/newton_schulz_cuda.cu) and a CPU test that
// executes the plan with a column-major GEMM simulator
// (tests/kernels/ns_gemm_plan_test.cc), so the layout logic is checked
// without a GPU.
//
// Layout. U, X and O are row-major [rows, cols]; a column-major BLAS reads
// such a buffer as its transpose. With m = min(rows, cols), n = max:
//   wide (rows <= cols): the buffer is Xc = X^T (n x m, ld n):
//     A  = X X^T          = Xc^T Xc             gemm(T, N, m, m, n)
//     X' = a X + B X  <=> Xc' = a Xc + Xc B^T     gemm(N, T, n, m, m)
//   tall (rows > cols): the buffer is Xc = X (m x n, ld m) (X = U^T):
//     A  = Xc Xc^T                              gemm(N, T, m, m, n)
//     X' = a X + B X                            gemm(N, N, m, n, m)
// and B = b*A + c*A*A is gemm(N, N, m, m, m) on the m x m buffers either
// way (beta = b on a copy of A; X' likewise starts as a copy of X with
// beta = a). The result lands in the input's layout: no transposes.
#ifndef MUON_KERNELS_CUDA_NS_GEMM_PLAN_H_
#define MUON_KERNELS_CUDA_NS_GEMM_PLAN_H_

#include <algorithm>
#include <array>
#include <cstdint>

namespace muon {
namespace kernels {
namespace cuda {

// The buffers of the iteration (each a strided batch of matrices).
enum class NsBuffer {
  kX,      // Current X: batch * rows*cols elements.
  kXNext,  // Next X (holds a copy of X before the update GEMM).
  kGram,   // A: batch * m*m.
  kPoly,   // B (holds a copy of A before the polynomial GEMM).
};

// C = alpha * op(A) op(B) + beta * C, column-major, `transpose_*` true for
// op = transpose; buffer i of the batch at base + i * stride (elements).
struct NsGemm {
  bool transpose_a;
  bool transpose_b;
  int m;
  int n;
  int k;
  double alpha;
  NsBuffer a;
  int lda;
  int64_t stride_a;
  NsBuffer b;
  int ldb;
  int64_t stride_b;
  double beta;
  NsBuffer c;
  int ldc;
  int64_t stride_c;
};

// One iteration: gram (A = X X^T), then copy kGram -> kPoly and poly
// (B = b*A + c*A*A), then copy kX -> kXNext and update (X' = a*X + B*X);
// the caller then swaps kX and kXNext.
struct NsStepPlan {
  NsGemm gram;
  NsGemm poly;
  NsGemm update;
};

// The plan for a [rows, cols] matrix (rows, cols in [1, INT_MAX]) and the
// iteration's (a, b, c).
inline NsStepPlan PlanNewtonSchulzStep(int64_t rows, int64_t cols,
                                       const std::array<double, 3>& abc) {
  const bool tall = rows > cols;
  const int m = static_cast<int>(std::min(rows, cols));
  const int n = static_cast<int>(std::max(rows, cols));
  const int64_t mn = rows * cols;
  const int64_t mm = static_cast<int64_t>(m) * m;
  NsStepPlan plan;
  // clang-format off
  // Each: {transpose_a, transpose_b, m, n, k, alpha,
  //        A, lda, stride_a,   B, ldb, stride_b,   beta, C, ldc, stride_c}.
  if (tall) {
    plan.gram   = {false, true,  m, m, n, 1.0,
                   NsBuffer::kX,    m, mn,  NsBuffer::kX,    m, mn,
                   0.0,    NsBuffer::kGram,  m, mm};
    plan.update = {false, false, m, n, m, 1.0,
                   NsBuffer::kPoly, m, mm,  NsBuffer::kX,    m, mn,
                   abc[0], NsBuffer::kXNext, m, mn};
  } else {
    plan.gram   = {true,  false, m, m, n, 1.0,
                   NsBuffer::kX,    n, mn,  NsBuffer::kX,    n, mn,
                   0.0,    NsBuffer::kGram,  m, mm};
    plan.update = {false, true,  n, m, m, 1.0,
                   NsBuffer::kX,    n, mn,  NsBuffer::kPoly, m, mm,
                   abc[0], NsBuffer::kXNext, n, mn};
  }
  plan.poly     = {false, false, m, m, m, abc[2],
                   NsBuffer::kGram, m, mm,  NsBuffer::kGram, m, mm,
                   abc[1], NsBuffer::kPoly,  m, mm};
  // clang-format on
  return plan;
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muon

#endif  // MUON_KERNELS_CUDA_NS_GEMM_PLAN_H_
