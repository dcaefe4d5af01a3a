// Newton-Schulz on a CUDA device with cuBLAS: the device-side API.
//
// Plain C++ (no CUDA headers): device pointers are `float*`/`void*` and a
// CUDA stream is passed as `void*` (a cudaStream_t; nullptr = the legacy
// default stream), so code compiled by gcc through Bazel can call it. The
// implementation (kernels/cuda/*.cu, nvcc) exists only in `--config=cuda`
// builds; default builds link stubs that return Unimplemented
// ("built without CUDA: build with --config=cuda") and BuiltWithCuda() false.
//
// Semantics are kernels::NewtonSchulz's (torch.optim.Muon's
// `_zeropower_via_newtonschulz`, torch/optim/_muon.py), on a bucket of
// `batch` same-shape matrices at once:
//   X = U (viewed transposed by GEMM flags when rows > cols; no copies);
//   X /= max(norm_scale * ||X||_F, eps)   (one norm per matrix: a
//        deterministic two-pass reduction in double, then a scale kernel);
//   for each iteration i, (a, b, c) = NewtonSchulzCoefficients(options, i):
//     A = X X^T;             (GEMM, beta = 0)
//     B = b*A + c*A*A;       (GEMM alpha = c, beta = b, on a copy of A)
//     X = a*X + B*X;         (GEMM alpha = 1, beta = a, on a copy of X)
// One cublasGemmEx per product for batch == 1, one
// cublasGemmStridedBatchedEx for batch > 1; the symmetric products (X X^T,
// A*A) of an m x m output with m >= 4096 compute the 36 of 8 x 8 tiles on
// and above the diagonal as one cublasGemmBatchedEx and copy the others
// from their mirrors (SymmetricProducts, kernels/cuda/ns_gemm_plan.h).
//
// Precision (GpuPrecision, kernels/ns_engine.h):
//   kBf16: X, A, B stored in bfloat16 (CUDA_R_16BF), products accumulated in
//          fp32 (CUBLAS_COMPUTE_32F), alpha/beta in fp32: torch's bfloat16
//          iteration. U is read as fp32 and normalised in fp32 before the
//          one rounding to bf16 (torch rounds U to bf16 first and its norm
//          to bf16: ours is slightly more accurate there). O is the bf16
//          result widened to fp32 (exact).
//   kTf32: fp32 storage, CUBLAS_COMPUTE_32F_FAST_TF32 (tensor cores round
//          GEMM inputs to 10-bit mantissas, accumulate in fp32).
//   kFp32: fp32 storage, CUBLAS_COMPUTE_32F (no tensor-core rounding).
//
// Determinism: cuBLAS GEMMs give the same bits run to run on the same GPU
// model, cuBLAS version, shapes and batch count (cuBLAS documentation,
// "Results reproducibility"); our reductions have a fixed order. Results can
// differ across GPU models, cuBLAS versions and batch counts (the batched
// kernels are other kernels), and between this path and the CPU one.
//
// Lifecycle: NsCudaContext::Create -> Reserve (optional: grows the device
// scratch so later calls do not allocate) -> NewtonSchulzBatched ... ->
// destroy. Thread-compatible: one thread uses a context at a time. All work
// is enqueued on the context's stream and is asynchronous to the host;
// launch errors are reported by the call, errors of the asynchronous
// execution by a later synchronising call (the stream's Synchronize,
// device/stream.h).
#ifndef MUON_KERNELS_CUDA_NEWTON_SCHULZ_CUDA_H_
#define MUON_KERNELS_CUDA_NEWTON_SCHULZ_CUDA_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "device/memory.h"
#include "device/runtime.h"
#include "device/stream.h"
#include "kernels/cuda/ns_gemm_plan.h"
#include "kernels/newton_schulz.h"
#include "kernels/ns_engine.h"

namespace muon {
namespace kernels {
namespace cuda {

// True in `--config=cuda` builds (real kernels), false with the stubs.
bool BuiltWithCuda();

// A cuBLAS handle bound to one device and stream, plus the device scratch
// of the iteration. Owns the handle and the scratch; the stream is not owned.
class NsCudaContext {
 public:
  // Creates a cuBLAS handle that enqueues on `stream` (a CUDA stream of
  // `runtime`'s device; not owned, outlives the context), with a 32 MiB
  // cuBLAS workspace of its own. The workspace and the iteration's scratch
  // come from `allocator` (not owned, outlives the context; null: the
  // runtime's allocator), e.g. a device::CountingAllocator that counts a
  // step's transient bytes. No call changes the caller's current device
  // (device::CudaDeviceGuard).
  // MUON_NS_GRAM_RESTART_EVERY (1-64), when set, replaces every call's
  // NewtonSchulzOptions::gram_restart_every on this context (for measuring
  // restart schedules; ParseGramRestartEvery).
  // MUON_NS_GRAM_FP32_Z=1 makes the bf16 Gram iteration form each Z =
  // a I + b R + c R R in fp32 and round it to bf16 once: c R R as bf16
  // GEMMs with an fp32 output (in symmetric tiles as the other products),
  // then one pass adds b R + a I and rounds. By default b R + c R R is
  // rounded, then again after a is added to the diagonal, losing what
  // cancels there. The CPU model of the bf16 arithmetic
  // (tests/kernels/ns_gram_error) puts Gram restart-every-2 1.13-1.35x
  // farther from float64 than the standard iteration by default and
  // 0.76-0.99x with this; it costs batch*m*m*4 bytes of scratch. Off (0)
  // by default until measured on a GPU.
  // Errors:
  //   Unimplemented: built without CUDA.
  //   InvalidArgument: null runtime or stream; a runtime, stream or
  //     allocator not of one CUDA device (names each device); a
  //     MUON_NS_SYMMETRIC*, MUON_NS_GRAM_RESTART_EVERY,
  //     MUON_NS_GRAM_FP32_Z or MUON_NS_CUDA_GRAPHS environment variable out
  //     of range (names it and its value).
  //   ResourceExhausted / Internal: CUDA or cuBLAS failures (names the call
  //     and the library's message).
  static absl::StatusOr<std::unique_ptr<NsCudaContext>> Create(
      device::Runtime* runtime, device::Stream* stream,
      device::Allocator* allocator = nullptr);
  ~NsCudaContext();
  NsCudaContext(const NsCudaContext&) = delete;
  NsCudaContext& operator=(const NsCudaContext&) = delete;

  // Grows the scratch to fit `batch` matrices [rows, cols] (either
  // orientation) in `precision` run with `options`: 2 X buffers of
  // batch*rows*cols (the iteration never hands the caller's output to
  // cuBLAS), A and B of batch*m*m elements (2 bytes each for bf16, 4
  // otherwise), 2 more m*m
  // buffers when `options` runs the Gram iteration on this shape
  // (GpuRunsGram) and one of batch*m*m floats more for bf16 with
  // MUON_NS_GRAM_FP32_Z, plus the norm partials. Never shrinks.
  // Errors: InvalidArgument (non-positive sizes); ResourceExhausted
  // (the allocator's); Internal.
  absl::Status Reserve(
      int64_t batch, int64_t rows, int64_t cols, GpuPrecision precision,
      const NewtonSchulzOptions& options = NewtonSchulzOptions());

  // Device bytes held by the scratch (not counting cuBLAS's workspace).
  int64_t ScratchBytes() const;

  // How the iteration runs its symmetric products (X X^T, A*A, and every
  // m x m product of Gram Newton-Schulz): by default tiles of the upper
  // triangle as batched GEMMs once m >= 4096 (SymmetricProducts'
  // defaults), or as the environment variables MUON_NS_SYMMETRIC,
  // MUON_NS_SYMMETRIC_TILES, MUON_NS_SYMMETRIC_MIN_EDGE and
  // MUON_NS_SYMMETRIC_GRAM read by Create say (ParseSymmetricProducts). Set
  // before Reserve and the calls that use it; the pointer arrays of kBatched
  // live in the scratch.
  const SymmetricProducts& symmetric_products() const;
  void set_symmetric_products(const SymmetricProducts& symmetric);

  // Whether calls run as CUDA graphs: off unless MUON_NS_CUDA_GRAPHS=1
  // (read by Create) or set_cuda_graphs(true). When on, the first call
  // with given U, O, shape, precision and options (SameGraphCall,
  // kernels/cuda/ns_graph_cache.h) is captured from this context's stream
  // into a graph and launched with cudaGraphLaunch, and later calls with
  // the same ones launch that graph again (found without allocating): one
  // launch instead of a few dozen kernels and GEMMs, for shapes where
  // enqueueing costs more than the GPU work (1024 x 1024 and below). A replay
  // runs the same kernels with the same arguments: its results are bitwise
  // those of direct calls. The last 64 calls' graphs are kept; all are dropped
  // when the scratch grows or the symmetric products change. Calls run directly
  // on a stream capture cannot take (the legacy or per-thread default
  // stream, a blocking stream) or that the caller is capturing already
  // (its graph takes them). A capture that fails turns graphs off for the
  // context (cuda_graphs() false) and the call runs directly. While a
  // call is captured, no other thread may query or synchronize this
  // context's stream (CUDA refuses it).
  bool cuda_graphs() const;
  void set_cuda_graphs(bool on);
  // Graphs held now (for tests and benchmarks).
  int CudaGraphCount() const;
  // The error of the capture that turned graphs off (OK when none failed
  // since set_cuda_graphs(true) or Create; the call it was for ran
  // directly).
  absl::Status cuda_graph_capture_error() const;
  // The CUDA device's ordinal.
  int device() const;
  // The stream the context enqueues on (Create's).
  device::Stream* stream() const;

  // Defined by the implementation (holds CUDA and cuBLAS types).
  struct State;
  explicit NsCudaContext(std::unique_ptr<State> state);
  // For the implementation only.
  State* state() const { return state_.get(); }

 private:
  std::unique_ptr<State> state_;
};

// A cuBLAS status (cublasStatus_t as int) as a Status, mapped as the device
// layer maps CUDA's (device::CudaErrorToStatus): OK for success; else
// ResourceExhausted (allocation failed), FailedPrecondition (not
// initialized, architecture mismatch, not supported), InvalidArgument
// (invalid value), Internal otherwise, with the message
// "<expr>: <name> (<code>): <cuBLAS's description>". Without CUDA: OK for
// 0, else Unimplemented.
absl::Status CublasStatusToStatus(int cublas_status, const char* expr);

// O = NS_k(U) for `batch` matrices on the device, enqueued on ctx's stream.
//   u:   device float32 [batch, rows, cols], row-major, contiguous
//        (matrix i at u + i*rows*cols); read only.
//   out: device float32 [batch, rows, cols]; must not overlap u.
//   batch in [1, 65535]; rows, cols in [1, INT_MAX] (32-bit cuBLAS API).
// Neither u nor out is a cuBLAS operand (the GEMMs run in the context's
// 256-byte-aligned scratch), so their alignment (4 bytes suffices)
// changes no bit of the result.
// Cost: batch * NewtonSchulzFlops(rows, cols, options) FLOPs on tensor cores
// (bf16, tf32) or CUDA cores (fp32). Grows the scratch when needed
// (allocates: call ctx->Reserve first on the hot path).
// Errors:
//   InvalidArgument: null pointers, shapes or batch out of range (names the
//     value), overlapping u/out, options rejected by
//     ValidateNewtonSchulzOptions.
//   Unimplemented: built without CUDA.
//   ResourceExhausted / Internal: from CUDA or cuBLAS (names the failing
//     call, e.g. "cublasGemmEx(...)", and cudaGetErrorString /
//     cublasGetStatusString).
absl::Status NewtonSchulzBatched(NsCudaContext* ctx, const float* u,
                                 int64_t batch, int64_t rows, int64_t cols,
                                 const NewtonSchulzOptions& options,
                                 GpuPrecision precision, float* out);

// The GPU's dense GEMM rate yardstick (what tools/ns_gpu_bench compares
// Newton-Schulz throughput with): one cublasGemmEx C[m, n] = A[m, k] *
// B[k, n] (column-major, no transposes, beta = 0) with the types
// NewtonSchulzBatched uses for `precision` (bf16 elements for kBf16, fp32
// otherwise), enqueued on ctx's stream.
// a, b, c are device buffers of m*k, k*n and m*n elements. 2*m*n*k FLOPs.
// Errors: InvalidArgument (sizes, null); Unimplemented; Internal (cuBLAS).
absl::Status DenseGemm(NsCudaContext* ctx, GpuPrecision precision, int64_t m,
                       int64_t n, int64_t k, const void* a, const void* b,
                       void* c);

}  // namespace cuda
}  // namespace kernels
}  // namespace muon

#endif  // MUON_KERNELS_CUDA_NEWTON_SCHULZ_CUDA_H_
