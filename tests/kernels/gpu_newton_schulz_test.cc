// Newton-Schulz on the GPU (kernels/cuda/newton_schulz_cuda.h and the
// host-staged MakeCudaNsEngine) against the CPU float64 reference. Every
// test skips, naming the reason, where no GPU is visible (always in default
// builds: "built without CUDA").
//
// Error bounds: GpuErrorBound in tests/kernels/ns_test_util.h (fp32: max
// 1e-4; tf32: Frobenius 1e-2, max 3e-2; bf16: Frobenius 4e-2, max 1e-1;
// derivation and the CPU model that checks them there).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "device/memory.h"
#include "device/runtime.h"
#include "device/stream.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/newton_schulz_cuda.h"
#include "kernels/newton_schulz.h"
#include "kernels/ns_engine.h"
#include "kernels/staged_ns_engine.h"
#include "tests/gpu_test_util.h"
#include "tests/kernels/ns_test_util.h"

// Each GPU test begins with this: skip (never pass silently) without a GPU.
#define MUON_SKIP_WITHOUT_GPU()                                          \
  do {                                                                   \
    std::string reason;                                                  \
    MUON_SKIP_OR_FAIL_UNLESS_GPU(CudaDeviceCount(&reason) == 0, reason); \
  } while (0)

namespace muon {
namespace kernels {
namespace {

using ::muon::kernels::testing::BitwiseEqual;
using ::muon::kernels::testing::EmulateGpuNewtonSchulz;
using ::muon::kernels::testing::ErrorBound;
using ::muon::kernels::testing::FroRelError;
using ::muon::kernels::testing::GpuErrorBound;
using ::muon::kernels::testing::GpuReferenceShapes;
using ::muon::kernels::testing::GramFp32ZMarginShapes;
using ::muon::kernels::testing::MaxRelError;
using ::muon::kernels::testing::PrecisionName;
using ::muon::kernels::testing::PrintGramZErrors;
using ::muon::kernels::testing::RandomMatrix;
using ::muon::kernels::testing::Reference;

constexpr GpuPrecision kPrecisions[] = {
    GpuPrecision::kBf16, GpuPrecision::kTf32, GpuPrecision::kFp32};

std::unique_ptr<NsEngine> MakeEngine(GpuPrecision precision) {
  absl::StatusOr<std::unique_ptr<NsEngine>> engine =
      MakeCudaNsEngine(0, precision);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

std::vector<float> RunEngine(NsEngine* engine, const std::vector<float>& u,
                             int64_t rows, int64_t cols,
                             const NewtonSchulzOptions& options) {
  std::vector<float> out(u.size(), NAN);
  const absl::Status status =
      engine->Orthogonalize(u.data(), rows, cols, options, out.data());
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

// A Newton-Schulz context on cuda:0 with the stream it enqueues on.
// `stream` is declared first so that it outlives the context.
struct CudaNs {
  device::Runtime* runtime = nullptr;
  std::unique_ptr<device::Stream> stream;
  std::unique_ptr<cuda::NsCudaContext> ctx;
  // Waits for the stream's work; its errors fail the calling test.
  absl::Status Sync() { return stream->Synchronize(absl::Minutes(5)); }
};

// `allocator`: the context's scratch (null: the runtime's).
absl::StatusOr<CudaNs> MakeCudaNs(device::Allocator* allocator = nullptr) {
  CudaNs ns;
  absl::StatusOr<device::Runtime*> runtime = device::CudaRuntime(0);
  if (!runtime.ok()) return runtime.status();
  ns.runtime = *runtime;
  absl::StatusOr<std::unique_ptr<device::Stream>> stream =
      ns.runtime->CreateStream("gpu_newton_schulz_test");
  if (!stream.ok()) return stream.status();
  ns.stream = *std::move(stream);
  absl::StatusOr<std::unique_ptr<cuda::NsCudaContext>> ctx =
      cuda::NsCudaContext::Create(ns.runtime, ns.stream.get(), allocator);
  if (!ctx.ok()) return ctx.status();
  ns.ctx = *std::move(ctx);
  return ns;
}

void ExpectWithinBound(const char* what, GpuPrecision precision, int64_t rows,
                       int64_t cols, const std::vector<float>& got,
                       const std::vector<double>& want) {
  const ErrorBound bound = GpuErrorBound(precision);
  const double max_err = MaxRelError(got, want);
  const double fro_err = FroRelError(got, want);
  const std::string key =
      absl::StrCat(what, "_", PrecisionName(precision), "_", rows, "x", cols);
  std::printf("%s: max rel %.3g (bound %.3g), fro rel %.3g (bound %.3g)\n",
              key.c_str(), max_err, bound.max_rel, fro_err, bound.fro_rel);
  ::testing::Test::RecordProperty(key, absl::StrCat(max_err, " ", fro_err));
  EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](float v) {
    return std::isfinite(v);
  })) << key;
  EXPECT_LE(max_err, bound.max_rel) << key;
  EXPECT_LE(fro_err, bound.fro_rel) << key;
}

void CheckScheduleAgainstReference(const char* what,
                                   const NewtonSchulzOptions& options) {
  std::vector<std::unique_ptr<NsEngine>> engines;
  for (GpuPrecision precision : kPrecisions) {
    engines.push_back(MakeEngine(precision));
    ASSERT_NE(engines.back(), nullptr);
  }
  for (auto [rows, cols] : GpuReferenceShapes()) {
    const std::vector<float> u = RandomMatrix(rows, cols, 51);
    const std::vector<double> ref = Reference(u, rows, cols, options);
    for (size_t p = 0; p < engines.size(); ++p) {
      ExpectWithinBound(what, kPrecisions[p], rows, cols,
                        RunEngine(engines[p].get(), u, rows, cols, options),
                        ref);
    }
  }
}

TEST(GpuNewtonSchulzTest, Engine_Quintic_MatchesFloat64ReferenceAllPrecisions) {
  MUON_SKIP_WITHOUT_GPU();
  CheckScheduleAgainstReference("quintic", NewtonSchulzOptions{});
}

TEST(GpuNewtonSchulzTest,
     Engine_PolarExpress_MatchesFloat64ReferenceAllPrecisions) {
  MUON_SKIP_WITHOUT_GPU();
  CheckScheduleAgainstReference("polar_express", PolarExpressSchedule());
}

// Gram Newton-Schulz (the m x m iteration, restart every 2 and every
// iteration) under the standard iteration's bounds: the same polynomial in
// another order.
TEST(GpuNewtonSchulzTest, Engine_Gram_MatchesFloat64ReferenceAllPrecisions) {
  MUON_SKIP_WITHOUT_GPU();
  // Restart 2 and 1: 3 and 5 X updates; restart 3: 2 (an even count:
  // the result in the other X buffer).
  for (int restart : {2, 1, 3}) {
    NewtonSchulzOptions options;
    options.method = NewtonSchulzMethod::kGram;
    options.gram_restart_every = restart;
    CheckScheduleAgainstReference(absl::StrCat("gram", restart).c_str(),
                                  options);
  }
}

// The Gram path is really taken (other products, so other bits than the
// standard iteration), and auto takes it for a 1:4 matrix only.
TEST(GpuNewtonSchulzTest, Engine_GramAndAuto_RunTheGramIteration) {
  MUON_SKIP_WITHOUT_GPU();
  std::unique_ptr<NsEngine> engine = MakeEngine(GpuPrecision::kFp32);
  ASSERT_NE(engine, nullptr);
  NewtonSchulzOptions standard;
  NewtonSchulzOptions gram;
  gram.method = NewtonSchulzMethod::kGram;
  NewtonSchulzOptions automatic;
  automatic.method = NewtonSchulzMethod::kAuto;
  const std::vector<float> wide = RandomMatrix(64, 256, 52);
  const std::vector<float> o_std =
      RunEngine(engine.get(), wide, 64, 256, standard);
  const std::vector<float> o_gram =
      RunEngine(engine.get(), wide, 64, 256, gram);
  EXPECT_FALSE(BitwiseEqual(o_std, o_gram));
  EXPECT_TRUE(
      BitwiseEqual(RunEngine(engine.get(), wide, 64, 256, automatic), o_gram));
  const std::vector<float> square = RandomMatrix(96, 96, 53);
  EXPECT_TRUE(BitwiseEqual(RunEngine(engine.get(), square, 96, 96, automatic),
                           RunEngine(engine.get(), square, 96, 96, standard)));
}

// Small, vector and odd shapes in fp32 (reduced precisions are
// ill-conditioned there, see ns_test_util.h).
TEST(GpuNewtonSchulzTest, Engine_Fp32SmallShapes_MatchFloat64Reference) {
  MUON_SKIP_WITHOUT_GPU();
  std::unique_ptr<NsEngine> engine = MakeEngine(GpuPrecision::kFp32);
  ASSERT_NE(engine, nullptr);
  for (const NewtonSchulzOptions& options :
       {NewtonSchulzOptions{}, PolarExpressSchedule()}) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1},
                              {1, 300},
                              {300, 1},
                              {7, 5},
                              {33, 65},
                              {129, 128}}) {
      const std::vector<float> u = RandomMatrix(rows, cols, 52);
      ExpectWithinBound("small", GpuPrecision::kFp32, rows, cols,
                        RunEngine(engine.get(), u, rows, cols, options),
                        Reference(u, rows, cols, options));
    }
  }
}

// Large shape: the float64 reference would take minutes; compare with the
// CPU fp32 kernel, itself within ~1e-5 of float64.
TEST(GpuNewtonSchulzTest, Engine_Fp32LargeMatrix_MatchesCpuFp32) {
  MUON_SKIP_WITHOUT_GPU();
  std::unique_ptr<NsEngine> gpu = MakeEngine(GpuPrecision::kFp32);
  ASSERT_NE(gpu, nullptr);
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{1024, 3072}, {3072, 1024}}) {
    const std::vector<float> u = RandomMatrix(rows, cols, 53);
    std::vector<float> cpu(u.size());
    ASSERT_TRUE(
        NewtonSchulz(u.data(), rows, cols, {}, cpu.data(), nullptr).ok());
    const std::vector<double> cpu64(cpu.begin(), cpu.end());
    ExpectWithinBound("vs_cpu_fp32", GpuPrecision::kFp32, rows, cols,
                      RunEngine(gpu.get(), u, rows, cols, {}), cpu64);
  }
}

// The symmetric products in tiles as the engine runs them by default
// (batched 8 x 8 tiles), from m = 1024 as MUON_NS_SYMMETRIC_MIN_EDGE asks
// (which the engine's context reads when it is made), on an m that 8 does
// not divide, so the last tiles are smaller and the batched GEMMs have 3
// tile sizes; standard and Gram (every m x m product tiled), in every
// precision, against the CPU's fp32 iteration (within 1e-6 of float64)
// under the float64 bounds.
TEST(GpuNewtonSchulzTest,
     Engine_SymmetricTilesOddEdge_MatchesCpuAllPrecisions) {
  MUON_SKIP_WITHOUT_GPU();
  ASSERT_EQ(setenv("MUON_NS_SYMMETRIC_MIN_EDGE", "1024", 1), 0);
  absl::Cleanup unset = [] { unsetenv("MUON_NS_SYMMETRIC_MIN_EDGE"); };
  NewtonSchulzOptions gram;
  gram.method = NewtonSchulzMethod::kGram;
  // The CPU references once each, not once per precision.
  struct Case {
    int64_t rows, cols;
    NewtonSchulzOptions options;
    std::vector<float> u;
    std::vector<double> cpu64;
  };
  std::vector<Case> cases;
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{1025, 3000}, {3000, 1025}}) {
    for (const NewtonSchulzOptions& options : {NewtonSchulzOptions{}, gram}) {
      Case c{rows, cols, options, RandomMatrix(rows, cols, 57), {}};
      std::vector<float> cpu(c.u.size());
      ASSERT_TRUE(
          NewtonSchulz(c.u.data(), rows, cols, options, cpu.data(), nullptr)
              .ok());
      c.cpu64.assign(cpu.begin(), cpu.end());
      cases.push_back(std::move(c));
    }
  }
  for (GpuPrecision precision : kPrecisions) {
    std::unique_ptr<NsEngine> gpu = MakeEngine(precision);
    ASSERT_NE(gpu, nullptr);
    for (const Case& c : cases) {
      ExpectWithinBound(
          c.options.method == NewtonSchulzMethod::kGram ? "tiles_gram"
                                                        : "tiles",
          precision, c.rows, c.cols,
          RunEngine(gpu.get(), c.u, c.rows, c.cols, c.options), c.cpu64);
    }
  }
}

// NewtonSchulzBatched on a context with `symmetric` (its scratch from
// `allocator`; null: the runtime's): `batch` copies of u (each scaled by
// its index + 1, so that the batch's matrices differ only in scale and
// share one result), the results of each.
std::vector<std::vector<float>> RunWithSymmetric(
    const cuda::SymmetricProducts& symmetric, GpuPrecision precision,
    const std::vector<float>& u, int64_t batch, int64_t rows, int64_t cols,
    const NewtonSchulzOptions& options,
    device::Allocator* allocator = nullptr) {
  absl::StatusOr<CudaNs> ns = MakeCudaNs(allocator);
  EXPECT_TRUE(ns.ok()) << ns.status();
  if (!ns.ok()) return {};
  ns->ctx->set_symmetric_products(symmetric);
  const int64_t size = rows * cols;
  std::vector<float> in(batch * size);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < size; ++i) in[b * size + i] = u[i] * (b + 1);
  }
  absl::StatusOr<device::DeviceBuffer<float>> d_in =
      ::muon::testing::CopyToNewDeviceBuffer(ns->runtime, in);
  absl::StatusOr<device::DeviceBuffer<float>> d_out =
      device::DeviceBuffer<float>::Allocate(ns->runtime->allocator(),
                                            batch * size);
  EXPECT_TRUE(d_in.ok() && d_out.ok());
  if (!d_in.ok() || !d_out.ok()) return {};
  const absl::Status status =
      cuda::NewtonSchulzBatched(ns->ctx.get(), d_in->data(), batch, rows, cols,
                                options, precision, d_out->data());
  EXPECT_TRUE(status.ok()) << status;
  const absl::Status synced = ns->Sync();
  EXPECT_TRUE(synced.ok()) << synced;
  const std::vector<float> all = ::muon::testing::CopyToHostVector(
      ns->runtime, d_out->data(), batch * size);
  std::vector<std::vector<float>> outs;
  for (int64_t b = 0; b < batch; ++b) {
    outs.emplace_back(all.begin() + b * size, all.begin() + (b + 1) * size);
  }
  return outs;
}

// Every way of running the symmetric products (full GEMMs, tile GEMMs in
// turn, batched tile GEMMs with 4 tiles and with 7, whose last tiles are
// smaller, so that batched runs several tile sizes; Gram with every m x m
// product tiled, the default, or its first square only), on a batch of 3
// matrices in every precision, standard and Gram, lands within the float64
// bounds of the CPU's fp32 iteration for each matrix of the batch.
TEST(GpuNewtonSchulzTest,
     SymmetricProductModes_BatchOfThree_MatchCpuAllPrecisions) {
  MUON_SKIP_WITHOUT_GPU();
  std::vector<std::pair<const char*, cuda::SymmetricProducts>> modes;
  cuda::SymmetricProducts full;
  full.mode = cuda::SymmetricMode::kFull;
  modes.push_back({"full", full});
  cuda::SymmetricProducts loop;
  loop.mode = cuda::SymmetricMode::kLoop;
  loop.tiles = 4;
  loop.min_edge = 256;
  modes.push_back({"loop4", loop});
  cuda::SymmetricProducts batched;
  batched.tiles = 4;
  batched.min_edge = 256;
  modes.push_back({"batched4", batched});
  batched.tiles = 7;
  modes.push_back({"batched7", batched});
  // Gram: the first square alone in tiles, the others full GEMMs.
  batched.gram_all = false;
  modes.push_back({"batched7_first", batched});
  NewtonSchulzOptions gram;
  gram.method = NewtonSchulzMethod::kGram;
  const int64_t rows = 300, cols = 700;
  const std::vector<float> u = RandomMatrix(rows, cols, 58);
  for (const NewtonSchulzOptions& options : {NewtonSchulzOptions{}, gram}) {
    std::vector<float> cpu(u.size());
    ASSERT_TRUE(
        NewtonSchulz(u.data(), rows, cols, options, cpu.data(), nullptr).ok());
    const std::vector<double> cpu64(cpu.begin(), cpu.end());
    for (GpuPrecision precision : kPrecisions) {
      for (const auto& [name, symmetric] : modes) {
        const std::vector<std::vector<float>> outs =
            RunWithSymmetric(symmetric, precision, u, 3, rows, cols, options);
        ASSERT_EQ(outs.size(), 3u) << name;
        for (const std::vector<float>& out : outs) {
          ExpectWithinBound(
              absl::StrCat(name, options.method == NewtonSchulzMethod::kGram
                                     ? "_gram"
                                     : "")
                  .c_str(),
              precision, rows, cols, out, cpu64);
        }
      }
    }
  }
}

// steps = 0 is the normalisation alone: the norm is a double sum (tree
// order here, sequential on the CPU), rounded to float, then one IEEE float
// division, so each element is within 1 float ulp of the CPU kernel's
// (equal unless the two double sums round to different floats).
TEST(GpuNewtonSchulzTest, ZeroSteps_Fp32_WithinOneUlpOfCpuNormalisation) {
  MUON_SKIP_WITHOUT_GPU();
  std::unique_ptr<NsEngine> engine = MakeEngine(GpuPrecision::kFp32);
  ASSERT_NE(engine, nullptr);
  NewtonSchulzOptions options = PolarExpressSchedule();
  options.coefficients.clear();
  options.steps = 0;  // norm_scale 1.02 stays.
  const std::vector<float> u = RandomMatrix(333, 777, 54);
  std::vector<float> cpu(u.size());
  ASSERT_TRUE(
      NewtonSchulz(u.data(), 333, 777, options, cpu.data(), nullptr).ok());
  const std::vector<float> gpu = RunEngine(engine.get(), u, 333, 777, options);
  int64_t differing = 0;
  for (size_t i = 0; i < u.size(); ++i) {
    ASSERT_LE(std::abs(gpu[i] - cpu[i]),
              std::nextafter(std::abs(cpu[i]), INFINITY) - std::abs(cpu[i]))
        << i;
    differing += gpu[i] != cpu[i];
  }
  std::printf("normalisation: %lld of %zu elements differ from the CPU's\n",
              static_cast<long long>(differing), u.size());
}

TEST(GpuNewtonSchulzTest, AllZeroMatrix_ReturnsZerosWithoutNaN) {
  MUON_SKIP_WITHOUT_GPU();
  for (GpuPrecision precision : kPrecisions) {
    std::unique_ptr<NsEngine> engine = MakeEngine(precision);
    ASSERT_NE(engine, nullptr);
    const std::vector<float> u(12 * 5, 0.0f);
    for (float v : RunEngine(engine.get(), u, 12, 5, {})) {
      ASSERT_EQ(v, 0.0f) << PrecisionName(precision);
    }
  }
}

TEST(GpuNewtonSchulzTest, Engine_SameInputTwice_BitwiseEqual) {
  MUON_SKIP_WITHOUT_GPU();
  for (GpuPrecision precision : kPrecisions) {
    std::unique_ptr<NsEngine> engine = MakeEngine(precision);
    ASSERT_NE(engine, nullptr);
    ASSERT_TRUE(engine->Reserve(600, 600, {}).ok());
    const std::vector<float> u = RandomMatrix(256, 600, 55);
    const std::vector<float> first = RunEngine(engine.get(), u, 256, 600, {});
    // Stale scratch from a different shape in between.
    RunEngine(engine.get(), RandomMatrix(600, 100, 56), 600, 100, {});
    const std::vector<float> second = RunEngine(engine.get(), u, 256, 600, {});
    EXPECT_TRUE(BitwiseEqual(first, second)) << PrecisionName(precision);
  }
}

TEST(GpuNewtonSchulzTest, Engine_NameAndErrors) {
  MUON_SKIP_WITHOUT_GPU();
  std::unique_ptr<NsEngine> engine = MakeEngine(GpuPrecision::kTf32);
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(engine->name(), "cuda:0/tf32");
  std::vector<float> u(6, 1.0f), out(6);
  EXPECT_EQ(engine->Orthogonalize(u.data(), 0, 6, {}, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->Orthogonalize(u.data(), 2, 3, {}, u.data()).code(),
            absl::StatusCode::kInvalidArgument);
  NewtonSchulzOptions bad;
  bad.norm_scale = -1.0;
  EXPECT_EQ(engine->Orthogonalize(u.data(), 2, 3, bad, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      MakeCudaNsEngine(CudaDeviceCount(), GpuPrecision::kBf16).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeCudaNsEngine(-1, GpuPrecision::kBf16).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Reserve with the Gram options sizes the scratch for the Gram iteration
// (two more m x m buffers than the standard one): a Gram call afterwards
// does not grow it, so a step allocates nothing.
TEST(GpuNewtonSchulzTest, ReserveWithGramOptions_GramCallDoesNotGrowScratch) {
  MUON_SKIP_WITHOUT_GPU();
  absl::StatusOr<CudaNs> ns = MakeCudaNs();
  ASSERT_TRUE(ns.ok()) << ns.status();
  cuda::NsCudaContext* ctx = ns->ctx.get();
  const int64_t rows = 128, cols = 512;
  NewtonSchulzOptions gram;
  gram.method = NewtonSchulzMethod::kGram;
  ASSERT_TRUE(ctx->Reserve(2, rows, cols, GpuPrecision::kBf16).ok());
  const int64_t standard_bytes = ctx->ScratchBytes();
  ASSERT_TRUE(ctx->Reserve(2, rows, cols, GpuPrecision::kBf16, gram).ok());
  const int64_t gram_bytes = ctx->ScratchBytes();
  // Q and the product buffer: 2 x batch x m x m bf16 values (plus alignment).
  EXPECT_GE(gram_bytes - standard_bytes, 2 * 2 * rows * rows * 2);
  const std::vector<float> u = RandomMatrix(2 * rows, cols, 54);
  absl::StatusOr<device::DeviceBuffer<float>> d_u =
      ::muon::testing::CopyToNewDeviceBuffer(ns->runtime, u);
  absl::StatusOr<device::DeviceBuffer<float>> d_o =
      device::DeviceBuffer<float>::Allocate(ns->runtime->allocator(),
                                            2 * rows * cols);
  ASSERT_TRUE(d_u.ok() && d_o.ok());
  ASSERT_TRUE(cuda::NewtonSchulzBatched(ctx, d_u->data(), 2, rows, cols, gram,
                                        GpuPrecision::kBf16, d_o->data())
                  .ok());
  ASSERT_TRUE(ns->Sync().ok());
  EXPECT_EQ(ctx->ScratchBytes(), gram_bytes);
}

// U is read and O written only by the elementwise passes (the GEMMs run
// in scratch), which go in groups of four where U, O and the size allow
// and one by one otherwise. A batch of 2 at U offsets 0 and 1 and O
// offsets 0, 1 and 2 elements into their buffers, with sizes a multiple of
// 4 and not (33 x 65), standard and Gram, bf16 and fp32: every placement
// gives the bits of the aligned one (the standard one within the
// precision's bound of float64), and O's buffer outside the batch stays
// untouched.
TEST(GpuNewtonSchulzTest, UnalignedUAndO_SameBitsAsAligned_NothingOutside) {
  MUON_SKIP_WITHOUT_GPU();
  absl::StatusOr<CudaNs> ns = MakeCudaNs();
  ASSERT_TRUE(ns.ok()) << ns.status();
  NewtonSchulzOptions gram;
  gram.method = NewtonSchulzMethod::kGram;
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{33, 65}, {64, 96}, {96, 64}}) {
    const int64_t size = rows * cols;
    const std::vector<float> one = RandomMatrix(rows, cols, 91);
    std::vector<float> u(2 * size + 1);
    for (int64_t i = 0; i < size; ++i) {
      u[i] = one[i];
      u[size + i] = 2.0f * one[i];
    }
    for (const auto& [precision, options] :
         {std::pair{GpuPrecision::kBf16, NewtonSchulzOptions()},
          std::pair{GpuPrecision::kBf16, gram},
          std::pair{GpuPrecision::kFp32, NewtonSchulzOptions()},
          std::pair{GpuPrecision::kFp32, gram}}) {
      std::vector<float> aligned;
      for (int64_t u_off : {0, 1}) {
        for (int64_t o_off : {0, 1, 2}) {
          std::vector<float> in(u.size() + 1, 0.0f);
          std::copy(u.begin(), u.begin() + 2 * size, in.begin() + u_off);
          auto d_in = ::muon::testing::CopyToNewDeviceBuffer(ns->runtime, in);
          auto d_out = ::muon::testing::CopyToNewDeviceBuffer(
              ns->runtime, std::vector<float>(2 * size + 2, 0.0f));
          ASSERT_TRUE(d_in.ok() && d_out.ok());
          const absl::Status status = cuda::NewtonSchulzBatched(
              ns->ctx.get(), d_in->data() + u_off, 2, rows, cols, options,
              precision, d_out->data() + o_off);
          ASSERT_TRUE(status.ok()) << status;
          ASSERT_TRUE(ns->Sync().ok());
          const std::vector<float> all = ::muon::testing::CopyToHostVector(
              ns->runtime, d_out->data(), 2 * size + 2);
          const std::vector<float> got(all.begin() + o_off,
                                       all.begin() + o_off + 2 * size);
          for (int64_t i = 0; i < 2 * size + 2; ++i) {
            if (i >= o_off && i < o_off + 2 * size) continue;
            EXPECT_EQ(all[i], 0.0f) << "element " << i << " of O's buffer, "
                                    << "outside the batch at offset " << o_off;
          }
          if (aligned.empty()) {
            aligned = got;
            if (options.method == NewtonSchulzMethod::kGram) continue;
            ExpectWithinBound(
                "aligned", precision, rows, cols,
                std::vector<float>(got.begin(), got.begin() + size),
                Reference(one, rows, cols, options));
            continue;
          }
          EXPECT_TRUE(BitwiseEqual(got, aligned))
              << rows << "x" << cols << " U offset " << u_off << " O offset "
              << o_off
              << (options.method == NewtonSchulzMethod::kGram ? " gram"
                                                              : " standard")
              << " " << PrecisionName(precision);
        }
      }
    }
  }
}

// A bucket of same-shape matrices through one strided-batched GEMM per
// product equals orthogonalizing each alone. cuBLAS may pick other kernels
// for the batched call, so equality is within the precision's bound (both
// are valid roundings of the same result); whether the bits agree is
// printed. Each batched matrix is also checked against the float64
// reference, which catches stride or offset mistakes.
TEST(GpuNewtonSchulzTest, Batched_EqualsPerMatrix) {
  MUON_SKIP_WITHOUT_GPU();
  absl::StatusOr<CudaNs> ns = MakeCudaNs();
  ASSERT_TRUE(ns.ok()) << ns.status();
  cuda::NsCudaContext* ctx = ns->ctx.get();
  device::Allocator* alloc = ns->runtime->allocator();
  constexpr int64_t kBatch = 5;
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{192, 320}, {320, 192}}) {
    const int64_t size = rows * cols;
    std::vector<float> u;
    std::vector<std::vector<double>> refs;
    for (int64_t i = 0; i < kBatch; ++i) {
      const std::vector<float> one =
          RandomMatrix(rows, cols, 60 + static_cast<uint32_t>(i));
      u.insert(u.end(), one.begin(), one.end());
      refs.push_back(Reference(one, rows, cols, {}));
    }
    absl::StatusOr<device::DeviceBuffer<float>> d_u =
        ::muon::testing::CopyToNewDeviceBuffer(ns->runtime, u);
    absl::StatusOr<device::DeviceBuffer<float>> d_batched =
        device::DeviceBuffer<float>::Allocate(alloc, kBatch * size);
    absl::StatusOr<device::DeviceBuffer<float>> d_single =
        device::DeviceBuffer<float>::Allocate(alloc, kBatch * size);
    ASSERT_TRUE(d_u.ok() && d_batched.ok() && d_single.ok());
    for (GpuPrecision precision : kPrecisions) {
      ASSERT_TRUE(ctx->Reserve(kBatch, rows, cols, precision).ok());
      ASSERT_TRUE(cuda::NewtonSchulzBatched(ctx, d_u->data(), kBatch, rows,
                                            cols, {}, precision,
                                            d_batched->data())
                      .ok());
      for (int64_t i = 0; i < kBatch; ++i) {
        ASSERT_TRUE(cuda::NewtonSchulzBatched(ctx, d_u->data() + i * size, 1,
                                              rows, cols, {}, precision,
                                              d_single->data() + i * size)
                        .ok());
      }
      ASSERT_TRUE(ns->Sync().ok());
      const std::vector<float> batched = ::muon::testing::CopyToHostVector(
          ns->runtime, d_batched->data(), kBatch * size);
      const std::vector<float> single = ::muon::testing::CopyToHostVector(
          ns->runtime, d_single->data(), kBatch * size);
      for (int64_t i = 0; i < kBatch; ++i) {
        const std::vector<float> b(batched.begin() + i * size,
                                   batched.begin() + (i + 1) * size);
        const std::vector<float> s(single.begin() + i * size,
                                   single.begin() + (i + 1) * size);
        std::printf("batched vs single %s %lldx%lld #%lld: bitwise %d\n",
                    PrecisionName(precision).c_str(),
                    static_cast<long long>(rows), static_cast<long long>(cols),
                    static_cast<long long>(i), BitwiseEqual(b, s) ? 1 : 0);
        ExpectWithinBound("batched_vs_single", precision, rows, cols, b,
                          std::vector<double>(s.begin(), s.end()));
        ExpectWithinBound("batched_vs_reference", precision, rows, cols, b,
                          refs[static_cast<size_t>(i)]);
      }
    }
  }
}

struct GraphCase {
  int64_t batch, rows, cols;
  NewtonSchulzOptions options;
};

// The cases of the CUDA graph tests: the standard iteration, a Gram
// bucket, and the Gram iteration on the transposed shape.
std::vector<GraphCase> GraphCases() {
  NewtonSchulzOptions gram;
  gram.method = NewtonSchulzMethod::kGram;
  return {{1, 256, 384, {}}, {3, 128, 600, gram}, {1, 600, 128, gram}};
}

// For `c` in every precision on ns's context: direct calls on two inputs,
// then the same with graphs on. The replays must be bitwise the direct
// calls, read U's values at their launch (not those of the capture), and
// another output buffer must be another graph.
void ExpectGraphsReplayDirectCalls(CudaNs* ns, const GraphCase& c,
                                   const std::string& what) {
  cuda::NsCudaContext* ctx = ns->ctx.get();
  device::Runtime* rt = ns->runtime;
  const int64_t elems = c.batch * c.rows * c.cols;
  const std::vector<float> u1 = RandomMatrix(c.batch * c.rows, c.cols, 70);
  const std::vector<float> u2 = RandomMatrix(c.batch * c.rows, c.cols, 71);
  absl::StatusOr<device::DeviceBuffer<float>> d_u =
      ::muon::testing::CopyToNewDeviceBuffer(rt, u1);
  absl::StatusOr<device::DeviceBuffer<float>> d_a =
      device::DeviceBuffer<float>::Allocate(rt->allocator(), elems);
  absl::StatusOr<device::DeviceBuffer<float>> d_b =
      device::DeviceBuffer<float>::Allocate(rt->allocator(), elems);
  ASSERT_TRUE(d_u.ok() && d_a.ok() && d_b.ok());
  const auto set_u = [&](const std::vector<float>& u) {
    return rt->CopyFromHost(d_u->data(), u.data(), d_u->bytes());
  };
  const auto run = [&](GpuPrecision precision, float* out) {
    absl::Status status = cuda::NewtonSchulzBatched(
        ctx, d_u->data(), c.batch, c.rows, c.cols, c.options, precision, out);
    if (status.ok()) status = ns->Sync();
    EXPECT_TRUE(status.ok()) << status;
    return ::muon::testing::CopyToHostVector(rt, out, elems);
  };
  for (GpuPrecision precision : kPrecisions) {
    const std::string where = absl::StrCat(
        what, " ", PrecisionName(precision), " ", c.batch, " x ", c.rows, "x",
        c.cols, " ", NewtonSchulzMethodName(c.options.method));
    ctx->set_cuda_graphs(false);
    ASSERT_TRUE(
        ctx->Reserve(c.batch, c.rows, c.cols, precision, c.options).ok());
    ASSERT_TRUE(set_u(u1).ok());
    const std::vector<float> direct1 = run(precision, d_a->data());
    ASSERT_TRUE(set_u(u2).ok());
    const std::vector<float> direct2 = run(precision, d_a->data());
    ASSERT_FALSE(BitwiseEqual(direct1, direct2)) << where;
    ASSERT_TRUE(set_u(u1).ok());

    ctx->set_cuda_graphs(true);
    const int before = ctx->CudaGraphCount();
    EXPECT_TRUE(BitwiseEqual(run(precision, d_a->data()), direct1)) << where;
    EXPECT_EQ(ctx->CudaGraphCount(), before + 1)
        << where << ": " << ctx->cuda_graph_capture_error();
    ASSERT_TRUE(set_u(u2).ok());
    EXPECT_TRUE(BitwiseEqual(run(precision, d_a->data()), direct2))
        << where << ": the replay";
    EXPECT_EQ(ctx->CudaGraphCount(), before + 1) << where << ": replayed";
    EXPECT_TRUE(BitwiseEqual(run(precision, d_b->data()), direct2))
        << where << ": another output";
    EXPECT_EQ(ctx->CudaGraphCount(), before + 2) << where;
    EXPECT_TRUE(ctx->cuda_graphs())
        << where << ": a capture failed: " << ctx->cuda_graph_capture_error();
  }
  ctx->set_cuda_graphs(false);
}

// With CUDA graphs on, a call is captured once per key and replayed,
// bitwise the direct calls, with full-GEMM products and with the
// symmetric products' tiles (batched, and in turn) at small edges.
TEST(GpuNewtonSchulzTest,
     CudaGraphs_ReplaysBitwiseDirectCalls_OneGraphPerCall) {
  MUON_SKIP_WITHOUT_GPU();
  absl::StatusOr<CudaNs> ns = MakeCudaNs();
  ASSERT_TRUE(ns.ok()) << ns.status();
  using cuda::SymmetricMode;
  const std::vector<std::pair<std::string, cuda::SymmetricProducts>> ways = {
      {"full GEMMs", {SymmetricMode::kFull, 8, 4096, true}},
      {"4x4 tiles batched from 64", {SymmetricMode::kBatched, 4, 64, true}},
      {"4x4 tiles in turn from 64", {SymmetricMode::kLoop, 4, 64, true}}};
  for (const auto& [what, way] : ways) {
    ns->ctx->set_symmetric_products(way);
    for (const GraphCase& c : GraphCases()) {
      ExpectGraphsReplayDirectCalls(&*ns, c, what);
    }
  }
}

// A context whose very first call is captured (no direct call has loaded
// the kernels or warmed cuBLAS) gives the bits of a direct context.
TEST(GpuNewtonSchulzTest, CudaGraphs_FirstCallOfNewContext_BitwiseDirect) {
  MUON_SKIP_WITHOUT_GPU();
  for (const GraphCase& c : GraphCases()) {
    absl::StatusOr<CudaNs> direct = MakeCudaNs();
    absl::StatusOr<CudaNs> graphs = MakeCudaNs();
    ASSERT_TRUE(direct.ok() && graphs.ok());
    graphs->ctx->set_cuda_graphs(true);
    const int64_t elems = c.batch * c.rows * c.cols;
    const std::vector<float> u = RandomMatrix(c.batch * c.rows, c.cols, 72);
    std::vector<std::vector<float>> got;
    for (CudaNs* ns : {&*direct, &*graphs}) {
      absl::StatusOr<device::DeviceBuffer<float>> d_u =
          ::muon::testing::CopyToNewDeviceBuffer(ns->runtime, u);
      absl::StatusOr<device::DeviceBuffer<float>> d_o =
          device::DeviceBuffer<float>::Allocate(ns->runtime->allocator(),
                                                elems);
      ASSERT_TRUE(d_u.ok() && d_o.ok());
      absl::Status status = cuda::NewtonSchulzBatched(
          ns->ctx.get(), d_u->data(), c.batch, c.rows, c.cols, c.options,
          GpuPrecision::kBf16, d_o->data());
      if (status.ok()) status = ns->Sync();
      ASSERT_TRUE(status.ok()) << status;
      got.push_back(
          ::muon::testing::CopyToHostVector(ns->runtime, d_o->data(), elems));
    }
    EXPECT_TRUE(BitwiseEqual(got[0], got[1])) << c.rows << "x" << c.cols;
    EXPECT_EQ(graphs->ctx->CudaGraphCount(), 1)
        << graphs->ctx->cuda_graph_capture_error();
  }
}

// MUON_NS_GRAM_FP32_Z=1: the bf16 Gram iteration (restart every 2) forms
// Z in fp32 and rounds it once, and so lands no farther from the float64
// iteration than the bf16 standard one, and nearer than Gram's default
// double rounding, as the CPU model of the arithmetic predicts
// (ns_precision_model_test, seed 1: standard 1.162e-2 / 1.137e-2, Gram
// 1.308e-2 / 1.328e-2 by default, 8.88e-3 / 8.78e-3 with fp32 Z at
// 256x1024 / 1024x256: margins of 0.76x and 0.77x for the GPU's own
// accumulation order). Also: its scratch holds the fp32 Z.
TEST(GpuNewtonSchulzTest, GramBf16Fp32Z_NoFartherFromFloat64ThanStandard) {
  MUON_SKIP_WITHOUT_GPU();
  const auto unset = absl::MakeCleanup([] { unsetenv("MUON_NS_GRAM_FP32_Z"); });
  ASSERT_EQ(setenv("MUON_NS_GRAM_FP32_Z", "1", 1), 0);
  std::unique_ptr<NsEngine> fp32_z = MakeEngine(GpuPrecision::kBf16);
  absl::StatusOr<CudaNs> fp32_z_ctx = MakeCudaNs();
  unsetenv("MUON_NS_GRAM_FP32_Z");
  std::unique_ptr<NsEngine> plain = MakeEngine(GpuPrecision::kBf16);
  absl::StatusOr<CudaNs> plain_ctx = MakeCudaNs();
  ASSERT_TRUE(fp32_z != nullptr && plain != nullptr);
  ASSERT_TRUE(fp32_z_ctx.ok() && plain_ctx.ok());
  NewtonSchulzOptions gram;
  gram.method = NewtonSchulzMethod::kGram;
  for (auto [rows, cols] : GramFp32ZMarginShapes()) {
    const std::vector<float> u = RandomMatrix(rows, cols, 1);
    const std::vector<double> ref = Reference(u, rows, cols, {});
    const double standard =
        FroRelError(RunEngine(plain.get(), u, rows, cols, {}), ref);
    const double gram_default =
        FroRelError(RunEngine(plain.get(), u, rows, cols, gram), ref);
    const double gram_fp32_z =
        FroRelError(RunEngine(fp32_z.get(), u, rows, cols, gram), ref);
    PrintGramZErrors("bf16", rows, cols, standard, gram_default, gram_fp32_z);
    EXPECT_LE(gram_fp32_z, standard) << rows << "x" << cols;
    EXPECT_LT(gram_fp32_z, gram_default) << rows << "x" << cols;
  }
  const int64_t m = 512;
  ASSERT_TRUE(
      plain_ctx->ctx->Reserve(2, m, 4 * m, GpuPrecision::kBf16, gram).ok());
  ASSERT_TRUE(
      fp32_z_ctx->ctx->Reserve(2, m, 4 * m, GpuPrecision::kBf16, gram).ok());
  EXPECT_GE(fp32_z_ctx->ctx->ScratchBytes() - plain_ctx->ctx->ScratchBytes(),
            2 * m * m * int64_t{sizeof(float)});
}

// A bucket of 3 (strided batches, one diagonal per matrix) through the
// bf16 Gram iteration with fp32 Z, wide and tall, with R R as one GEMM
// and in symmetric tiles (fp32 tile outputs, mirrored as 32-bit words:
// in turn, and batched with 4 and 7 tiles, whose last tiles are smaller;
// m = 100 leaves partial 32 x 32 squares in the Z pass): each matrix
// within the bf16 bound of the float64 iteration and of the CPU model of
// the same arithmetic.
TEST(GpuNewtonSchulzTest,
     GramBf16Fp32Z_BucketAnyTiling_EachMatrixMatchesModel) {
  MUON_SKIP_WITHOUT_GPU();
  const auto unset = absl::MakeCleanup([] { unsetenv("MUON_NS_GRAM_FP32_Z"); });
  ASSERT_EQ(setenv("MUON_NS_GRAM_FP32_Z", "1", 1), 0);
  std::vector<std::pair<std::string, cuda::SymmetricProducts>> modes;
  cuda::SymmetricProducts tiled;  // the default: m = 128 is not tiled
  modes.push_back({"full", tiled});
  tiled.min_edge = 64;
  tiled.tiles = 4;
  modes.push_back({"batched4", tiled});
  tiled.tiles = 7;
  modes.push_back({"batched7", tiled});
  tiled.mode = cuda::SymmetricMode::kLoop;
  tiled.tiles = 4;
  modes.push_back({"loop4", tiled});
  NewtonSchulzOptions gram;
  gram.method = NewtonSchulzMethod::kGram;
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{128, 600},
                            {600, 128},
                            {100, 600},
                            {600, 100}}) {
    const std::vector<float> u = RandomMatrix(rows, cols, 73);
    const std::vector<double> ref = Reference(u, rows, cols, {});
    const std::vector<float> model = EmulateGpuNewtonSchulz(
        u, rows, cols, gram, GpuPrecision::kBf16, /*gram_fp32_z=*/true);
    const std::vector<double> model64(model.begin(), model.end());
    for (const auto& [name, symmetric] : modes) {
      const std::vector<std::vector<float>> outs = RunWithSymmetric(
          symmetric, GpuPrecision::kBf16, u, 3, rows, cols, gram);
      ASSERT_EQ(outs.size(), 3u) << name;
      for (const std::vector<float>& out : outs) {
        ExpectWithinBound(("gram_fp32_z_" + name).c_str(), GpuPrecision::kBf16,
                          rows, cols, out, ref);
        ExpectWithinBound(("gram_fp32_z_" + name + "_vs_model").c_str(),
                          GpuPrecision::kBf16, rows, cols, out, model64);
      }
    }
  }
}

// The CUDA device's allocator, with every allocation filled with 0xFF
// bytes first: NaN as fp32 and as bf16.
class NanFilledAllocator final : public device::Allocator {
 public:
  explicit NanFilledAllocator(device::Runtime* runtime) : runtime_(runtime) {}
  device::Device device() const override {
    return runtime_->allocator()->device();
  }
  absl::StatusOr<void*> AllocateRaw(int64_t bytes) override {
    absl::StatusOr<void*> p = runtime_->allocator()->AllocateRaw(bytes);
    if (!p.ok() || *p == nullptr) return p;
    const std::vector<unsigned char> nan(static_cast<size_t>(bytes), 0xFF);
    const absl::Status filled = runtime_->CopyFromHost(*p, nan.data(), bytes);
    if (!filled.ok()) {
      runtime_->allocator()->DeallocateRaw(*p);
      return filled;
    }
    return p;
  }
  void DeallocateRaw(void* p) override {
    runtime_->allocator()->DeallocateRaw(p);
  }

 private:
  device::Runtime* const runtime_;
};

// Scratch that starts as NaN changes no bit of the result, in every
// precision, standard and Gram (with and without MUON_NS_GRAM_FP32_Z),
// wide and tall, with the symmetric products in 7 batched tiles (the last
// ones smaller): every tile a mirror copy reads, every fp32 P the fp32-Z
// pass reads and every GEMM output read with beta != 0 was written
// earlier in the same call. The GEMM simulator (ns_gemm_plan_test) checks
// the plan's order on NaN-filled buffers; this checks the CUDA kernels.
TEST(GpuNewtonSchulzTest, ScratchStartingAsNaN_SameBitsAsFreshScratch) {
  MUON_SKIP_WITHOUT_GPU();
  const auto unset = absl::MakeCleanup([] { unsetenv("MUON_NS_GRAM_FP32_Z"); });
  absl::StatusOr<device::Runtime*> runtime = device::CudaRuntime(0);
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  cuda::SymmetricProducts tiled;
  tiled.min_edge = 64;
  tiled.tiles = 7;
  NewtonSchulzOptions gram;
  gram.method = NewtonSchulzMethod::kGram;
  for (const char* fp32_z : {"0", "1"}) {
    ASSERT_EQ(setenv("MUON_NS_GRAM_FP32_Z", fp32_z, 1), 0);
    for (auto [rows, cols] :
         {std::pair<int64_t, int64_t>{300, 700}, {700, 300}}) {
      const std::vector<float> u = RandomMatrix(rows, cols, 59);
      for (GpuPrecision precision : kPrecisions) {
        for (const NewtonSchulzOptions& options :
             {NewtonSchulzOptions{}, gram}) {
          const std::string what = absl::StrCat(
              PrecisionName(precision), " ", rows, "x", cols,
              options.method == NewtonSchulzMethod::kGram ? " gram" : "",
              " MUON_NS_GRAM_FP32_Z=", fp32_z);
          NanFilledAllocator nan(*runtime);
          const std::vector<std::vector<float>> want =
              RunWithSymmetric(tiled, precision, u, 2, rows, cols, options);
          const std::vector<std::vector<float>> got = RunWithSymmetric(
              tiled, precision, u, 2, rows, cols, options, &nan);
          ASSERT_EQ(want.size(), 2u) << what;
          ASSERT_EQ(got.size(), 2u) << what;
          for (size_t b = 0; b < got.size(); ++b) {
            EXPECT_TRUE(std::all_of(got[b].begin(), got[b].end(),
                                    [](float v) { return std::isfinite(v); }))
                << what << ", matrix " << b;
            EXPECT_TRUE(BitwiseEqual(got[b], want[b]))
                << what << ", matrix " << b;
          }
        }
      }
    }
  }
}

// MUON_NS_CUDA_GRAPHS: "1" turns graphs on for the contexts created while
// it is set; other text is refused by name.
TEST(GpuNewtonSchulzTest, CudaGraphsSetting_OneTurnsOnOtherTextRefused) {
  MUON_SKIP_WITHOUT_GPU();
  const auto unset = absl::MakeCleanup([] { unsetenv("MUON_NS_CUDA_GRAPHS"); });
  ASSERT_EQ(setenv("MUON_NS_CUDA_GRAPHS", "1", 1), 0);
  absl::StatusOr<CudaNs> on = MakeCudaNs();
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE(on->ctx->cuda_graphs());
  ASSERT_EQ(setenv("MUON_NS_CUDA_GRAPHS", "2", 1), 0);
  absl::StatusOr<CudaNs> refused = MakeCudaNs();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              ::testing::HasSubstr("MUON_NS_CUDA_GRAPHS must be 0 or 1"));
  unsetenv("MUON_NS_CUDA_GRAPHS");
  absl::StatusOr<CudaNs> off = MakeCudaNs();
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->ctx->cuda_graphs());
}

}  // namespace
}  // namespace kernels
}  // namespace muon
