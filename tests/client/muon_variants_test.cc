// The Muon variants of docs/user_guide.md section 11 on several layouts,
// with the multi-rank harness of tests/client/distributed_world.h:
//   - adjust_lr_fn "spectral_norm" (microsoft/dion's lr * sqrt(rows /
//     cols)): bitwise the single-device run on FSDP (uneven and empty
//     shards), TP Shard(1) and HSDP;
//   - execution.exchange_dtype "bfloat16": within a stated bound of the
//     fp32 run on FSDP, TP, HSDP and DDP, replicas equal, half the bytes;
//   - NorMuon: parameters, momentum and row state bitwise the single-device
//     run on FSDP Shard(0) and Shard(1), TP Shard(1), HSDP, DDP, FSDP x TP,
//     EP x TP over expert stacks, and pipeline stages;
//   - row blocks (per-head, fused QKV): on one device bitwise the same
//     blocks given as separate parameters, and bitwise that on FSDP (heads
//     split across ranks), TP Shard(0) and Shard(1), HSDP, with NorMuon.
// The single-device runs themselves are checked against float64
// references (muon_test, tests/python/test_optimizer.py).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "common/layout.h"
#include "gtest/gtest.h"
#include "kernels/muon_update.h"
#include "tests/client/distributed_world.h"
#include "tests/client/single_device_reference.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::muon::testing::BitwiseEqual;
using ::muon::testing::ExpectEachMatrixOrthogonalizedOnce;
using ::muon::testing::ExpectMatchesSingleDevice;
using ::muon::testing::ExpectShardsMatchSingleDevice;
using ::muon::testing::ExtractRegion;
using ::muon::testing::InsertRegion;
using ::muon::testing::kSteps;
using ::muon::testing::MakeProblem;
using ::muon::testing::MatricesProblem;
using ::muon::testing::MeshConfig;
using ::muon::testing::Numel;
using ::muon::testing::OneDimLayout;
using ::muon::testing::Problem;
using ::muon::testing::ProblemLayout;
using ::muon::testing::RankShards;
using ::muon::testing::RunDistributedSteps;
using ::muon::testing::RunSingleDevice;
using ::muon::testing::SingleDeviceResult;
using ::muon::testing::SubMeshConfig;
using ::muon::testing::TestOptions;
using ::muon::testing::UniformLayout;
using ::muon::testing::World;

// adjust_lr_fn "spectral_norm" (dion's lr * sqrt(rows / cols), on the
// global shape whatever the shard) on FSDP Shard(0) with uneven and empty
// shards, TP Shard(1) and HSDP: the same bits as one device, whose own
// step the float64 references check (muon_test, test_optimizer.py).
TEST(MuonVariantsTest, Step_SpectralNormFsdpTpHsdp_MatchesSingleDeviceBitwise) {
  const Problem problem = MatricesProblem();
  MuonOptions o = TestOptions();
  o.adjust_lr_fn = kernels::AdjustLrFn::kSpectralNorm;
  ProblemLayout tp;
  tp.mesh = Mesh::OneDim(4, "tp");
  tp.placements.assign(problem.specs.size(), {Placement::Shard(1)});
  ProblemLayout hsdp;
  hsdp.mesh.names = {"dp_replicate", "dp_shard"};
  hsdp.mesh.sizes = {2, 2};
  hsdp.placements.assign(problem.specs.size(),
                         {Placement::Replicate(), Placement::Shard(0)});
  const ProblemLayout fsdp =
      OneDimLayout(4, Placement::Shard(0), problem.specs.size());
  for (const auto& [name, layout] :
       std::vector<std::pair<std::string, ProblemLayout>>{
           {"fsdp", fsdp}, {"tp", tp}, {"hsdp", hsdp}}) {
    SCOPED_TRACE(name);
    World world(4);
    ExpectMatchesSingleDevice(world, problem, layout, MeshConfig(layout), o);
  }
}

// What a run with execution.exchange_dtype "bfloat16" did: the largest
// |element - the fp32 single-device run's| over every rank's shards after
// kSteps steps, whether every replica of a shard holds the same bits, and
// the bytes all ranks sent over the steps.
struct Bf16Run {
  double max_diff = 0;
  bool replicas_equal = true;
  int64_t bytes_sent = 0;
  // [param]: the parameters reassembled from the ranks' shards.
  std::vector<std::vector<float>> whole;
};

Bf16Run RunBf16Exchange(const Problem& problem, const ProblemLayout& layout,
                        const SingleDeviceResult& single, bool bf16) {
  World world(layout.mesh.world_size());
  EXPECT_TRUE(world.Connect());
  const std::vector<absl::Status> statuses = RunDistributedSteps(
      problem, layout,
      [&](int rank, RankShards& shards) {
        return world.MakeMuon(rank, shards, MeshConfig(layout), TestOptions(),
                              [bf16](DistributedConfig& c) {
                                if (bf16) {
                                  c.execution.set_exchange_dtype("bfloat16");
                                }
                              });
      },
      &world.run);
  Bf16Run out;
  for (const auto& spec : problem.specs) {
    out.whole.emplace_back(Numel(spec.shape), 0.0f);
  }
  // The first copy of each (parameter, region) seen, by region text.
  std::map<std::string, std::vector<float>> first;
  for (int r = 0; r < world.size(); ++r) {
    EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
    const RankShards& shards = world.run.shards[r];
    for (size_t k = 0; k < shards.held.size(); ++k) {
      const int i = shards.held[k];
      const std::vector<float>& local = shards.params[k].data;
      InsertRegion(local, problem.specs[i].shape, shards.ranges[k],
                   &out.whole[i]);
      const std::vector<float> want = ExtractRegion(
          single.params[i], problem.specs[i].shape, shards.ranges[k]);
      for (size_t e = 0; e < local.size(); ++e) {
        out.max_diff =
            std::max<double>(out.max_diff, std::fabs(local[e] - want[e]));
      }
      std::string key = absl::StrCat(i);
      for (const Range& range : shards.ranges[k]) {
        absl::StrAppend(&key, ":", range.begin, "-", range.end);
      }
      auto [it, fresh] = first.insert({key, local});
      if (!fresh && !BitwiseEqual(it->second, local)) {
        out.replicas_equal = false;
      }
    }
    for (const StepStats& s : world.run.stats[r])
      out.bytes_sent += s.bytes_sent;
  }
  return out;
}

// exchange_dtype "bfloat16" on FSDP Shard(0) (uneven and empty shards), TP
// Shard(1), HSDP and DDP. Against the fp32 single-device run (which the
// float64 references check: muon_test, test_optimizer.py): each step moves
// an element by adjusted_lr * O (|O| <= ~1, adjusted_lr <= 0.02 * 2), and
// bf16 rounding of O and of U's sent parts (2^-9 relative each) perturbs
// O by at most ~2^-7 through Newton-Schulz, so over kSteps steps the
// difference stays below kSteps * 0.04 * 2^-7 = 9.4e-4 (measured: 2.0e-4
// on every layout). Every replica
// holds the same bits (the owner rounds O before anyone applies it), and
// the ranks send at most half the fp32 bytes plus one word per peer part.
// Newton-Schulz sees U rounded to bf16 whoever owns a matrix and whatever
// the layout, so the four layouts give the same bits as each other.
TEST(MuonVariantsTest,
     Step_Bf16ExchangeFsdpTpHsdpDdp_SameBitsOnEveryLayoutNearFp32HalfTheBytes) {
  const Problem problem = MatricesProblem();
  const absl::StatusOr<SingleDeviceResult> single =
      RunSingleDevice(problem, TestOptions());
  ASSERT_THAT(single, IsOk());
  const size_t n = problem.specs.size();
  ProblemLayout tp =
      UniformLayout(Mesh::OneDim(4, "tp"), {Placement::Shard(1)}, n);
  ProblemLayout hsdp;
  hsdp.mesh.names = {"dp_replicate", "dp_shard"};
  hsdp.mesh.sizes = {2, 2};
  hsdp.placements.assign(n, {Placement::Replicate(), Placement::Shard(0)});
  const double bound = kSteps * 0.04 * std::ldexp(1.0, -7);
  std::vector<std::vector<float>> first_whole;
  for (const auto& [name, layout] :
       std::vector<std::pair<std::string, ProblemLayout>>{
           {"fsdp", OneDimLayout(4, Placement::Shard(0), n)},
           {"tp", tp},
           {"hsdp", hsdp},
           {"ddp", OneDimLayout(4, Placement::Replicate(), n)}}) {
    SCOPED_TRACE(name);
    const Bf16Run fp32 = RunBf16Exchange(problem, layout, *single, false);
    const Bf16Run bf16 = RunBf16Exchange(problem, layout, *single, true);
    EXPECT_EQ(fp32.max_diff, 0.0);  // the fp32 exchange keeps the bits
    EXPECT_GT(bf16.max_diff, 0.0);  // bf16 did round something
    EXPECT_LE(bf16.max_diff, bound);
    std::printf(
        "bf16 exchange, %s: max |diff| %.3g (bound %.3g), bytes "
        "%lld vs %lld fp32\n",
        name.c_str(), bf16.max_diff, bound,
        static_cast<long long>(bf16.bytes_sent),
        static_cast<long long>(fp32.bytes_sent));
    EXPECT_TRUE(bf16.replicas_equal);
    const int64_t parts = 2 * kSteps * 4 * 4 * static_cast<int64_t>(n);
    EXPECT_LE(2 * bf16.bytes_sent, fp32.bytes_sent + 8 * parts);
    EXPECT_LT(bf16.bytes_sent, fp32.bytes_sent);
    if (first_whole.empty()) {
      first_whole = bf16.whole;
    } else {
      for (size_t i = 0; i < n; ++i) {
        EXPECT_TRUE(BitwiseEqual(bf16.whole[i], first_whole[i]))
            << problem.specs[i].name << " differs from the fsdp run";
      }
    }
  }
}

// NorMuon's row state travels with the exchanges (to the owner with the
// gather, back with the redistribute): every layout ends with the single
// device's parameters, momentum and row state (ExpectMatchesSingleDevice
// compares each rank's variance_neuron with the single device's rows),
// uneven and empty shards included.
TEST(MuonVariantsTest, Step_NorMuonEveryLayout_MatchesSingleDeviceBitwise) {
  const Problem problem = MatricesProblem();
  const size_t n = problem.specs.size();
  MuonOptions o = TestOptions();
  o.normuon = true;
  ProblemLayout hsdp;
  hsdp.mesh.names = {"dp_replicate", "dp_shard"};
  hsdp.mesh.sizes = {2, 2};
  hsdp.placements.assign(n, {Placement::Replicate(), Placement::Shard(0)});
  ProblemLayout fsdp_tp;
  fsdp_tp.mesh.names = {"dp_shard", "tp"};
  fsdp_tp.mesh.sizes = {2, 2};
  fsdp_tp.placements.assign(n, {Placement::Shard(0), Placement::Shard(1)});
  for (const auto& [name, layout] :
       std::vector<std::pair<std::string, ProblemLayout>>{
           {"fsdp shard(0)", OneDimLayout(4, Placement::Shard(0), n)},
           {"fsdp shard(1)", OneDimLayout(4, Placement::Shard(1), n)},
           {"tp shard(1)",
            UniformLayout(Mesh::OneDim(4, "tp"), {Placement::Shard(1)}, n)},
           {"hsdp", hsdp},
           {"ddp", OneDimLayout(4, Placement::Replicate(), n)},
           {"fsdp x tp", fsdp_tp}}) {
    SCOPED_TRACE(name);
    World world(4);
    ExpectMatchesSingleDevice(world, problem, layout, MeshConfig(layout), o);
  }
  {
    // Async mode: the row state shares its bucket slot's lifetime with U
    // and O while later buckets are gathered ahead.
    SCOPED_TRACE("fsdp shard(0), async, prefetch 2, small buckets");
    const ProblemLayout fsdp = OneDimLayout(4, Placement::Shard(0), n);
    World world(4);
    ExpectMatchesSingleDevice(world, problem, fsdp, MeshConfig(fsdp), o,
                              [](DistributedConfig& c) {
                                c.execution.set_async_gpu_parallelism(true);
                                c.execution.set_prefetch_count(2);
                                c.execution.set_bucket_size_bytes(256);
                              });
  }
  // NorMuon did change the result (the row state is not a no-op).
  const absl::StatusOr<SingleDeviceResult> plain =
      RunSingleDevice(problem, TestOptions());
  const absl::StatusOr<SingleDeviceResult> normuon =
      RunSingleDevice(problem, o);
  ASSERT_THAT(plain, IsOk());
  ASSERT_THAT(normuon, IsOk());
  EXPECT_FALSE(BitwiseEqual(plain->params[3], normuon->params[3]));
}

// Pipeline stages (pp x dp_shard, two parameters per stage, FSDP inside a
// stage): each rank holds only its stage's parameters and their row state.
TEST(MuonVariantsTest, Step_NorMuonPipelineStages_MatchesSingleDeviceBitwise) {
  const Problem problem = MatricesProblem();
  const size_t n = problem.specs.size();
  MuonOptions o = TestOptions();
  o.normuon = true;
  ProblemLayout pp =
      UniformLayout(Mesh{{"pp", "dp_shard"}, {2, 2}},
                    {Placement::Replicate(), Placement::Shard(0)}, n);
  std::vector<std::string> names;
  for (size_t i = 0; i < n; ++i) {
    pp.sub_meshes.push_back(SubMesh{{0}, {static_cast<int>(i) / 2}});
    names.push_back(problem.specs[i].name);
  }
  const absl::StatusOr<SingleDeviceResult> single = RunSingleDevice(problem, o);
  ASSERT_THAT(single, IsOk());
  World world(4);
  ASSERT_TRUE(world.Connect());
  const std::vector<absl::Status> statuses = RunDistributedSteps(
      problem, pp,
      [&](int rank, RankShards& shards) {
        return world.MakeMuon(rank, shards, SubMeshConfig(pp, names), o);
      },
      &world.run);
  for (int r = 0; r < world.size(); ++r) {
    ASSERT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
    EXPECT_EQ(world.run.shards[r].held.size(), 2u) << "rank " << r;
  }
  ExpectShardsMatchSingleDevice(problem, *single, world.run);
  ExpectEachMatrixOrthogonalizedOnce(problem, *single, world.run);
}

// Expert stacks under EP x TP: each expert slice is its own matrix with its
// own rows' state (slices one after another in the parameter's row state);
// the stack's rows split over tp (Shard(1)) and its experts over ep.
TEST(MuonVariantsTest,
     Step_NorMuonExpertStacksEpTp_MatchesSingleDeviceBitwise) {
  Problem problem = MakeProblem(
      {{"attn.weight", {12, 12}}, {"experts.w1", {4, 12, 10}, true}}, kSteps);
  ProblemLayout layout;
  layout.mesh = Mesh{{"ep", "tp"}, {2, 2}};
  layout.placements = {{Placement::Replicate(), Placement::Shard(0)},
                       {Placement::Shard(0), Placement::Shard(1)}};
  MuonOptions o = TestOptions();
  o.normuon = true;
  World world(4);
  ExpectMatchesSingleDevice(world, problem, layout, MeshConfig(layout), o);
}

// A fused QKV [16, 6] (q 8 rows | k 4 | v 4: grouped-query) and per-head
// [12, 5] (3 heads of 4 rows), and the same blocks as separate parameters.
Problem RowBlockProblem(bool as_blocks) {
  if (as_blocks) {
    Problem p = MakeProblem({{"wqkv", {16, 6}, false, {8, 4, 4}},
                             {"wo", {12, 5}, false, {4, 4, 4}}},
                            ::muon::testing::kSteps);
    return p;
  }
  // The same values cut into the blocks (MakeProblem's RandomValues per
  // tensor are cut here by rows, so the values agree).
  const Problem whole = RowBlockProblem(true);
  Problem p;
  const std::vector<std::vector<int64_t>> splits = {{8, 4, 4}, {4, 4, 4}};
  for (size_t i = 0; i < whole.specs.size(); ++i) {
    const int64_t cols = whole.specs[i].shape[1];
    int64_t row = 0;
    for (size_t b = 0; b < splits[i].size(); ++b) {
      p.specs.push_back(
          {absl::StrCat(whole.specs[i].name, ".", b), {splits[i][b], cols}});
      auto cut = [&](const std::vector<float>& v) {
        return std::vector<float>(v.begin() + row * cols,
                                  v.begin() + (row + splits[i][b]) * cols);
      };
      p.init.push_back(cut(whole.init[i]));
      if (p.grads.size() < whole.grads.size()) {
        p.grads.resize(whole.grads.size());
      }
      for (size_t s = 0; s < whole.grads.size(); ++s) {
        p.grads[s].push_back(cut(whole.grads[s][i]));
      }
      row += splits[i][b];
    }
  }
  return p;
}

// The blocks of one device's run concatenated back per parameter.
std::vector<float> Concat(const SingleDeviceResult& r, size_t first,
                          size_t count) {
  std::vector<float> out;
  for (size_t k = first; k < first + count; ++k) {
    out.insert(out.end(), r.params[k].begin(), r.params[k].end());
  }
  return out;
}

// On one device, a parameter with row blocks steps exactly as its blocks
// given as separate parameters (each its own Newton-Schulz, AdjustLR on the
// block's shape, NorMuon's rescale per block): the independent check of
// what row blocks mean. Without blocks the result differs.
TEST(MuonVariantsTest, Step_RowBlocksOneDevice_EqualsBlocksAsSeparateParams) {
  for (const bool normuon : {false, true}) {
    SCOPED_TRACE(normuon ? "normuon" : "muon");
    MuonOptions o = TestOptions();
    o.normuon = normuon;
    o.adjust_lr_fn = kernels::AdjustLrFn::kSpectralNorm;
    const absl::StatusOr<SingleDeviceResult> blocks =
        RunSingleDevice(RowBlockProblem(true), o);
    const absl::StatusOr<SingleDeviceResult> separate =
        RunSingleDevice(RowBlockProblem(false), o);
    ASSERT_THAT(blocks, IsOk());
    ASSERT_THAT(separate, IsOk());
    EXPECT_TRUE(BitwiseEqual(blocks->params[0], Concat(*separate, 0, 3)));
    EXPECT_TRUE(BitwiseEqual(blocks->params[1], Concat(*separate, 3, 3)));
    EXPECT_EQ(blocks->stats[0].matrices_orthogonalized, 6);
    Problem unsplit = RowBlockProblem(true);
    for (auto& spec : unsplit.specs) spec.row_splits.clear();
    const absl::StatusOr<SingleDeviceResult> whole =
        RunSingleDevice(unsplit, o);
    ASSERT_THAT(whole, IsOk());
    EXPECT_FALSE(BitwiseEqual(blocks->params[0], whole->params[0]));
  }
}

// Row blocks on FSDP Shard(0) over 4 ranks (rows 4,4,4,4 of wqkv: the
// q block spans ranks 0-1, k and v live on one rank each; wo's heads of 4
// rows over chunks of 3: heads split across ranks), TP Shard(0), Shard(1),
// HSDP: the single device's bits, NorMuon's row state included; every
// block is orthogonalized once in the world.
TEST(MuonVariantsTest, Step_RowBlocksEveryLayout_MatchesSingleDeviceBitwise) {
  const Problem problem = RowBlockProblem(true);
  const size_t n = problem.specs.size();
  ProblemLayout hsdp;
  hsdp.mesh.names = {"dp_replicate", "dp_shard"};
  hsdp.mesh.sizes = {2, 2};
  hsdp.placements.assign(n, {Placement::Replicate(), Placement::Shard(0)});
  for (const bool normuon : {false, true}) {
    MuonOptions o = TestOptions();
    o.normuon = normuon;
    for (const auto& [name, layout] :
         std::vector<std::pair<std::string, ProblemLayout>>{
             {"fsdp shard(0)", OneDimLayout(4, Placement::Shard(0), n)},
             {"tp shard(0)",
              UniformLayout(Mesh::OneDim(4, "tp"), {Placement::Shard(0)}, n)},
             {"shard(1)", OneDimLayout(4, Placement::Shard(1), n)},
             {"hsdp", hsdp}}) {
      SCOPED_TRACE(absl::StrCat(name, normuon ? ", normuon" : ""));
      World world(4);
      ExpectMatchesSingleDevice(world, problem, layout, MeshConfig(layout), o);
    }
  }
}

}  // namespace
}  // namespace muon
