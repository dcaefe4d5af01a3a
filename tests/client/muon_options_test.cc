// MuonOptions (client/muon.h): torch.optim.Muon's defaults, and every bad
// option refused by ValidateMuonOptions and by Muon::Create with torch's
// message (torch/optim/_muon.py, Muon.__init__ and
// _zeropower_via_newtonschulz), naming the value; the accepted edge values.
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/muon.h"
#include "client/parameter.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "muon/v1/coordinator.pb.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::testing::HasSubstr;

Parameter SmallParam() {
  Parameter p;
  p.name = "w";
  p.local_shape = {3, 5};
  p.data.assign(15, 0.5f);
  p.grad.assign(15, 0.0f);
  return p;
}

TEST(MuonOptionsTest, Defaults_MatchTorch) {
  const MuonOptions o;
  EXPECT_EQ(o.lr, 1e-3);
  EXPECT_EQ(o.weight_decay, 0.1);
  EXPECT_EQ(o.momentum, 0.95);
  EXPECT_TRUE(o.nesterov);
  EXPECT_EQ(o.ns_a, 3.4445);
  EXPECT_EQ(o.ns_b, -4.7750);
  EXPECT_EQ(o.ns_c, 2.0315);
  EXPECT_EQ(o.eps, 1e-7);
  EXPECT_EQ(o.ns_steps, 5);
  EXPECT_EQ(o.adjust_lr_fn, kernels::AdjustLrFn::kOriginal);
  EXPECT_EQ(o.ns_schedule, kernels::CoefficientSchedule::kQuintic);
  EXPECT_EQ(o.ns_method, kernels::NewtonSchulzMethod::kStandard);
  EXPECT_EQ(o.device, device::DeviceKind::kHost);
  EXPECT_EQ(o.gpu_precision, kernels::GpuPrecision::kBf16);
  EXPECT_TRUE(ValidateMuonOptions(o).ok());
}

TEST(MuonOptionsTest, MuonOptionsFromProto_NamesParsedUnsetKeepDefaults) {
  v1::OptimizerOptions proto;
  absl::StatusOr<MuonOptions> o = MuonOptionsFromProto(proto);
  ASSERT_THAT(o, IsOk());
  EXPECT_EQ(o->ns_method, kernels::NewtonSchulzMethod::kStandard);
  proto.set_ns_method("gram");
  proto.set_adjust_lr_fn("match_rms_adamw");
  proto.set_ns_schedule("polar_express");
  o = MuonOptionsFromProto(proto);
  ASSERT_THAT(o, IsOk());
  EXPECT_EQ(o->ns_method, kernels::NewtonSchulzMethod::kGram);
  EXPECT_EQ(o->adjust_lr_fn, kernels::AdjustLrFn::kMatchRmsAdamW);
  EXPECT_EQ(o->ns_schedule, kernels::CoefficientSchedule::kPolarExpress);
}

// One bad option, set as a value or spelled as a name, and the message it
// gets (torch's wording; a value as Python prints it).
struct BadOption {
  std::string name;
  std::function<void(MuonOptions&, MuonOptionNames&)> set;
  std::string message;
};

class MuonBadOptionTest : public ::testing::TestWithParam<BadOption> {};

// A bad name is refused where it is parsed (ApplyMuonOptionNames, options
// untouched); a bad value by ValidateMuonOptions and by Muon::Create, with
// the parameters untouched.
TEST_P(MuonBadOptionTest, RefusedWithMessageBeforeAnythingChanges) {
  MuonOptions o;
  MuonOptionNames names;
  GetParam().set(o, names);
  const MuonOptions before_names = o;
  absl::Status parsed = ApplyMuonOptionNames(names, &o);
  if (!parsed.ok()) {
    EXPECT_THAT(parsed, StatusIs(absl::StatusCode::kInvalidArgument,
                                 HasSubstr(GetParam().message)));
    EXPECT_EQ(o.adjust_lr_fn, before_names.adjust_lr_fn);
    EXPECT_EQ(o.ns_method, before_names.ns_method);
    return;
  }
  EXPECT_THAT(ValidateMuonOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(GetParam().message)));
  Parameter p = SmallParam();
  const std::vector<float> before = p.data;
  EXPECT_THAT(Muon::Create({&p}, o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(GetParam().message)));
  EXPECT_EQ(p.data, before);
}

INSTANTIATE_TEST_SUITE_P(
    TorchArgumentErrors, MuonBadOptionTest,
    ::testing::Values(
        BadOption{"NegativeLr",
                  [](MuonOptions& o, MuonOptionNames&) { o.lr = -0.5; },
                  "Learning rate should be >= 0 but is: -0.5"},
        BadOption{"NegativeWholeLr",
                  [](MuonOptions& o, MuonOptionNames&) { o.lr = -1.0; },
                  "Learning rate should be >= 0 but is: -1.0"},
        BadOption{"NegativeMomentum",
                  [](MuonOptions& o, MuonOptionNames&) { o.momentum = -0.25; },
                  "momentum should be >= 0 but is: -0.25"},
        BadOption{
            "NegativeWeightDecay",
            [](MuonOptions& o, MuonOptionNames&) { o.weight_decay = -0.125; },
            "weight decay should be >= 0 but is: -0.125"},
        BadOption{"UnknownAdjustLrFn",
                  [](MuonOptions&, MuonOptionNames& n) {
                    n.adjust_lr_fn = "match_rms_sgd";
                  },
                  "Adjust learning rate function match_rms_sgd is not "
                  "supported"},
        // The spelling is exact (torch compares strings).
        BadOption{"AdjustLrFnCapitalized",
                  [](MuonOptions&, MuonOptionNames& n) {
                    n.adjust_lr_fn = "Original";
                  },
                  "Adjust learning rate function Original is not supported"},
        BadOption{"NsSteps100",
                  [](MuonOptions& o, MuonOptionNames&) { o.ns_steps = 100; },
                  "Number of steps must be less than 100 for computational "
                  "efficiency"},
        BadOption{
            "UnknownNsMethod",
            [](MuonOptions&, MuonOptionNames& n) { n.ns_method = "Gram"; },
            "ns_method \"Gram\" is not supported"},
        BadOption{
            "UnknownNsSchedule",
            [](MuonOptions&, MuonOptionNames& n) { n.ns_schedule = "cubic"; },
            "ns_schedule \"cubic\" is not supported"},
        BadOption{"UnknownDevice",
                  [](MuonOptions&, MuonOptionNames& n) { n.device = "tpu"; },
                  "device \"tpu\" is not supported"},
        BadOption{
            "UnknownGpuPrecision",
            [](MuonOptions&, MuonOptionNames& n) { n.gpu_precision = "fp8"; },
            "gpu_precision \"fp8\" is not supported"}),
    [](const ::testing::TestParamInfo<BadOption>& info) {
      return info.param.name;
    });

// The edge values torch accepts.
class MuonEdgeOptionTest
    : public ::testing::TestWithParam<std::function<void(MuonOptions&)>> {};

TEST_P(MuonEdgeOptionTest, ValidateAndCreate_Succeed) {
  MuonOptions o;
  GetParam()(o);
  EXPECT_TRUE(ValidateMuonOptions(o).ok());
  Parameter p = SmallParam();
  absl::StatusOr<std::unique_ptr<Muon>> muon = Muon::Create({&p}, o);
  EXPECT_TRUE(muon.ok()) << muon.status();
}

INSTANTIATE_TEST_SUITE_P(
    TorchAccepts, MuonEdgeOptionTest,
    ::testing::Values([](MuonOptions& o) { o.lr = 0.0; },
                      [](MuonOptions& o) { o.ns_steps = 99; },
                      [](MuonOptions& o) { o.momentum = 0.0; },
                      [](MuonOptions& o) { o.weight_decay = 0.0; }));

// Gram and auto Newton-Schulz are valid for CUDA parameters too (the cuBLAS
// iteration has both; gpu_newton_schulz_test runs them on a GPU).
TEST(MuonOptionsTest, GramAndAutoOnCuda_Validate) {
  for (kernels::NewtonSchulzMethod method :
       {kernels::NewtonSchulzMethod::kGram,
        kernels::NewtonSchulzMethod::kAuto}) {
    MuonOptions o;
    o.ns_method = method;
    o.device = device::DeviceKind::kCuda;
    EXPECT_TRUE(ValidateMuonOptions(o).ok())
        << kernels::NewtonSchulzMethodName(method);
  }
}

}  // namespace
}  // namespace muon
