// NorMuon (MuonOptions::normuon; Li et al., arXiv 2510.05491, Algorithm 1,
// with microsoft/dion's normuon.py rescale to the Frobenius norm of the
// orthogonalized update):
//   - one device against an independent float64 loop written from those
//     sources (momentum, Nesterov, Newton-Schulz, the row-wise second
//     moment, the normalization and rescale, AdjustLR), parameters and row
//     state within bounds derived from Newton-Schulz's fp32 error;
//   - the options' errors, and the combinations it refuses (bf16 exchange,
//     custom gather/redistribute functions), on every rank before any
//     collective;
//   - ranks that disagree on normuon fail at the plan, naming the rank;
//   - a failed transactional step restores the row state bit for bit.
// Layouts (bitwise the single device): muon_variants_test; checkpoints and
// state_dict: muon_checkpoint_test.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "client/parameter.h"
#include "common/layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/distributed_world.h"
#include "tests/client/single_device_reference.h"
#include "tests/client/torch_reference64.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::muon::testing::BitwiseEqual;
using ::muon::testing::ExpectedAdjustedLr;
using ::muon::testing::MatricesProblem;
using ::muon::testing::MeshConfig;
using ::muon::testing::OneDimLayout;
using ::muon::testing::Problem;
using ::muon::testing::ProblemLayout;
using ::muon::testing::RandomValues;
using ::muon::testing::RankShards;
using ::muon::testing::RunOnRanks;
using ::muon::testing::TestOptions;
using ::muon::testing::TorchZeropower64;
using ::muon::testing::World;
using ::testing::AllOf;
using ::testing::HasSubstr;

// Relative error of the fp32 Newton-Schulz kernel against float64, of
// max|O| (kMaxRelErr of tests/kernels/newton_schulz_test.cc, where it is
// derived and measured).
constexpr double kNsRelErr = 1e-4;

// NorMuon's normalization in float64 (arXiv 2510.05491 Algorithm 1 with
// dion's _normuon_normalization_core rescale): v_i += (1 - beta2) *
// (mean_j O_ij^2 - v_i); O_ij /= sqrt(v_i) + eps; O *= ||O_in||_F /
// max(||O||_F, eps). Updates `o` and `v` in place.
void NorMuon64(std::vector<double>* o, int64_t rows, int64_t cols,
               std::vector<double>* v, double beta2, double eps) {
  double before = 0;
  for (double x : *o) before += x * x;
  double after = 0;
  for (int64_t i = 0; i < rows; ++i) {
    double sq = 0;
    for (int64_t j = 0; j < cols; ++j)
      sq += (*o)[i * cols + j] * (*o)[i * cols + j];
    (*v)[i] += (1.0 - beta2) * (sq / cols - (*v)[i]);
    const double denom = std::sqrt((*v)[i]) + eps;
    for (int64_t j = 0; j < cols; ++j) {
      (*o)[i * cols + j] /= denom;
      after += (*o)[i * cols + j] * (*o)[i * cols + j];
    }
  }
  const double scale = std::sqrt(before) / std::max(std::sqrt(after), eps);
  for (double& x : *o) x *= scale;
}

// One matrix of the float64 loop: weights, momentum, row state, and the
// bounds on |fp32 - float64| per weight and per row state element (they
// grow with each step).
struct Ref64 {
  int64_t rows = 0, cols = 0;
  std::vector<double> w, buf, v, tol_w, tol_v;
};

// One float64 step of `m` with gradient `g`: torch.optim.Muon's
// _single_tensor_muon with NorMuon between Newton-Schulz and the update.
// The bounds, to first order: the fp32 Newton-Schulz output is within
// delta = kNsRelErr * max|O| of the float64 O per element. Row i's final
// factor c_i = s / (sqrt(v_i) + eps) (s: the Frobenius rescale) multiplies
// that error (c_i * delta), and c_i itself moves: v_i through the row's
// mean of squares by at most 2 * rms_i * delta * (1 - beta2) (rms_i: the
// row's root mean square of O), i.e. sqrt(v_i) by rho_i <= delta / rms_i
// relatively (v_i >= (1 - beta2) * rms_i^2), and s by at most sigma =
// delta * sqrt(rows * cols) / ||O||_F + 2 * max_i rho_i. So |dF_ij| <=
// c_i * delta + |F_ij| * (rho_i + sigma); doubled for second-order terms
// and fp32 rounding, then times AdjustLR.
void Step64(const MuonOptions& o, const std::vector<float>& g, Ref64* m) {
  const int64_t rows = m->rows, cols = m->cols, n = rows * cols;
  std::vector<double> u(n);
  for (int64_t k = 0; k < n; ++k) {
    m->buf[k] += (1.0 - o.momentum) * (g[k] - m->buf[k]);
    u[k] = o.nesterov ? g[k] + o.momentum * (m->buf[k] - g[k]) : m->buf[k];
  }
  std::vector<double> f = TorchZeropower64(u, rows, cols, o);
  double max_o = 0, norm_o = 0;
  std::vector<double> rms(rows, 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const double x = f[i * cols + j];
      max_o = std::max(max_o, std::abs(x));
      rms[i] += x * x;
    }
    norm_o += rms[i];
    rms[i] = std::sqrt(rms[i] / cols);
  }
  const std::vector<double> o_in = f;
  NorMuon64(&f, rows, cols, &m->v, o.normuon_beta2, o.normuon_eps);
  const double delta = kNsRelErr * max_o;
  double sigma = delta * std::sqrt(static_cast<double>(n)) / std::sqrt(norm_o);
  std::vector<double> rho(rows);
  for (int64_t i = 0; i < rows; ++i) {
    rho[i] = rms[i] > 0 ? delta / rms[i] : 0.0;
    sigma = std::max(
        sigma, delta * std::sqrt(static_cast<double>(n)) / std::sqrt(norm_o) +
                   2.0 * rho[i]);
    m->tol_v[i] = o.normuon_beta2 * m->tol_v[i] +
                  (1.0 - o.normuon_beta2) * 2.0 * rms[i] * delta +
                  1e-6 * m->v[i];
  }
  const double adj = ExpectedAdjustedLr(o.lr, o.adjust_lr_fn, rows, cols);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t k = i * cols + j;
      const double c = o_in[k] != 0 ? f[k] / o_in[k] : 0.0;
      m->w[k] = m->w[k] * (1.0 - o.lr * o.weight_decay) - adj * f[k];
      m->tol_w[k] +=
          adj * 2.0 * (std::abs(c) * delta + std::abs(f[k]) * (rho[i] + sigma));
    }
  }
}

struct Shape {
  int64_t rows, cols;
};

// Runs `steps` NorMuon steps on one device over one parameter per shape
// and the float64 loop beside it; every weight and row state element must
// stay within its bound after every step. Returns the largest |fp32 -
// float64| weight difference seen.
double ExpectNearFloat64Loop(const MuonOptions& o,
                             const std::vector<Shape>& shapes, int steps) {
  std::vector<Parameter> params;
  std::vector<Ref64> ref;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const int64_t n = shapes[i].rows * shapes[i].cols;
    Parameter p;
    p.name = absl::StrCat("w", i);
    p.local_shape = {shapes[i].rows, shapes[i].cols};
    p.data = RandomValues(n, 300 + i);
    p.grad.assign(n, 0.0f);
    params.push_back(p);
    Ref64 r;
    r.rows = shapes[i].rows;
    r.cols = shapes[i].cols;
    r.w.assign(p.data.begin(), p.data.end());
    r.buf.assign(n, 0.0);
    r.v.assign(r.rows, 0.0);
    r.tol_w.assign(n, 1e-6);  // fp32 rounding of the weights
    r.tol_v.assign(r.rows, 0.0);
    ref.push_back(r);
  }
  std::vector<Parameter*> ptrs;
  for (Parameter& p : params) ptrs.push_back(&p);
  absl::StatusOr<std::unique_ptr<Muon>> muon = Muon::Create(ptrs, o);
  EXPECT_TRUE(muon.ok()) << muon.status();
  if (!muon.ok()) return 0;
  double max_diff = 0;
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].grad = RandomValues(params[i].data.size(), 900 + 10 * s + i);
      Step64(o, params[i].grad, &ref[i]);
    }
    EXPECT_TRUE((*muon)->Step().ok());
    for (size_t i = 0; i < params.size(); ++i) {
      SCOPED_TRACE(absl::StrCat("step ", s + 1, ", parameter ", i, " [",
                                shapes[i].rows, ", ", shapes[i].cols, "]"));
      for (size_t k = 0; k < ref[i].w.size(); ++k) {
        const double diff = std::abs(params[i].data[k] - ref[i].w[k]);
        max_diff = std::max(max_diff, diff);
        EXPECT_LE(diff, ref[i].tol_w[k]) << "weight " << k;
      }
      const std::vector<float> v = (*muon)->row_state(static_cast<int>(i));
      EXPECT_EQ(v.size(), ref[i].v.size());
      for (size_t r = 0; r < v.size() && r < ref[i].v.size(); ++r) {
        EXPECT_LE(std::abs(v[r] - ref[i].v[r]), ref[i].tol_v[r])
            << "row state " << r;
      }
    }
  }
  return max_diff;
}

// Tall, wide, square and uneven shapes; Nesterov on and off; beta2 0.95
// (the sources' default) and 0.5; three AdjustLR functions.
TEST(NorMuonTest, Step_SingleDevice_MatchesIndependentFloat64Loop) {
  openblas_set_num_threads(1);
  const std::vector<Shape> shapes = {{10, 7}, {3, 5}, {5, 3}, {12, 16}};
  MuonOptions o = TestOptions();
  o.normuon = true;
  const double d1 = ExpectNearFloat64Loop(o, shapes, 4);
  o.nesterov = false;
  o.normuon_beta2 = 0.5;
  o.adjust_lr_fn = kernels::AdjustLrFn::kMatchRmsAdamW;
  const double d2 = ExpectNearFloat64Loop(o, shapes, 3);
  o.adjust_lr_fn = kernels::AdjustLrFn::kSpectralNorm;
  o.weight_decay = 0.0;
  const double d3 = ExpectNearFloat64Loop(o, shapes, 3);
  std::printf(
      "NorMuon vs float64: max |w - w64| %.3g (default), %.3g "
      "(match_rms_adamw, beta2 0.5), %.3g (spectral_norm)\n",
      d1, d2, d3);
}

// The normalization changes the update: NorMuon's weights are not plain
// Muon's, and its update keeps the Frobenius norm of Newton-Schulz's
// output (the rescale), so the weights move by as much in total.
TEST(NorMuonTest, Step_NorMuon_DiffersFromMuonWithTheSameUpdateNorm) {
  openblas_set_num_threads(1);
  std::vector<std::vector<float>> after;
  for (bool normuon : {false, true}) {
    Parameter p;
    p.name = "w";
    p.local_shape = {12, 16};
    p.data = RandomValues(12 * 16, 5);
    p.grad = RandomValues(12 * 16, 6);
    MuonOptions o = TestOptions();
    o.weight_decay = 0.0;
    o.normuon = normuon;
    absl::StatusOr<std::unique_ptr<Muon>> muon = Muon::Create({&p}, o);
    ASSERT_TRUE(muon.ok()) << muon.status();
    const std::vector<float> before = p.data;
    ASSERT_TRUE((*muon)->Step().ok());
    for (size_t k = 0; k < p.data.size(); ++k) p.data[k] -= before[k];
    after.push_back(p.data);  // the step
  }
  EXPECT_FALSE(BitwiseEqual(after[0], after[1]));
  double n0 = 0, n1 = 0;
  for (size_t k = 0; k < after[0].size(); ++k) {
    n0 += after[0][k] * after[0][k];
    n1 += after[1][k] * after[1][k];
  }
  EXPECT_NEAR(std::sqrt(n1), std::sqrt(n0), 1e-5 * std::sqrt(n0));
}

TEST(NorMuonTest, Create_BadBeta2OrEps_InvalidArgumentNamingIt) {
  Parameter p;
  p.name = "w";
  p.local_shape = {3, 5};
  p.data.assign(15, 0.5f);
  const double nan = std::nan("");
  for (const auto& [beta2, eps, what] :
       std::vector<std::tuple<double, double, std::string>>{
           {1.0, 1e-8, "normuon_beta2 should be in [0, 1) but is: 1.0"},
           {-0.1, 1e-8, "normuon_beta2 should be in [0, 1) but is: -0.1"},
           {nan, 1e-8, "normuon_beta2 should be in [0, 1) but is: nan"},
           {0.95, 0.0, "normuon_eps should be a finite value > 0 but is: 0.0"},
           {0.95, INFINITY, "normuon_eps should be a finite value > 0"}}) {
    MuonOptions o;
    o.normuon = true;
    o.normuon_beta2 = beta2;
    o.normuon_eps = eps;
    EXPECT_THAT(Muon::Create({&p}, o),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(what)));
  }
}

// The job spec's optimizer fields reach MuonOptions; unset keeps the
// defaults (off, 0.95, 1e-8).
TEST(NorMuonTest, MuonOptionsFromProto_NorMuonFields_SetOrDefault) {
  v1::OptimizerOptions proto;
  absl::StatusOr<MuonOptions> o = MuonOptionsFromProto(proto);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->normuon);
  EXPECT_EQ(o->normuon_beta2, 0.95);
  EXPECT_EQ(o->normuon_eps, 1e-8);
  proto.set_normuon(true);
  proto.set_normuon_beta2(0.9);
  proto.set_normuon_eps(1e-6);
  o = MuonOptionsFromProto(proto);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->normuon);
  EXPECT_EQ(o->normuon_beta2, 0.9);
  EXPECT_EQ(o->normuon_eps, 1e-6);
}

// Runs Create on 4 ranks of FSDP Shard(0) with `options` per rank and the
// config customized by `customize`; returns each rank's status.
std::vector<absl::Status> CreateOnFourRanks(
    const std::function<MuonOptions(int)>& options,
    const std::function<void(DistributedConfig&)>& customize) {
  const Problem problem = MatricesProblem();
  const ProblemLayout layout =
      OneDimLayout(4, Placement::Shard(0), problem.specs.size());
  World world(4);
  EXPECT_TRUE(world.Connect());
  for (int r = 0; r < 4; ++r)
    EXPECT_TRUE(world.MakeShards(r, problem, layout).ok());
  return RunOnRanks(4, [&](int rank) {
    return world.CreateMuon(rank, MeshConfig(layout), options(rank), customize);
  });
}

// bf16 exchange and custom gather/redistribute functions cannot carry the
// float32 row state: refused on every rank at Create, before any
// collective (the coordinator is never joined).
TEST(NorMuonTest, Create_WithBf16ExchangeOrCustomExchange_RefusedOnEveryRank) {
  auto normuon = [](int) {
    MuonOptions o = TestOptions();
    o.normuon = true;
    return o;
  };
  const std::vector<absl::Status> bf16 = CreateOnFourRanks(
      normuon,
      [](DistributedConfig& c) { c.execution.set_exchange_dtype("bfloat16"); });
  const std::vector<absl::Status> custom =
      CreateOnFourRanks(normuon, [](DistributedConfig& c) {
        c.gather_fn = [](int, int, int, const float*, float*) {
          return absl::OkStatus();
        };
      });
  for (int r = 0; r < 4; ++r) {
    EXPECT_THAT(bf16[r],
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(absl::StrCat("rank ", r)),
                               HasSubstr("normuon"), HasSubstr("bfloat16"))));
    EXPECT_THAT(custom[r], StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("custom gather_fn")));
  }
}

// Rank 1 with another beta2: refused the same way (the owner's would
// decide every holder's state).
TEST(NorMuonTest, Create_RanksDisagreeOnBeta2_EveryRankNamesTheRank) {
  const std::vector<absl::Status> st = CreateOnFourRanks(
      [](int rank) {
        MuonOptions o = TestOptions();
        o.normuon = true;
        if (rank == 1) o.normuon_beta2 = 0.9;
        return o;
      },
      nullptr);
  for (int r = 0; r < 4; ++r) {
    EXPECT_THAT(st[r], StatusIs(absl::StatusCode::kInvalidArgument,
                                HasSubstr("rank 1 reports normuon_beta2=0.9")))
        << "rank " << r;
  }
}

// Rank 2 without NorMuon: the plan fails on every rank, naming rank 2.
TEST(NorMuonTest, Create_RanksDisagreeOnNorMuon_EveryRankNamesTheRank) {
  const std::vector<absl::Status> st = CreateOnFourRanks(
      [](int rank) {
        MuonOptions o = TestOptions();
        o.normuon = rank != 2;
        return o;
      },
      nullptr);
  for (int r = 0; r < 4; ++r) {
    EXPECT_THAT(st[r], StatusIs(absl::StatusCode::kInvalidArgument,
                                HasSubstr("rank 2 reports normuon=false but "
                                          "rank 0 reports normuon=true")))
        << "rank " << r;
  }
}

// transactional_step: a step that fails after the update (here a fault
// injected on the only rank) restores the row state with the parameters
// and momentum, bit for bit.
TEST(NorMuonTest, Step_FailedTransactionalStep_RestoresRowStateBitwise) {
  openblas_set_num_threads(1);
  Parameter p;
  p.name = "w";
  p.local_shape = {10, 7};
  p.data = RandomValues(70, 11);
  p.grad = RandomValues(70, 12);
  MuonOptions o = TestOptions();
  o.normuon = true;
  o.transactional_step = true;
  absl::StatusOr<std::unique_ptr<Muon>> muon = Muon::Create({&p}, o);
  ASSERT_TRUE(muon.ok()) << muon.status();
  ASSERT_TRUE((*muon)->Step().ok());
  const std::vector<float> v = (*muon)->row_state(0);
  const std::vector<float> w = p.data;
  ASSERT_FALSE(BitwiseEqual(v, std::vector<float>(10, 0.0f)));
  (*muon)->SetPostUpdateFaultForTesting([](int64_t step) {
    return absl::InternalError(absl::StrCat("injected fault at step ", step));
  });
  p.grad = RandomValues(70, 13);
  EXPECT_THAT((*muon)->Step(), StatusIs(absl::StatusCode::kInternal,
                                        HasSubstr("injected fault")));
  EXPECT_TRUE(BitwiseEqual((*muon)->row_state(0), v));
  EXPECT_TRUE(BitwiseEqual(p.data, w));
  EXPECT_EQ((*muon)->step_count(), 1);
}

}  // namespace
}  // namespace muon
