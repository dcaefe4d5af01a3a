// Tests of muon::Muon on a single device (no DistributedConfig): the step is
// checked against torch.optim.Muon's semantics (`_single_tensor_muon` in
// torch/optim/_muon.py, PyTorch 2.9) two ways.
//
// Bit for bit, the element-wise operations: a float32 reference written in
// the test, operation by operation,
//   B <- B.lerp_(G, 1 - mu)            torch's scalar lerp formula
//   U <- nesterov ? G.lerp(B, mu) : B
//   O <- NS_k(U)                       kernels::NewtonSchulz, the SAME kernel
//                                      the optimizer calls (tested against
//                                      float64 in tests/kernels)
//   W <- W * (1 - lr*wd)               unadjusted lr
//   W <- W - AdjustLR(lr, shape) * O
// so parameters and momentum buffers are compared bit for bit. These tests
// (Step_*_ElementwiseOpsMatchTorchBitwise) prove the lerps, the decay and the
// adjusted lr around Newton-Schulz, not Newton-Schulz itself.
//
// Independently, the whole step: torch.optim.Muon's step, including
// _zeropower_via_newtonschulz, written out in float64 with plain loops in
// this file (nothing from //kernels), for every option set above; the
// optimizer must stay within the Newton-Schulz kernel's fp32 error bound of
// it. Then torch's argument errors and Step's preflight.
//
// Built with -ffp-contract=off (BUILD.bazel) so the expected values are not
// fused into multiply-adds by the compiler.
#include "client/muon.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/parameter.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/newton_schulz.h"
#include "tests/client/torch_reference64.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::muon::testing::ExpectedAdjustedLr;
using ::muon::testing::TorchZeropower64;
using ::testing::AllOf;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;

// Deterministic values in [-1, 1) (the generator's output is fixed by the
// standard; the float conversion is ours, so the values are portable).
std::vector<float> RandomValues(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<float> v(n);
  for (float& x : v) {
    x = static_cast<float>(gen() >> 8) * 0x1p-23f - 1.0f;
  }
  return v;
}

Parameter MakeParam(const std::string& name, int64_t rows, int64_t cols,
                    uint32_t seed) {
  Parameter p;
  p.name = name;
  p.local_shape = {rows, cols};
  p.data = RandomValues(rows * cols, seed);
  p.grad.assign(rows * cols, 0.0f);
  return p;
}

// Bitwise equality of two float vectors (distinguishes -0 from 0 and
// compares NaN payloads).
::testing::AssertionResult BitwiseEqual(const std::vector<float>& actual,
                                        const std::vector<float>& expected) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "sizes differ: " << actual.size() << " vs " << expected.size();
  }
  for (size_t i = 0; i < actual.size(); ++i) {
    if (std::memcmp(&actual[i], &expected[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << actual[i] << " (" << std::hexfloat
             << actual[i] << ") vs expected " << std::defaultfloat
             << expected[i] << " (" << std::hexfloat << expected[i] << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

// torch's scalar lerp (ATen native/Lerp.h) in float32:
//   |w| < 0.5 ? self + w*(end - self) : end - (end - self)*(1 - w).
float TorchLerp(float self, float end, float w) {
  const float diff = end - self;
  return std::abs(w) < 0.5f ? self + w * diff : end - diff * (1.0f - w);
}

// The state of one matrix in the hand-written reference.
struct RefMatrix {
  int64_t rows;
  int64_t cols;
  std::vector<float> w;
  std::vector<float> buf;  // momentum buffer, zeros at first
};

// One torch.optim.Muon step of `m` with gradient `g`, in float32, following
// `_single_tensor_muon` (torch/optim/_muon.py, PyTorch 2.9) literally.
void ReferenceStep(const MuonOptions& o, const std::vector<float>& g,
                   RefMatrix* m) {
  const int64_t n = m->rows * m->cols;
  // buf.lerp_(grad, 1 - momentum): the weight is a Python float (double)
  // cast to float32 by the tensor op.
  const float w_buf = static_cast<float>(1.0 - o.momentum);
  for (int64_t i = 0; i < n; ++i) m->buf[i] = TorchLerp(m->buf[i], g[i], w_buf);
  // update = grad.lerp(buf, momentum) if nesterov else buf.
  std::vector<float> u(n);
  const float w_nest = static_cast<float>(o.momentum);
  for (int64_t i = 0; i < n; ++i) {
    u[i] = o.nesterov ? TorchLerp(g[i], m->buf[i], w_nest) : m->buf[i];
  }
  kernels::NewtonSchulzOptions ns;
  ns.a = o.ns_a;
  ns.b = o.ns_b;
  ns.c = o.ns_c;
  ns.eps = o.eps;
  ns.steps = o.ns_steps;
  std::vector<float> orth(n);
  ASSERT_TRUE(kernels::NewtonSchulz(u.data(), m->rows, m->cols, ns, orth.data(),
                                    nullptr)
                  .ok());
  // param.mul_(1 - lr * weight_decay); param.add_(update, alpha=-adj_lr).
  const float decay = static_cast<float>(1.0 - o.lr * o.weight_decay);
  const float alpha = static_cast<float>(
      -ExpectedAdjustedLr(o.lr, o.adjust_lr_fn, m->rows, m->cols));
  for (int64_t i = 0; i < n; ++i) {
    float p = m->w[i] * decay;
    const float step = alpha * orth[i];
    m->w[i] = p + step;
  }
}

struct Shape {
  int64_t rows;
  int64_t cols;
};

// Runs `steps` Muon steps on one parameter per shape (seeded weights and
// gradients) and compares every parameter and momentum buffer bitwise with
// the float32 reference after every step.
void ExpectStepsMatchReference(const MuonOptions& options,
                               const std::vector<Shape>& shapes, int steps) {
  openblas_set_num_threads(1);
  std::vector<Parameter> params;
  std::vector<RefMatrix> ref;
  for (size_t i = 0; i < shapes.size(); ++i) {
    params.push_back(MakeParam(absl::StrCat("w", i), shapes[i].rows,
                               shapes[i].cols, 100 + i));
    ref.push_back(RefMatrix{shapes[i].rows, shapes[i].cols, params[i].data,
                            std::vector<float>(params[i].data.size(), 0.0f)});
  }
  std::vector<Parameter*> ptrs;
  for (Parameter& p : params) ptrs.push_back(&p);
  absl::StatusOr<std::unique_ptr<Muon>> muon = Muon::Create(ptrs, options);
  ASSERT_TRUE(muon.ok()) << muon.status();
  for (int s = 0; s < steps; ++s) {
    SCOPED_TRACE(absl::StrCat("step ", s + 1));
    double expected_flops = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].grad = RandomValues(params[i].data.size(), 1000 * (s + 1) + i);
      ReferenceStep(options, params[i].grad, &ref[i]);
      expected_flops += kernels::NewtonSchulzFlops(
          shapes[i].rows, shapes[i].cols, options.ns_steps);
    }
    ASSERT_TRUE((*muon)->Step().ok());
    EXPECT_EQ((*muon)->step_count(), s + 1);
    for (size_t i = 0; i < params.size(); ++i) {
      SCOPED_TRACE(absl::StrCat("parameter ", params[i].name, " [",
                                shapes[i].rows, ", ", shapes[i].cols, "]"));
      EXPECT_TRUE(BitwiseEqual((*muon)->momentum_buffer(i), ref[i].buf));
      EXPECT_TRUE(BitwiseEqual(params[i].data, ref[i].w));
    }
    EXPECT_EQ((*muon)->last_step_stats().matrices_orthogonalized,
              static_cast<int>(params.size()));
    EXPECT_DOUBLE_EQ((*muon)->last_step_stats().ns_flops, expected_flops);
  }
}

// --- Options ---

TEST(MuonTest, Create_DefaultOptions_KeepsOptionsAndIsWorldOfOne) {
  Parameter p = MakeParam("fc.weight", 3, 5, 1);
  absl::StatusOr<std::unique_ptr<Muon>> muon = Muon::Create({&p});
  ASSERT_TRUE(muon.ok()) << muon.status();
  EXPECT_EQ((*muon)->options().lr, 1e-3);
  EXPECT_EQ((*muon)->options().weight_decay, 0.1);
  EXPECT_EQ((*muon)->options().momentum, 0.95);
  EXPECT_TRUE((*muon)->options().nesterov);
  EXPECT_EQ((*muon)->options().adjust_lr_fn, kernels::AdjustLrFn::kOriginal);
  EXPECT_EQ((*muon)->current_rank(), 0);
  EXPECT_EQ((*muon)->world_size(), 1);
  EXPECT_EQ((*muon)->step_count(), 0);
  EXPECT_EQ((*muon)->agent(), nullptr);
  EXPECT_EQ((*muon)->momentum_buffer(0), std::vector<float>(15, 0.0f));
  const std::map<int, std::vector<int>> assignments = (*muon)->assignments();
  ASSERT_EQ(assignments.size(), 1u);
  EXPECT_EQ(assignments.at(0), std::vector<int>({0}));
}

// --- The step's element-wise operations against the float32 reference ---

TEST(MuonTest,
     Step_DefaultOptionsNesterovThreeSteps_ElementwiseOpsMatchTorchBitwise) {
  ExpectStepsMatchReference(MuonOptions{}, {{3, 5}, {5, 3}}, 3);
}

TEST(MuonTest, Step_NesterovOnThreeSteps_ElementwiseOpsMatchTorchBitwise) {
  MuonOptions o;
  o.lr = 0.02;
  o.weight_decay = 0.05;
  o.nesterov = true;
  ExpectStepsMatchReference(o, {{3, 5}, {5, 3}}, 3);
}

TEST(MuonTest, Step_NesterovOffThreeSteps_ElementwiseOpsMatchTorchBitwise) {
  MuonOptions o;
  o.lr = 0.02;
  o.weight_decay = 0.05;
  o.nesterov = false;
  ExpectStepsMatchReference(o, {{3, 5}, {5, 3}}, 3);
}

// momentum 0.3: 1 - mu = 0.7 takes lerp's large-weight branch for the buffer
// and mu = 0.3 the small-weight branch for Nesterov (the reverse of 0.95).
TEST(MuonTest, Step_LowMomentumThreeSteps_ElementwiseOpsMatchTorchBitwise) {
  MuonOptions o;
  o.lr = 0.02;
  o.momentum = 0.3;
  ExpectStepsMatchReference(o, {{4, 6}, {6, 4}}, 3);
}

TEST(MuonTest,
     Step_OriginalAdjustLrTallAndWide_ElementwiseOpsMatchTorchBitwise) {
  MuonOptions o;
  o.lr = 0.02;
  o.adjust_lr_fn = kernels::AdjustLrFn::kOriginal;
  // Tall: lr*sqrt(8/2) = 2*lr; wide: lr*sqrt(max(1, 2/8)) = lr.
  ExpectStepsMatchReference(o, {{8, 2}, {2, 8}, {7, 3}, {3, 7}}, 2);
}

TEST(MuonTest,
     Step_MatchRmsAdamWAdjustLrTallAndWide_ElementwiseOpsMatchTorchBitwise) {
  MuonOptions o;
  o.lr = 0.02;
  o.adjust_lr_fn = kernels::AdjustLrFn::kMatchRmsAdamW;
  ExpectStepsMatchReference(o, {{8, 2}, {2, 8}, {7, 3}, {3, 7}}, 2);
}

TEST(MuonTest,
     Step_CustomCoefficientsAndNsSteps_ElementwiseOpsMatchTorchBitwise) {
  MuonOptions o;
  o.lr = 0.01;
  o.ns_a = 2.0;
  o.ns_b = -1.5;
  o.ns_c = 0.5;
  o.ns_steps = 3;
  o.eps = 1e-5;
  ExpectStepsMatchReference(o, {{3, 5}, {5, 3}}, 2);
}

// The reference's own AdjustLR values for these shapes (pins the formula the
// bitwise tests above rely on).
TEST(MuonTest, ExpectedAdjustedLr_TallAndWide_MatchTorchFormula) {
  EXPECT_DOUBLE_EQ(
      ExpectedAdjustedLr(0.02, kernels::AdjustLrFn::kOriginal, 8, 2), 0.04);
  EXPECT_DOUBLE_EQ(
      ExpectedAdjustedLr(0.02, kernels::AdjustLrFn::kOriginal, 2, 8), 0.02);
  EXPECT_DOUBLE_EQ(
      ExpectedAdjustedLr(0.02, kernels::AdjustLrFn::kMatchRmsAdamW, 8, 2),
      0.02 * 0.2 * std::sqrt(8.0));
  EXPECT_DOUBLE_EQ(
      ExpectedAdjustedLr(0.02, kernels::AdjustLrFn::kMatchRmsAdamW, 2, 8),
      0.02 * 0.2 * std::sqrt(8.0));
  EXPECT_DOUBLE_EQ(
      ExpectedAdjustedLr(0.02, kernels::AdjustLrFn::kSpectralNorm, 8, 2), 0.04);
  EXPECT_DOUBLE_EQ(
      ExpectedAdjustedLr(0.02, kernels::AdjustLrFn::kSpectralNorm, 2, 8), 0.01);
}

// With a zero gradient U = 0 and NS(0) = 0 (the norm is clamped to eps), so
// the step is weight decay alone: W * (float)(1 - lr*wd) with the UNADJUSTED
// lr, bit for bit. The adjusted lr differs by a factor 2 ("original", 16x4)
// and 0.8 ("match_rms_adamw"), so using it would change the result.
TEST(MuonTest, Step_ZeroGradient_DecaysWithUnadjustedLr) {
  for (const kernels::AdjustLrFn fn :
       {kernels::AdjustLrFn::kOriginal, kernels::AdjustLrFn::kMatchRmsAdamW,
        kernels::AdjustLrFn::kSpectralNorm}) {
    SCOPED_TRACE(kernels::AdjustLrFnName(fn));
    MuonOptions o;
    o.lr = 0.05;
    o.weight_decay = 0.5;
    o.adjust_lr_fn = fn;
    Parameter p = MakeParam("tall", 16, 4, 7);
    const std::vector<float> before = p.data;
    absl::StatusOr<std::unique_ptr<Muon>> muon = Muon::Create({&p}, o);
    ASSERT_TRUE(muon.ok()) << muon.status();
    ASSERT_TRUE((*muon)->Step().ok());
    const float decay = static_cast<float>(1.0 - o.lr * o.weight_decay);
    const float wrong_decay = static_cast<float>(
        1.0 - ExpectedAdjustedLr(o.lr, fn, 16, 4) * o.weight_decay);
    ASSERT_NE(decay, wrong_decay);
    std::vector<float> expected(before.size());
    int differs_from_wrong = 0;
    for (size_t i = 0; i < before.size(); ++i) {
      expected[i] = before[i] * decay;
      if (expected[i] != before[i] * wrong_decay) ++differs_from_wrong;
    }
    EXPECT_GT(differs_from_wrong, 0);
    EXPECT_TRUE(BitwiseEqual(p.data, expected));
    EXPECT_EQ((*muon)->momentum_buffer(0), std::vector<float>(64, 0.0f));
  }
}

// Weight decay uses the unadjusted lr also with a non-zero update: the float32
// reference with the adjusted lr in the decay would not match.
TEST(MuonTest, Step_WeightDecayWithTallMatrix_UsesUnadjustedLr) {
  MuonOptions o;
  o.lr = 0.05;
  o.weight_decay = 0.5;
  o.adjust_lr_fn = kernels::AdjustLrFn::kOriginal;
  ExpectStepsMatchReference(o, {{12, 3}}, 1);

  // And the variant with the adjusted lr in the decay gives other bits.
  openblas_set_num_threads(1);
  Parameter p = MakeParam("w0", 12, 3, 100);
  p.grad = RandomValues(36, 1000);
  RefMatrix wrong{12, 3, p.data, std::vector<float>(36, 0.0f)};
  MuonOptions wrong_o = o;
  wrong_o.weight_decay =
      o.weight_decay *
      ExpectedAdjustedLr(o.lr, kernels::AdjustLrFn::kOriginal, 12, 3) / o.lr;
  ReferenceStep(wrong_o, p.grad, &wrong);
  absl::StatusOr<std::unique_ptr<Muon>> muon = Muon::Create({&p}, o);
  ASSERT_TRUE(muon.ok()) << muon.status();
  ASSERT_TRUE((*muon)->Step().ok());
  EXPECT_FALSE(BitwiseEqual(p.data, wrong.w));
}

// --- The whole step against an independent float64 formulation ---

// Relative error bound of the fp32 Newton-Schulz kernel against float64,
// of max|O| (kMaxRelErr in tests/kernels/newton_schulz_test.cc, where it is
// derived and measured).
constexpr double kNsRelErr = 1e-4;
// float32 rounding of the weights (two roundings per step of values below
// ~1.1, 2^-24 relative) and of the momentum buffer (a few per step of values
// below 1), with headroom.
constexpr double kWeightRoundingTol = 1e-6;
constexpr double kBufferTol = 1e-6;

struct OptionSet {
  std::string name;
  MuonOptions options;
  std::vector<Shape> shapes;
  int steps;
};

// The option sets of the bitwise tests above, and lr 0.02 on a square
// matrix.
std::vector<OptionSet> OptionSets() {
  std::vector<OptionSet> sets;
  sets.push_back({"default options", MuonOptions{}, {{3, 5}, {5, 3}}, 3});
  MuonOptions o;
  o.lr = 0.02;
  o.weight_decay = 0.05;
  sets.push_back({"nesterov on", o, {{3, 5}, {5, 3}}, 3});
  o.nesterov = false;
  sets.push_back({"nesterov off", o, {{3, 5}, {5, 3}}, 3});
  o = MuonOptions{};
  o.lr = 0.02;
  o.momentum = 0.3;
  sets.push_back({"momentum 0.3", o, {{4, 6}, {6, 4}}, 3});
  o = MuonOptions{};
  o.lr = 0.02;
  sets.push_back(
      {"adjust_lr_fn original", o, {{8, 2}, {2, 8}, {7, 3}, {3, 7}}, 2});
  o.adjust_lr_fn = kernels::AdjustLrFn::kMatchRmsAdamW;
  sets.push_back(
      {"adjust_lr_fn match_rms_adamw", o, {{8, 2}, {2, 8}, {7, 3}, {3, 7}}, 2});
  o.adjust_lr_fn = kernels::AdjustLrFn::kSpectralNorm;
  sets.push_back(
      {"adjust_lr_fn spectral_norm", o, {{8, 2}, {2, 8}, {7, 3}, {3, 7}}, 2});
  o = MuonOptions{};
  o.lr = 0.01;
  o.ns_a = 2.0;
  o.ns_b = -1.5;
  o.ns_c = 0.5;
  o.ns_steps = 3;
  o.eps = 1e-5;
  sets.push_back({"custom coefficients", o, {{3, 5}, {5, 3}}, 2});
  o = MuonOptions{};
  o.lr = 0.05;
  o.weight_decay = 0.5;
  sets.push_back({"weight decay 0.5, tall", o, {{12, 3}}, 1});
  o = MuonOptions{};
  o.lr = 0.02;
  sets.push_back({"lr 0.02, square", o, {{3, 5}, {5, 3}, {6, 6}}, 3});
  return sets;
}

// Runs the option set's steps (seeded weights and gradients, as
// ExpectStepsMatchReference) with the optimizer and with torch's step in
// float64 (lerp, Nesterov lerp, TorchZeropower64, decay with the unadjusted
// lr, update with the adjusted lr), comparing after every step. A weight
// may differ by the Newton-Schulz bound of each update so far
// (adjusted lr * kNsRelErr * max|O|) plus float32 rounding.
void ExpectStepsNearFloat64Loop(const OptionSet& set) {
  openblas_set_num_threads(1);
  const MuonOptions& o = set.options;
  std::vector<Parameter> params;
  std::vector<std::vector<double>> w, buf;
  std::vector<double> tol;  // [param], grows with each step's update
  for (size_t i = 0; i < set.shapes.size(); ++i) {
    params.push_back(MakeParam(absl::StrCat("w", i), set.shapes[i].rows,
                               set.shapes[i].cols, 100 + i));
    w.emplace_back(params[i].data.begin(), params[i].data.end());
    buf.emplace_back(params[i].data.size(), 0.0);
    tol.push_back(kWeightRoundingTol);
  }
  std::vector<Parameter*> ptrs;
  for (Parameter& p : params) ptrs.push_back(&p);
  absl::StatusOr<std::unique_ptr<Muon>> muon = Muon::Create(ptrs, o);
  ASSERT_TRUE(muon.ok()) << muon.status();
  for (int s = 0; s < set.steps; ++s) {
    SCOPED_TRACE(absl::StrCat("step ", s + 1));
    for (size_t i = 0; i < params.size(); ++i) {
      const int64_t rows = set.shapes[i].rows;
      const int64_t cols = set.shapes[i].cols;
      const int64_t n = rows * cols;
      params[i].grad = RandomValues(n, 1000 * (s + 1) + i);
      std::vector<double> u(n);
      for (int64_t k = 0; k < n; ++k) {
        const double g = params[i].grad[k];
        buf[i][k] += (1.0 - o.momentum) * (g - buf[i][k]);
        u[k] = o.nesterov ? g + o.momentum * (buf[i][k] - g) : buf[i][k];
      }
      const std::vector<double> orth = TorchZeropower64(u, rows, cols, o);
      const double adj = ExpectedAdjustedLr(o.lr, o.adjust_lr_fn, rows, cols);
      double max_orth = 0.0;
      for (int64_t k = 0; k < n; ++k) {
        w[i][k] = w[i][k] * (1.0 - o.lr * o.weight_decay) - adj * orth[k];
        max_orth = std::max(max_orth, std::abs(orth[k]));
      }
      tol[i] += adj * kNsRelErr * max_orth;
    }
    ASSERT_TRUE((*muon)->Step().ok());
    for (size_t i = 0; i < params.size(); ++i) {
      SCOPED_TRACE(absl::StrCat("parameter ", params[i].name, " [",
                                set.shapes[i].rows, ", ", set.shapes[i].cols,
                                "]"));
      const std::vector<float>& got_buf =
          (*muon)->momentum_buffer(static_cast<int>(i));
      for (size_t k = 0; k < w[i].size(); ++k) {
        ASSERT_NEAR(params[i].data[k], w[i][k], tol[i]) << "element " << k;
        ASSERT_NEAR(got_buf[k], buf[i][k], kBufferTol) << "element " << k;
      }
    }
  }
}

TEST(MuonTest, Step_EveryOptionSet_MatchesIndependentFloat64TorchLoop) {
  for (const OptionSet& set : OptionSets()) {
    SCOPED_TRACE(set.name);
    ExpectStepsNearFloat64Loop(set);
  }
}

// TorchZeropower64 itself, on values worked out by hand: a 1 x 2 row has
// the single singular value 1 after normalisation, so each step maps it
// through p(s) = a s + b s^3 + c s^5 (as a 2 x 1 column, transposed).
TEST(MuonTest, TorchZeropower64_RowAndColumn_ScaleByQuinticOfOne) {
  MuonOptions o;
  o.ns_a = 2.0;
  o.ns_b = -1.5;
  o.ns_c = 0.5;
  o.ns_steps = 2;
  // p(1) = 2 - 1.5 + 0.5 = 1 (twice): O = G / ||G|| = [0.6, -0.8].
  EXPECT_THAT(TorchZeropower64({3.0, -4.0}, 1, 2, o),
              ::testing::ElementsAre(::testing::DoubleEq(0.6),
                                     ::testing::DoubleEq(-0.8)));
  EXPECT_THAT(TorchZeropower64({3.0, -4.0}, 2, 1, o),
              ::testing::ElementsAre(::testing::DoubleEq(0.6),
                                     ::testing::DoubleEq(-0.8)));
  // a = 3, b = c = 0, one step: p(1) = 3.
  o.ns_a = 3.0;
  o.ns_b = 0.0;
  o.ns_c = 0.0;
  o.ns_steps = 1;
  EXPECT_THAT(TorchZeropower64({3.0, -4.0}, 1, 2, o),
              ::testing::ElementsAre(::testing::DoubleEq(1.8),
                                     ::testing::DoubleEq(-2.4)));
  // [[2, 0], [0, 1]] (||.||_F = sqrt 5), b = 1, a = c = 0, one step:
  // X = D / sqrt5, A = X X^T = diag(4, 1) / 5, X' = A X = diag(8, 1) / 5^1.5.
  o.ns_a = 0.0;
  o.ns_b = 1.0;
  const double s = 5.0 * std::sqrt(5.0);
  EXPECT_THAT(TorchZeropower64({2.0, 0.0, 0.0, 1.0}, 2, 2, o),
              ::testing::ElementsAre(
                  ::testing::DoubleEq(8.0 / s), ::testing::DoubleEq(0.0),
                  ::testing::DoubleEq(0.0), ::testing::DoubleEq(1.0 / s)));
}

TEST(MuonTest, ZeroGrad_AfterStep_ClearsGradientsKeepingSizes) {
  Parameter p = MakeParam("w", 3, 5, 3);
  p.grad = RandomValues(15, 4);
  absl::StatusOr<std::unique_ptr<Muon>> muon = Muon::Create({&p});
  ASSERT_TRUE(muon.ok()) << muon.status();
  ASSERT_TRUE((*muon)->Step().ok());
  (*muon)->ZeroGrad();
  EXPECT_EQ(p.grad, std::vector<float>(15, 0.0f));
}

// --- Parameter errors (option errors: muon_options_test.cc) ---

// ns_method = "gram" runs kernels::NewtonSchulz with kGram: one step on a
// wide and a tall matrix equals the standard method's step to the Gram
// kernel's error (tests/kernels/newton_schulz_gram_test.cc) and is not
// bitwise the standard one (the option reaches the kernel).
TEST(MuonTest, Step_GramMethod_ClosesToStandardButNotBitwise) {
  std::vector<float> results[2];
  for (int method = 0; method < 2; ++method) {
    MuonOptions o;
    o.lr = 0.05;
    o.ns_method = method == 0 ? kernels::NewtonSchulzMethod::kStandard
                              : kernels::NewtonSchulzMethod::kGram;
    Parameter wide = MakeParam("wide", 32, 160, 3);
    Parameter tall = MakeParam("tall", 150, 40, 4);
    wide.grad = RandomValues(32 * 160, 5);
    tall.grad = RandomValues(150 * 40, 6);
    absl::StatusOr<std::unique_ptr<Muon>> muon =
        Muon::Create(std::vector<Parameter*>{&wide, &tall}, o);
    ASSERT_TRUE(muon.ok()) << muon.status();
    ASSERT_TRUE((*muon)->Step().ok());
    results[method] = wide.data;
    results[method].insert(results[method].end(), tall.data.begin(),
                           tall.data.end());
  }
  EXPECT_FALSE(BitwiseEqual(results[0], results[1]));
  double max_diff = 0.0;
  for (size_t i = 0; i < results[0].size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(results[0][i]) -
                                            results[1][i]));
  }
  // lr * sqrt(max(1, rows/cols)) * |O| <= 0.05 * 1.94 * ~0.5; the O error
  // bound is 1e-4 of max |O|.
  EXPECT_LE(max_diff, 1e-5);
}

// ns_method = "auto" picks per matrix: the wide matrix's step is bitwise
// the "gram" job's, the square one's bitwise the "standard" job's.
TEST(MuonTest, Step_AutoMethod_GramForWideStandardForSquare_Bitwise) {
  std::vector<float> wide_result[3], square_result[3];
  const kernels::NewtonSchulzMethod methods[3] = {
      kernels::NewtonSchulzMethod::kStandard,
      kernels::NewtonSchulzMethod::kGram, kernels::NewtonSchulzMethod::kAuto};
  for (int i = 0; i < 3; ++i) {
    MuonOptions o;
    o.lr = 0.05;
    o.ns_method = methods[i];
    Parameter wide = MakeParam("wide", 32, 160, 3);
    Parameter square = MakeParam("square", 48, 48, 4);
    wide.grad = RandomValues(32 * 160, 5);
    square.grad = RandomValues(48 * 48, 6);
    absl::StatusOr<std::unique_ptr<Muon>> muon =
        Muon::Create(std::vector<Parameter*>{&wide, &square}, o);
    ASSERT_TRUE(muon.ok()) << muon.status();
    ASSERT_TRUE((*muon)->Step().ok());
    wide_result[i] = wide.data;
    square_result[i] = square.data;
  }
  EXPECT_FALSE(BitwiseEqual(wide_result[0], wide_result[1]));
  EXPECT_TRUE(BitwiseEqual(wide_result[2], wide_result[1]));
  EXPECT_TRUE(BitwiseEqual(square_result[2], square_result[0]));
}

TEST(MuonTest, Create_OneDimParameter_ReturnsInvalidArgumentNamingIt) {
  Parameter w = MakeParam("fc.weight", 3, 5, 1);
  Parameter bias;
  bias.name = "fc.bias";
  bias.local_shape = {5};
  bias.data.assign(5, 0.5f);
  bias.grad.assign(5, 0.0f);
  EXPECT_THAT(Muon::Create(std::vector<Parameter*>{&w, &bias}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("fc.bias"), HasSubstr("[5]"))));
  EXPECT_EQ(bias.data, std::vector<float>(5, 0.5f));
}

TEST(MuonTest, Create_ThreeDimParameter_ReturnsInvalidArgumentNamingIt) {
  Parameter w;
  w.name = "conv.weight";
  w.local_shape = {2, 3, 4};
  w.data.assign(24, 1.0f);
  w.grad.assign(24, 0.0f);
  EXPECT_THAT(Muon::Create({&w}), StatusIs(absl::StatusCode::kInvalidArgument,
                                           AllOf(HasSubstr("conv.weight"),
                                                 HasSubstr("[2, 3, 4]"))));
}

TEST(MuonTest, Create_DataSizeNotMatchingLocalShape_ReturnsInvalidArgument) {
  Parameter w = MakeParam("fc.weight", 3, 5, 1);
  w.data.resize(14);
  EXPECT_THAT(Muon::Create({&w}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("fc.weight"), HasSubstr("14"),
                             HasSubstr("15"))));
}

// --- Step preflight ---

class MuonStepPreflightTest : public ::testing::Test {
 protected:
  void SetUp() override {
    params_.push_back(MakeParam("a.weight", 3, 5, 1));
    params_.push_back(MakeParam("b.weight", 5, 3, 2));
    for (Parameter& p : params_) ptrs_.push_back(&p);
    MuonOptions o;
    o.lr = 0.02;
    absl::StatusOr<std::unique_ptr<Muon>> muon = Muon::Create(ptrs_, o);
    ASSERT_TRUE(muon.ok()) << muon.status();
    muon_ = *std::move(muon);
    // One good step so that the momentum buffers are not all zero.
    for (size_t i = 0; i < params_.size(); ++i) {
      params_[i].grad = RandomValues(15, 20 + i);
    }
    ASSERT_TRUE(muon_->Step().ok());
  }

  // Expects a failed Step to have changed nothing: parameters, momentum
  // buffers and the step count.
  void ExpectStepFailsWithoutSideEffects(const std::string& name) {
    std::vector<std::vector<float>> data, bufs;
    for (size_t i = 0; i < params_.size(); ++i) {
      data.push_back(params_[i].data);
      bufs.push_back(muon_->momentum_buffer(i));
    }
    EXPECT_THAT(muon_->Step(),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         AllOf(HasSubstr(name), HasSubstr("rank 0"))));
    for (size_t i = 0; i < params_.size(); ++i) {
      SCOPED_TRACE(params_[i].name);
      EXPECT_TRUE(BitwiseEqual(params_[i].data, data[i]));
      EXPECT_TRUE(BitwiseEqual(muon_->momentum_buffer(i), bufs[i]));
    }
    EXPECT_EQ(muon_->step_count(), 1);
  }

  std::vector<Parameter> params_;
  std::vector<Parameter*> ptrs_;
  std::unique_ptr<Muon> muon_;
};

// The bad gradient is on the second parameter, so a step that updated
// parameters one by one before checking would already have changed the first.
TEST_F(MuonStepPreflightTest, Step_MissingGradient_ReturnsFailedPrecondition) {
  params_[0].grad = RandomValues(15, 30);
  params_[1].grad.clear();
  ExpectStepFailsWithoutSideEffects("b.weight");
}

TEST_F(MuonStepPreflightTest,
       Step_WrongSizeGradient_ReturnsFailedPrecondition) {
  params_[0].grad = RandomValues(15, 30);
  params_[1].grad = RandomValues(16, 31);
  ExpectStepFailsWithoutSideEffects("b.weight");
}

TEST_F(MuonStepPreflightTest, Step_AfterFixingGradient_Succeeds) {
  params_[1].grad.clear();
  ASSERT_FALSE(muon_->Step().ok());
  params_[1].grad = RandomValues(15, 31);
  EXPECT_TRUE(muon_->Step().ok());
  EXPECT_EQ(muon_->step_count(), 2);
}

}  // namespace
}  // namespace muon
