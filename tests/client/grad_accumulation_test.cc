// Gradient accumulation correctness: orthogonalization happens once, after
// the micro-batch gradients are accumulated, not per micro-batch. A
// bias-free MLP, FSDP over 4 ranks (threads, Gloo).
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "common/layout.h"
#include "examples/fashion_mnist/mlp.h"
#include "gtest/gtest.h"
#include "tests/client/rank_threads.h"
#include "tests/client/thread_world.h"

namespace muon {
namespace {

using ::muon::examples::InitLinear;
using ::muon::examples::Mlp;
using ::muon::testing::BitwiseEqual;
using ::muon::testing::RandomValues;
using ::muon::testing::RunOnRanks;
using ::muon::testing::ThreadWorld;

constexpr int kWorld = 4;
constexpr int kBatch = 32;
constexpr int kMicroBatches = 4;
const std::vector<int64_t> kSizes = {32, 24, 16, 10};

struct Data {
  std::vector<float> x;  // [kBatch, 32]
  std::vector<int32_t> y;
};

Data MakeData() {
  Data d;
  d.x = RandomValues(kBatch * kSizes[0], 42);
  for (int i = 0; i < kBatch; ++i) d.y.push_back((i * 7) % 10);
  return d;
}

MuonOptions Options() {
  MuonOptions o;
  o.lr = 0.02;
  return o;
}

// Full weights of every layer after one step; `micro` micro-batches are
// accumulated before each optimizer step when `accumulate`, else the
// optimizer steps after every micro-batch. rank < 0: single device.
struct TrainResult {
  std::vector<std::vector<float>> weights;
  int64_t steps = 0;
  int matrices = 0;  // orthogonalized in the last step, this rank
};

absl::StatusOr<TrainResult> Train(int rank, ThreadWorld* tw, int micro,
                                  bool accumulate) {
  Mlp mlp(kSizes);
  const Data data = MakeData();
  const int layers = mlp.num_layers();
  const Mesh mesh{{"dp_shard"}, {kWorld}};
  std::vector<std::vector<float>> full(layers), grads(layers);
  std::vector<Parameter> params(layers);
  std::vector<Box> boxes(layers);
  std::vector<Parameter*> ptrs;
  for (int l = 0; l < layers; ++l) {
    const int64_t r = mlp.rows(l), c = mlp.cols(l);
    full[l] = InitLinear(r, c, 9, l);
    grads[l].resize(r * c);
    const Box whole{Range{0, r}, Range{0, c}};
    if (rank < 0) {
      boxes[l] = whole;
    } else {
      absl::StatusOr<Box> b =
          LocalBox(r, c, {Placement::Shard(0)}, mesh, mesh.Coord(rank));
      if (!b.ok()) return b.status();
      boxes[l] = *b;
    }
    Parameter& p = params[l];
    p.name = absl::StrCat("fc", l);
    p.global_shape = {r, c};
    p.local_shape = {boxes[l].rows.size(), boxes[l].cols.size()};
    p.data.resize(boxes[l].numel());
    p.grad.assign(boxes[l].numel(), 0.0f);
    CopyRegion(full[l].data(), whole, p.data.data(), boxes[l], boxes[l]);
    ptrs.push_back(&p);
  }
  std::optional<DistributedConfig> config;
  if (rank >= 0) {
    AutoConfigOptions o;
    o.fsdp = tw->comm(rank);
    o.coordinator = tw->client(rank);
    absl::StatusOr<DistributedConfig> c = CreateAutoConfig(ptrs, o);
    if (!c.ok()) return c.status();
    config = *c;
  }
  absl::StatusOr<std::unique_ptr<Muon>> opt =
      Muon::Create(ptrs, Options(), config);
  if (!opt.ok()) return opt.status();
  auto unshard = [&]() -> absl::Status {
    // Every rank keeps the full weights in sync from the parameters it holds
    // (FSDP's all-gather).
    for (int l = 0; l < layers; ++l) {
      if (rank < 0) {
        full[l] = params[l].data;
        continue;
      }
      std::vector<int64_t> counts(kWorld);
      for (int q = 0; q < kWorld; ++q) {
        counts[q] = LocalBox(mlp.rows(l), mlp.cols(l), {Placement::Shard(0)},
                             mesh, mesh.Coord(q))
                        ->numel();
      }
      // Shard(0) chunks are contiguous rows: the all-gather is the matrix.
      absl::Status s = tw->comm(rank)->AllGatherV(
          params[l].data.data(), params[l].data.size(), full[l].data(), counts);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  };
  const int per = kBatch / micro;
  std::vector<const float*> w;
  std::vector<float*> g;
  for (int l = 0; l < layers; ++l) {
    w.push_back(full[l].data());
    g.push_back(grads[l].data());
  }
  TrainResult run;
  for (int k = 0; k < micro; ++k) {
    mlp.ForwardBackward(w, data.x.data() + k * per * kSizes[0],
                        data.y.data() + k * per, per, accumulate ? kBatch : per,
                        g);
    for (int l = 0; l < layers; ++l) {
      std::vector<float> shard(boxes[l].numel());
      const Box whole{Range{0, mlp.rows(l)}, Range{0, mlp.cols(l)}};
      CopyRegion(grads[l].data(), whole, shard.data(), boxes[l], boxes[l]);
      for (size_t i = 0; i < shard.size(); ++i) params[l].grad[i] += shard[i];
    }
    if (!accumulate || k == micro - 1) {
      absl::Status s = (*opt)->Step();
      if (!s.ok()) return s;
      (*opt)->ZeroGrad();
      absl::Status u = unshard();
      if (!u.ok()) return u;
      for (int l = 0; l < layers; ++l) w[l] = full[l].data();
    }
  }
  run.steps = (*opt)->step_count();
  run.matrices = (*opt)->last_step_stats().matrices_orthogonalized;
  run.weights = full;
  return run;
}

std::vector<TrainResult> TrainDistributed(int micro, bool accumulate) {
  ThreadWorld tw(kWorld);
  EXPECT_TRUE(tw.Connect());
  std::vector<TrainResult> runs(kWorld);
  std::vector<absl::Status> st =
      RunOnRanks(kWorld, [&](int rank) -> absl::Status {
        absl::StatusOr<TrainResult> r = Train(rank, &tw, micro, accumulate);
        if (!r.ok()) return r.status();
        runs[rank] = *r;
        return absl::OkStatus();
      });
  for (int r = 0; r < kWorld; ++r)
    EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
  return runs;
}

double MaxAbsDiff(const std::vector<std::vector<float>>& a,
                  const std::vector<std::vector<float>>& b) {
  double d = 0;
  for (size_t l = 0; l < a.size(); ++l) {
    for (size_t i = 0; i < a[l].size(); ++i) {
      d = std::max(d, std::fabs(double(a[l][i]) - b[l][i]));
    }
  }
  return d;
}

TEST(GradAccumulationTest,
     Step_FsdpAccumulatedMicroBatches_MatchesSingleLargeBatch) {
  openblas_set_num_threads(1);
  absl::StatusOr<TrainResult> large =
      Train(-1, nullptr, 1, /*accumulate=*/true);
  ASSERT_TRUE(large.ok()) << large.status();
  absl::StatusOr<TrainResult> single_accum =
      Train(-1, nullptr, kMicroBatches, true);
  ASSERT_TRUE(single_accum.ok()) << single_accum.status();
  std::vector<TrainResult> dist =
      TrainDistributed(kMicroBatches, /*accumulate=*/true);
  ASSERT_EQ(dist.size(), static_cast<size_t>(kWorld));
  int matrices = 0;
  for (int r = 0; r < kWorld; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    // One optimizer step for the 4 micro-batches.
    EXPECT_EQ(dist[r].steps, 1);
    matrices += dist[r].matrices;
    // Distributed accumulation is single-device accumulation, bit for bit.
    for (size_t l = 0; l < dist[r].weights.size(); ++l) {
      EXPECT_TRUE(BitwiseEqual(dist[r].weights[l], single_accum->weights[l]))
          << "layer " << l;
    }
  }
  // Each matrix orthogonalized once in the world, after accumulation.
  EXPECT_EQ(matrices, 3);
  // And it matches the single large batch up to the gradient GEMMs' summation
  // order (tolerance 1e-5).
  EXPECT_LE(MaxAbsDiff(dist[0].weights, large->weights), 1e-5);
}

TEST(GradAccumulationTest, Step_PerMicroBatchSteps_DifferFromAccumulated) {
  openblas_set_num_threads(1);
  std::vector<TrainResult> per_micro =
      TrainDistributed(kMicroBatches, /*accumulate=*/false);
  absl::StatusOr<TrainResult> accumulated =
      Train(-1, nullptr, kMicroBatches, true);
  ASSERT_TRUE(accumulated.ok());
  EXPECT_EQ(per_micro[0].steps, kMicroBatches);
  // Orthogonalizing every micro-batch is a different optimizer: the check
  // above would catch it.
  EXPECT_GT(MaxAbsDiff(per_micro[0].weights, accumulated->weights), 1e-3);
}

}  // namespace
}  // namespace muon
