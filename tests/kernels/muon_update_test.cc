#include "kernels/muon_update.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muon {
namespace kernels {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Expected values below were worked out with torch's lerp formula
// (ATen Lerp.h: |w| < 0.5 ? self + w*(end - self)
//                         : end - (end - self)*(1 - w)),
// every operation rounded to float32, and are written as hex float literals
// so the comparison is exact (EXPECT_EQ, bit for bit).

// buf.lerp_(grad, 1 - 0.9): w = (float)0.1 = 0x1.99999ap-4 (small branch);
// diff = 3 - 1 = 2; w*diff = 0x1.99999ap-3 (exact); 1 + 0x1.99999ap-3 rounds
// to 0x1.333334p+0 = 1.2f.
TEST(MomentumUpdateTest, MomentumUpdate_SimpleValues_MatchesTorchLerp) {
  std::vector<float> buf = {1.0f};
  const std::vector<float> grad = {3.0f};
  MomentumUpdate(buf.data(), grad.data(), 1, 0.9);
  EXPECT_EQ(buf[0], 0x1.333334p+0f);
  EXPECT_EQ(buf[0], 1.2f);
}

// Default momentum 0.95: w = (float)(1 - 0.95) = 0x1.99999ap-5, |w| < 0.5,
// so torch takes the self + w*diff branch. The other branch
// (end - diff*(1 - w)) would give 0x1.eb852p-5, 0x1.5c29p-3 and 0x1.8f5c3p-3
// for these inputs, so this pins the branch choice.
TEST(MomentumUpdateTest, MomentumUpdate_DefaultMomentum_UsesSmallWeightBranch) {
  std::vector<float> buf = {0.1f, 0.1f, 0.1f};
  const std::vector<float> grad = {-0.7f, 1.5f, 2.0f};
  MomentumUpdate(buf.data(), grad.data(), 3, 0.95);
  EXPECT_THAT(buf, ElementsAre(0x1.eb851ep-5f, 0x1.5c28f6p-3f, 0x1.8f5c28p-3f));
}

// w = 0.5 is not "small" (the test is |w| < 0.5): end - diff*0.5.
// buf 1, grad 3: 3 - 2*0.5 = 2.
TEST(MomentumUpdateTest, MomentumUpdate_HalfMomentum_UsesLargeWeightBranch) {
  std::vector<float> buf = {1.0f};
  const std::vector<float> grad = {3.0f};
  MomentumUpdate(buf.data(), grad.data(), 1, 0.5);
  EXPECT_EQ(buf[0], 2.0f);
}

// momentum 0: w = 1, large branch: grad - diff*0 = grad exactly.
// momentum 1: w = 0, small branch: buf + 0*diff = buf exactly.
TEST(MomentumUpdateTest, MomentumUpdate_ExtremeMomentum_CopiesOrKeeps) {
  std::vector<float> buf = {0.1f, -3.25f};
  const std::vector<float> grad = {7.0f, 1e-3f};
  MomentumUpdate(buf.data(), grad.data(), 2, 0.0);
  EXPECT_THAT(buf, ElementsAre(7.0f, 1e-3f));
  std::vector<float> buf2 = {0.1f, -3.25f};
  MomentumUpdate(buf2.data(), grad.data(), 2, 1.0);
  EXPECT_THAT(buf2, ElementsAre(0.1f, -3.25f));
}

TEST(MomentumUpdateTest, MomentumUpdate_ZeroLength_DoesNothing) {
  MomentumUpdate(static_cast<float*>(nullptr),
                 static_cast<const float*>(nullptr), 0, 0.95);
}

// grad.lerp(buf, 0.95): w = 0.95f = 0x1.e66666p-1, |w| >= 0.5, so torch takes
// end - diff*(1 - w). First element worked out:
//   diff = buf - grad = 0.05f - 0.3f = -0.25 (exact),
//   1 - w = 0x1.9999ap-5, diff*(1 - w) = -0x1.9999ap-7 (exact),
//   0.05f + 0x1.9999ap-7 = 0.0625000... rounds to 0x1p-4.
// The small-weight branch would give 0x1.000004p-4, 0x1.c28f5cp-4 and
// 0x1.63d708p+0 instead.
TEST(NesterovUpdateTest, NesterovUpdate_DefaultMomentum_UsesLargeWeightBranch) {
  const std::vector<float> grad = {0.3f, 0.3f, -0.7f};
  const std::vector<float> buf = {0.05f, 0.1f, 1.5f};
  std::vector<float> out(3);
  NesterovUpdate(grad.data(), buf.data(), 3, 0.95, out.data());
  EXPECT_THAT(out, ElementsAre(0x1p-4f, 0x1.c28f5ep-4f, 0x1.63d70ap+0f));
}

TEST(NesterovUpdateTest, NesterovUpdate_OutAliasesGrad_SameResult) {
  std::vector<float> grad = {0.3f, 0.3f, -0.7f};
  const std::vector<float> buf = {0.05f, 0.1f, 1.5f};
  NesterovUpdate(grad.data(), buf.data(), 3, 0.95, grad.data());
  EXPECT_THAT(grad, ElementsAre(0x1p-4f, 0x1.c28f5ep-4f, 0x1.63d70ap+0f));
}

// One whole torch Muon momentum step on one element: B = lerp(B, G, 0.05)
// then U = lerp(G, B, 0.95), with the default momentum.
TEST(NesterovUpdateTest, NesterovUpdate_AfterMomentumUpdate_MatchesTorchStep) {
  std::vector<float> buf = {0.1f};
  const std::vector<float> grad = {2.0f};
  MomentumUpdate(buf.data(), grad.data(), 1, 0.95);
  ASSERT_EQ(buf[0], 0x1.8f5c28p-3f);  // See the default-momentum test above.
  // Nesterov, large branch (self = grad = 2, end = buf):
  //   diff = 0x1.8f5c28p-3 - 2 = -0x1.ce147cp+0 (exact);
  //   1 - 0.95f = 0x1.9999ap-5; diff*(1 - w) rounds to -0x1.71aa02p-4;
  //   0x1.8f5c28p-3 + 0x1.71aa02p-4 rounds to 0x1.241894p-2.
  std::vector<float> out(1);
  NesterovUpdate(grad.data(), buf.data(), 1, 0.95, out.data());
  EXPECT_EQ(out[0], 0x1.241894p-2f);
}

TEST(AdjustLrTest, AdjustLr_OriginalTall_ScalesBySqrtOfAspect) {
  EXPECT_EQ(AdjustLr(0.02, AdjustLrFn::kOriginal, 1024, 256), 0.04);
  EXPECT_EQ(AdjustLr(0.02, AdjustLrFn::kOriginal, 3, 2), 0.02 * std::sqrt(1.5));
}

TEST(AdjustLrTest, AdjustLr_OriginalWideOrSquare_KeepsLr) {
  EXPECT_EQ(AdjustLr(0.02, AdjustLrFn::kOriginal, 256, 1024), 0.02);
  EXPECT_EQ(AdjustLr(0.02, AdjustLrFn::kOriginal, 512, 512), 0.02);
  EXPECT_EQ(AdjustLr(1e-3, AdjustLrFn::kOriginal, 1, 4096), 1e-3);
}

TEST(AdjustLrTest, AdjustLr_MatchRmsAdamW_ScalesByPointTwoSqrtMaxDim) {
  // 0.2 * sqrt(1024) = 6.4 (the double nearest 6.4), either orientation.
  EXPECT_EQ(AdjustLr(0.02, AdjustLrFn::kMatchRmsAdamW, 1024, 256), 0.02 * 6.4);
  EXPECT_EQ(AdjustLr(0.02, AdjustLrFn::kMatchRmsAdamW, 256, 1024), 0.02 * 6.4);
}

// dion's adjust_lr_spectral_norm: lr * sqrt(fan_out / fan_in), which also
// shrinks the steps of wide matrices (unlike "original").
TEST(AdjustLrTest, AdjustLr_SpectralNorm_ScalesBySqrtRowsOverCols) {
  EXPECT_EQ(AdjustLr(0.02, AdjustLrFn::kSpectralNorm, 1024, 256), 0.02 * 2.0);
  EXPECT_EQ(AdjustLr(0.02, AdjustLrFn::kSpectralNorm, 256, 1024), 0.02 * 0.5);
  EXPECT_EQ(AdjustLr(0.02, AdjustLrFn::kSpectralNorm, 512, 512), 0.02);
  EXPECT_EQ(AdjustLr(0.3, AdjustLrFn::kSpectralNorm, 14336, 4096),
            0.3 * std::sqrt(14336.0 / 4096.0));
}

// torch computes ratio = 0.2 * sqrt(max) first, then lr * ratio. The other
// association (lr * 0.2) * sqrt(max) gives 0.22170250336881628 here, one ulp
// lower; we must match torch's bits.
TEST(AdjustLrTest, AdjustLr_MatchRmsAdamW_UsesTorchOperationOrder) {
  EXPECT_EQ(AdjustLr(0.02, AdjustLrFn::kMatchRmsAdamW, 768, 3072),
            0.2217025033688163);
  EXPECT_EQ(AdjustLr(0.3, AdjustLrFn::kMatchRmsAdamW, 4096, 11008),
            6.295140983329921);
}

TEST(ParseAdjustLrFnTest, ParseAdjustLrFn_TorchNames_Parse) {
  absl::StatusOr<AdjustLrFn> original = ParseAdjustLrFn("original");
  ASSERT_TRUE(original.ok()) << original.status();
  EXPECT_EQ(*original, AdjustLrFn::kOriginal);
  absl::StatusOr<AdjustLrFn> match = ParseAdjustLrFn("match_rms_adamw");
  ASSERT_TRUE(match.ok()) << match.status();
  EXPECT_EQ(*match, AdjustLrFn::kMatchRmsAdamW);
  absl::StatusOr<AdjustLrFn> spectral = ParseAdjustLrFn("spectral_norm");
  ASSERT_TRUE(spectral.ok()) << spectral.status();
  EXPECT_EQ(*spectral, AdjustLrFn::kSpectralNorm);
  for (AdjustLrFn fn : {AdjustLrFn::kOriginal, AdjustLrFn::kMatchRmsAdamW,
                        AdjustLrFn::kSpectralNorm}) {
    EXPECT_EQ(ParseAdjustLrFn(AdjustLrFnName(fn)).value(), fn);
  }
}

TEST(ParseAdjustLrFnTest, ParseAdjustLrFn_UnknownName_ReturnsInvalidArgument) {
  for (const char* name :
       {"", "Original", "match_rms_adam", "none", "original "}) {
    absl::StatusOr<AdjustLrFn> fn = ParseAdjustLrFn(name);
    ASSERT_FALSE(fn.ok()) << name;
    EXPECT_EQ(fn.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(std::string(fn.status().message()),
                HasSubstr(absl::StrCat("\"", name, "\"")));
  }
}

// lr 0.02, weight decay 0.1, adjusted lr 0.128 (match_rms_adamw, 1024x256):
//   decay = (float)(1 - 0.002) = 0x1.fef9dcp-1, alpha = (float)-0.128 =
//   -0x1.0624dep-3; param = (param*decay) + alpha*update, each op in float.
// For elements 2 and 3 a single rounding of the exact double result would
// give 0x1.8e5604p-2 and -0x1.425aeep-2: the float-per-operation semantics
// of torch's mul_ then add_ are what is pinned here.
TEST(ApplyUpdateTest, ApplyUpdate_WeightDecayAndStep_MatchTorchMulThenAdd) {
  std::vector<float> param = {1.0f, 0.3f, -0.2f};
  const std::vector<float> update = {0.5f, -0.7f, 0.9f};
  const double lr = 0.02;
  const double adjusted_lr =
      AdjustLr(lr, AdjustLrFn::kMatchRmsAdamW, 1024, 256);
  ASSERT_EQ(adjusted_lr, 0.128);
  ApplyUpdate(param.data(), update.data(), 3, lr, 0.1, adjusted_lr);
  EXPECT_THAT(param,
              ElementsAre(0x1.de354p-1f, 0x1.8e5606p-2f, -0x1.425af0p-2f));
}

TEST(ApplyUpdateTest, ApplyUpdate_NoDecayNoLr_KeepsParam) {
  std::vector<float> param = {1.0f, -0.3f};
  const std::vector<float> update = {5.0f, 7.0f};
  ApplyUpdate(param.data(), update.data(), 2, 0.0, 0.1, 0.0);
  EXPECT_THAT(param, ElementsAre(1.0f, -0.3f));
}

// Decay uses the unadjusted lr: with lr 0.5 and weight decay 1, param halves
// whatever adjusted_lr is; the update term is then -adjusted_lr * update.
TEST(ApplyUpdateTest, ApplyUpdate_DecayUsesUnadjustedLr) {
  std::vector<float> param = {4.0f};
  const std::vector<float> update = {1.0f};
  ApplyUpdate(param.data(), update.data(), 1, 0.5, 1.0, 0.25);
  EXPECT_EQ(param[0], 4.0f * 0.5f - 0.25f);
}

}  // namespace
}  // namespace kernels
}  // namespace muon
