// client/update_rule.h: torch.optim.Muon's arithmetic on the host kernels,
// against the formulas of torch/optim/_muon.py written out here, and the
// per-parameter lr / weight decay of param groups.
#include "client/update_rule.h"

#include <cmath>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/ns_engine.h"
#include "kernels/step_kernels.h"

namespace muon {
namespace {

TEST(UpdateRuleTest, ParamGroups_OverrideOneParameterOnly) {
  UpdateRule rule;
  rule.lr = 0.02;
  rule.weight_decay = 0.1;
  EXPECT_EQ(rule.LrOf(1), 0.02);
  rule.momentum = 0.95;
  rule.SetParamHyperparameters(1, 3, 0.5, 0.0, 0.85);
  EXPECT_EQ(rule.LrOf(0), 0.02);
  EXPECT_EQ(rule.LrOf(1), 0.5);
  EXPECT_EQ(rule.WeightDecayOf(1), 0.0);
  EXPECT_EQ(rule.WeightDecayOf(2), 0.1);
  EXPECT_EQ(rule.MomentumOf(1), 0.85);
  EXPECT_EQ(rule.MomentumOf(2), 0.95);
}

TEST(UpdateRuleTest, MomentumAndApply_MatchTorchMuonFormulas) {
  std::unique_ptr<kernels::NsEngine> engine = kernels::MakeCpuNsEngine();
  std::unique_ptr<kernels::StepKernels> k =
      kernels::MakeHostStepKernels(engine.get());
  UpdateRule rule;
  rule.lr = 0.02;
  rule.weight_decay = 0.1;
  rule.momentum = 0.9;
  rule.nesterov = true;
  std::vector<float> buf = {1.0f, -2.0f}, grad = {0.5f, 4.0f}, update(2);
  ASSERT_TRUE(rule.Momentum(*k, nullptr, 0, buf.data(),
                            kernels::ParamDType::kFloat32, grad.data(),
                            kernels::ParamDType::kFloat32, 2)
                  .ok());
  ASSERT_TRUE(k->FormUpdate(nullptr, buf.data(), kernels::ParamDType::kFloat32,
                            grad.data(), kernels::ParamDType::kFloat32, 2,
                            rule.momentum, rule.nesterov, update.data())
                  .ok());
  for (int i : {0, 1}) {
    // buf.lerp_(grad, 1 - momentum); grad.lerp(buf, momentum).
    const float b0 = i == 0 ? 1.0f : -2.0f, g = grad[i];
    const float b = b0 + (1.0f - 0.9f) * (g - b0);
    EXPECT_NEAR(buf[i], b, 1e-6f);
    EXPECT_NEAR(update[i], g + 0.9f * (b - g), 1e-6f);
  }
  // A [64, 16] matrix: AdjustLR "original" scales by sqrt(max(1, 64 / 16)).
  std::vector<float> param = {1.0f, 1.0f}, o = {0.5f, -0.5f};
  ASSERT_TRUE(rule.Apply(*k, nullptr, 0, 64, 16, param.data(),
                         kernels::ParamDType::kFloat32, o.data(), 2)
                  .ok());
  const double adjusted = 0.02 * std::sqrt(4.0);
  EXPECT_NEAR(param[0], (1.0 - 0.02 * 0.1) - adjusted * 0.5, 1e-6);
  EXPECT_NEAR(param[1], (1.0 - 0.02 * 0.1) + adjusted * 0.5, 1e-6);
}

}  // namespace
}  // namespace muon
