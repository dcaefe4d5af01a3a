// QK-clip (MuonClip; client/qk_clip.h, Muon::ClipQk): the group scales
// against the Kimi K2 report's rule with Megatron-LM's grouped-query
// grouping, the row scaling against a float64 reference, the behaviour it
// exists for (after the clip, a clipped group's largest logit recomputed
// from the weights is the threshold), bitwise the single device on FSDP
// (heads split across ranks), TP (whole heads), Shard(1), HSDP and a fused
// QKV projection, the MAX over ranks that saw different data, and bad
// input refused on every rank with nothing scaled.
#include "client/qk_clip.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "client/parameter.h"
#include "client/qk_clipper.h"
#include "common/layout.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/bfloat16.h"
#include "kernels/step_kernels.h"
#include "tests/client/distributed_world.h"
#include "tests/client/single_device_reference.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::muon::testing::BitwiseEqual;
using ::muon::testing::ExtractRegion;
using ::muon::testing::MakeProblem;
using ::muon::testing::MeshConfig;
using ::muon::testing::OneDimLayout;
using ::muon::testing::Problem;
using ::muon::testing::ProblemLayout;
using ::muon::testing::RandomValues;
using ::muon::testing::RunOnRanks;
using ::muon::testing::UniformLayout;
using ::muon::testing::World;
using ::testing::HasSubstr;

constexpr int64_t kHeadDim = 4;
constexpr int64_t kHidden = 6;

// Grouped-query attention (4 query heads, 2 key heads) over separate wq
// [16, 6] and wk [8, 6], and multi-head attention (2 heads) in a fused wqkv
// [24, 6] laid out q | k | v by rows.
QkClipOptions Layers(double threshold) {
  QkClipOptions o;
  o.threshold = threshold;
  QkClipLayer gqa;
  gqa.q_param = "wq";
  gqa.k_param = "wk";
  gqa.num_heads = 4;
  gqa.num_kv_heads = 2;
  gqa.head_dim = kHeadDim;
  QkClipLayer fused;
  fused.q_param = "wqkv";
  fused.k_param = "wqkv";
  fused.k_row_begin = 2 * kHeadDim;
  fused.num_heads = 2;
  fused.num_kv_heads = 2;
  fused.head_dim = kHeadDim;
  o.layers = {gqa, fused};
  return o;
}

TEST(QkClipTest, GroupScales_GroupedQueryHeads_MinOfOneAndThresholdOverMax) {
  QkClipLayer l;
  l.num_heads = 4;
  l.num_kv_heads = 2;
  // Group 0 = heads 0, 1 (max 150 > 100); group 1 = heads 2, 3 (max 90).
  const std::vector<float> s = {50, 150, 80, 90};
  EXPECT_THAT(QkClipGroupScales(l, s.data(), 100.0),
              ::testing::ElementsAre(::testing::DoubleEq(100.0 / 150.0),
                                     ::testing::DoubleEq(1.0)));
  // Without grouping every head is its own group; -inf never clips.
  l.num_kv_heads = 4;
  const std::vector<float> t = {-INFINITY, 200, 100, 400};
  EXPECT_THAT(QkClipGroupScales(l, t.data(), 100.0),
              ::testing::ElementsAre(1.0, 0.5, 1.0, 0.25));
}

TEST(QkClipTest, GlobalRowsSpan_OnlyTheRowsTheShardHolds) {
  // A shard holding global rows [3, 7) of 2 columns.
  const Range held{3, 7};
  const ElementSpan tail = GlobalRowsSpan(held, 2, 5, 9);  // rows 5, 6
  EXPECT_EQ(tail.first, 4);
  EXPECT_EQ(tail.count, 4);
  const ElementSpan head = GlobalRowsSpan(held, 2, 0, 4);  // row 3
  EXPECT_EQ(head.first, 0);
  EXPECT_EQ(head.count, 2);
  EXPECT_EQ(GlobalRowsSpan(held, 2, 7, 9).count, 0);  // after the shard
  EXPECT_EQ(GlobalRowsSpan(held, 2, 0, 3).count, 0);  // before it
  EXPECT_EQ(GlobalRowsSpan(held, 0, 3, 7).count, 0);  // no columns
}

// bf16 shards through the host kernels: head 1 of 2 clips (gamma 0.25,
// so each side scales by 0.25^0.5 = 0.5, exact in bf16): rows 4-7 of both
// projections halve, element for element, rows 0-3 keep their bits (the
// rows' byte offset counts 2-byte elements).
TEST(QkClipTest, QkClipperBf16Rows_OnlyClippedHeadsRowsScaled) {
  constexpr int64_t kRows = 8, kCols = 3;
  std::vector<kernels::bf16_t> q(kRows * kCols), k(kRows * kCols);
  const std::vector<float> values = RandomValues(kRows * kCols, 7);
  for (int64_t i = 0; i < kRows * kCols; ++i) {
    q[i] = kernels::FloatToBf16(values[i]);
    k[i] = kernels::FloatToBf16(-values[i]);
  }
  const std::vector<kernels::bf16_t> q0 = q, k0 = k;
  std::vector<ParamView> views(2);
  for (int j = 0; j < 2; ++j) {
    views[j].name = j == 0 ? "wq" : "wk";
    views[j].data = j == 0 ? q.data() : k.data();
    views[j].dtype = DType::kBFloat16;
    views[j].grad_dtype = DType::kBFloat16;
    views[j].local_shape = {kRows, kCols};
  }
  const std::vector<ParamPlacement> placements(
      2, ParamPlacement{{Placement::Replicate()}, {}});
  const Mesh mesh = Mesh::OneDim(1);
  QkClipOptions options;
  options.threshold = 100;
  options.alpha = 0.5;
  QkClipLayer layer;
  layer.q_param = "wq";
  layer.k_param = "wk";
  layer.num_heads = layer.num_kv_heads = 2;
  layer.head_dim = 4;
  options.layers = {layer};
  absl::StatusOr<QkClipper> clipper = QkClipper::Create(
      options, QkClipRank{0, 1, &views, &placements, &mesh, nullptr}, false);
  ASSERT_THAT(clipper, IsOk());
  std::unique_ptr<kernels::StepKernels> host =
      kernels::MakeHostStepKernels(nullptr);
  QkClipStats stats;
  ASSERT_THAT(clipper->Clip({50, 400}, *host, nullptr, &stats), IsOk());
  EXPECT_EQ(stats.groups_clipped, 1);
  for (int64_t i = 0; i < kRows * kCols; ++i) {
    if (i < 4 * kCols) {
      ASSERT_EQ(q[i], q0[i]) << i;
      ASSERT_EQ(k[i], k0[i]) << i;
    } else {
      ASSERT_EQ(kernels::Bf16ToFloat(q[i]), kernels::Bf16ToFloat(q0[i]) / 2)
          << i;
      ASSERT_EQ(kernels::Bf16ToFloat(k[i]), kernels::Bf16ToFloat(k0[i]) / 2)
          << i;
    }
  }
}

// Largest logit of each query head over tokens x [n, kHidden]: max over
// token pairs of (x_i . Wq_h) . (x_j . Wk_g(h)) in double (the rows of
// head h and of its key head), layer `l` of Layers().
std::vector<double> MaxLogits(const QkClipLayer& l, const std::vector<float>& x,
                              int tokens, const std::vector<float>& wq,
                              const std::vector<float>& wk) {
  auto project = [&](const std::vector<float>& w, int64_t row0) {
    std::vector<double> out(tokens * kHeadDim, 0.0);
    for (int i = 0; i < tokens; ++i) {
      for (int64_t d = 0; d < kHeadDim; ++d) {
        for (int64_t c = 0; c < kHidden; ++c) {
          out[i * kHeadDim + d] +=
              double{x[i * kHidden + c]} * w[(row0 + d) * kHidden + c];
        }
      }
    }
    return out;
  };
  std::vector<double> s(l.num_heads, -INFINITY);
  const int per_group = l.num_heads / l.num_kv_heads;
  for (int h = 0; h < l.num_heads; ++h) {
    const std::vector<double> q = project(wq, l.q_row_begin + h * kHeadDim);
    const std::vector<double> k =
        project(wk, l.k_row_begin + (h / per_group) * kHeadDim);
    for (int i = 0; i < tokens; ++i) {
      for (int j = 0; j < tokens; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < kHeadDim; ++d) {
          dot += q[i * kHeadDim + d] * k[j * kHeadDim + d];
        }
        s[h] = std::max(s[h], dot);
      }
    }
  }
  return s;
}

// wq [16, H], wk [8, H] and wqkv [24, H], Layers()'s parameters, one
// step.
Problem LayersProblem() {
  return MakeProblem(
      {{"wq", {16, kHidden}}, {"wk", {8, kHidden}}, {"wqkv", {24, kHidden}}},
      1);
}

// `world` connected, and each rank's shards of `problem` in `layout` cut.
void ConnectWithShards(const Problem& problem, const ProblemLayout& layout,
                       World* world) {
  ASSERT_TRUE(world->Connect());
  for (int r = 0; r < world->size(); ++r) {
    ASSERT_TRUE(world->MakeShards(r, problem, layout).ok());
  }
}

// Every rank's shards' values ([rank][parameter]).
std::vector<std::vector<std::vector<float>>> ShardData(const World& world) {
  std::vector<std::vector<std::vector<float>>> data(world.size());
  for (int r = 0; r < world.size(); ++r) {
    for (const Parameter& p : world.run.shards[r].params) {
      data[r].push_back(p.data);
    }
  }
  return data;
}

// Every rank's shards hold the bits of `before` (ShardData): nothing
// scaled.
void ExpectUnscaled(
    const World& world,
    const std::vector<std::vector<std::vector<float>>>& before) {
  const std::vector<std::vector<std::vector<float>>> now = ShardData(world);
  for (int r = 0; r < world.size(); ++r) {
    for (size_t k = 0; k < before[r].size(); ++k) {
      EXPECT_TRUE(BitwiseEqual(now[r][k], before[r][k]))
          << "rank " << r << " parameter " << k;
    }
  }
}

// A whole (unsharded) parameter [rows, kHidden] holding `data`.
Parameter Whole(const std::string& name, int64_t rows,
                std::vector<float> data) {
  Parameter p;
  p.name = name;
  p.local_shape = {rows, kHidden};
  p.data = std::move(data);
  p.grad.assign(p.data.size(), 0.0f);
  return p;
}

std::vector<float> Scaled(const std::vector<float>& v, float by) {
  std::vector<float> out = v;
  for (float& x : out) x *= by;
  return out;
}

// One device: the maxima measured from the weights, then ClipQk. Every
// weight is within one rounding of the float64 reference w * gamma^alpha
// (or gamma^(1 - alpha)); recomputed from the clipped weights, a clipped
// group's largest logit is the threshold, and an unclipped group's weights
// keep their bits.
TEST(QkClipTest, ClipQk_SingleDevice_ClippedGroupsLandOnThreshold) {
  const int tokens = 5;
  const std::vector<float> x = RandomValues(tokens * kHidden, 1);
  Parameter wq = Whole("wq", 16, Scaled(RandomValues(16 * kHidden, 2), 4));
  Parameter wk = Whole("wk", 8, Scaled(RandomValues(8 * kHidden, 3), 4));
  Parameter wqkv = Whole("wqkv", 24, Scaled(RandomValues(24 * kHidden, 4), 4));
  const QkClipOptions probe = Layers(1.0);
  std::vector<float> maxima;
  std::vector<double> before;
  for (const auto& [layer, q, k] :
       {std::tuple<QkClipLayer, Parameter*, Parameter*>{probe.layers[0], &wq,
                                                        &wk},
        {probe.layers[1], &wqkv, &wqkv}}) {
    for (double s : MaxLogits(layer, x, tokens, q->data, k->data)) {
      maxima.push_back(static_cast<float>(s));
      before.push_back(s);
    }
  }
  // A threshold between the heads' maxima: some groups clip, some do not.
  std::vector<double> sorted = before;
  std::sort(sorted.begin(), sorted.end());
  const double tau = 0.5 * (sorted[2] + sorted[3]);
  MuonOptions o;
  o.qk_clip = Layers(tau);
  o.qk_clip.alpha = 0.3;
  const std::vector<std::vector<float>> orig = {wq.data, wk.data, wqkv.data};
  absl::StatusOr<std::unique_ptr<Muon>> muon =
      Muon::Create({&wq, &wk, &wqkv}, o);
  ASSERT_TRUE(muon.ok()) << muon.status();
  QkClipStats stats;
  ASSERT_TRUE((*muon)->ClipQk(maxima, &stats).ok());
  EXPECT_GT(stats.groups_clipped, 0);
  EXPECT_LT(stats.groups_clipped, 4);
  EXPECT_EQ(stats.max_logit, *std::max_element(maxima.begin(), maxima.end()));
  // Recomputed from the clipped weights.
  int64_t offset = 0;
  int64_t unclipped = 0;
  for (const auto& [layer, q, k] :
       {std::tuple<QkClipLayer, Parameter*, Parameter*>{o.qk_clip.layers[0],
                                                        &wq, &wk},
        {o.qk_clip.layers[1], &wqkv, &wqkv}}) {
    const std::vector<double> after =
        MaxLogits(layer, x, tokens, q->data, k->data);
    const int per_group = layer.num_heads / layer.num_kv_heads;
    for (int g = 0; g < layer.num_kv_heads; ++g) {
      double group_before = -INFINITY, group_after = -INFINITY;
      for (int h = g * per_group; h < (g + 1) * per_group; ++h) {
        group_before = std::max(group_before, before[offset + h]);
        group_after = std::max(group_after, after[h]);
      }
      if (group_before > tau) {
        EXPECT_NEAR(group_after, tau, 1e-5 * tau) << "layer group " << g;
      } else {
        EXPECT_EQ(group_after, group_before) << "layer group " << g;
        ++unclipped;
      }
    }
    offset += layer.num_heads;
  }
  EXPECT_GT(unclipped, 0);
  // Element by element against float64: the factor gamma^alpha in double,
  // one float multiply (two roundings: the factor and the product).
  const std::vector<double> gamma0 =
      QkClipGroupScales(o.qk_clip.layers[0], maxima.data(), tau);
  for (int64_t r = 0; r < 16; ++r) {
    const double f = std::pow(gamma0[r / (2 * kHeadDim)], 0.3);
    for (int64_t c = 0; c < kHidden; ++c) {
      const double want = double{orig[0][r * kHidden + c]} * f;
      EXPECT_NEAR(wq.data[r * kHidden + c], want,
                  std::ldexp(std::abs(want), -23))
          << "wq row " << r;
    }
  }
}

// MLA (the Kimi K2 report's rule): 3 heads whose query rows are 4
// head-specific (q^C) then 2 rotary (q^R), key rows 4 per head (k^C), and a
// rotary key k^R [2, kHidden] shared by all heads and not listed. Logit of
// head h between tokens i, j: q^C_i . k^C_j + q^R_i . k^R_j. After the
// clip: q^C scaled by gamma^alpha, q^R by gamma, k^C by gamma^(1-alpha),
// k^R untouched (bitwise), and a clipped head's largest logit is tau.
TEST(QkClipTest, ClipQk_MlaRule_RotaryQueryTakesGammaSharedKeyUntouched) {
  constexpr int kHeads = 3, kNope = 4, kRope = 2, kTokens = 5;
  const std::vector<float> x = RandomValues(kTokens * kHidden, 21);
  Parameter wq = Whole("wq", kHeads * (kNope + kRope),
                       Scaled(RandomValues(kHeads * 6 * kHidden, 22), 4));
  Parameter wkc = Whole("wkc", kHeads * kNope,
                        Scaled(RandomValues(kHeads * kNope * kHidden, 23), 4));
  Parameter wkr =
      Whole("wkr", kRope, Scaled(RandomValues(kRope * kHidden, 24), 4));
  auto row_dot = [&](const std::vector<float>& w, int64_t row, int token) {
    double d = 0;
    for (int64_t c = 0; c < kHidden; ++c) {
      d += double{w[row * kHidden + c]} * x[token * kHidden + c];
    }
    return d;
  };
  auto max_logits = [&]() {
    std::vector<double> s(kHeads, -INFINITY);
    for (int h = 0; h < kHeads; ++h) {
      for (int i = 0; i < kTokens; ++i) {
        for (int j = 0; j < kTokens; ++j) {
          double l = 0;
          for (int d = 0; d < kNope; ++d) {
            l += row_dot(wq.data, h * 6 + d, i) *
                 row_dot(wkc.data, h * kNope + d, j);
          }
          for (int d = 0; d < kRope; ++d) {
            l += row_dot(wq.data, h * 6 + kNope + d, i) *
                 row_dot(wkr.data, d, j);
          }
          s[h] = std::max(s[h], l);
        }
      }
    }
    return s;
  };
  const std::vector<double> before = max_logits();
  std::vector<double> sorted = before;
  std::sort(sorted.begin(), sorted.end());
  const double tau = 0.5 * (sorted[0] + sorted[1]);  // two heads clip
  MuonOptions o;
  o.qk_clip.threshold = tau;
  o.qk_clip.alpha = 0.5;
  QkClipLayer mla;
  mla.q_param = "wq";
  mla.k_param = "wkc";
  mla.num_heads = mla.num_kv_heads = kHeads;
  mla.head_dim = kNope + kRope;
  mla.k_head_dim = kNope;
  mla.q_rope_dim = kRope;
  o.qk_clip.layers = {mla};
  const std::vector<float> q0 = wq.data, kc0 = wkc.data, kr0 = wkr.data;
  absl::StatusOr<std::unique_ptr<Muon>> muon =
      Muon::Create(std::vector<Parameter*>{&wq, &wkc, &wkr}, o);
  ASSERT_TRUE(muon.ok()) << muon.status();
  std::vector<float> maxima(before.begin(), before.end());
  QkClipStats stats;
  ASSERT_TRUE((*muon)->ClipQk(maxima, &stats).ok());
  EXPECT_EQ(stats.groups_clipped, 2);
  EXPECT_TRUE(BitwiseEqual(wkr.data, kr0));
  const std::vector<double> after = max_logits();
  for (int h = 0; h < kHeads; ++h) {
    // The factors come from the float maxima handed to ClipQk.
    const double s_h = maxima[h];
    const double gamma = s_h > tau ? tau / s_h : 1.0;
    if (before[h] > tau) {
      EXPECT_NEAR(after[h], tau, 1e-5 * tau) << "head " << h;
    } else {
      EXPECT_EQ(after[h], before[h]) << "head " << h;
    }
    for (int64_t c = 0; c < kHidden; ++c) {
      const int64_t nope = (h * 6) * kHidden + c;
      const int64_t rope = (h * 6 + kNope) * kHidden + c;
      const int64_t key = (h * kNope) * kHidden + c;
      EXPECT_EQ(wq.data[nope],
                q0[nope] * static_cast<float>(std::pow(gamma, 0.5)));
      EXPECT_EQ(wq.data[rope], q0[rope] * static_cast<float>(gamma));
      EXPECT_EQ(wkc.data[key],
                kc0[key] * static_cast<float>(std::pow(gamma, 0.5)));
    }
  }
}

// Four ranks, each with its own maxima (different data; -inf for heads it
// did not see): the world's MAX decides, and every layout gives the single
// device's bits for the same reduced maxima.
TEST(QkClipTest,
     ClipQk_FsdpTpShard1Hsdp_MaxOverRanksMatchesSingleDeviceBitwise) {
  const Problem problem = LayersProblem();
  const double tau = 100.0;
  // Rank r's maxima: head h sees 60 + 25 * ((h + r) % 4), or nothing.
  auto maxima_of = [](int rank) {
    std::vector<float> m;
    for (int h = 0; h < 6; ++h) {
      m.push_back(h == rank ? -INFINITY
                            : static_cast<float>(60 + 25 * ((h + rank) % 4)));
    }
    return m;
  };
  std::vector<float> reduced(6, -INFINITY);
  for (int r = 0; r < 4; ++r) {
    const std::vector<float> m = maxima_of(r);
    for (int h = 0; h < 6; ++h) reduced[h] = std::max(reduced[h], m[h]);
  }
  MuonOptions o;
  o.qk_clip = Layers(tau);
  // The single device with the reduced maxima.
  std::vector<Parameter> whole;
  for (size_t i = 0; i < problem.specs.size(); ++i) {
    whole.push_back(Whole(problem.specs[i].name, problem.specs[i].shape[0],
                          problem.init[i]));
  }
  std::vector<Parameter*> ptrs;
  for (Parameter& p : whole) ptrs.push_back(&p);
  absl::StatusOr<std::unique_ptr<Muon>> single = Muon::Create(ptrs, o);
  ASSERT_TRUE(single.ok()) << single.status();
  QkClipStats single_stats;
  ASSERT_TRUE((*single)->ClipQk(reduced, &single_stats).ok());
  ASSERT_GT(single_stats.groups_clipped, 0);

  const size_t n = problem.specs.size();
  ProblemLayout hsdp;
  hsdp.mesh.names = {"dp_replicate", "dp_shard"};
  hsdp.mesh.sizes = {2, 2};
  hsdp.placements.assign(n, {Placement::Replicate(), Placement::Shard(0)});
  for (const auto& [name, layout] :
       std::vector<std::pair<std::string, ProblemLayout>>{
           {"fsdp shard(0)", OneDimLayout(4, Placement::Shard(0), n)},
           {"tp shard(0)",
            UniformLayout(Mesh::OneDim(4, "tp"), {Placement::Shard(0)}, n)},
           {"shard(1)", OneDimLayout(4, Placement::Shard(1), n)},
           {"hsdp", hsdp}}) {
    SCOPED_TRACE(name);
    World world(4);
    ASSERT_TRUE(world.Connect());
    for (int r = 0; r < 4; ++r) {
      ASSERT_TRUE(world.MakeShards(r, problem, layout).ok());
    }
    std::vector<QkClipStats> stats(4);
    const std::vector<absl::Status> st = RunOnRanks(4, [&](int rank) {
      MUON_RETURN_IF_ERROR(world.CreateMuon(rank, MeshConfig(layout), o));
      return world.run.muons[rank]->ClipQk(maxima_of(rank), &stats[rank]);
    });
    for (int r = 0; r < 4; ++r) {
      ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
      EXPECT_EQ(stats[r].groups_clipped, single_stats.groups_clipped);
      const auto& shards = world.run.shards[r];
      for (size_t k = 0; k < shards.held.size(); ++k) {
        const int i = shards.held[k];
        EXPECT_TRUE(
            BitwiseEqual(shards.params[k].data,
                         ExtractRegion(whole[i].data, problem.specs[i].shape,
                                       shards.ranges[k])))
            << "rank " << r << " " << problem.specs[i].name;
      }
    }
  }
}

// Rank 2 passes one value too few: every rank fails with InvalidArgument
// naming rank 2 (rank 2 its own count), and no rank scaled anything.
TEST(QkClipTest, ClipQk_OneRankWrongCount_EveryRankNamesItNothingScaled) {
  const Problem problem = LayersProblem();
  const ProblemLayout layout = OneDimLayout(4, Placement::Shard(0), 3);
  MuonOptions o;
  o.qk_clip = Layers(1e-3);  // everything would clip
  World world(4);
  ConnectWithShards(problem, layout, &world);
  if (HasFatalFailure()) return;
  const std::vector<std::vector<std::vector<float>>> before = ShardData(world);
  const std::vector<absl::Status> st = RunOnRanks(4, [&](int rank) {
    MUON_RETURN_IF_ERROR(world.CreateMuon(rank, MeshConfig(layout), o));
    return world.run.muons[rank]->ClipQk(
        std::vector<float>(rank == 2 ? 5 : 6, 50.0f));
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_THAT(st[r], StatusIs(absl::StatusCode::kInvalidArgument,
                                HasSubstr(r == 2 ? "rank 2: ClipQk got 5 maxima"
                                                 : "rank 2 passed bad")))
        << "rank " << r;
  }
  ExpectUnscaled(world, before);
}

// Rank 2 refused for its own reason (a stream with CPU parameters) still
// joins the clip's collective: every rank fails (rank 2 naming its reason,
// the others its missing maxima), none waits for it, nothing is scaled.
TEST(QkClipTest, ClipQkOnStream_OneRankRefused_EveryRankFailsNothingScaled) {
  const Problem problem = LayersProblem();
  const ProblemLayout layout = OneDimLayout(4, Placement::Shard(0), 3);
  World world(4);
  ConnectWithShards(problem, layout, &world);
  if (HasFatalFailure()) return;
  const std::vector<std::vector<std::vector<float>>> before = ShardData(world);
  int not_a_stream = 0;
  const std::vector<absl::Status> st = RunOnRanks(4, [&](int rank) {
    MuonOptions o;
    o.qk_clip = Layers(1.0);
    MUON_RETURN_IF_ERROR(world.CreateMuon(rank, MeshConfig(layout), o));
    return world.run.muons[rank]->ClipQkOnStream(
        std::vector<float>(6, 1e6f), rank == 2 ? &not_a_stream : nullptr);
  });
  EXPECT_THAT(st[2], StatusIs(absl::StatusCode::kInvalidArgument,
                              HasSubstr("rank 2: a stream was given for "
                                        "QK-clip")));
  for (int r : {0, 1, 3}) {
    EXPECT_THAT(st[r], StatusIs(absl::StatusCode::kInvalidArgument,
                                HasSubstr("rank 2")))
        << "rank " << r;
  }
  ExpectUnscaled(world, before);
}

// During a step begun by MarkReady (overlap_backward) the executor writes
// the parameters: QK-clip is refused until Step, which then runs as usual.
TEST(QkClipTest, ClipQk_DuringOverlappedStep_FailedPreconditionUntilStep) {
  Parameter wq = Whole("wq", 16, std::vector<float>(16 * kHidden, 1.0f));
  Parameter wk = Whole("wk", 8, std::vector<float>(8 * kHidden, 1.0f));
  wq.grad.assign(wq.data.size(), 0.25f);
  wk.grad.assign(wk.data.size(), 0.5f);
  MuonOptions o;
  o.qk_clip = Layers(1.0);
  o.qk_clip.layers.resize(1);
  o.check_finite = false;
  DistributedConfig config;
  config.state.mesh = Mesh::OneDim(1);
  config.state.param_placements.assign(
      2, ParamPlacement{{Placement::Replicate()}});
  config.execution.set_overlap_backward(true);
  absl::StatusOr<std::unique_ptr<Muon>> muon =
      Muon::Create(std::vector<Parameter*>{&wq, &wk}, o, config);
  ASSERT_TRUE(muon.ok()) << muon.status();
  const std::vector<float> maxima(4, 1e6f);
  ASSERT_TRUE((*muon)->MarkReady(1).ok());
  EXPECT_THAT((*muon)->ClipQk(maxima),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("during a step begun by MarkReady")));
  ASSERT_TRUE((*muon)->Step().ok());
  QkClipStats stats;
  ASSERT_TRUE((*muon)->ClipQk(maxima, &stats).ok());
  EXPECT_EQ(stats.groups_clipped, 2);
}

// Rank 3 configured without the fused layer: ClipQk's first all-gather
// finds it, and every rank fails naming rank 3 (no collective mismatch).
TEST(QkClipTest, ClipQk_RankWithOtherLayers_EveryRankNamesIt) {
  const Problem problem = LayersProblem();
  const ProblemLayout layout = OneDimLayout(4, Placement::Shard(0), 3);
  World world(4);
  ConnectWithShards(problem, layout, &world);
  if (HasFatalFailure()) return;
  const std::vector<absl::Status> st = RunOnRanks(4, [&](int rank) {
    MuonOptions o;
    o.qk_clip = Layers(100.0);
    if (rank == 3) o.qk_clip.layers.resize(1);
    MUON_RETURN_IF_ERROR(world.CreateMuon(rank, MeshConfig(layout), o));
    return world.run.muons[rank]->ClipQk(
        std::vector<float>(rank == 3 ? 4 : 6, 50.0f));
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_THAT(st[r], StatusIs(absl::StatusCode::kInvalidArgument,
                                HasSubstr("rank 3 has 1 qk_clip layers")))
        << "rank " << r;
  }
}

TEST(QkClipTest, Create_BadLayers_InvalidArgumentNamingTheField) {
  Parameter wq = Whole("wq", 16, std::vector<float>(16 * kHidden, 1.0f));
  Parameter wk = Whole("wk", 8, std::vector<float>(8 * kHidden, 1.0f));
  struct Case {
    std::function<void(QkClipOptions&)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](QkClipOptions& o) { o.threshold = 0; },
       "qk_clip threshold should be a finite value > 0 but is: 0"},
      {[](QkClipOptions& o) { o.alpha = 1.5; },
       "qk_clip alpha should be in [0, 1] but is: 1.5"},
      {[](QkClipOptions& o) { o.layers[0].num_kv_heads = 3; },
       "qk_clip layer 0 (\"wq\", \"wk\") has num_heads 4 and num_kv_heads 3"},
      {[](QkClipOptions& o) { o.layers[0].k_param = "wv"; },
       "names parameter \"wv\", which this optimizer does not have"},
      {[](QkClipOptions& o) { o.layers[0].head_dim = 5; },
       "q parameter \"wq\" has 16 rows but 4 heads of 5 rows from row 0 "
       "need 20"},
      // Rows past int64 (as a C caller's head_dim can give) refused, not
      // wrapped round to a negative end.
      {[](QkClipOptions& o) { o.layers[0].head_dim = int64_t{1} << 62; },
       "4 heads of 4611686018427387904 rows from row 0 need more than "
       "2^63 - 1"},
      {[](QkClipOptions& o) { o.layers[0].q_row_begin = INT64_MAX; },
       "from row 9223372036854775807 need more than 2^63 - 1"},
  };
  for (const Case& c : cases) {
    MuonOptions o;
    o.qk_clip = Layers(100.0);
    o.qk_clip.layers.resize(1);
    c.edit(o.qk_clip);
    EXPECT_THAT(
        Muon::Create(std::vector<Parameter*>{&wq, &wk}, o),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
  MuonOptions off;
  absl::StatusOr<std::unique_ptr<Muon>> muon =
      Muon::Create(std::vector<Parameter*>{&wq, &wk}, off);
  ASSERT_TRUE(muon.ok());
  EXPECT_THAT(
      (*muon)->ClipQk({}),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no layers")));
}

// CPU parameters take no stream: ClipQkOnStream with one is refused
// naming it, with nothing scaled; without one it clips.
TEST(QkClipTest, ClipQkOnStream_CpuParams_StreamRefusedNothingScaled) {
  Parameter wq = Whole("wq", 16, std::vector<float>(16 * kHidden, 1.0f));
  Parameter wk = Whole("wk", 8, std::vector<float>(8 * kHidden, 1.0f));
  MuonOptions o;
  o.qk_clip = Layers(1.0);
  o.qk_clip.layers.resize(1);
  absl::StatusOr<std::unique_ptr<Muon>> muon =
      Muon::Create(std::vector<Parameter*>{&wq, &wk}, o);
  ASSERT_TRUE(muon.ok()) << muon.status();
  const std::vector<float> wq_before = wq.data;
  const std::vector<float> maxima(4, 1e6f);
  int not_a_stream = 0;
  EXPECT_THAT((*muon)->ClipQkOnStream(maxima, &not_a_stream),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank 0: a stream was given for QK-clip but "
                                 "the parameters are on cpu")));
  EXPECT_EQ(wq.data, wq_before);
  QkClipStats stats;
  ASSERT_TRUE((*muon)->ClipQkOnStream(maxima, nullptr, &stats).ok());
  EXPECT_EQ(stats.groups_clipped, 2);
  EXPECT_NE(wq.data, wq_before);
}

}  // namespace
}  // namespace muon
