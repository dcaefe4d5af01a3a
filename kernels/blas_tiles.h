// Thread-count-independent fp32 GEMM and SYRK on OpenBLAS.
//
// OpenBLAS 0.3.21's threaded GEMM picks its code path from the thread count
// (the SkylakeX `sgemm_direct` path is taken only when one thread is
// available; the split of C among threads changes the micro-kernel a tile
// goes through), so the same product gives different last bits with 1 and 2
// threads. The functions here give the same bits for every thread count:
//   - the output C is cut into fixed kTileRows x kTileCols tiles, a function
//     of the shapes only;
//   - each tile is one single-threaded OpenBLAS call over the whole inner
//     dimension k (no sum is split across threads);
//   - the tiles run on a process-wide pool of ComputeThreads() threads in
//     any order, which cannot change a tile's bits.
// OpenBLAS itself is kept at one thread (openblas_set_num_threads(1)) from
// the first call on; the thread count it had then (OPENBLAS_NUM_THREADS, or
// its core count) becomes ComputeThreads(). The bits still depend on the
// OpenBLAS build and core type (OPENBLAS_CORETYPE or autodetection):
// BlasCoreName() names the kernel set.
//
// Thread-safe: any number of threads may call these at once (ranks run as
// threads in tests); they share the pool and each call waits for its own
// tiles only.
#ifndef MUON_KERNELS_BLAS_TILES_H_
#define MUON_KERNELS_BLAS_TILES_H_

#include <string>

#include "absl/status/status.h"

namespace muon {
namespace kernels {

// Rows and columns of one output tile (fixed: the bits depend on them).
inline constexpr int kTileRows = 256;
inline constexpr int kTileCols = 256;

// Largest thread count SetComputeThreads accepts: OpenBLAS 0.3.21 as
// Debian builds it (MAX_THREADS=64) keeps 2 x 64 work buffers for calls in
// flight at once, and every tile is a call.
inline constexpr int kMaxComputeThreads = 64;

// Threads the tiled products run on (>= 1; the calling thread counts as
// one). The first call (or the first product) takes it from
// MUONRT_NUM_THREADS when that is an integer in [1, kMaxComputeThreads],
// else from OpenBLAS's own count (OPENBLAS_NUM_THREADS, capped by OpenBLAS
// at the core count, or the core count), and sets OpenBLAS to one thread.
int ComputeThreads();

// Sets the thread count for later products (1..kMaxComputeThreads). Changes
// speed only, never bits.
// Errors:
//   InvalidArgument: threads outside [1, kMaxComputeThreads] (names it).
absl::Status SetComputeThreads(int threads);

// OpenBLAS's name for the kernel set it runs ("Haswell", "SkylakeX",
// "Cooperlake", ...; openblas_get_corename), which with the OpenBLAS
// version decides the bits. Includes the version: "SkylakeX (OpenBLAS
// 0.3.21 ...)".
std::string BlasCoreName();

// C = alpha * op(A) * op(B) + beta * C, row-major, as
// cblas_sgemm(CblasRowMajor, ...): op(A) is m x k (A stored [m, lda] or,
// when trans_a, [k, lda]), op(B) k x n (B stored [k, ldb] or, when trans_b,
// [n, ldb]), C m x n with leading dimension ldc. Host pointers, float32;
// C must not overlap A or B. 2*m*n*k FLOPs. m, n, k >= 0 (nothing to do
// when m or n is 0). Preconditions (checked by assert only): leading
// dimensions valid for the shapes.
void TiledSgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                const float* a, int lda, const float* b, int ldb, float beta,
                float* c, int ldc);

// The upper triangle of C = alpha * op(A) * op(A)^T + beta * C, as
// cblas_ssyrk(CblasRowMajor, CblasUpper, trans ? CblasTrans : CblasNoTrans,
// n, k, ...): op(A) is n x k (A stored [n, lda] or, when trans, [k, lda]),
// C n x n with leading dimension ldc; its strict lower triangle is not
// written. Diagonal tiles are ssyrk calls, tiles above them sgemm calls.
// Host pointers, float32; C must not overlap A. n*n*k FLOPs.
void TiledSyrkUpper(bool trans, int n, int k, float alpha, const float* a,
                    int lda, float beta, float* c, int ldc);

}  // namespace kernels
}  // namespace muon

#endif  // MUON_KERNELS_BLAS_TILES_H_
