// Newton-Schulz throughput on a CUDA GPU next to the GPU's dense GEMM rate
// measured in the same run.
//
// Prints the GPU, then the dense GEMM yardstick (one cublasGemmEx of
// --gemm_size^3 in the chosen precision: bf16 in / fp32 accumulate by
// default), then per size rows x cols (m = min, n = max):
//   NS best / median  device time of NewtonSchulzBatched (device-resident
//                     U and O: normalisation, k iterations, output
//                     conversion), from CUDA events, after 2 warm-ups;
//   NS TFLOP/s        NewtonSchulzFlops(rows, cols, options) / best;
//   gram TFLOP/s      one GEMM of the Gram shape m x m x n (A = X X^T) in
//                     the same precision: the shape-specific yardstick;
//   NS/peak           NS rate / the --gemm_size yardstick;
//   graph best        NS best again with the context's CUDA graphs on
//                     (each call one cudaGraphLaunch of the captured call;
//                     NsCudaContext::set_cuda_graphs), and whether its
//                     output is bitwise the direct calls' ("same");
//   staged best       the host-staged engine (MakeCudaNsEngine:
//                     H2D + NS + D2H from pageable host memory), wall clock.
//
// Built meaningfully only with --config=cuda; a default build prints
// "built without CUDA" and exits 2. Exits 1 when no GPU is visible.
//
// Usage: ns_gpu_bench [--sizes 1024x1024,4096x4096,4096x11008,8192x8192]
//          [--precision bf16|tf32|fp32] [--schedule quintic|polar_express]
//          [--method standard|gram|auto]
//          [--repeats 10] [--calls 20] [--gemm_size 8192] [--batch 1]
//          [--device 0]
//          [--graphs 1] [--staged 1]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "device/cuda_runtime.h"
#include "device/memory.h"
#include "device/runtime.h"
#include "device/stream.h"
#include "kernels/cuda/newton_schulz_cuda.h"
#include "kernels/newton_schulz.h"
#include "kernels/ns_engine.h"
#include "kernels/staged_ns_engine.h"
#include "tools/bench_util.h"

namespace {

namespace kernels = ::muon::kernels;
namespace cuda = ::muon::kernels::cuda;
namespace device = ::muon::device;

using ::muon::bench::Shape;
using ::muon::bench::Summarize;
using ::muon::bench::Timing;

}  // namespace

ABSL_FLAG(std::string, sizes, "1024x1024,4096x4096,4096x11008,8192x8192",
          "Matrix shapes RxC, comma-separated.");
ABSL_FLAG(std::string, precision, "bf16", "bf16, tf32 or fp32.");
ABSL_FLAG(std::string, schedule, "quintic", "quintic or polar_express.");
ABSL_FLAG(std::string, method, "standard",
          "Newton-Schulz method: standard, gram (restart every 2) or auto.");
ABSL_FLAG(int, gram_restart_every, 2,
          "Gram Newton-Schulz: iterations per restart block, >= 1.");
ABSL_FLAG(int, repeats, 10, "Timed runs after 2 warm-ups.");
ABSL_FLAG(int, calls, 20,
          "Calls back to back per timed run (the time is divided by it): the "
          "throughput of back-to-back calls.");
ABSL_FLAG(int64_t, gemm_size, 8192, "m = n = k of the dense GEMM yardstick.");
ABSL_FLAG(int64_t, batch, 1, "Matrices per NS call (strided-batched).");
ABSL_FLAG(int, device, 0, "CUDA device.");
ABSL_FLAG(bool, staged, true, "Also time the host-staged engine.");
ABSL_FLAG(bool, graphs, true, "Also time NS replayed as CUDA graphs.");

namespace {

constexpr char kUsage[] =
    "usage: ns_gpu_bench [--sizes RxC[,RxC...]] [--precision bf16|tf32|fp32]\n"
    "         [--schedule quintic|polar_express] [--method "
    "standard|gram|auto]\n"
    "         [--gram_restart_every L] [--repeats N]\n"
    "         [--gemm_size N] [--batch B] [--device D] [--graphs 0|1]\n"
    "         [--staged 0|1]\n"
    "  --sizes      matrix shapes (default "
    "1024x1024,4096x4096,4096x11008,8192x8192)\n"
    "  --precision  GEMM arithmetic (default bf16: bf16 in, fp32 accumulate)\n"
    "  --schedule   coefficient schedule (default quintic, 5 iterations)\n"
    "  --method     standard (default), gram (Gram Newton-Schulz, restart\n"
    "               every 2) or auto; NS TFLOP/s counts the standard\n"
    "               iteration's FLOPs whatever the method (time-equivalent)\n"
    "  --gram_restart_every  Gram iterations per restart block (default 2)\n"
    "  --repeats    timed runs after 2 warm-ups (default 10)\n"
    "  --calls      calls back to back per timed run (default 20)\n"
    "  --gemm_size  m = n = k of the dense GEMM yardstick (default 8192)\n"
    "  --batch      matrices per NS call (strided-batched; default 1)\n"
    "  --device     CUDA device (default 0)\n"
    "  --graphs     also time NS as CUDA graphs (default 1)\n"
    "  --staged     also time the host-staged engine (default 1)\n";

// Uniform [-1, 1) from raw mt19937 bits, as tools/ns_bench.
std::vector<float> RandomValues(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) {
    x = static_cast<float>(static_cast<double>(gen() >> 8) / (1 << 23) - 1.0);
  }
  return v;
}

// Host float -> bfloat16 bits, round to nearest even (finite inputs).
std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &v[i], sizeof(u));
    u += 0x7fffu + ((u >> 16) & 1u);
    out[i] = static_cast<uint16_t>(u >> 16);
  }
  return out;
}

// How long one wait for the GPU may take before the bench gives up.
constexpr absl::Duration kSyncTimeout = absl::Minutes(5);

// A buffer of `rt`'s device holding n random GEMM operands in the
// precision's storage type.
absl::StatusOr<device::DeviceMemory> RandomOperand(device::Runtime* rt,
                                                   int64_t n,
                                                   kernels::GpuPrecision p,
                                                   uint32_t seed) {
  const std::vector<float> values = RandomValues(n, seed);
  const bool bf16 = p == kernels::GpuPrecision::kBf16;
  const int64_t bytes = n * (bf16 ? 2 : 4);
  absl::StatusOr<device::DeviceMemory> buffer =
      device::DeviceMemory::Allocate(rt->allocator(), bytes);
  if (!buffer.ok()) return buffer.status();
  absl::Status status;
  if (bf16) {
    const std::vector<uint16_t> half = ToBf16(values);
    status = rt->CopyFromHost(buffer->data(), half.data(), bytes);
  } else {
    status = rt->CopyFromHost(buffer->data(), values.data(), bytes);
  }
  if (!status.ok()) return status;
  return buffer;
}

// Best and median milliseconds of one call of `fn` (which enqueues on
// `stream`, of `rt`'s device) over `repeats` event-timed runs after 2
// warm-ups; each run enqueues --calls calls back to back between its
// timing events and counts the elapsed time / calls: the throughput of
// back-to-back calls. Where enqueuing a call takes longer than its GPU work
// (1024x1024, ~50 us) that is the host's enqueue rate, which a step without
// CUDA graphs pays too; the GPU-only time would need a CUDA graph of the
// calls.
template <typename Fn>
absl::StatusOr<Timing> TimeDevice(device::Runtime* rt, device::Stream* stream,
                                  int repeats, Fn fn) {
  const int calls = absl::GetFlag(FLAGS_calls);
  for (int i = 0; i < 2; ++i) {
    absl::Status status = fn();
    if (!status.ok()) return status;
  }
  absl::Status sync = stream->Synchronize(kSyncTimeout);
  if (!sync.ok()) return sync;
  absl::StatusOr<std::unique_ptr<device::Event>> start =
      rt->CreateTimingEvent("start");
  if (!start.ok()) return start.status();
  absl::StatusOr<std::unique_ptr<device::Event>> stop =
      rt->CreateTimingEvent("stop");
  if (!stop.ok()) return stop.status();
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) {
    absl::Status status = (*start)->Record(stream);
    for (int c = 0; c < calls && status.ok(); ++c) status = fn();
    if (status.ok()) status = (*stop)->Record(stream);
    if (status.ok()) status = (*stop)->Synchronize(kSyncTimeout);
    if (!status.ok()) return status;
    absl::StatusOr<double> seconds = (*stop)->SecondsSince(start->get());
    if (!seconds.ok()) return seconds.status();
    ms.push_back(*seconds * 1e3 / calls);
  }
  return Summarize(std::move(ms));
}

absl::StatusOr<Timing> TimeGemm(device::Runtime* rt, cuda::NsCudaContext* ctx,
                                kernels::GpuPrecision p, int64_t m, int64_t n,
                                int64_t k, int repeats) {
  absl::StatusOr<device::DeviceMemory> a = RandomOperand(rt, m * k, p, 11);
  if (!a.ok()) return a.status();
  absl::StatusOr<device::DeviceMemory> b = RandomOperand(rt, k * n, p, 12);
  if (!b.ok()) return b.status();
  absl::StatusOr<device::DeviceMemory> c = RandomOperand(rt, m * n, p, 13);
  if (!c.ok()) return c.status();
  return TimeDevice(rt, ctx->stream(), repeats, [&] {
    return cuda::DenseGemm(ctx, p, m, n, k, a->data(), b->data(), c->data());
  });
}

// The environment (MUON_NS_SYMMETRIC*) may change how symmetric products
// run: says which way the figures were taken.
void PrintSymmetricProducts(const cuda::SymmetricProducts& sym,
                            int gram_restart_every) {
  using cuda::SymmetricMode;
  const char* sym_mode = sym.mode == SymmetricMode::kFull ? "full GEMMs"
                         : sym.mode == SymmetricMode::kLoop
                             ? "tile GEMMs in turn"
                             : "batched tile GEMMs";
  std::printf(
      "symmetric products: %s, %d x %d tiles once m >= %lld; Gram: %s, "
      "restart every %d\n",
      sym_mode, sym.tiles, sym.tiles, static_cast<long long>(sym.min_edge),
      sym.gram_all ? "every m x m product" : "first square only",
      gram_restart_every);
}

// NS timed with the context's CUDA graphs on, and whether the output of
// the last replay is bitwise that of the last direct call (left in `out`);
// whether a graph was captured at all (the calls run directly on a stream
// capture cannot take), and when a capture failed, why.
struct GraphTiming {
  Timing timing;
  bool same_bits = false;
  bool captured = false;
  absl::Status capture_error;
};

absl::StatusOr<GraphTiming> TimeGraphs(
    device::Runtime* rt, cuda::NsCudaContext* ctx,
    const device::DeviceBuffer<float>& u, int64_t batch, int64_t rows,
    int64_t cols, const kernels::NewtonSchulzOptions& options,
    kernels::GpuPrecision precision, const device::DeviceBuffer<float>& out,
    int repeats) {
  const auto to_host = [&]() -> absl::StatusOr<std::vector<float>> {
    std::vector<float> host(static_cast<size_t>(out.size()));
    absl::Status s = ctx->stream()->Synchronize(kSyncTimeout);
    if (s.ok()) s = rt->CopyToHost(host.data(), out.data(), out.bytes());
    if (!s.ok()) return s;
    return host;
  };
  absl::StatusOr<std::vector<float>> direct = to_host();
  if (!direct.ok()) return direct.status();
  ctx->set_cuda_graphs(true);
  const int graphs_before = ctx->CudaGraphCount();
  absl::StatusOr<Timing> timing = TimeDevice(rt, ctx->stream(), repeats, [&] {
    return cuda::NewtonSchulzBatched(ctx, u.data(), batch, rows, cols, options,
                                     precision, out.data());
  });
  const absl::Status capture_error = ctx->cuda_graph_capture_error();
  const bool captured = ctx->CudaGraphCount() > graphs_before;
  ctx->set_cuda_graphs(false);
  if (!timing.ok()) return timing.status();
  absl::StatusOr<std::vector<float>> replayed = to_host();
  if (!replayed.ok()) return replayed.status();
  return GraphTiming{*timing,
                     std::memcmp(direct->data(), replayed->data(),
                                 direct->size() * sizeof(float)) == 0,
                     captured, capture_error};
}

// The "graph best" column of `graph` into text[size]: "<best>ms same" or
// "DIFFER", or "no capture" (and why on stderr).
void FormatGraphTiming(const GraphTiming& graph, char* text, size_t size) {
  if (graph.captured && graph.capture_error.ok()) {
    std::snprintf(text, size, "%.2fms %s", graph.timing.best,
                  graph.same_bits ? "same" : "DIFFER");
    return;
  }
  std::snprintf(text, size, "no capture");
  std::fprintf(stderr, "ns_gpu_bench: no CUDA graph captured: %s\n",
               graph.capture_error.ok()
                   ? "the stream cannot be captured"
                   : graph.capture_error.ToString().c_str());
}

int Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "ns_gpu_bench: %s: %s\n", what,
               status.ToString().c_str());
  return 1;
}

// Whether the flags are in range and name known precisions, schedules and
// methods.
bool FlagsValid(std::vector<Shape>* shapes) {
  return ::muon::bench::ParseSizes(absl::GetFlag(FLAGS_sizes), "ns_gpu_bench",
                                   shapes) &&
         kernels::ParseGpuPrecision(absl::GetFlag(FLAGS_precision)).ok() &&
         kernels::ParseCoefficientSchedule(absl::GetFlag(FLAGS_schedule))
             .ok() &&
         kernels::ParseNewtonSchulzMethod(absl::GetFlag(FLAGS_method)).ok() &&
         absl::GetFlag(FLAGS_repeats) >= 1 && absl::GetFlag(FLAGS_calls) >= 1 &&
         absl::GetFlag(FLAGS_gemm_size) >= 1 &&
         absl::GetFlag(FLAGS_gram_restart_every) >= 1 &&
         absl::GetFlag(FLAGS_batch) >= 1 && absl::GetFlag(FLAGS_device) >= 0;
}

// What every shape's row is measured with.
struct Bench {
  device::Runtime* rt = nullptr;        // the CUDA device's runtime
  cuda::NsCudaContext* ctx = nullptr;   // on the bench's stream
  kernels::NsEngine* engine = nullptr;  // host-staged engine, or null
  kernels::GpuPrecision precision = kernels::GpuPrecision::kBf16;
  kernels::NewtonSchulzOptions options;
  int64_t batch = 1;
  int repeats = 1;
  double peak_tflops = 0;  // the dense GEMM yardstick
};

// The host-staged engine on host U (rows x cols, fp32): the best wall-clock
// ms of b.repeats runs after one warm-up, in *best_ms. Returns 0, or 1
// after printing the failed stage.
int TimeStaged(const Bench& b, const std::vector<float>& u, int64_t rows,
               int64_t cols, double* best_ms) {
  std::vector<float> host_out(static_cast<size_t>(rows * cols));
  absl::Status status = b.engine->Reserve(rows, cols, b.options);
  if (!status.ok()) return Fail("engine reserve", status);
  std::vector<double> ms;
  for (int r = 0; r < b.repeats + 1; ++r) {
    const auto start = std::chrono::steady_clock::now();
    status = b.engine->Orthogonalize(u.data(), rows, cols, b.options,
                                     host_out.data());
    const auto stop = std::chrono::steady_clock::now();
    if (!status.ok()) return Fail("engine", status);
    if (r > 0) {
      ms.push_back(
          std::chrono::duration<double, std::milli>(stop - start).count());
    }
  }
  *best_ms = Summarize(ms).best;
  return 0;
}

// Sets *count to the visible GPUs. Returns 0; 2 after printing that the
// binary has no CUDA; 1 after printing why no GPU is visible.
int CountGpus(int* count) {
  if (!cuda::BuiltWithCuda()) {
    std::fprintf(stderr,
                 "ns_gpu_bench: built without CUDA: build with "
                 "`bazel build --config=cuda //tools:ns_gpu_bench`\n");
    return 2;
  }
  std::string reason;
  *count = kernels::CudaDeviceCount(&reason);
  if (*count == 0) {
    std::fprintf(stderr, "ns_gpu_bench: no GPU: %s\n", reason.c_str());
    return 1;
  }
  return 0;
}

// The Newton-Schulz options the flags name (FlagsValid checked them).
kernels::NewtonSchulzOptions OptionsFromFlags() {
  kernels::NewtonSchulzOptions options =
      *kernels::ParseCoefficientSchedule(absl::GetFlag(FLAGS_schedule));
  options.method =
      *kernels::ParseNewtonSchulzMethod(absl::GetFlag(FLAGS_method));
  options.gram_restart_every = absl::GetFlag(FLAGS_gram_restart_every);
  return options;
}

// Times the dense GEMM yardstick (--gemm_size cubed, b's precision), prints
// it and sets b->peak_tflops (FLOP/s / 1e12). Returns 0, or 1 after
// printing the failed stage.
int MeasureYardstick(Bench* b) {
  const int64_t size = absl::GetFlag(FLAGS_gemm_size);
  absl::StatusOr<Timing> peak =
      TimeGemm(b->rt, b->ctx, b->precision, size, size, size, b->repeats);
  if (!peak.ok()) return Fail("dense GEMM", peak.status());
  b->peak_tflops = 2.0 * size * size * size / (peak->best * 1e-3) / 1e12;
  std::printf(
      "dense GEMM yardstick: cublasGemmEx %s %lldx%lldx%lld: best %.3f ms, "
      "%.1f TFLOP/s\n\n",
      absl::GetFlag(FLAGS_precision).c_str(), static_cast<long long>(size),
      static_cast<long long>(size), static_cast<long long>(size), peak->best,
      b->peak_tflops);
  return 0;
}

// Prints the Newton-Schulz settings, the symmetric products, the dense
// GEMM yardstick (MeasureYardstick) and the table's header. Returns 0, or 1
// after printing the failed stage.
int PrintSettingsAndYardstick(Bench* b) {
  std::printf(
      "NS: precision %s, schedule %s (%d iterations), method %s, batch %lld, "
      "2 warm-ups + %d timed runs (CUDA events)\n",
      absl::GetFlag(FLAGS_precision).c_str(),
      absl::GetFlag(FLAGS_schedule).c_str(),
      kernels::NewtonSchulzIterations(b->options),
      absl::GetFlag(FLAGS_method).c_str(), static_cast<long long>(b->batch),
      b->repeats);
  PrintSymmetricProducts(b->ctx->symmetric_products(),
                         b->options.gram_restart_every);
  if (MeasureYardstick(b) != 0) return 1;
  std::printf("%-11s %5s %5s %9s %9s %9s %9s %8s %15s %10s\n", "size", "m", "n",
              "NS best", "NS med", "NS TF/s", "gram TF/s", "NS/peak",
              "graph best", "staged");
  return 0;
}

// Prints one row of the table for `shape` (the file comment's columns).
// Returns 0, or 1 after printing the failed stage.
int BenchShape(const Bench& b, const Shape& shape) {
  const int64_t rows = shape.rows;
  const int64_t cols = shape.cols;
  const int64_t m = std::min(rows, cols);
  const int64_t n = std::max(rows, cols);
  const int64_t elems = b.batch * rows * cols;
  const std::vector<float> u = RandomValues(elems, 1);
  absl::StatusOr<device::DeviceBuffer<float>> d_u =
      device::DeviceBuffer<float>::Allocate(b.rt->allocator(), elems);
  if (!d_u.ok()) return Fail("allocate U", d_u.status());
  absl::StatusOr<device::DeviceBuffer<float>> d_out =
      device::DeviceBuffer<float>::Allocate(b.rt->allocator(), elems);
  if (!d_out.ok()) return Fail("allocate O", d_out.status());
  absl::Status status = b.rt->CopyFromHost(d_u->data(), u.data(), d_u->bytes());
  if (!status.ok()) return Fail("copy U", status);
  status = b.ctx->Reserve(b.batch, rows, cols, b.precision, b.options);
  if (!status.ok()) return Fail("reserve", status);
  absl::StatusOr<Timing> ns = TimeDevice(b.rt, b.ctx->stream(), b.repeats, [&] {
    return cuda::NewtonSchulzBatched(b.ctx, d_u->data(), b.batch, rows, cols,
                                     b.options, b.precision, d_out->data());
  });
  if (!ns.ok()) return Fail("NewtonSchulzBatched", ns.status());
  char graph_text[32] = "-";
  if (absl::GetFlag(FLAGS_graphs)) {
    absl::StatusOr<GraphTiming> graph =
        TimeGraphs(b.rt, b.ctx, *d_u, b.batch, rows, cols, b.options,
                   b.precision, *d_out, b.repeats);
    if (!graph.ok())
      return Fail("NewtonSchulzBatched as graphs", graph.status());
    FormatGraphTiming(*graph, graph_text, sizeof(graph_text));
  }
  absl::StatusOr<Timing> gram =
      TimeGemm(b.rt, b.ctx, b.precision, m, m, n, b.repeats);
  if (!gram.ok()) return Fail("Gram GEMM", gram.status());
  char staged_text[32] = "-";
  if (b.engine != nullptr) {
    double staged_ms = 0.0;
    if (TimeStaged(b, u, rows, cols, &staged_ms) != 0) return 1;
    std::snprintf(staged_text, sizeof(staged_text), "%.2fms", staged_ms);
  }
  const double ns_tflops = b.batch *
                           kernels::NewtonSchulzFlops(rows, cols, b.options) /
                           (ns->best * 1e-3) / 1e12;
  const double gram_tflops = 2.0 * m * m * n / (gram->best * 1e-3) / 1e12;
  char size[32];
  std::snprintf(size, sizeof(size), "%lldx%lld", static_cast<long long>(rows),
                static_cast<long long>(cols));
  std::printf("%-11s %5lld %5lld %7.2fms %7.2fms %9.1f %9.1f %8.2f %15s %10s\n",
              size, static_cast<long long>(m), static_cast<long long>(n),
              ns->best, ns->median, ns_tflops, gram_tflops,
              ns_tflops / b.peak_tflops, graph_text, staged_text);
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  absl::ParseCommandLine(argc, argv);
  std::vector<Shape> shapes;
  if (!FlagsValid(&shapes)) {
    std::fprintf(stderr, "ns_gpu_bench: bad flags\n%s", kUsage);
    return 2;
  }
  const int device = absl::GetFlag(FLAGS_device);
  int count = 0;
  if (const int rc = CountGpus(&count); rc != 0) return rc;
  Bench bench;
  bench.precision = *kernels::ParseGpuPrecision(absl::GetFlag(FLAGS_precision));
  bench.options = OptionsFromFlags();
  bench.batch = absl::GetFlag(FLAGS_batch);
  bench.repeats = absl::GetFlag(FLAGS_repeats);
  absl::StatusOr<device::Runtime*> runtime = device::CudaRuntime(device);
  if (!runtime.ok()) return Fail("CUDA runtime", runtime.status());
  device::Runtime* rt = *runtime;
  absl::StatusOr<std::string> gpu = device::CudaDeviceDescription(device);
  if (!gpu.ok()) return Fail("device properties", gpu.status());
  absl::StatusOr<std::unique_ptr<device::Stream>> stream =
      rt->CreateStream("ns_gpu_bench");
  if (!stream.ok()) return Fail("stream", stream.status());
  absl::StatusOr<std::unique_ptr<cuda::NsCudaContext>> ctx =
      cuda::NsCudaContext::Create(rt, stream->get());
  if (!ctx.ok()) return Fail("context", ctx.status());
  bench.rt = rt;
  bench.ctx = ctx->get();

  std::printf("GPU %d of %d: %s\n", device, count, gpu->c_str());
  if (PrintSettingsAndYardstick(&bench) != 0) return 1;

  std::unique_ptr<kernels::NsEngine> engine;
  if (absl::GetFlag(FLAGS_staged)) {
    absl::StatusOr<std::unique_ptr<kernels::NsEngine>> made =
        kernels::MakeCudaNsEngine(device, bench.precision);
    if (!made.ok()) return Fail("MakeCudaNsEngine", made.status());
    engine = std::move(*made);
  }
  bench.engine = engine.get();
  for (const Shape& shape : shapes) {
    if (BenchShape(bench, shape) != 0) return 1;
  }
  engine.reset();
  ctx->reset();  // Synchronises the stream.
  const absl::Status status = (*stream)->Synchronize(kSyncTimeout);
  if (!status.ok()) return Fail("stream", status);
  return 0;
}
