// Muon over parameters on a CUDA device (world of one): the whole step on
// the GPU (momentum, finite check, snapshot, Newton-Schulz, apply), ordered
// on the caller's stream. Proven against the host:
//   - with gpu_precision "fp32", bitwise equal to CPU parameters whose
//     Newton-Schulz runs host-staged on the same GPU (MuonOptions::device
//     "cuda": the same cuBLAS iteration, batch 1 per shape; the elementwise
//     kernels round each operation as the CPU's do), for fp32 and bf16
//     parameters over three steps, momentum included, and so with NorMuon
//     (its CUDA kernel against the host's, row state included);
//   - with the default bf16 Newton-Schulz, within torch.optim.Muon's bf16
//     bound of the CPU step;
// and the device-side paths: the non-finite check, the transactional
// rollback, state_dict round trips, a caller stream, the step begun during
// backward (MarkReadyOnStream on the stream that produced each gradient,
// with and without check_finite); and QK-clip's row scaling on the device
// (QkClipper with the CUDA kernels), bitwise the host's. Skips without a
// GPU (fails with MUON_REQUIRE_GPU=1; tools/device_checks.sh runs it).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "client/muon_options.h"
#include "client/qk_clipper.h"
#include "client/tensor_view.h"
#include "common/layout.h"
#include "common/status_macros.h"
#include "device/cuda_runtime.h"
#include "device/memory.h"
#include "device/runtime.h"
#include "gtest/gtest.h"
#include "kernels/bfloat16.h"
#include "kernels/step_kernels.h"
#include "tests/client/rank_threads.h"
#include "tests/gpu_test_util.h"

namespace muon {
namespace {

using ::muon::testing::BitwiseEqual;
using ::muon::testing::RandomValues;

struct Shape {
  const char* name;
  int64_t rows, cols;
};

// Distinct shapes: one Newton-Schulz call of batch 1 each, as the
// host-staged engine makes.
const std::vector<Shape>& Shapes() {
  static const std::vector<Shape> shapes = {
      {"w0", 96, 64}, {"w1", 64, 160}, {"w2", 48, 48}};
  return shapes;
}

// Parameters and gradients held on the host (for CPU parameters) or copied
// to cuda:0, in fp32 or bf16.
class Params {
 public:
  Params(bool on_gpu, DType dtype) : on_gpu_(on_gpu), dtype_(dtype) {
    if (on_gpu_) {
      absl::StatusOr<device::Runtime*> rt =
          device::GetRuntime(device::Device::Cuda(0));
      EXPECT_TRUE(rt.ok()) << rt.status();
      runtime_ = *rt;
    } else {
      runtime_ = device::HostRuntime();
    }
    for (size_t i = 0; i < Shapes().size(); ++i) {
      const int64_t bytes = Numel(i) * DTypeSize(dtype_);
      data_.push_back(
          *device::DeviceMemory::Allocate(runtime_->allocator(), bytes));
      grad_.push_back(
          *device::DeviceMemory::Allocate(runtime_->allocator(), bytes));
      Write(data_[i], Scaled(RandomValues(Numel(i), 20 + i), 0.02f));
    }
  }

  static int64_t Numel(size_t i) { return Shapes()[i].rows * Shapes()[i].cols; }

  std::vector<ParamView> Views() const {
    std::vector<ParamView> views;
    for (size_t i = 0; i < Shapes().size(); ++i) {
      ParamView v;
      v.name = Shapes()[i].name;
      v.data = data_[i].data();
      v.grad = grad_[i].data();
      v.dtype = dtype_;
      v.grad_dtype = dtype_;
      v.local_shape = {Shapes()[i].rows, Shapes()[i].cols};
      v.device = on_gpu_ ? device::Device::Cuda(0) : device::Device::Host();
      views.push_back(v);
    }
    return views;
  }

  // Gradients of step `step` (the same values on every holder), times
  // `factor`.
  void SetGrads(int step, float factor = 1.0f) {
    for (size_t i = 0; i < Shapes().size(); ++i) {
      Write(grad_[i], Scaled(RandomValues(Numel(i), 100 * step + i), factor));
    }
  }
  void SetGradValue(size_t i, int64_t index, float value) {
    std::vector<float> g = Read(grad_[i], Numel(i));
    g[index] = value;
    Write(grad_[i], g);
  }

  void SetData(size_t i, const std::vector<float>& v) { Write(data_[i], v); }

  // SetData ordered on `stream` (an asynchronous copy from a host buffer
  // kept until the next call for i).
  absl::Status SetDataOnStream(size_t i, const std::vector<float>& v,
                               device::Stream* stream) {
    staged_.resize(Shapes().size());
    std::vector<char>& host = staged_[i];
    if (dtype_ == DType::kFloat32) {
      host.resize(v.size() * 4);
      std::memcpy(host.data(), v.data(), host.size());
    } else {
      host.resize(v.size() * 2);
      for (size_t k = 0; k < v.size(); ++k) {
        const kernels::bf16_t b = kernels::FloatToBf16(v[k]);
        std::memcpy(host.data() + 2 * k, &b, 2);
      }
    }
    return runtime_->CopyFromHostOnStream(stream, data_[i].data(), host.data(),
                                          static_cast<int64_t>(host.size()));
  }

  // Parameter i's gradient on its device, and its dtype for the kernels.
  void* grad(size_t i) { return grad_[i].data(); }
  kernels::ParamDType kernel_dtype() const {
    return dtype_ == DType::kBFloat16 ? kernels::ParamDType::kBFloat16
                                      : kernels::ParamDType::kFloat32;
  }

  // The parameters' bits, widened to fp32 (exact for bf16).
  std::vector<float> Data(size_t i) const { return Read(data_[i], Numel(i)); }

 private:
  static std::vector<float> Scaled(std::vector<float> v, float s) {
    for (float& x : v) x *= s;
    return v;
  }
  void Write(device::DeviceMemory& mem, const std::vector<float>& v) const {
    if (dtype_ == DType::kFloat32) {
      ASSERT_TRUE(
          runtime_->CopyFromHost(mem.data(), v.data(), v.size() * 4).ok());
      return;
    }
    std::vector<kernels::bf16_t> b(v.size());
    for (size_t k = 0; k < v.size(); ++k) b[k] = kernels::FloatToBf16(v[k]);
    ASSERT_TRUE(
        runtime_->CopyFromHost(mem.data(), b.data(), b.size() * 2).ok());
  }
  std::vector<float> Read(const device::DeviceMemory& mem, int64_t n) const {
    std::vector<float> out(n);
    if (dtype_ == DType::kFloat32) {
      EXPECT_TRUE(runtime_->CopyToHost(out.data(), mem.data(), n * 4).ok());
      return out;
    }
    std::vector<kernels::bf16_t> b(n);
    EXPECT_TRUE(runtime_->CopyToHost(b.data(), mem.data(), n * 2).ok());
    for (int64_t k = 0; k < n; ++k) out[k] = kernels::Bf16ToFloat(b[k]);
    return out;
  }

  const bool on_gpu_;
  const DType dtype_;
  device::Runtime* runtime_ = nullptr;
  std::vector<device::DeviceMemory> data_;
  std::vector<device::DeviceMemory> grad_;
  std::vector<std::vector<char>> staged_;  // SetDataOnStream's sources
};

MuonOptions Options(const std::string& precision) {
  MuonOptions o;
  o.lr = 0.02;
  o.gpu_precision = *kernels::ParseGpuPrecision(precision);
  return o;
}

struct OptimizerRun {
  std::unique_ptr<Params> params;
  std::unique_ptr<Muon> muon;
};

// `steps` steps; CPU parameters with Newton-Schulz host-staged on cuda:0
// when `host_staged`.
OptimizerRun Steps(bool on_gpu, DType dtype, const MuonOptions& options,
                   int steps) {
  OptimizerRun run;
  run.params = std::make_unique<Params>(on_gpu, dtype);
  absl::StatusOr<std::unique_ptr<Muon>> muon =
      Muon::Create(run.params->Views(), options);
  EXPECT_TRUE(muon.ok()) << muon.status();
  if (!muon.ok()) return run;
  run.muon = *std::move(muon);
  for (int s = 0; s < steps; ++s) {
    run.params->SetGrads(s);
    const absl::Status st = run.muon->Step();
    EXPECT_TRUE(st.ok()) << st;
  }
  return run;
}

// The same `steps` steps with `options` on CPU parameters whose
// Newton-Schulz runs host-staged on cuda:0 (`host`) and on CUDA parameters
// (`gpu`).
struct HostStagedAndGpu {
  OptimizerRun host;
  OptimizerRun gpu;
};
HostStagedAndGpu RunHostStagedAndGpu(DType dtype, const MuonOptions& options,
                                     int steps) {
  MuonOptions host_staged = options;
  host_staged.device = device::DeviceKind::kCuda;
  HostStagedAndGpu runs;
  runs.host = Steps(/*on_gpu=*/false, dtype, host_staged, steps);
  runs.gpu = Steps(/*on_gpu=*/true, dtype, options, steps);
  return runs;
}

TEST(GpuMuonTest, CudaParamsFp32Mode_BitwiseEqualToHostStagedCudaNewtonSchulz) {
  MUON_SKIP_OR_FAIL_UNLESS_CUDA_DEVICE();
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    const HostStagedAndGpu runs =
        RunHostStagedAndGpu(dtype, Options("fp32"), 3);
    const OptimizerRun& ref = runs.host;
    const OptimizerRun& gpu = runs.gpu;
    ASSERT_NE(ref.muon, nullptr);
    ASSERT_NE(gpu.muon, nullptr);
    EXPECT_EQ(gpu.muon->step_count(), 3);
    EXPECT_EQ(gpu.muon->last_step_stats().matrices_orthogonalized, 3);
    for (size_t i = 0; i < Shapes().size(); ++i) {
      EXPECT_TRUE(BitwiseEqual(gpu.params->Data(i), ref.params->Data(i)))
          << Shapes()[i].name;
      EXPECT_TRUE(BitwiseEqual(gpu.muon->momentum_buffer(i),
                               ref.muon->momentum_buffer(i)))
          << Shapes()[i].name;
    }
  }
}

// On the device as on the host: momentum in the parameter's dtype (torch's
// bytes per parameter), and the Newton-Schulz scratch counted.
TEST(GpuMuonTest, CudaParams_MemoryCountsTorchMomentumBytesAndScratch) {
  MUON_SKIP_OR_FAIL_UNLESS_CUDA_DEVICE();
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    const OptimizerRun gpu = Steps(/*on_gpu=*/true, dtype, Options("bf16"), 1);
    ASSERT_NE(gpu.muon, nullptr);
    int64_t numel = 0;
    for (size_t i = 0; i < Shapes().size(); ++i) numel += gpu.params->Numel(i);
    const OptimizerMemory mem = gpu.muon->memory();
    EXPECT_EQ(mem.momentum_bytes, numel * (dtype == DType::kBFloat16 ? 2 : 4));
    EXPECT_EQ(mem.state_bytes,
              mem.momentum_bytes + 8 * static_cast<int64_t>(Shapes().size()));
    EXPECT_GT(mem.scratch_bytes, 0);
    EXPECT_EQ(mem.peak_bytes,
              mem.state_bytes + mem.buffer_bytes + mem.scratch_bytes);
  }
}

TEST(GpuMuonTest, CudaParamsBf16NewtonSchulz_WithinTorchBoundOfCpuStep) {
  MUON_SKIP_OR_FAIL_UNLESS_CUDA_DEVICE();
  const OptimizerRun cpu =
      Steps(/*on_gpu=*/false, DType::kFloat32, Options("fp32"), 1);
  const OptimizerRun gpu =
      Steps(/*on_gpu=*/true, DType::kFloat32, Options("bf16"), 1);
  ASSERT_NE(gpu.muon, nullptr);
  const Params initial(/*on_gpu=*/false, DType::kFloat32);
  for (size_t i = 0; i < Shapes().size(); ++i) {
    const std::vector<float> a = gpu.params->Data(i);
    const std::vector<float> b = cpu.params->Data(i);
    const std::vector<float> w0 = initial.Data(i);
    double diff = 0, norm = 0;
    for (size_t k = 0; k < a.size(); ++k) {
      diff += (double{a[k]} - b[k]) * (double{a[k]} - b[k]);
      norm += (double{b[k]} - w0[k]) * (double{b[k]} - w0[k]);
    }
    const double rel = std::sqrt(diff / norm);
    // tools/torch_muon_compare.py's Frobenius bound for bf16 Newton-Schulz.
    std::printf(
        "%s: bf16 GPU step vs fp32 CPU step, relative update "
        "difference %.3g (bound 4e-2)\n",
        Shapes()[i].name, rel);
    EXPECT_LT(rel, 4e-2) << Shapes()[i].name;
    EXPECT_GT(rel, 0.0) << "bf16 and fp32 cannot agree to the bit";
  }
}

TEST(GpuMuonTest, CudaParams_NonFiniteGradient_FailedPreconditionUnchanged) {
  MUON_SKIP_OR_FAIL_UNLESS_CUDA_DEVICE();
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    OptimizerRun run = Steps(/*on_gpu=*/true, dtype, Options("fp32"), 1);
    ASSERT_NE(run.muon, nullptr);
    std::vector<std::vector<float>> before, momentum;
    for (size_t i = 0; i < Shapes().size(); ++i) {
      before.push_back(run.params->Data(i));
      momentum.push_back(run.muon->momentum_buffer(i));
    }
    run.params->SetGrads(1);
    run.params->SetGradValue(1, 77, std::numeric_limits<float>::infinity());
    run.params->SetGradValue(1, 5, std::nanf(""));
    const absl::Status st = run.muon->Step();
    EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
    EXPECT_NE(st.message().find("\"w1\" has a non-finite gradient (nan at "
                                "local index 5) at step 2"),
              std::string::npos)
        << st;
    EXPECT_EQ(run.muon->step_count(), 1);
    for (size_t i = 0; i < Shapes().size(); ++i) {
      EXPECT_TRUE(BitwiseEqual(run.params->Data(i), before[i]));
      EXPECT_TRUE(BitwiseEqual(run.muon->momentum_buffer(i), momentum[i]));
    }
  }
}

TEST(GpuMuonTest, CudaParams_TransactionalStepFault_RestoredBitwise) {
  MUON_SKIP_OR_FAIL_UNLESS_CUDA_DEVICE();
  MuonOptions options = Options("fp32");
  options.transactional_step = true;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    OptimizerRun run = Steps(/*on_gpu=*/true, dtype, options, 1);
    ASSERT_NE(run.muon, nullptr);
    std::vector<std::vector<float>> before, momentum;
    for (size_t i = 0; i < Shapes().size(); ++i) {
      before.push_back(run.params->Data(i));
      momentum.push_back(run.muon->momentum_buffer(i));
    }
    run.muon->SetPostUpdateFaultForTesting([](int64_t) {
      return absl::InternalError("planted fault after the update");
    });
    run.params->SetGrads(1);
    const absl::Status st = run.muon->Step();
    EXPECT_TRUE(absl::IsInternal(st)) << st;
    EXPECT_EQ(run.muon->step_count(), 1);
    for (size_t i = 0; i < Shapes().size(); ++i) {
      EXPECT_TRUE(BitwiseEqual(run.params->Data(i), before[i]));
      EXPECT_TRUE(BitwiseEqual(run.muon->momentum_buffer(i), momentum[i]));
    }
  }
}

TEST(GpuMuonTest, CudaParams_StateDictIntoFreshOptimizer_SameNextStep) {
  MUON_SKIP_OR_FAIL_UNLESS_CUDA_DEVICE();
  OptimizerRun a = Steps(/*on_gpu=*/true, DType::kFloat32, Options("fp32"), 2);
  ASSERT_NE(a.muon, nullptr);
  // b: a fresh optimizer over a copy of a's parameters, loaded with a's
  // state (the momentum goes host -> device).
  Params b_params(/*on_gpu=*/true, DType::kFloat32);
  for (size_t i = 0; i < Shapes().size(); ++i) {
    b_params.SetData(i, a.params->Data(i));
  }
  absl::StatusOr<std::unique_ptr<Muon>> b =
      Muon::Create(b_params.Views(), Options("fp32"));
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE((*b)->load_state_dict(a.muon->state_dict()).ok());
  EXPECT_EQ((*b)->step_count(), 2);
  a.params->SetGrads(2);
  b_params.SetGrads(2);
  ASSERT_TRUE(a.muon->Step().ok());
  ASSERT_TRUE((*b)->Step().ok());
  for (size_t i = 0; i < Shapes().size(); ++i) {
    EXPECT_TRUE(BitwiseEqual(b_params.Data(i), a.params->Data(i)));
    EXPECT_TRUE(
        BitwiseEqual((*b)->momentum_buffer(i), a.muon->momentum_buffer(i)));
  }
}

// QK-clip of one layer: w0's 6 query heads of 16 rows in 2 groups, w1's 2
// key heads from row 8; threshold 100, alpha 0.5.
QkClipOptions OneLayerQkClip() {
  QkClipOptions options;
  options.threshold = 100;
  options.alpha = 0.5;
  QkClipLayer layer;
  layer.q_param = "w0";
  layer.k_param = "w1";
  layer.k_row_begin = 8;
  layer.num_heads = 6;
  layer.num_kv_heads = 2;
  layer.head_dim = 16;
  options.layers = {layer};
  return options;
}

// Maxima of OneLayerQkClip's heads that clip both groups.
const std::vector<float>& LayerMaxLogits() {
  static const std::vector<float> maxima = {50, 400, 120, 80, 250, -INFINITY};
  return maxima;
}

// OneLayerQkClip on `params`: the rows of both groups scaled, with
// `kernels` on `stream`. Returns the groups clipped (-1 on an error).
int64_t ClipLayer(const Params& params, kernels::StepKernels& kernels,
                  device::Stream* stream) {
  const QkClipOptions options = OneLayerQkClip();
  const std::vector<ParamView> views = params.Views();
  const std::vector<ParamPlacement> placements(
      views.size(), ParamPlacement{{Placement::Replicate()}, {}});
  const Mesh mesh = Mesh::OneDim(1);
  const QkClipRank rank{0, 1, &views, &placements, &mesh, nullptr};
  absl::StatusOr<QkClipper> clipper = QkClipper::Create(options, rank, false);
  if (!clipper.ok()) {
    ADD_FAILURE() << clipper.status();
    return -1;
  }
  QkClipStats stats;
  const absl::Status s =
      clipper->Clip(LayerMaxLogits(), kernels, stream, &stats);
  if (!s.ok()) {
    ADD_FAILURE() << s;
    return -1;
  }
  return stats.groups_clipped;
}

// Parameters and momentum buffers bitwise `ref`'s, named by shape.
void ExpectSameBitsAs(const OptimizerRun& ref, const Params& params,
                      const Muon& muon) {
  for (size_t i = 0; i < Shapes().size(); ++i) {
    EXPECT_TRUE(BitwiseEqual(params.Data(i), ref.params->Data(i)))
        << Shapes()[i].name;
    EXPECT_TRUE(
        BitwiseEqual(muon.momentum_buffer(i), ref.muon->momentum_buffer(i)))
        << Shapes()[i].name;
  }
}

// Muon over `params` with overlap_backward (world of one), in the async
// schedule with prefetch or the sequential one, one matrix per bucket.
std::unique_ptr<Muon> OverlappedMuon(const Params& params,
                                     const MuonOptions& options, bool async) {
  DistributedConfig config;
  config.state.mesh = Mesh::OneDim(1);
  config.state.param_placements.assign(
      Shapes().size(), ParamPlacement{{Placement::Replicate()}, {}});
  config.execution.set_overlap_backward(true);
  config.execution.set_async_gpu_parallelism(async);
  config.execution.set_prefetch_count(async ? 1 : 0);
  config.execution.set_bucket_size_bytes(4096);
  absl::StatusOr<std::unique_ptr<Muon>> muon =
      Muon::Create(params.Views(), options, config);
  EXPECT_TRUE(muon.ok()) << muon.status();
  return muon.ok() ? *std::move(muon) : nullptr;
}

// Work that keeps a stream busy for tens of milliseconds on an H100/H200
// (64 in-place passes over 1 GiB of fp32; MUON_TEST_BACKLOG_MIB sets the
// size, which tools/device_checks.sh makes small under compute-sanitizer,
// whose instrumented kernels are slow anyway), so that what is enqueued
// after it is certainly still queued when the host goes on.
class Backlog {
 public:
  explicit Backlog(device::Runtime* runtime) {
    int64_t mib = 1024;
    if (const char* env = std::getenv("MUON_TEST_BACKLOG_MIB")) {
      mib = std::max<int64_t>(1, std::atoll(env));
    }
    floats_ = mib << 18;
    absl::StatusOr<device::DeviceMemory> mem =
        device::DeviceMemory::Allocate(runtime->allocator(), floats_ * 4);
    EXPECT_TRUE(mem.ok()) << mem.status();
    if (!mem.ok()) return;
    memory_ = *std::move(mem);
    const absl::Status zeroed = runtime->Zero(memory_.data(), floats_ * 4);
    EXPECT_TRUE(zeroed.ok()) << zeroed;  // defined values (initcheck)
  }
  absl::Status Enqueue(kernels::StepKernels& kernels, device::Stream* stream) {
    if (memory_.data() == nullptr) {
      return absl::FailedPreconditionError("no backlog memory");
    }
    for (int k = 0; k < 64; ++k) {
      MUON_RETURN_IF_ERROR(kernels.Scale(stream, memory_.data(),
                                         kernels::ParamDType::kFloat32, floats_,
                                         1.0f));
    }
    return absl::OkStatus();
  }

 private:
  int64_t floats_ = 0;
  device::DeviceMemory memory_;
};

// Tests on cuda:0 with a trainer's stream, the CUDA step kernels (to
// make work on it) and a backlog (made at its first use); normuon, qk_clip and
// overlap_backward accepted with CUDA parameters (Muon refuses them until these
// tests have passed on a GPU). Skips without a GPU.
class CudaTrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MUON_SKIP_OR_FAIL_UNLESS_CUDA_DEVICE();
    absl::StatusOr<device::Runtime*> rt =
        device::GetRuntime(device::Device::Cuda(0));
    ASSERT_TRUE(rt.ok()) << rt.status();
    absl::StatusOr<std::unique_ptr<device::Stream>> trainer =
        (*rt)->CreateStream("trainer");
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    trainer_ = *std::move(trainer);
    absl::StatusOr<std::unique_ptr<kernels::StepKernels>> kernels =
        kernels::MakeCudaStepKernels(0, nullptr, kernels::GpuPrecision::kFp32);
    ASSERT_TRUE(kernels.ok()) << kernels.status();
    kernels_ = *std::move(kernels);
    runtime_ = *rt;
  }

  void* trainer_handle() const { return trainer_->native_handle(); }
  absl::Status SyncTrainer() {
    return trainer_->Synchronize(absl::Seconds(60));
  }

  std::unique_ptr<device::Stream> trainer_;
  std::unique_ptr<kernels::StepKernels> kernels_;
  // The backlog, made at its first use (1 GiB unless MUON_TEST_BACKLOG_MIB).
  Backlog& backlog() {
    if (backlog_ == nullptr) backlog_ = std::make_unique<Backlog>(runtime_);
    return *backlog_;
  }

  device::Runtime* runtime_ = nullptr;
  std::unique_ptr<Backlog> backlog_;
  const ScopedCudaVariantsForTesting allowed_;
};

TEST_F(CudaTrainerTest, StepOnCallerStream_SameBitsAsDefaultStream) {
  const OptimizerRun ref =
      Steps(/*on_gpu=*/true, DType::kFloat32, Options("fp32"), 2);
  Params params(/*on_gpu=*/true, DType::kFloat32);
  absl::StatusOr<std::unique_ptr<Muon>> muon =
      Muon::Create(params.Views(), Options("fp32"));
  ASSERT_TRUE(muon.ok()) << muon.status();
  for (int s = 0; s < 2; ++s) {
    params.SetGrads(s);
    const absl::Status st = (*muon)->StepOnStream(trainer_handle());
    ASSERT_TRUE(st.ok()) << st;
  }
  ASSERT_TRUE(SyncTrainer().ok());
  for (size_t i = 0; i < Shapes().size(); ++i) {
    EXPECT_TRUE(BitwiseEqual(params.Data(i), ref.params->Data(i)))
        << Shapes()[i].name;
  }
}

// One step begun during backward on `trainer`: behind a backlog, each
// gradient, written as twice its value, is made final on `trainer` by an
// exact rescaling (x0.5), still queued when the parameter is marked ready
// there (last parameter first). A momentum pass or a gather not ordered
// after that work reads a wrong gradient.
absl::Status OverlappedStep(Params& params, Muon& muon,
                            kernels::StepKernels& kernels, Backlog& backlog,
                            device::Stream* trainer, int step) {
  params.SetGrads(step, 2.0f);
  MUON_RETURN_IF_ERROR(backlog.Enqueue(kernels, trainer));
  for (int i = static_cast<int>(Shapes().size()) - 1; i >= 0; --i) {
    MUON_RETURN_IF_ERROR(kernels.Scale(trainer, params.grad(i),
                                       params.kernel_dtype(), Params::Numel(i),
                                       0.5f));
    MUON_RETURN_IF_ERROR(muon.MarkReadyOnStream(i, trainer->native_handle()));
  }
  return muon.StepOnStream(trainer->native_handle());
}

// overlap_backward with CUDA parameters, MarkReadyOnStream on the
// trainer's stream: bitwise the same steps without overlap (fp32 mode,
// fp32 and bf16 parameters, async and sequential), momentum included.
TEST_F(CudaTrainerTest, OverlapBackwardOnTrainerStream_SameBitsAsStep) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    const OptimizerRun ref = Steps(/*on_gpu=*/true, dtype, Options("fp32"), 3);
    ASSERT_NE(ref.muon, nullptr);
    for (bool async : {false, true}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), async ? " async" : " seq"));
      Params params(/*on_gpu=*/true, dtype);
      std::unique_ptr<Muon> muon =
          OverlappedMuon(params, Options("fp32"), async);
      ASSERT_NE(muon, nullptr);
      for (int s = 0; s < 3; ++s) {
        const absl::Status st = OverlappedStep(params, *muon, *kernels_,
                                               backlog(), trainer_.get(), s);
        ASSERT_TRUE(st.ok()) << st;
      }
      ASSERT_TRUE(SyncTrainer().ok());
      EXPECT_EQ(muon->step_count(), 3);
      ExpectSameBitsAs(ref, params, *muon);
    }
  }
}

// overlap_backward with each gradient made final on its own stream (the
// trainer's, a side stream, CUDA's legacy default stream), behind a
// backlog there, and marked ready on it: the executor waits on one event
// per producer stream, and the steps are bitwise those without overlap.
TEST_F(CudaTrainerTest, OverlapBackwardOnThreeProducerStreams_SameBitsAsStep) {
  absl::StatusOr<std::unique_ptr<device::Stream>> side =
      runtime_->CreateStream("side");
  ASSERT_TRUE(side.ok()) << side.status();
  absl::StatusOr<std::unique_ptr<device::Stream>> legacy =
      runtime_->WrapStream(nullptr, "legacy default");
  ASSERT_TRUE(legacy.ok()) << legacy.status();
  device::Stream* const producers[] = {trainer_.get(), side->get(),
                                       legacy->get()};
  const OptimizerRun ref =
      Steps(/*on_gpu=*/true, DType::kFloat32, Options("fp32"), 3);
  ASSERT_NE(ref.muon, nullptr);
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "seq");
    Params params(/*on_gpu=*/true, DType::kFloat32);
    std::unique_ptr<Muon> muon = OverlappedMuon(params, Options("fp32"), async);
    ASSERT_NE(muon, nullptr);
    for (int s = 0; s < 3; ++s) {
      params.SetGrads(s, 2.0f);
      for (int i = static_cast<int>(Shapes().size()) - 1; i >= 0; --i) {
        device::Stream* const producer = producers[i % 3];
        ASSERT_TRUE(backlog().Enqueue(*kernels_, producer).ok());
        ASSERT_TRUE(kernels_
                        ->Scale(producer, params.grad(i), params.kernel_dtype(),
                                Params::Numel(i), 0.5f)
                        .ok());
        const absl::Status marked =
            muon->MarkReadyOnStream(i, producer->native_handle());
        ASSERT_TRUE(marked.ok()) << marked;
      }
      const absl::Status st = muon->StepOnStream(trainer_handle());
      ASSERT_TRUE(st.ok()) << st;
    }
    ASSERT_TRUE(SyncTrainer().ok());
    EXPECT_EQ(muon->step_count(), 3);
    ExpectSameBitsAs(ref, params, *muon);
  }
}

// check_finite with overlap_backward on CUDA parameters: an Inf in a
// gradient marked mid-backward fails Step naming it, with parameters,
// momentum and step count as before the step (the snapshot of its first
// MarkReady); the next step with finite gradients continues as a run that
// never saw the Inf.
TEST_F(CudaTrainerTest, OverlapCheckFinite_InfUndoneThenSameBits) {
  const OptimizerRun ref =
      Steps(/*on_gpu=*/true, DType::kFloat32, Options("fp32"), 2);
  ASSERT_NE(ref.muon, nullptr);
  MuonOptions options = Options("fp32");
  options.check_finite = true;
  Params params(/*on_gpu=*/true, DType::kFloat32);
  std::unique_ptr<Muon> muon = OverlappedMuon(params, options, /*async=*/true);
  ASSERT_NE(muon, nullptr);
  ASSERT_TRUE(
      OverlappedStep(params, *muon, *kernels_, backlog(), trainer_.get(), 0)
          .ok());
  ASSERT_TRUE(SyncTrainer().ok());
  std::vector<std::vector<float>> before, momentum;
  for (size_t i = 0; i < Shapes().size(); ++i) {
    before.push_back(params.Data(i));
    momentum.push_back(muon->momentum_buffer(i));
  }
  // Step 2: w1's gradient becomes non-finite only on the trainer's stream,
  // behind the backlog (FLT_MAX x4 = inf, then x0.125 keeps it inf and
  // brings the others' doubled values back), so a scan not ordered there
  // sees finite values.
  params.SetGrads(1, 2.0f);
  params.SetGradValue(1, 9, std::numeric_limits<float>::max());
  ASSERT_TRUE(backlog().Enqueue(*kernels_, trainer_.get()).ok());
  for (int i = static_cast<int>(Shapes().size()) - 1; i >= 0; --i) {
    const std::vector<float> factors =
        i == 1 ? std::vector<float>{4.0f, 0.125f} : std::vector<float>{0.5f};
    for (float f : factors) {
      ASSERT_TRUE(kernels_
                      ->Scale(trainer_.get(), params.grad(i),
                              params.kernel_dtype(), Params::Numel(i), f)
                      .ok());
    }
    ASSERT_TRUE(muon->MarkReadyOnStream(i, trainer_handle()).ok());
  }
  const absl::Status st = muon->StepOnStream(trainer_handle());
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_NE(st.message().find("\"w1\" has a non-finite gradient (inf at "
                              "local index 9) at step 2"),
            std::string::npos)
      << st;
  ASSERT_TRUE(SyncTrainer().ok());
  EXPECT_EQ(muon->step_count(), 1);
  for (size_t i = 0; i < Shapes().size(); ++i) {
    EXPECT_TRUE(BitwiseEqual(params.Data(i), before[i])) << Shapes()[i].name;
    EXPECT_TRUE(BitwiseEqual(muon->momentum_buffer(i), momentum[i]))
        << Shapes()[i].name;
  }
  ASSERT_TRUE(
      OverlappedStep(params, *muon, *kernels_, backlog(), trainer_.get(), 1)
          .ok());
  ASSERT_TRUE(SyncTrainer().ok());
  for (size_t i = 0; i < Shapes().size(); ++i) {
    EXPECT_TRUE(BitwiseEqual(params.Data(i), ref.params->Data(i)))
        << Shapes()[i].name;
  }
}

// QK-clip through Muon with CUDA parameters: two steps, the parameters
// rewritten on the trainer's stream behind a backlog, then ClipQkOnStream
// there; bitwise the same on CPU parameters (Newton-Schulz host-staged on
// the same GPU, the clip by the host kernels), fp32 and bf16 parameters.
TEST_F(CudaTrainerTest, QkClipOnStream_BitwiseEqualToHostStaged) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    MuonOptions options = Options("fp32");
    options.qk_clip = OneLayerQkClip();
    const HostStagedAndGpu runs = RunHostStagedAndGpu(dtype, options, 2);
    const OptimizerRun& ref = runs.host;
    const OptimizerRun& gpu = runs.gpu;
    ASSERT_NE(ref.muon, nullptr);
    ASSERT_NE(gpu.muon, nullptr);
    // The parameters doubled (exact) before the clip: on the host at once,
    // on the GPU by a copy on the trainer's stream behind a backlog, which
    // a clip not ordered there would overtake.
    ASSERT_TRUE(backlog().Enqueue(*kernels_, trainer_.get()).ok());
    for (size_t i = 0; i < Shapes().size(); ++i) {
      std::vector<float> doubled = ref.params->Data(i);
      for (float& x : doubled) x *= 2.0f;
      ref.params->SetData(i, doubled);
      ASSERT_TRUE(gpu.params->SetDataOnStream(i, doubled, trainer_.get()).ok());
    }
    QkClipStats ref_stats, gpu_stats;
    ASSERT_TRUE(ref.muon->ClipQk(LayerMaxLogits(), &ref_stats).ok());
    const absl::Status st = gpu.muon->ClipQkOnStream(
        LayerMaxLogits(), trainer_handle(), &gpu_stats);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_TRUE(SyncTrainer().ok());
    EXPECT_EQ(ref_stats.groups_clipped, 2);
    EXPECT_EQ(gpu_stats.groups_clipped, 2);
    for (size_t i = 0; i < Shapes().size(); ++i) {
      EXPECT_TRUE(BitwiseEqual(gpu.params->Data(i), ref.params->Data(i)))
          << Shapes()[i].name;
    }
  }
}

// NorMuon with CUDA parameters (its CUDA kernel as the owner transform on
// the compute stream, the row state in device memory): with gpu_precision
// "fp32", bitwise equal to CPU parameters whose Newton-Schulz runs
// host-staged on the same GPU and whose NorMuon runs the host kernel, for
// fp32 and bf16 parameters over three steps: parameters, momentum and the
// row state "variance_neuron".
TEST(GpuMuonTest, CudaParamsNorMuonFp32Mode_BitwiseEqualToHostStaged) {
  MUON_SKIP_OR_FAIL_UNLESS_CUDA_DEVICE();
  const ScopedCudaVariantsForTesting allowed;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    MuonOptions options = Options("fp32");
    options.normuon = true;
    const HostStagedAndGpu runs = RunHostStagedAndGpu(dtype, options, 3);
    const OptimizerRun& ref = runs.host;
    const OptimizerRun& gpu = runs.gpu;
    ASSERT_NE(ref.muon, nullptr);
    ASSERT_NE(gpu.muon, nullptr);
    EXPECT_EQ(gpu.muon->row_state_name(), "variance_neuron");
    for (size_t i = 0; i < Shapes().size(); ++i) {
      EXPECT_TRUE(BitwiseEqual(gpu.params->Data(i), ref.params->Data(i)))
          << Shapes()[i].name;
      EXPECT_TRUE(BitwiseEqual(gpu.muon->momentum_buffer(i),
                               ref.muon->momentum_buffer(i)))
          << Shapes()[i].name;
      EXPECT_TRUE(BitwiseEqual(gpu.muon->row_state(i), ref.muon->row_state(i)))
          << Shapes()[i].name;
      EXPECT_EQ(gpu.muon->row_state(i).size(),
                static_cast<size_t>(Shapes()[i].rows));
    }
  }
}

// QK-clip's row scaling on cuda:0 (QkClipper with the CUDA kernels on a
// stream) against the same clip of host parameters with the host kernels:
// bitwise, fp32 and bf16. Muon refuses qk_clip on CUDA parameters
// (CheckQkClipDevice) until this has passed on a GPU.
TEST_F(CudaTrainerTest, QkClipperRowScaling_BitwiseHost) {
  std::unique_ptr<kernels::StepKernels> host =
      kernels::MakeHostStepKernels(nullptr);
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    Params on_gpu(/*on_gpu=*/true, dtype), on_host(/*on_gpu=*/false, dtype);
    const std::vector<float> w0_before = on_host.Data(0);
    ASSERT_EQ(ClipLayer(on_host, *host, nullptr), 2);
    ASSERT_EQ(ClipLayer(on_gpu, *kernels_, trainer_.get()), 2);
    ASSERT_TRUE(SyncTrainer().ok());
    EXPECT_FALSE(BitwiseEqual(on_host.Data(0), w0_before));  // it clipped
    for (size_t i = 0; i < Shapes().size(); ++i) {
      EXPECT_TRUE(BitwiseEqual(on_gpu.Data(i), on_host.Data(i)))
          << Shapes()[i].name << " " << DTypeName(dtype);
    }
  }
}

}  // namespace
}  // namespace muon
