// Newton-Schulz on cuBLAS (kernels/cuda/newton_schulz_cuda.h), nvcc.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "device/cuda_runtime.h"
#include "device/memory.h"
#include "device/runtime.h"
#include "device/stream.h"
#include "kernels/cuda/cublas_check.cuh"
#include "kernels/cuda/newton_schulz_cuda.h"
#include "kernels/cuda/ns_gemm_plan.h"
#include "kernels/cuda/ns_graph_cache.h"
#include "kernels/cuda/vec4.cuh"
#include "kernels/newton_schulz.h"
#include "kernels/ns_engine.h"

namespace muon {
namespace kernels {
namespace cuda {

// Instantiated CUDA graphs a context keeps (a few per bucket shape and
// slot in a step; each holds only its launch parameters).
constexpr int kMaxCudaGraphs = 64;

struct NsCudaContext::State {
  int device = 0;
  device::Stream* stream_wrapper = nullptr;  // Not owned.
  cudaStream_t stream = nullptr;             // stream_wrapper's handle.
  device::Allocator* allocator = nullptr;    // Not owned.
  cublasHandle_t handle = nullptr;           // Owned.
  // Given to cuBLAS (cublasSetWorkspace).
  device::DeviceMemory cublas_workspace;
  device::DeviceMemory scratch;  // Our iteration buffers (see Layout).
  SymmetricProducts symmetric;   // How symmetric products run.
  // MUON_NS_GRAM_RESTART_EVERY (0: the options' gram_restart_every).
  int gram_restart_every = 0;
  // The tile GEMMs of the symmetric product being enqueued (reused, so
  // that a product allocates nothing once the first has run).
  std::vector<NsGemm> tiles;
  // Whether calls are captured once and replayed as CUDA graphs
  // (MUON_NS_CUDA_GRAPHS, set_cuda_graphs), and the instantiated graphs
  // (cudaGraphExec_t), dropped whenever the scratch moves.
  bool cuda_graphs = false;
  // Why the capture that turned cuda_graphs off failed (OK: none did).
  absl::Status graph_capture_error;
  NsGraphCache graphs{kMaxCudaGraphs};
  // Whether the stream may be captured at all (StreamCapturable, asked
  // once at creation: the stream is the context's for its life).
  bool stream_capturable = false;
  // MUON_NS_GRAM_FP32_Z: the bf16 Gram iteration forms Z in fp32 and
  // rounds it once (FormGramPolynomialFp32).
  bool gram_fp32_z = false;
};

namespace {

// cuBLAS workspace per handle: NVIDIA recommends 32 MiB on Hopper.
constexpr int64_t kCublasWorkspaceBytes = int64_t{32} << 20;
// Threads per block of the reduction and elementwise kernels.
constexpr int kThreads = 256;
// Blocks per matrix of the first reduction pass (at most).
constexpr int kMaxNormBlocks = 1024;
// gridDim.y limit: one matrix of the bucket per y index.
constexpr int64_t kMaxBatch = 65535;
constexpr int64_t kAlign = 256;

int64_t AlignUp(int64_t bytes) {
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

// The GEMM types of a precision.
struct GemmTypes {
  cudaDataType_t data;          // A, B, C element type.
  cublasComputeType_t compute;  // Accumulation.
  int64_t elem_bytes;
};

GemmTypes TypesFor(GpuPrecision precision) {
  switch (precision) {
    case GpuPrecision::kBf16:
      return {CUDA_R_16BF, CUBLAS_COMPUTE_32F, 2};
    case GpuPrecision::kTf32:
      return {CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, 4};
    case GpuPrecision::kFp32:
      break;
  }
  return {CUDA_R_32F, CUBLAS_COMPUTE_32F, 4};
}

int NormBlocks(int64_t size) {
  const int64_t per_block = int64_t{kThreads} * 8;
  return static_cast<int>(std::max<int64_t>(
      1,
      std::min<int64_t>(kMaxNormBlocks, (size + per_block - 1) / per_block)));
}

// Byte offsets of the scratch regions for one (batch, shape, precision).
struct Layout {
  int64_t x0 = 0;       // X ping buffer (work type).
  int64_t x1 = 0;       // X pong buffer (work type).
  int64_t gram = 0;     // A: batch * m * m.
  int64_t poly = 0;     // B (Gram: Z): batch * m * m.
  int64_t q = 0;        // Gram only: Q, batch * m * m.
  int64_t tmp = 0;      // Gram only: Q Z or R Z, batch * m * m.
  int64_t z32 = 0;      // bf16 Gram with fp32 Z: Z in fp32, batch * m * m.
  int64_t partial = 0;  // double [batch, NormBlocks].
  int64_t denom = 0;    // float [batch].
  int64_t ptrs = 0;     // Batched tiles: A, B, C pointer arrays, each
                        // [batch * TileGemms()].
  int64_t total = 0;
};

Layout MakeLayout(int64_t batch, int64_t rows, int64_t cols,
                  GpuPrecision precision, bool gram,
                  const SymmetricProducts& symmetric, bool gram_fp32_z) {
  const GemmTypes t = TypesFor(precision);
  const int64_t m = std::min(rows, cols);
  const int64_t x_bytes = AlignUp(batch * rows * cols * t.elem_bytes);
  const int64_t g_bytes = AlignUp(batch * m * m * t.elem_bytes);
  Layout l;
  int64_t at = 0;
  l.x0 = at;
  at += x_bytes;
  l.x1 = at;
  at += x_bytes;
  l.gram = at;
  at += g_bytes;
  l.poly = at;
  at += g_bytes;
  l.q = at;
  l.tmp = at;
  l.z32 = at;
  if (gram) {
    at += g_bytes;
    l.tmp = at;
    at += g_bytes;
    l.z32 = at;
    if (gram_fp32_z && precision == GpuPrecision::kBf16) {
      at += AlignUp(batch * m * m * int64_t{sizeof(float)});
    }
  }
  l.partial = at;
  at += AlignUp(batch * NormBlocks(rows * cols) * int64_t{sizeof(double)});
  l.denom = at;
  at += AlignUp(batch * int64_t{sizeof(float)});
  l.ptrs = at;
  if (symmetric.mode == SymmetricMode::kBatched && symmetric.Tiled(m)) {
    at += AlignUp(3 * batch * symmetric.TileGemms() * int64_t{sizeof(void*)});
  }
  l.total = at;
  return l;
}

// ---- Kernels ---------------------------------------------------------------

// Block-wide sum of one double per thread, fixed tree order (deterministic).
__device__ double BlockSum(double v) {
  __shared__ double shared[kThreads];
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride)
      shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  return shared[0];
}

// Pass 1: partial[mat, block] = sum of squares of a fixed slice of matrix
// `mat` (blockIdx.y), in double (squares of floats are exact in double).
__global__ void SumSquaresKernel(const float* __restrict__ u, int64_t size,
                                 double* __restrict__ partial) {
  const float* x = u + static_cast<int64_t>(blockIdx.y) * size;
  double sum = 0.0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
       i < size; i += stride) {
    const double v = x[i];
    sum += v * v;
  }
  const double block = BlockSum(sum);
  if (threadIdx.x == 0) partial[blockIdx.y * gridDim.x + blockIdx.x] = block;
}

// Pass 2 (one block per matrix): denom[mat] = (float)max(norm_scale *
// sqrt(sum of partials), eps), as the CPU kernel's double arithmetic.
__global__ void FinishNormKernel(const double* __restrict__ partial, int blocks,
                                 double norm_scale, double eps,
                                 float* __restrict__ denom) {
  const double* p = partial + static_cast<int64_t>(blockIdx.x) * blocks;
  double sum = 0.0;
  for (int i = threadIdx.x; i < blocks; i += kThreads) sum += p[i];
  const double total = BlockSum(sum);
  if (threadIdx.x == 0) {
    // std::max(norm, eps) as the CPU kernel: a NaN norm stays NaN (fmax
    // would return eps).
    const double norm = __dmul_rn(norm_scale, sqrt(total));
    denom[blockIdx.x] = static_cast<float>(norm < eps ? eps : norm);
  }
}

__device__ __forceinline__ void Store(float* p, float v) { *p = v; }
__device__ __forceinline__ void Store(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16_rn(v);
}

// Pass 3: x = u / denom[mat] (IEEE float division, as torch's div_ and the
// CPU kernel), converted to the work type (one rounding to bf16).
template <typename T>
__global__ void ScaleKernel(const float* __restrict__ u, int64_t size,
                            const float* __restrict__ denom,
                            T* __restrict__ x) {
  const int64_t offset = static_cast<int64_t>(blockIdx.y) * size;
  const float d = denom[blockIdx.y];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
       i < size; i += stride) {
    Store(&x[offset + i], __fdiv_rn(u[offset + i], d));
  }
}

// The bits a work type T stores: fp32 as itself, bf16 as uint16_t (for
// Vec4's lanes), rounded as Store rounds.
template <typename T>
struct WorkBits;
template <>
struct WorkBits<float> {
  using type = float;
  static __device__ __forceinline__ float From(float v) { return v; }
};
template <>
struct WorkBits<__nv_bfloat16> {
  using type = uint16_t;
  static __device__ __forceinline__ uint16_t From(float v) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
};

// ScaleKernel in groups of four (each matrix's `groups` = size / 4 groups
// start at a group boundary: size is a multiple of 4).
template <typename T>
__global__ void ScaleVec4Kernel(
    const float4* __restrict__ u, int64_t groups,
    const float* __restrict__ denom,
    typename Vec4<typename WorkBits<T>::type>::type* __restrict__ x) {
  const int64_t offset = static_cast<int64_t>(blockIdx.y) * groups;
  const float d = denom[blockIdx.y];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
       i < groups; i += stride) {
    const float4 v = u[offset + i];
    typename Vec4<typename WorkBits<T>::type>::type out{};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      SetLane(out, k, WorkBits<T>::From(__fdiv_rn(GetLane(v, k), d)));
    }
    x[offset + i] = out;
  }
}

__global__ void Bf16ToFloatKernel(const __nv_bfloat16* __restrict__ x,
                                  int64_t n, float* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
       i < n; i += stride) {
    out[i] = __bfloat162float(x[i]);
  }
}

// Bf16ToFloatKernel in groups of four (widening is exact either way).
__global__ void Bf16ToFloatVec4Kernel(const uint2* __restrict__ x,
                                      int64_t groups,
                                      float4* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
       i < groups; i += stride) {
    const uint2 v = x[i];
    float4 o{};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      SetLane(o, k, __bfloat162float(__ushort_as_bfloat16(GetLane(v, k))));
    }
    out[i] = o;
  }
}

__device__ __forceinline__ float Load(const float* p) { return *p; }
__device__ __forceinline__ float Load(const __nv_bfloat16* p) {
  return __bfloat162float(*p);
}

// z[mat] += a * I for the m x m matrices of the batch (blockIdx.y = mat,
// matrix i at z + i * m * m): one fp32 addition and one rounding to T per
// diagonal element.
template <typename T>
__global__ void AddDiagonalKernel(T* __restrict__ z, int m, float a) {
  T* zm = z + static_cast<int64_t>(blockIdx.y) * m * m;
  for (int i = blockIdx.x * kThreads + threadIdx.x; i < m;
       i += gridDim.x * kThreads) {
    T* d = zm + static_cast<int64_t>(i) * m + i;
    Store(d, __fadd_rn(Load(d), a));
  }
}

constexpr int kMirrorBlock = 32;
constexpr int kMirrorRows = 8;  // Threads per block: 32 x 8.

// Loads the mirror of the square at rows r0.., columns c0.. of a
// column-major m x m matrix (its rows c0.., columns r0..) into square, so
// that square[j][i] = mat(c0 + i, r0 + j): each thread row reads along a
// column of mat, coalesced. Only the elements whose destination (r0 + j,
// c0 + i) lies in a tile below the diagonal (tiles of `edge`) are read:
// the others may be uncomputed (a square can straddle a tile boundary).
// The caller synchronizes the block afterwards.
template <typename T>
__device__ void LoadMirrorSquare(const T* __restrict__ mat, int m, int edge,
                                 int r0, int c0,
                                 T (&square)[kMirrorBlock][kMirrorBlock + 1]) {
  for (int j = threadIdx.y; j < kMirrorBlock; j += kMirrorRows) {
    const int src_col = r0 + j, src_row = c0 + threadIdx.x;
    if (src_col < m && src_row < m && src_col / edge > src_row / edge)
      square[j][threadIdx.x] = mat[src_row + static_cast<int64_t>(src_col) * m];
  }
}

// MirrorLowerTiles: in each of the batch's m x m column-major matrices
// (blockIdx.z), every element of a tile below the diagonal (row tile >
// column tile, tiles of `edge`) is copied from its mirror above. Those
// elements are only written and their mirrors only read: no race. A block
// moves one kMirrorBlock x kMirrorBlock square through shared memory (the
// classic tiled transpose), so that both the reads of the mirror and the
// writes run along columns, coalesced; squares with no element below the
// diagonal tiles return at once.
template <typename T>
__global__ void MirrorLowerTilesKernel(T* __restrict__ c, int m, int edge) {
  __shared__ T square[kMirrorBlock][kMirrorBlock + 1];
  T* mat = c + static_cast<int64_t>(blockIdx.z) * m * m;
  for (int64_t by = blockIdx.y; by * kMirrorBlock < m; by += gridDim.y) {
    for (int64_t bx = blockIdx.x; bx * kMirrorBlock < m; bx += gridDim.x) {
      // Destination rows r0.., columns c0.. (a square below the diagonal
      // tiles has its rows' tiles past its columns').
      const int r0 = static_cast<int>(bx * kMirrorBlock);
      const int c0 = static_cast<int>(by * kMirrorBlock);
      const int r_last = min(r0 + kMirrorBlock, m) - 1;
      if (r_last / edge <= c0 / edge) continue;  // Uniform per block.
      LoadMirrorSquare(mat, m, edge, r0, c0, square);
      __syncthreads();
      for (int j = threadIdx.y; j < kMirrorBlock; j += kMirrorRows) {
        const int r = r0 + threadIdx.x, col = c0 + j;
        if (r < m && col < m && r / edge > col / edge)
          mat[r + static_cast<int64_t>(col) * m] = square[threadIdx.x][j];
      }
      __syncthreads();
    }
  }
}

// Z = bf16(b R + a I + P) in each of the batch's m x m column-major
// matrices (blockIdx.z): R bf16 (exact in fp32), b R rounded to fp32, a
// added on the diagonal, then P = c R R (fp32) added and the sum rounded
// to bf16 once. Only P's tiles on and above the diagonal (tiles of
// `edge`; edge = m: all of P) were computed: an element below them takes
// its mirror's P, moved through shared memory as MirrorLowerTilesKernel
// moves it, so that every read and write runs along columns, coalesced.
__global__ void GramPolynomialFinishKernel(const __nv_bfloat16* __restrict__ r,
                                           const float* __restrict__ p, int m,
                                           int edge, float a, float b,
                                           __nv_bfloat16* __restrict__ z) {
  __shared__ float mirror[kMirrorBlock][kMirrorBlock + 1];
  const int64_t mm = static_cast<int64_t>(m) * m;
  const __nv_bfloat16* rm = r + static_cast<int64_t>(blockIdx.z) * mm;
  const float* pm = p + static_cast<int64_t>(blockIdx.z) * mm;
  __nv_bfloat16* zm = z + static_cast<int64_t>(blockIdx.z) * mm;
  for (int64_t by = blockIdx.y; by * kMirrorBlock < m; by += gridDim.y) {
    for (int64_t bx = blockIdx.x; bx * kMirrorBlock < m; bx += gridDim.x) {
      // Rows r0.., columns c0.. of Z.
      const int r0 = static_cast<int>(bx * kMirrorBlock);
      const int c0 = static_cast<int>(by * kMirrorBlock);
      const int r_last = min(r0 + kMirrorBlock, m) - 1;
      const bool mirrored = r_last / edge > c0 / edge;  // Uniform per block.
      if (mirrored) {
        LoadMirrorSquare(pm, m, edge, r0, c0, mirror);
        __syncthreads();
      }
      for (int j = threadIdx.y; j < kMirrorBlock; j += kMirrorRows) {
        const int row = r0 + threadIdx.x, col = c0 + j;
        if (row >= m || col >= m) continue;
        const int64_t at = row + static_cast<int64_t>(col) * m;
        const float pv =
            row / edge > col / edge ? mirror[threadIdx.x][j] : pm[at];
        float v = __fmul_rn(b, __bfloat162float(rm[at]));
        if (row == col) v = __fadd_rn(v, a);
        zm[at] = __float2bfloat16_rn(__fadd_rn(v, pv));
      }
      if (mirrored) __syncthreads();
    }
  }
}

// The byte offsets of a symmetric product's tiles of one size (from their
// matrices' starts in the A, B and C buffers).
struct TileOffsets {
  int count;
  long long a[kMaxSymmetricTiles * (kMaxSymmetricTiles + 1) / 2];
  long long b[kMaxSymmetricTiles * (kMaxSymmetricTiles + 1) / 2];
  long long c[kMaxSymmetricTiles * (kMaxSymmetricTiles + 1) / 2];
};

// Passed by value to FillTilePointersKernel: within CUDA's 4 KiB kernel
// parameter limit (older toolkits and drivers) with the other arguments.
static_assert(sizeof(TileOffsets) <= 3400,
              "TileOffsets outgrows the kernel parameter space");

// The pointer arrays of cublasGemmBatchedEx for `batch` matrices' tiles:
// entry mat * count + t is tile t of matrix mat (matrix mat at a + mat *
// stride_a bytes, likewise b and c).
__global__ void FillTilePointersKernel(const char* a, const char* b, char* c,
                                       long long stride_a, long long stride_b,
                                       long long stride_c, TileOffsets off,
                                       int batch, const void** pa,
                                       const void** pb, void** pc) {
  const int total = off.count * batch;
  for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += gridDim.x * blockDim.x) {
    const int mat = idx / off.count;
    const int t = idx % off.count;
    pa[idx] = a + mat * stride_a + off.a[t];
    pb[idx] = b + mat * stride_b + off.b[t];
    pc[idx] = c + mat * stride_c + off.c[t];
  }
}

int ElementwiseBlocks(int64_t n) {
  return static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t{1} << 16)));
}

// ---- GEMM -----------------------------------------------------------------

// One column-major GEMM (or a strided batch of them):
//   C = alpha * op(A) op(B) + beta * C, alpha/beta in fp32.
struct Gemm {
  cublasOperation_t trans_a;
  cublasOperation_t trans_b;
  int m, n, k;
  float alpha;
  const void* a;
  int lda;
  long long stride_a;
  const void* b;
  int ldb;
  long long stride_b;
  float beta;
  void* c;
  int ldc;
  long long stride_c;
};

// `c_type`: C's element type (t.data, or CUDA_R_32F for bf16 inputs with
// an fp32 output, a combination cublasGemmEx supports with
// CUBLAS_COMPUTE_32F).
absl::Status RunGemm(cublasHandle_t handle, const GemmTypes& t, int batch,
                     const Gemm& g, cudaDataType_t c_type) {
  if (batch == 1) {
    MUON_CUBLAS_RETURN_IF_ERROR(
        cublasGemmEx(handle, g.trans_a, g.trans_b, g.m, g.n, g.k, &g.alpha, g.a,
                     t.data, g.lda, g.b, t.data, g.ldb, &g.beta, g.c, c_type,
                     g.ldc, t.compute, CUBLAS_GEMM_DEFAULT));
  } else {
    MUON_CUBLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(
        handle, g.trans_a, g.trans_b, g.m, g.n, g.k, &g.alpha, g.a, t.data,
        g.lda, g.stride_a, g.b, t.data, g.ldb, g.stride_b, &g.beta, g.c, c_type,
        g.ldc, g.stride_c, batch, t.compute, CUBLAS_GEMM_DEFAULT));
  }
  return absl::OkStatus();
}

absl::Status RunGemm(cublasHandle_t handle, const GemmTypes& t, int batch,
                     const Gemm& g) {
  return RunGemm(handle, t, batch, g, t.data);
}

absl::Status WithContext(absl::Status status, const char* what, int iteration) {
  if (status.ok()) return status;
  return absl::Status(
      status.code(), absl::StrCat("NewtonSchulzBatched: ", what, " (iteration ",
                                  iteration, "): ", status.message()));
}

// Enqueues out[i] = x[i] widened, i in [0, n), on `stream`, in groups of
// four where x and out allow (InGroupsOfFour). The caller checks the
// launches.
void WidenOutput(const __nv_bfloat16* x, int64_t n, float* out,
                 cudaStream_t stream) {
  auto groups_of_four = [&](int64_t groups) {
    Bf16ToFloatVec4Kernel<<<ElementwiseBlocks(groups), kThreads, 0, stream>>>(
        reinterpret_cast<const uint2*>(x), groups,
        reinterpret_cast<float4*>(out));
  };
  auto one_by_one = [&](int64_t done, int64_t count) {
    Bf16ToFloatKernel<<<ElementwiseBlocks(count), kThreads, 0, stream>>>(
        x + done, count, out + done);
  };
  InGroupsOfFour(AlignedForFour<uint16_t>(x) && AlignedForFour<float>(out), n,
                 groups_of_four, one_by_one);
}

// Normalises `batch` fp32 matrices of `size` elements into x (work type T).
template <typename T>
absl::Status Normalize(NsCudaContext::State* s, const Layout& l, const float* u,
                       int64_t batch, int64_t size,
                       const NewtonSchulzOptions& options, T* x) {
  char* base = static_cast<char*>(s->scratch.data());
  double* partial = reinterpret_cast<double*>(base + l.partial);
  float* denom = reinterpret_cast<float*>(base + l.denom);
  const int blocks = NormBlocks(size);
  const unsigned int y = static_cast<unsigned int>(batch);
  SumSquaresKernel<<<dim3(blocks, y), kThreads, 0, s->stream>>>(u, size,
                                                                partial);
  MUON_CUDA_RETURN_IF_LAUNCH_FAILED("SumSquaresKernel");
  FinishNormKernel<<<y, kThreads, 0, s->stream>>>(
      partial, blocks, options.norm_scale, options.eps, denom);
  MUON_CUDA_RETURN_IF_LAUNCH_FAILED("FinishNormKernel");
  using Bits = typename WorkBits<T>::type;
  if (size % 4 == 0 && AlignedForFour<float>(u) && AlignedForFour<Bits>(x)) {
    const int64_t groups = size / 4;
    const int scale_blocks = std::min(ElementwiseBlocks(groups), 4096);
    ScaleVec4Kernel<T><<<dim3(scale_blocks, y), kThreads, 0, s->stream>>>(
        reinterpret_cast<const float4*>(u), groups, denom,
        reinterpret_cast<typename Vec4<Bits>::type*>(x));
  } else {
    const int scale_blocks = std::min(ElementwiseBlocks(size), 4096);
    ScaleKernel<T>
        <<<dim3(scale_blocks, y), kThreads, 0, s->stream>>>(u, size, denom, x);
  }
  MUON_CUDA_RETURN_IF_LAUNCH_FAILED("ScaleKernel");
  return absl::OkStatus();
}

// Destroys the context's CUDA graphs (a graph still running is freed when
// it finishes: cudaGraphExecDestroy).
void DropGraphs(NsCudaContext::State* s) {
  for (void* graph : s->graphs.Clear()) {
    (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph));
  }
}

absl::Status ReserveState(NsCudaContext::State* s, const Layout& l) {
  if (s->scratch.bytes() >= l.total) return absl::OkStatus();
  device::CudaDeviceGuard device_guard(s->device);
  if (!device_guard.status().ok()) return device_guard.status();
  // Work already enqueued may still use the old buffer.
  MUON_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s->stream));
  DropGraphs(s);  // they point into the old buffer
  s->scratch = device::DeviceMemory();
  absl::StatusOr<device::DeviceMemory> buffer =
      device::DeviceMemory::Allocate(s->allocator, l.total);
  if (!buffer.ok()) return buffer.status();
  s->scratch = std::move(*buffer);
  return absl::OkStatus();
}

// `options`, or, when the context has MUON_NS_GRAM_RESTART_EVERY, a copy
// in *storage with that restart: no copy (a schedule's coefficients would
// allocate) when it has none.
const NewtonSchulzOptions& Effective(const NsCudaContext::State* s,
                                     const NewtonSchulzOptions& options,
                                     NewtonSchulzOptions* storage) {
  if (s->gram_restart_every <= 0) return options;
  *storage = options;
  storage->gram_restart_every = s->gram_restart_every;
  return *storage;
}

// The iteration's device buffers (work type: bf16 or fp32); x and x_next
// swap after every X update, q and tmp after every Q Z.
struct IterationBuffers {
  void* x;
  void* x_next;
  void* gram;   // A, or Gram's R.
  void* poly;   // B, or Gram's Z.
  void* q;      // Gram only.
  void* tmp;    // Gram only.
  float* z32;   // bf16 Gram with fp32 Z only: Z in fp32 (Layout::z32).
  void** ptrs;  // Batched tiles' pointer arrays (Layout::ptrs).
  void* Get(NsBuffer which) const {
    switch (which) {
      case NsBuffer::kX:
        return x;
      case NsBuffer::kXNext:
        return x_next;
      case NsBuffer::kGram:
        return gram;
      case NsBuffer::kPoly:
        return poly;
      case NsBuffer::kQ:
        return q;
      case NsBuffer::kTmp:
        break;
    }
    return tmp;
  }
};

// The bucket's shape and the GEMM types.
struct IterationShape {
  int batch;
  int64_t rows, cols;
  GemmTypes types;
  bool bf16;
  int64_t m() const { return std::min(rows, cols); }
};

// Where a product writes: the C buffer (g.offset_c and the strides count
// its elements), its element type and size. By default g.c in the work
// type (DefaultOut); the bf16 Gram iteration's fp32 Z writes fp32.
struct ProductOut {
  void* c;
  cudaDataType_t type;
  int64_t elem_bytes;
};

ProductOut DefaultOut(const IterationShape& shape, const IterationBuffers& buf,
                      const NsGemm& g) {
  return {buf.Get(g.c), shape.types.data, shape.types.elem_bytes};
}

absl::Status RunPlanned(NsCudaContext::State* s, const IterationShape& shape,
                        const IterationBuffers& buf, const NsGemm& g,
                        const ProductOut& out) {
  const int64_t e = shape.types.elem_bytes;
  auto at = [&](NsBuffer which, int64_t offset) {
    return static_cast<char*>(buf.Get(which)) + offset * e;
  };
  return RunGemm(
      s->handle, shape.types, shape.batch,
      {g.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N,
       g.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.m, g.n, g.k,
       static_cast<float>(g.alpha), at(g.a, g.offset_a), g.lda, g.stride_a,
       at(g.b, g.offset_b), g.ldb, g.stride_b, static_cast<float>(g.beta),
       static_cast<char*>(out.c) + g.offset_c * out.elem_bytes, g.ldc,
       g.stride_c},
      out.type);
}

absl::Status RunPlanned(NsCudaContext::State* s, const IterationShape& shape,
                        const IterationBuffers& buf, const NsGemm& g) {
  return RunPlanned(s, shape, buf, g, DefaultOut(shape, buf, g));
}

// The tiles of `tiles` whose sizes are t's, as one pointer-array batched
// GEMM over the bucket's matrices: a kernel fills the A, B and C pointer
// arrays in buf.ptrs (stream-ordered: the previous group's GEMM has read
// them), then cublasGemmBatchedEx.
absl::Status RunTileGroup(NsCudaContext::State* s, const IterationShape& shape,
                          const IterationBuffers& buf,
                          const std::vector<NsGemm>& tiles, const NsGemm& t,
                          const ProductOut& out) {
  const int64_t e = shape.types.elem_bytes;
  TileOffsets off{};
  for (const NsGemm& u : tiles) {
    if (u.m != t.m || u.n != t.n) continue;
    off.a[off.count] = u.offset_a * e;
    off.b[off.count] = u.offset_b * e;
    off.c[off.count] = u.offset_c * out.elem_bytes;
    ++off.count;
  }
  const int total = off.count * shape.batch;
  const void** pa = const_cast<const void**>(buf.ptrs);
  const void** pb = pa + total;
  void** pc = buf.ptrs + 2 * total;
  FillTilePointersKernel<<<(total + kThreads - 1) / kThreads, kThreads, 0,
                           s->stream>>>(
      static_cast<const char*>(buf.Get(t.a)),
      static_cast<const char*>(buf.Get(t.b)), static_cast<char*>(out.c),
      t.stride_a * e, t.stride_b * e, t.stride_c * out.elem_bytes, off,
      shape.batch, pa, pb, pc);
  MUON_CUDA_RETURN_IF_LAUNCH_FAILED("FillTilePointersKernel");
  const float alpha = static_cast<float>(t.alpha);
  const float beta = static_cast<float>(t.beta);
  MUON_CUBLAS_RETURN_IF_ERROR(cublasGemmBatchedEx(
      s->handle, t.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N,
      t.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N, t.m, t.n, t.k, &alpha, pa,
      shape.types.data, t.lda, pb, shape.types.data, t.ldb, &beta, pc, out.type,
      t.ldc, total, shape.types.compute, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

// The tiles on and above the diagonal: one GEMM each (kLoop), or one
// batched GEMM per tile size (kBatched; one size when `tiles` divides m
// into multiples of 8, else up to 3: full, last column, last corner).
absl::Status RunUpperTiles(NsCudaContext::State* s, const IterationShape& shape,
                           const IterationBuffers& buf, const NsGemm& g,
                           const ProductOut& out) {
  UpperTileGemms(g, s->symmetric.tiles, &s->tiles);
  const std::vector<NsGemm>& tiles = s->tiles;
  // cuBLAS's batch count is at most 65535 (kMaxBatch): a bucket of more
  // matrices than that many tiles' worth runs the tiles in turn.
  const bool loop =
      s->symmetric.mode == SymmetricMode::kLoop ||
      static_cast<int64_t>(tiles.size()) * shape.batch > kMaxBatch;
  if (loop) {
    for (const NsGemm& t : tiles) {
      MUON_CU_RETURN_IF_ERROR(RunPlanned(s, shape, buf, t, out));
    }
    return absl::OkStatus();
  }
  for (size_t i = 0; i < tiles.size(); ++i) {
    bool seen = false;  // An earlier tile of the same size ran this group.
    for (size_t j = 0; j < i && !seen; ++j) {
      seen = tiles[j].m == tiles[i].m && tiles[j].n == tiles[i].n;
    }
    if (!seen)
      MUON_CU_RETURN_IF_ERROR(
          RunTileGroup(s, shape, buf, tiles, tiles[i], out));
  }
  return absl::OkStatus();
}

// g's product into `out`: only its tiles on and above the diagonal
// (RunUpperTiles) when `tiled` and the context's SymmetricProducts tile an
// m x m output, else all of it (RunPlanned). Returns the edge of the tiles
// left uncomputed below the diagonal: g.m when none are.
absl::StatusOr<int> RunUpperOrWhole(NsCudaContext::State* s,
                                    const IterationShape& shape,
                                    const IterationBuffers& buf,
                                    const NsGemm& g, const ProductOut& out,
                                    bool tiled) {
  if (!tiled || !s->symmetric.Tiled(g.m)) {
    MUON_CU_RETURN_IF_ERROR(RunPlanned(s, shape, buf, g, out));
    return static_cast<int>(g.m);
  }
  MUON_CU_RETURN_IF_ERROR(RunUpperTiles(s, shape, buf, g, out));
  return SymmetricTileEdge(g.m, s->symmetric.tiles);
}

// The grid of the mirror kernels over `batch` m x m matrices: one block
// per kMirrorBlock square (each grid dimension at most 65535, the kernels
// stride past that), one grid layer per matrix.
dim3 MirrorGrid(int64_t m, int64_t batch) {
  const unsigned int squares = static_cast<unsigned int>(
      std::min<int64_t>((m + kMirrorBlock - 1) / kMirrorBlock, 65535));
  return dim3(squares, squares, static_cast<unsigned int>(batch));
}

// A product whose m x m output is symmetric element for element (see
// UpperTileGemms): once the context's SymmetricProducts tiles m (and
// `tiled`), the GEMMs of the tiles on and above the diagonal, then the
// mirror copy; else g as one GEMM. Every element is the same sum of the
// same products either way (ns_gemm_plan_test proves the plan bitwise on a
// simulator); cuBLAS may pick other kernels for the tiles than for the
// whole, so its rounding can differ in the last place from one full GEMM's.
absl::Status RunSymmetric(NsCudaContext::State* s, const IterationShape& shape,
                          const IterationBuffers& buf, const NsGemm& g,
                          bool tiled = true) {
  const ProductOut out = DefaultOut(shape, buf, g);
  absl::StatusOr<int> edge = RunUpperOrWhole(s, shape, buf, g, out, tiled);
  if (!edge.ok() || *edge == g.m) return edge.status();
  const dim3 grid = MirrorGrid(g.m, shape.batch);
  const dim3 block(kMirrorBlock, kMirrorRows);
  void* c = static_cast<char*>(out.c) + g.offset_c * out.elem_bytes;
  // The copy moves bits: bf16 as 16-bit and fp32 as 32-bit words.
  if (shape.bf16) {
    MirrorLowerTilesKernel<uint16_t>
        <<<grid, block, 0, s->stream>>>(static_cast<uint16_t*>(c), g.m, *edge);
  } else {
    MirrorLowerTilesKernel<uint32_t>
        <<<grid, block, 0, s->stream>>>(static_cast<uint32_t*>(c), g.m, *edge);
  }
  MUON_CUDA_RETURN_IF_LAUNCH_FAILED("MirrorLowerTilesKernel");
  return absl::OkStatus();
}

absl::Status CopyAsync(NsCudaContext::State* s, void* dst, const void* src,
                       int64_t bytes) {
  MUON_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes),
                      cudaMemcpyDeviceToDevice, s->stream));
  return absl::OkStatus();
}

// The standard iteration (NsStepPlan), `steps` X updates.
absl::Status StandardIterations(NsCudaContext::State* s,
                                const IterationShape& shape,
                                const NewtonSchulzOptions& options,
                                IterationBuffers* buf) {
  const int64_t m = shape.m();
  const int64_t gram_bytes = shape.batch * m * m * shape.types.elem_bytes;
  const int64_t x_bytes =
      shape.batch * shape.rows * shape.cols * shape.types.elem_bytes;
  for (int step = 0; step < NewtonSchulzIterations(options); ++step) {
    const NsStepPlan plan = PlanNewtonSchulzStep(
        shape.rows, shape.cols, NewtonSchulzCoefficients(options, step));
    MUON_CU_RETURN_IF_ERROR(WithContext(RunSymmetric(s, shape, *buf, plan.gram),
                                        "A = X X^T", step));
    // B = b*A + c*A*A: B starts as a copy of A, then beta = b.
    MUON_CU_RETURN_IF_ERROR(WithContext(
        CopyAsync(s, buf->poly, buf->gram, gram_bytes), "copy A", step));
    MUON_CU_RETURN_IF_ERROR(WithContext(RunSymmetric(s, shape, *buf, plan.poly),
                                        "B = b*A + c*A*A", step));
    // X' = a*X + B*X: X' starts as a copy of X, then beta = a.
    MUON_CU_RETURN_IF_ERROR(WithContext(
        CopyAsync(s, buf->x_next, buf->x, x_bytes), "copy X", step));
    MUON_CU_RETURN_IF_ERROR(WithContext(RunPlanned(s, shape, *buf, plan.update),
                                        "X = a*X + B*X", step));
    std::swap(buf->x, buf->x_next);
  }
  return absl::OkStatus();
}

// Z += a I on the bucket's m x m matrices.
absl::Status AddDiagonal(NsCudaContext::State* s, const IterationShape& shape,
                         void* z, float a) {
  const int m = static_cast<int>(shape.m());
  const dim3 grid((m + kThreads - 1) / kThreads,
                  static_cast<unsigned int>(shape.batch));
  if (shape.bf16) {
    AddDiagonalKernel<__nv_bfloat16><<<grid, kThreads, 0, s->stream>>>(
        static_cast<__nv_bfloat16*>(z), m, a);
  } else {
    AddDiagonalKernel<float>
        <<<grid, kThreads, 0, s->stream>>>(static_cast<float*>(z), m, a);
  }
  MUON_CUDA_RETURN_IF_LAUNCH_FAILED("AddDiagonalKernel");
  return absl::OkStatus();
}

// bf16 Z = a I + b R + c R R formed in fp32 and rounded once: P = c R R
// into buf.z32 (bf16 R, fp32 output: `square` with beta = 0, its tiles on
// and above the diagonal alone when the product is tiled (`tiled` and the
// context's SymmetricProducts), else whole), then one pass
// (GramPolynomialFinishKernel) Z = bf16(b R + a I + P) into buf.poly,
// below the diagonal tiles from P's mirror. The default way
// (GramInnerStep) rounds b R + c R R to bf16 and then rounds again after
// adding a, which loses what cancels: near convergence a + b r + c r^2 =
// 0.70 is left of 3.44 - 2.74.
absl::Status FormGramPolynomialFp32(NsCudaContext::State* s,
                                    const IterationShape& shape,
                                    const IterationBuffers& buf,
                                    const NsGemm& square,
                                    const std::array<double, 3>& abc,
                                    bool tiled) {
  const int m = static_cast<int>(shape.m());
  NsGemm rr = square;  // alpha = c
  rr.beta = 0.0;
  const ProductOut p{buf.z32, CUDA_R_32F, int64_t{sizeof(float)}};
  absl::StatusOr<int> edge = RunUpperOrWhole(s, shape, buf, rr, p, tiled);
  if (!edge.ok()) return edge.status();
  GramPolynomialFinishKernel<<<MirrorGrid(m, shape.batch),
                               dim3(kMirrorBlock, kMirrorRows), 0, s->stream>>>(
      static_cast<const __nv_bfloat16*>(buf.gram), buf.z32, m, *edge,
      static_cast<float>(abc[0]), static_cast<float>(abc[1]),
      static_cast<__nv_bfloat16*>(buf.poly));
  MUON_CUDA_RETURN_IF_LAUNCH_FAILED("GramPolynomialFinishKernel");
  return absl::OkStatus();
}

// Z = a I + b R + c R R into buf->poly: in fp32, rounded once, for bf16
// with the context's gram_fp32_z (FormGramPolynomialFp32); else b R +
// c R R in the work type (beta = b on a copy of R; a symmetric product,
// tiled when `tiled`), then a added to the diagonal.
absl::Status FormGramPolynomial(NsCudaContext::State* s,
                                const IterationShape& shape,
                                const IterationBuffers& buf,
                                const NsGemm& square,
                                const std::array<double, 3>& abc, bool tiled) {
  if (shape.bf16 && s->gram_fp32_z) {
    return FormGramPolynomialFp32(s, shape, buf, square, abc, tiled);
  }
  const int64_t m = shape.m();
  const int64_t mm_bytes = shape.batch * m * m * shape.types.elem_bytes;
  MUON_CU_RETURN_IF_ERROR(CopyAsync(s, buf.poly, buf.gram, mm_bytes));
  MUON_CU_RETURN_IF_ERROR(RunSymmetric(s, shape, buf, square, tiled));
  return AddDiagonal(s, shape, buf.poly, static_cast<float>(abc[0]));
}

// One Gram iteration inside a restart block (see NsGramPlan): Z from R,
// Q from Z (j = 0: a copy), and R = Z R Z unless it is the block's last.
absl::Status GramInnerStep(NsCudaContext::State* s, const IterationShape& shape,
                           const NewtonSchulzOptions& options, int step, int j,
                           bool last, IterationBuffers* buf) {
  const int64_t m = shape.m();
  const int64_t mm_bytes = shape.batch * m * m * shape.types.elem_bytes;
  const std::array<double, 3> abc = NewtonSchulzCoefficients(options, step);
  const NsGramPlan plan = PlanGramNewtonSchulz(shape.rows, shape.cols, abc);
  // R is symmetric element for element as X X^T (j = 0), and after every
  // product when all run as symmetric products (gram_all).
  const bool all = s->symmetric.gram_all;
  MUON_CU_RETURN_IF_ERROR(
      WithContext(FormGramPolynomial(s, shape, *buf, plan.square, abc,
                                     /*tiled=*/j == 0 || all),
                  "Z = a*I + b*R + c*R*R", step));
  if (j == 0) {
    MUON_CU_RETURN_IF_ERROR(
        WithContext(CopyAsync(s, buf->q, buf->poly, mm_bytes), "Q = Z", step));
  } else {
    MUON_CU_RETURN_IF_ERROR(WithContext(
        RunSymmetric(s, shape, *buf, plan.accumulate, all), "Q = Q Z", step));
    std::swap(buf->q, buf->tmp);
  }
  if (last) return absl::OkStatus();
  MUON_CU_RETURN_IF_ERROR(WithContext(
      RunSymmetric(s, shape, *buf, plan.right, all), "T = R Z", step));
  return WithContext(RunSymmetric(s, shape, *buf, plan.left, all), "R = Z T",
                     step);
}

// Gram Newton-Schulz (NsGramPlan): one X update per restart block.
absl::Status GramIterations(NsCudaContext::State* s,
                            const IterationShape& shape,
                            const NewtonSchulzOptions& options,
                            IterationBuffers* buf) {
  const int steps = NewtonSchulzIterations(options);
  const int every = std::max(options.gram_restart_every, 1);
  for (int start = 0; start < steps; start += every) {
    const int len = std::min(every, steps - start);
    const NsGramPlan plan = PlanGramNewtonSchulz(
        shape.rows, shape.cols, NewtonSchulzCoefficients(options, start));
    MUON_CU_RETURN_IF_ERROR(WithContext(RunSymmetric(s, shape, *buf, plan.gram),
                                        "R = X X^T", start));
    for (int j = 0; j < len; ++j) {
      MUON_CU_RETURN_IF_ERROR(
          GramInnerStep(s, shape, options, start + j, j, j + 1 == len, buf));
    }
    MUON_CU_RETURN_IF_ERROR(
        WithContext(RunPlanned(s, shape, *buf, plan.apply), "X = Q X", start));
    std::swap(buf->x, buf->x_next);
  }
  return absl::OkStatus();
}

// Enqueues `call` on s->stream, in the scratch of layout `l` (reserved):
// normalisation, the iterations (Gram when `gram`), the bf16 widening or
// the fp32 copy into out.
absl::Status EnqueueCall(NsCudaContext::State* s, const Layout& l, bool gram,
                         const NsCall& call) {
  const NewtonSchulzOptions& options = *call.options;
  const int64_t size = call.rows * call.cols;
  char* base = static_cast<char*>(s->scratch.data());
  const bool bf16 = call.precision == GpuPrecision::kBf16;
  // X ping-pong in two scratch buffers of the work type, widened (bf16) or
  // copied (fp32, tf32) into out at the end. cuBLAS sees only the
  // scratch, aligned to 256 bytes whatever out's alignment, so that the
  // GEMMs it picks, and the bits, do not depend on where out lies.
  IterationBuffers buf;
  buf.gram = base + l.gram;
  buf.poly = base + l.poly;
  buf.q = base + l.q;
  buf.tmp = base + l.tmp;
  buf.z32 = reinterpret_cast<float*>(base + l.z32);
  buf.ptrs = reinterpret_cast<void**>(base + l.ptrs);
  buf.x = base + l.x0;
  buf.x_next = base + l.x1;
  if (bf16) {
    MUON_CU_RETURN_IF_ERROR(Normalize(s, l, call.u, call.batch, size, options,
                                      static_cast<__nv_bfloat16*>(buf.x)));
  } else {
    MUON_CU_RETURN_IF_ERROR(Normalize(s, l, call.u, call.batch, size, options,
                                      static_cast<float*>(buf.x)));
  }
  const IterationShape shape{static_cast<int>(call.batch), call.rows, call.cols,
                             TypesFor(call.precision), bf16};
  MUON_CU_RETURN_IF_ERROR(gram ? GramIterations(s, shape, options, &buf)
                               : StandardIterations(s, shape, options, &buf));
  if (bf16) {
    WidenOutput(static_cast<const __nv_bfloat16*>(buf.x), call.batch * size,
                call.out, s->stream);
    MUON_CUDA_RETURN_IF_LAUNCH_FAILED("Bf16ToFloatKernel");
  } else {
    MUON_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(call.out, buf.x, call.batch * size * sizeof(float),
                        cudaMemcpyDeviceToDevice, s->stream));
  }
  return absl::OkStatus();
}

// Captures what `enqueue` puts on s->stream as a CUDA graph
// (cudaStreamCaptureModeThreadLocal: other threads may go on using CUDA)
// and instantiates it. Errors: enqueue's; the CUDA error of the capture
// or the instantiation.
template <typename Enqueue>
absl::StatusOr<cudaGraphExec_t> CaptureGraph(NsCudaContext::State* s,
                                             Enqueue&& enqueue) {
  MUON_CUDA_RETURN_IF_ERROR(
      cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeThreadLocal));
  const absl::Status enqueued = enqueue();
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(s->stream, &graph);
  if (!enqueued.ok() || ended != cudaSuccess) {
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    if (!enqueued.ok()) return enqueued;
    return device::CudaErrorToStatus(
        static_cast<int>(ended),
        "cudaStreamEndCapture (Newton-Schulz captured as a CUDA graph)");
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  MUON_CUDA_RETURN_IF_ERROR(made);
  return exec;
}

// Whether a stream may ever be captured: a stream of its own (capture
// cannot take the legacy or per-thread default stream) and non-blocking
// (another thread's work on the legacy default stream would end a
// blocking stream's capture). Asked once, when the context is created.
bool StreamCapturable(cudaStream_t stream) {
  if (stream == nullptr || stream == cudaStreamLegacy ||
      stream == cudaStreamPerThread) {
    return false;
  }
  unsigned int flags = 0;
  if (cudaStreamGetFlags(stream, &flags) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return (flags & cudaStreamNonBlocking) != 0;
}

// Whether this call may capture the context's stream: StreamCapturable,
// and not being captured by the caller already (its graph then takes the
// direct launches).
bool CanCapture(const NsCudaContext::State* s) {
  if (!s->stream_capturable) return false;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s->stream, &capturing) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return capturing == cudaStreamCaptureStatusNone;
}

// Launches the graph of `call` on s->stream, capturing `enqueue` into it
// first when the context has none (the least recently used one is dropped
// beyond kMaxCudaGraphs). A capture that fails (cuBLAS or CUDA refusing
// it) turns the context's graphs off and runs `enqueue` directly.
// Errors: enqueue's; cudaGraphLaunch's.
template <typename Enqueue>
absl::Status LaunchAsGraph(NsCudaContext::State* s, const NsCall& call,
                           Enqueue&& enqueue) {
  auto exec = static_cast<cudaGraphExec_t>(s->graphs.Find(call));
  if (exec == nullptr) {
    absl::StatusOr<cudaGraphExec_t> captured = CaptureGraph(s, enqueue);
    if (!captured.ok()) {
      s->cuda_graphs = false;  // the captured work was discarded, not run
      s->graph_capture_error = captured.status();
      return enqueue();
    }
    exec = *captured;
    if (void* dropped = s->graphs.Insert(call, exec)) {
      (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(dropped));
    }
  }
  MUON_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, s->stream));
  return absl::OkStatus();
}

// The context's settings from the environment into *s: MUON_NS_SYMMETRIC*
// (ParseSymmetricProducts), MUON_NS_GRAM_RESTART_EVERY,
// MUON_NS_CUDA_GRAPHS and MUON_NS_GRAM_FP32_Z (0 or 1). Returns an empty
// string, or the error of the first bad one (naming it and its value).
std::string ReadEnvironment(NsCudaContext::State* s) {
  std::string error = ParseSymmetricProducts(
      std::getenv("MUON_NS_SYMMETRIC"), std::getenv("MUON_NS_SYMMETRIC_TILES"),
      std::getenv("MUON_NS_SYMMETRIC_MIN_EDGE"),
      std::getenv("MUON_NS_SYMMETRIC_GRAM"), &s->symmetric);
  if (error.empty()) {
    error = ParseGramRestartEvery(std::getenv("MUON_NS_GRAM_RESTART_EVERY"),
                                  &s->gram_restart_every);
  }
  if (error.empty()) {
    error =
        ParseCudaGraphs(std::getenv("MUON_NS_CUDA_GRAPHS"), &s->cuda_graphs);
  }
  int64_t fp32_z = 0;
  if (error.empty()) {
    error = ParseEnvInteger("MUON_NS_GRAM_FP32_Z",
                            std::getenv("MUON_NS_GRAM_FP32_Z"), 0, 1, &fp32_z);
  }
  s->gram_fp32_z = fp32_z == 1;
  return error;
}

}  // namespace

absl::Status CublasStatusToStatus(int cublas_status, const char* expr) {
  const cublasStatus_t st = static_cast<cublasStatus_t>(cublas_status);
  if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string message =
      absl::StrCat(expr, ": ", cublasGetStatusName(st), " (", cublas_status,
                   "): ", cublasGetStatusString(st));
  switch (st) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(message);
    case CUBLAS_STATUS_NOT_INITIALIZED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_LICENSE_ERROR:
      return absl::FailedPreconditionError(message);
    case CUBLAS_STATUS_INVALID_VALUE:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

bool BuiltWithCuda() { return true; }

NsCudaContext::NsCudaContext(std::unique_ptr<State> state)
    : state_(std::move(state)) {}

NsCudaContext::~NsCudaContext() {
  if (state_ == nullptr) return;
  device::CudaDeviceGuard device_guard(state_->device);
  (void)cudaStreamSynchronize(state_->stream);
  DropGraphs(state_.get());
  if (state_->handle != nullptr) (void)cublasDestroy(state_->handle);
}

absl::StatusOr<std::unique_ptr<NsCudaContext>> NsCudaContext::Create(
    device::Runtime* runtime, device::Stream* stream,
    device::Allocator* allocator) {
  if (runtime == nullptr || stream == nullptr) {
    return absl::InvalidArgumentError(
        "NsCudaContext::Create: runtime and stream must be non-null");
  }
  const device::Device where = runtime->device();
  if (allocator == nullptr) allocator = runtime->allocator();
  if (!where.is_cuda() || stream->device() != where ||
      allocator->device() != where) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NsCudaContext::Create: the runtime (", where.ToString(),
        "), stream \"", stream->name(), "\" (", stream->device().ToString(),
        ") and allocator (", allocator->device().ToString(),
        ") must be of one CUDA device"));
  }
  auto state = std::make_unique<State>();
  if (const std::string error = ReadEnvironment(state.get()); !error.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("NsCudaContext::Create: ", error));
  }
  state->device = where.ordinal;
  state->stream_wrapper = stream;
  state->stream = static_cast<cudaStream_t>(stream->native_handle());
  state->allocator = allocator;
  device::CudaDeviceGuard device_guard(where.ordinal);
  if (!device_guard.status().ok()) return device_guard.status();
  state->stream_capturable = StreamCapturable(state->stream);
  // From here on the context owns what it creates (the destructor frees).
  auto ctx =
      std::unique_ptr<NsCudaContext>(new NsCudaContext(std::move(state)));
  State* s = ctx->state_.get();
  MUON_CUBLAS_RETURN_IF_ERROR(cublasCreate(&s->handle));
  MUON_CUBLAS_RETURN_IF_ERROR(cublasSetStream(s->handle, s->stream));
  absl::StatusOr<device::DeviceMemory> workspace =
      device::DeviceMemory::Allocate(allocator, kCublasWorkspaceBytes);
  if (!workspace.ok()) return workspace.status();
  s->cublas_workspace = std::move(*workspace);
  // After cublasSetStream, which resets the workspace to cuBLAS's default.
  MUON_CUBLAS_RETURN_IF_ERROR(
      cublasSetWorkspace(s->handle, s->cublas_workspace.data(),
                         static_cast<size_t>(s->cublas_workspace.bytes())));
  MUON_CUBLAS_RETURN_IF_ERROR(
      cublasSetPointerMode(s->handle, CUBLAS_POINTER_MODE_HOST));
  // bf16 GEMMs: split-K partial sums reduced in fp32 (the compute type), not
  // in the bf16 output type, as the header promises ("accumulated in
  // fp32"). PyTorch allows the reduced-precision reduction by default
  // (torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction).
  MUON_CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(
      s->handle, static_cast<cublasMath_t>(
                     CUBLAS_DEFAULT_MATH |
                     CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  return ctx;
}

absl::Status NsCudaContext::Reserve(int64_t batch, int64_t rows, int64_t cols,
                                    GpuPrecision precision,
                                    const NewtonSchulzOptions& requested) {
  NewtonSchulzOptions storage;
  const NewtonSchulzOptions& options =
      Effective(state_.get(), requested, &storage);
  if (batch < 1 || rows < 1 || cols < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NsCudaContext::Reserve: sizes must be positive, got batch=", batch,
        " rows=", rows, " cols=", cols));
  }
  const bool gram =
      GpuRunsGram(rows, cols, NewtonSchulzIterations(options),
                  static_cast<int>(options.method), options.gram_restart_every);
  return ReserveState(state_.get(),
                      MakeLayout(batch, rows, cols, precision, gram,
                                 state_->symmetric, state_->gram_fp32_z));
}

int64_t NsCudaContext::ScratchBytes() const { return state_->scratch.bytes(); }

const SymmetricProducts& NsCudaContext::symmetric_products() const {
  return state_->symmetric;
}

void NsCudaContext::set_symmetric_products(const SymmetricProducts& symmetric) {
  DropGraphs(state_.get());  // they ran the products the old way
  state_->symmetric = symmetric;
}

bool NsCudaContext::cuda_graphs() const { return state_->cuda_graphs; }
void NsCudaContext::set_cuda_graphs(bool on) {
  state_->cuda_graphs = on;
  if (on) {
    // Copied, not moved from a temporary: nvcc warns on discarding the
    // result of a [[nodiscard]] absl::Status's move assignment.
    const absl::Status none;
    state_->graph_capture_error = none;
  }
}
int NsCudaContext::CudaGraphCount() const { return state_->graphs.size(); }
absl::Status NsCudaContext::cuda_graph_capture_error() const {
  return state_->graph_capture_error;
}
int NsCudaContext::device() const { return state_->device; }
device::Stream* NsCudaContext::stream() const { return state_->stream_wrapper; }

absl::Status NewtonSchulzBatched(NsCudaContext* ctx, const float* u,
                                 int64_t batch, int64_t rows, int64_t cols,
                                 const NewtonSchulzOptions& requested,
                                 GpuPrecision precision, float* out) {
  if (ctx == nullptr || u == nullptr || out == nullptr) {
    return absl::InvalidArgumentError(
        "NewtonSchulzBatched: ctx, u and out must be non-null");
  }
  NewtonSchulzOptions storage;
  const NewtonSchulzOptions& options =
      Effective(ctx->state(), requested, &storage);
  if (rows < 1 || cols < 1 || rows > INT_MAX || cols > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NewtonSchulzBatched: rows and cols must be in [1, INT_MAX], got rows=",
        rows, " cols=", cols));
  }
  if (batch < 1 || batch > kMaxBatch) {
    return absl::InvalidArgumentError(
        absl::StrCat("NewtonSchulzBatched: batch must be in [1, ", kMaxBatch,
                     "], got ", batch));
  }
  MUON_CU_RETURN_IF_ERROR(ValidateNewtonSchulzOptions(options));
  const int64_t bytes = batch * rows * cols * int64_t{sizeof(float)};
  if (BytesOverlap(u, bytes, out, bytes)) {
    return absl::InvalidArgumentError(
        "NewtonSchulzBatched: out must not overlap u");
  }
  NsCudaContext::State* s = ctx->state();
  device::CudaDeviceGuard device_guard(s->device);
  if (!device_guard.status().ok()) return device_guard.status();
  const NsCall call{u, out, batch, rows, cols, precision, &options};
  const bool gram =
      GpuRunsGram(rows, cols, NewtonSchulzIterations(options),
                  static_cast<int>(options.method), options.gram_restart_every);
  const Layout l = MakeLayout(batch, rows, cols, precision, gram, s->symmetric,
                              s->gram_fp32_z);
  MUON_CU_RETURN_IF_ERROR(ReserveState(s, l));
  if (!s->cuda_graphs || !CanCapture(s)) return EnqueueCall(s, l, gram, call);
  return LaunchAsGraph(s, call, [&] { return EnqueueCall(s, l, gram, call); });
}

absl::Status DenseGemm(NsCudaContext* ctx, GpuPrecision precision, int64_t m,
                       int64_t n, int64_t k, const void* a, const void* b,
                       void* c) {
  if (ctx == nullptr || a == nullptr || b == nullptr || c == nullptr) {
    return absl::InvalidArgumentError("DenseGemm: null argument");
  }
  if (m < 1 || n < 1 || k < 1 || m > INT_MAX || n > INT_MAX || k > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("DenseGemm: sizes must be in [1, INT_MAX], got m=", m,
                     " n=", n, " k=", k));
  }
  NsCudaContext::State* s = ctx->state();
  device::CudaDeviceGuard device_guard(s->device);
  if (!device_guard.status().ok()) return device_guard.status();
  const GemmTypes t = TypesFor(precision);
  const int mi = static_cast<int>(m);
  const int ni = static_cast<int>(n);
  const int ki = static_cast<int>(k);
  const Gemm g = {CUBLAS_OP_N, CUBLAS_OP_N, mi, ni, ki,   1.0f, a,  mi,
                  0,           b,           ki, 0,  0.0f, c,    mi, 0};
  return RunGemm(s->handle, t, 1, g);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muon
