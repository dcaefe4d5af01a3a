// Newton-Schulz on cuBLAS (kernels/cuda/newton_schulz_cuda.h), nvcc.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "device/cuda_runtime.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/newton_schulz_cuda.h"
#include "kernels/cuda/ns_gemm_plan.h"
#include "kernels/newton_schulz.h"
#include "kernels/ns_engine.h"

namespace muon {
namespace kernels {
namespace cuda {

struct NsCudaContext::State {
  int device = 0;
  cudaStream_t stream = nullptr;    // Not owned.
  cublasHandle_t handle = nullptr;  // Owned.
  DeviceBuffer cublas_workspace;    // Given to cuBLAS (cublasSetWorkspace).
  DeviceBuffer scratch;             // Our iteration buffers (see Layout).
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
  int64_t x1 = 0;       // X pong buffer (bf16 only; fp32 pongs into out).
  int64_t gram = 0;     // A: batch * m * m.
  int64_t poly = 0;     // B: batch * m * m.
  int64_t partial = 0;  // double [batch, NormBlocks].
  int64_t denom = 0;    // float [batch].
  int64_t total = 0;
};

Layout MakeLayout(int64_t batch, int64_t rows, int64_t cols,
                  GpuPrecision precision) {
  const GemmTypes t = TypesFor(precision);
  const int64_t m = std::min(rows, cols);
  const int64_t x_bytes = AlignUp(batch * rows * cols * t.elem_bytes);
  const int64_t g_bytes = AlignUp(batch * m * m * t.elem_bytes);
  Layout l;
  int64_t at = 0;
  l.x0 = at;
  at += x_bytes;
  l.x1 = at;
  if (precision == GpuPrecision::kBf16) at += x_bytes;
  l.gram = at;
  at += g_bytes;
  l.poly = at;
  at += g_bytes;
  l.partial = at;
  at += AlignUp(batch * NormBlocks(rows * cols) * int64_t{sizeof(double)});
  l.denom = at;
  at += AlignUp(batch * int64_t{sizeof(float)});
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
    denom[blockIdx.x] =
        static_cast<float>(fmax(__dmul_rn(norm_scale, sqrt(total)), eps));
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

__global__ void Bf16ToFloatKernel(const __nv_bfloat16* __restrict__ x,
                                  int64_t n, float* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
       i < n; i += stride) {
    out[i] = __bfloat162float(x[i]);
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

absl::Status RunGemm(cublasHandle_t handle, const GemmTypes& t, int batch,
                     const Gemm& g) {
  if (batch == 1) {
    MUON_CUBLAS_RETURN_IF_ERROR(
        cublasGemmEx(handle, g.trans_a, g.trans_b, g.m, g.n, g.k, &g.alpha, g.a,
                     t.data, g.lda, g.b, t.data, g.ldb, &g.beta, g.c, t.data,
                     g.ldc, t.compute, CUBLAS_GEMM_DEFAULT));
  } else {
    MUON_CUBLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(
        handle, g.trans_a, g.trans_b, g.m, g.n, g.k, &g.alpha, g.a, t.data,
        g.lda, g.stride_a, g.b, t.data, g.ldb, g.stride_b, &g.beta, g.c, t.data,
        g.ldc, g.stride_c, batch, t.compute, CUBLAS_GEMM_DEFAULT));
  }
  return absl::OkStatus();
}

absl::Status WithContext(absl::Status status, const char* what, int iteration) {
  if (status.ok()) return status;
  return absl::Status(
      status.code(), absl::StrCat("NewtonSchulzBatched: ", what, " (iteration ",
                                  iteration, "): ", status.message()));
}

bool Overlap(const void* x, const void* y, int64_t bytes) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(x);
  const uintptr_t b = reinterpret_cast<uintptr_t>(y);
  const uintptr_t n = static_cast<uintptr_t>(bytes);
  return a < b + n && b < a + n;
}

// Normalises `batch` fp32 matrices of `size` elements into x (work type T).
template <typename T>
absl::Status Normalize(NsCudaContext::State* s, const Layout& l, const float* u,
                       int64_t batch, int64_t size,
                       const NewtonSchulzOptions& options, T* x) {
  char* base = s->scratch.as<char>();
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
  const int scale_blocks = std::min(ElementwiseBlocks(size), 4096);
  ScaleKernel<T>
      <<<dim3(scale_blocks, y), kThreads, 0, s->stream>>>(u, size, denom, x);
  MUON_CUDA_RETURN_IF_LAUNCH_FAILED("ScaleKernel");
  return absl::OkStatus();
}

absl::Status ReserveState(NsCudaContext::State* s, const Layout& l) {
  if (s->scratch.bytes() >= l.total) return absl::OkStatus();
  device::CudaDeviceGuard device_guard(s->device);
  if (!device_guard.status().ok()) return device_guard.status();
  // Work already enqueued may still use the old buffer.
  MUON_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s->stream));
  s->scratch = DeviceBuffer();
  absl::StatusOr<DeviceBuffer> buffer = DeviceBuffer::Allocate(l.total);
  if (!buffer.ok()) return buffer.status();
  s->scratch = std::move(*buffer);
  return absl::OkStatus();
}

}  // namespace

bool BuiltWithCuda() { return true; }

NsCudaContext::NsCudaContext(std::unique_ptr<State> state)
    : state_(std::move(state)) {}

NsCudaContext::~NsCudaContext() {
  if (state_ == nullptr) return;
  device::CudaDeviceGuard device_guard(state_->device);
  (void)cudaStreamSynchronize(state_->stream);
  if (state_->handle != nullptr) (void)cublasDestroy(state_->handle);
}

absl::StatusOr<std::unique_ptr<NsCudaContext>> NsCudaContext::Create(
    int device, void* stream) {
  int count = 0;
  const cudaError_t count_err = cudaGetDeviceCount(&count);
  if (count_err != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "NsCudaContext::Create: no usable GPU: cudaGetDeviceCount: ",
        cudaGetErrorName(count_err), ": ", cudaGetErrorString(count_err)));
  }
  if (count == 0) {
    return absl::FailedPreconditionError(
        "NsCudaContext::Create: no usable GPU: cudaGetDeviceCount reports 0 "
        "devices");
  }
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("NsCudaContext::Create: device must be in [0, ", count,
                     "), got ", device));
  }
  auto state = std::make_unique<State>();
  state->device = device;
  state->stream = static_cast<cudaStream_t>(stream);
  device::CudaDeviceGuard device_guard(device);
  if (!device_guard.status().ok()) return device_guard.status();
  // From here on the context owns what it creates (the destructor frees).
  auto ctx =
      std::unique_ptr<NsCudaContext>(new NsCudaContext(std::move(state)));
  State* s = ctx->state_.get();
  MUON_CUBLAS_RETURN_IF_ERROR(cublasCreate(&s->handle));
  MUON_CUBLAS_RETURN_IF_ERROR(cublasSetStream(s->handle, s->stream));
  absl::StatusOr<DeviceBuffer> workspace =
      DeviceBuffer::Allocate(kCublasWorkspaceBytes);
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
                                    GpuPrecision precision) {
  if (batch < 1 || rows < 1 || cols < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NsCudaContext::Reserve: sizes must be positive, got batch=", batch,
        " rows=", rows, " cols=", cols));
  }
  return ReserveState(state_.get(), MakeLayout(batch, rows, cols, precision));
}

int64_t NsCudaContext::ScratchBytes() const { return state_->scratch.bytes(); }
int NsCudaContext::device() const { return state_->device; }
void* NsCudaContext::stream() const { return state_->stream; }

absl::Status NewtonSchulzBatched(NsCudaContext* ctx, const float* u,
                                 int64_t batch, int64_t rows, int64_t cols,
                                 const NewtonSchulzOptions& options,
                                 GpuPrecision precision, float* out) {
  if (ctx == nullptr || u == nullptr || out == nullptr) {
    return absl::InvalidArgumentError(
        "NewtonSchulzBatched: ctx, u and out must be non-null");
  }
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
  const int64_t size = rows * cols;
  if (Overlap(u, out, batch * size * int64_t{sizeof(float)})) {
    return absl::InvalidArgumentError(
        "NewtonSchulzBatched: out must not overlap u");
  }
  NsCudaContext::State* s = ctx->state();
  device::CudaDeviceGuard device_guard(s->device);
  if (!device_guard.status().ok()) return device_guard.status();
  const Layout l = MakeLayout(batch, rows, cols, precision);
  MUON_CU_RETURN_IF_ERROR(ReserveState(s, l));

  const GemmTypes t = TypesFor(precision);
  const int steps = NewtonSchulzIterations(options);
  const int64_t m = std::min(rows, cols);
  char* base = s->scratch.as<char>();
  const bool bf16 = precision == GpuPrecision::kBf16;

  // X ping-pong. bf16: two bf16 scratch buffers, widened into out at the
  // end. fp32/tf32: out and one scratch buffer, starting where the last
  // iteration lands in out (no final copy), as the CPU kernel.
  void* x;
  void* x_next;
  if (bf16) {
    x = base + l.x0;
    x_next = base + l.x1;
    MUON_CU_RETURN_IF_ERROR(Normalize(s, l, u, batch, size, options,
                                      static_cast<__nv_bfloat16*>(x)));
  } else {
    x = (steps % 2 == 0) ? static_cast<void*>(out) : base + l.x0;
    x_next = (steps % 2 == 0) ? base + l.x0 : static_cast<void*>(out);
    MUON_CU_RETURN_IF_ERROR(
        Normalize(s, l, u, batch, size, options, static_cast<float*>(x)));
  }
  void* gram = base + l.gram;
  void* poly = base + l.poly;
  const size_t gram_bytes = static_cast<size_t>(batch * m * m * t.elem_bytes);
  const size_t x_bytes = static_cast<size_t>(batch * size * t.elem_bytes);
  const int b = static_cast<int>(batch);

  // The GEMM sequence and its layout (transposes by flags, no copies of
  // transposes) are in kernels/cuda/ns_gemm_plan.h.
  for (int step = 0; step < steps; ++step) {
    const NsStepPlan plan = PlanNewtonSchulzStep(
        rows, cols, NewtonSchulzCoefficients(options, step));
    const auto buffer = [&](NsBuffer which) -> void* {
      switch (which) {
        case NsBuffer::kX:
          return x;
        case NsBuffer::kXNext:
          return x_next;
        case NsBuffer::kGram:
          return gram;
        case NsBuffer::kPoly:
          break;
      }
      return poly;
    };
    const auto run = [&](const NsGemm& g) {
      return RunGemm(
          s->handle, t, b,
          {g.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N,
           g.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.m, g.n, g.k,
           static_cast<float>(g.alpha), buffer(g.a), g.lda, g.stride_a,
           buffer(g.b), g.ldb, g.stride_b, static_cast<float>(g.beta),
           buffer(g.c), g.ldc, g.stride_c});
    };
    MUON_CU_RETURN_IF_ERROR(WithContext(run(plan.gram), "A = X X^T", step));
    // B = b*A + c*A*A: B starts as a copy of A, then beta = b.
    MUON_CU_RETURN_IF_ERROR(WithContext(
        [&]() -> absl::Status {
          MUON_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
              poly, gram, gram_bytes, cudaMemcpyDeviceToDevice, s->stream));
          return absl::OkStatus();
        }(),
        "copy A", step));
    MUON_CU_RETURN_IF_ERROR(
        WithContext(run(plan.poly), "B = b*A + c*A*A", step));
    // X' = a*X + B*X: X' starts as a copy of X, then beta = a.
    MUON_CU_RETURN_IF_ERROR(WithContext(
        [&]() -> absl::Status {
          MUON_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
              x_next, x, x_bytes, cudaMemcpyDeviceToDevice, s->stream));
          return absl::OkStatus();
        }(),
        "copy X", step));
    MUON_CU_RETURN_IF_ERROR(
        WithContext(run(plan.update), "X = a*X + B*X", step));
    std::swap(x, x_next);
  }
  if (bf16) {
    const int64_t total = batch * size;
    Bf16ToFloatKernel<<<ElementwiseBlocks(total), kThreads, 0, s->stream>>>(
        static_cast<const __nv_bfloat16*>(x), total, out);
    MUON_CUDA_RETURN_IF_LAUNCH_FAILED("Bf16ToFloatKernel");
  }
  return absl::OkStatus();
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
