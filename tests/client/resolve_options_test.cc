// ResolveOptions (client/muon_options.h): every check across options made once,
// each with its message, and the defaults that depend on other options
// (check_finite under overlap_backward); MuonOptionsFromProto's check_finite
// and transactional_step.
#include <string>

#include "absl/status/status.h"
#include "client/muon_options.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "muon/v1/coordinator.pb.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

OptionContext Host(int rank = 0) {
  return OptionContext{device::Device::Host(), rank, false};
}

TEST(ResolveOptionsTest, CheckFiniteUnset_OnWithoutOverlapOffWithIt) {
  const MuonOptions unset;
  ASSERT_FALSE(unset.check_finite.has_value());
  v1::ExecutionOptions plain;
  absl::StatusOr<MuonOptions> on = ResolveOptions(unset, plain, Host());
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_EQ(on->check_finite, std::optional<bool>(true));

  v1::ExecutionOptions overlap;
  overlap.set_overlap_backward(true);
  absl::StatusOr<MuonOptions> off = ResolveOptions(unset, overlap, Host());
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->check_finite, std::optional<bool>(false));

  MuonOptions explicit_off;
  explicit_off.check_finite = false;
  absl::StatusOr<MuonOptions> kept =
      ResolveOptions(explicit_off, plain, Host());
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->check_finite, std::optional<bool>(false));
}

TEST(ResolveOptionsTest,
     OverlapWithCheckFiniteKeptOn_TransactionalOrCudaRefusedByName) {
  v1::ExecutionOptions overlap;
  overlap.set_overlap_backward(true);
  MuonOptions check;
  check.check_finite = true;
  absl::StatusOr<MuonOptions> checked = ResolveOptions(check, overlap, Host());
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ(checked->check_finite, std::optional<bool>(true));
  MuonOptions transactional;
  transactional.transactional_step = true;
  EXPECT_THAT(ResolveOptions(transactional, overlap, Host()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cannot run with transactional_step")));
  EXPECT_THAT(
      ResolveOptions(MuonOptions(), overlap,
                     OptionContext{device::Device::Cuda(0), 1, false})
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("rank 1"), HasSubstr("parameters on cuda:0"))));
}

TEST(ResolveOptionsTest, NorMuonAndExchangeCombinations_RefusedByName) {
  MuonOptions normuon;
  normuon.normuon = true;
  v1::ExecutionOptions bf16;
  bf16.set_exchange_dtype("bfloat16");
  EXPECT_THAT(ResolveOptions(normuon, bf16, Host(2)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("rank 2"), HasSubstr("normuon"),
                             HasSubstr("bfloat16"))));
  EXPECT_THAT(
      ResolveOptions(normuon, v1::ExecutionOptions(),
                     OptionContext{device::Device::Host(), 0, true})
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("normuon"), HasSubstr("custom gather_fn"))));
  EXPECT_THAT(ResolveOptions(normuon, v1::ExecutionOptions(),
                             OptionContext{device::Device::Cuda(1), 0, false})
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("normuon runs on CPU parameters"),
                             HasSubstr("cuda:1"))));
  EXPECT_THAT(ResolveOptions(MuonOptions(), bf16,
                             OptionContext{device::Device::Host(), 0, true})
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("exchange_dtype \"bfloat16\" applies to the "
                                 "built-in exchange")));
  EXPECT_THAT(
      ResolveOptions(MuonOptions(), v1::ExecutionOptions(),
                     OptionContext{device::Device::Cuda(0), 0, true})
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("custom gather_fn / redistribute_fn take "
                               "host memory"),
                     HasSubstr("cuda:0"))));
}

// kCpuOnlyOptions is what CUDA parameters are refused with, by name: each
// listed option on cuda:0 is InvalidArgument naming it and "CPU parameters
// in this version", the same options on the host pass, and with none of
// them CUDA parameters pass (the docs' cpu-only markers are compared with
// the list in tests/python/test_docs.py).
TEST(ResolveOptionsTest, CpuOnlyOptions_EachRefusedOnCudaByName) {
  const OptionContext cuda{device::Device::Cuda(0), 2, false};
  EXPECT_TRUE(ResolveOptions(MuonOptions(), v1::ExecutionOptions(), cuda).ok());
  ASSERT_EQ(kCpuOnlyOptions.size(), 3u);
  for (const std::string name : kCpuOnlyOptions) {
    MuonOptions o;
    v1::ExecutionOptions execution;
    if (name == "normuon") {
      o.normuon = true;
    } else if (name == "qk_clip") {
      QkClipLayer layer;
      layer.q_param = "wq";
      layer.k_param = "wk";
      layer.num_heads = layer.num_kv_heads = 1;
      layer.head_dim = 4;
      o.qk_clip.layers.push_back(layer);
    } else if (name == "overlap_backward") {
      execution.set_overlap_backward(true);
    } else {
      ADD_FAILURE() << "kCpuOnlyOptions lists \"" << name
                    << "\", which this test does not set";
      continue;
    }
    EXPECT_TRUE(ResolveOptions(o, execution, Host()).ok()) << name;
    EXPECT_THAT(ResolveOptions(o, execution, cuda).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("rank 2"), HasSubstr(name),
                               HasSubstr("CPU parameters in this version"),
                               HasSubstr("cuda:0"))))
        << name;
  }
}

// The check Muon::SetQkClip shares with ResolveOptions: layers on CUDA
// parameters refused, naming the rank and device; no layers, or the host,
// pass.
TEST(ResolveOptionsTest, CheckQkClipDevice_RefusesLayersOnCudaOnly) {
  QkClipOptions qk;
  const OptionContext cuda{device::Device::Cuda(0), 3, false};
  EXPECT_TRUE(CheckQkClipDevice(qk, cuda).ok());
  QkClipLayer layer;
  layer.q_param = "wq";
  layer.k_param = "wk";
  layer.num_heads = layer.num_kv_heads = 1;
  layer.head_dim = 4;
  qk.layers.push_back(layer);
  EXPECT_TRUE(CheckQkClipDevice(qk, Host()).ok());
  EXPECT_THAT(CheckQkClipDevice(qk, cuda),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("rank 3"), HasSubstr("qk_clip"),
                             HasSubstr("cuda:0"))));
}

// torch's argument messages come first, without a rank (they read as
// torch.optim.Muon.__init__'s); the execution options' follow with one.
TEST(ResolveOptionsTest, TorchArgumentErrorsFirstThenExecution) {
  MuonOptions bad;
  bad.lr = -0.5;
  v1::ExecutionOptions negative;
  negative.set_prefetch_count(-1);
  EXPECT_THAT(ResolveOptions(bad, negative, Host()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "Learning rate should be >= 0 but is: -0.5"));
  EXPECT_THAT(
      ResolveOptions(MuonOptions(), negative, Host(5)).status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("rank 5"), HasSubstr("prefetch_count is -1"))));
}

// The job spec's execution.device and gpu_precision set MuonOptions' (one
// schema for both forms); set to other values in both, they are refused.
TEST(ResolveOptionsTest, ExecutionDeviceAndPrecision_SetMuonOptionsOrRefused) {
  v1::ExecutionOptions execution;
  execution.set_device("cuda");
  execution.set_gpu_precision("fp32");
  absl::StatusOr<MuonOptions> merged =
      ResolveOptions(MuonOptions(), execution, Host());
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->device, device::DeviceKind::kCuda);
  EXPECT_EQ(merged->gpu_precision, kernels::GpuPrecision::kFp32);

  MuonOptions same;
  same.device = device::DeviceKind::kCuda;
  EXPECT_TRUE(ResolveOptions(same, execution, Host()).ok());

  MuonOptions tf32;
  tf32.gpu_precision = kernels::GpuPrecision::kTf32;
  EXPECT_THAT(ResolveOptions(tf32, execution, Host(4)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("rank 4"),
                             HasSubstr("execution.gpu_precision \"fp32\" "
                                       "disagrees with "
                                       "MuonOptions.gpu_precision"))));
  MuonOptions cuda;
  cuda.device = device::DeviceKind::kCuda;
  v1::ExecutionOptions cpu;
  cpu.set_device("cpu");
  EXPECT_THAT(ResolveOptions(cuda, cpu, Host()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("execution.device \"cpu\" disagrees")));
  v1::ExecutionOptions bad;
  bad.set_device("tpu");
  EXPECT_THAT(ResolveOptions(MuonOptions(), bad, Host()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("execution.device \"tpu\" is not supported")));
}

TEST(MuonOptionsFromProtoTest, ReadsCheckFiniteAndTransactionalStep) {
  v1::OptimizerOptions proto;
  absl::StatusOr<MuonOptions> unset = MuonOptionsFromProto(proto);
  ASSERT_TRUE(unset.ok());
  EXPECT_FALSE(unset->check_finite.has_value());
  EXPECT_FALSE(unset->transactional_step);
  proto.set_check_finite(false);
  proto.set_transactional_step(true);
  absl::StatusOr<MuonOptions> set = MuonOptionsFromProto(proto);
  ASSERT_TRUE(set.ok());
  EXPECT_EQ(set->check_finite, std::optional<bool>(false));
  EXPECT_TRUE(set->transactional_step);
}

}  // namespace
}  // namespace muon
