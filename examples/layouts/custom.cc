// Custom distributed setup: a framework that is not PyTorch's fills
// DistributedConfig itself: assign_fn (here an assignment by parameter
// size), gather_fn and redistribute_fn written against its own collectives
// (here the job's muon::Communicator), and the state.
//
//   config = DistributedConfig(assign_fn=size_aware_assign_fn,
//       gather_fn=custom_gather_fn, redistribute_fn=custom_redistribute_fn,
//       state={"rank": ..., "world_size": ..., "framework": ...,
//              "shard_dim": 0})
//
// The parameters are sharded along dim 0 over every rank (torch.chunk).
// gather_fn: all-gather every rank's rows, the owner keeps the concatenation;
// redistribute_fn: the owner broadcasts the orthogonalized matrix and each rank
// keeps its rows (a scatter). Both are called on every rank for every matrix in
// the plan's order, so the collectives inside them line up across ranks.
//
//   bazel run //examples/layouts:custom
#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <vector>

#include "absl/status/status.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "comm/communicator.h"
#include "common/layout.h"
#include "common/status_macros.h"
#include "examples/layouts/example_main.h"

namespace muon::examples {
namespace {

// size_aware_assign_fn: largest matrix first, each to the least loaded rank.
std::map<int, std::vector<int>> SizeAwareAssign(
    const std::vector<MatrixInfo>& matrices, int world_size) {
  std::vector<int> order(matrices.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return matrices[a].rows * matrices[a].cols >
           matrices[b].rows * matrices[b].cols;
  });
  std::vector<int64_t> load(world_size, 0);
  std::map<int, std::vector<int>> assignments;
  for (int i : order) {
    const int rank = static_cast<int>(
        std::min_element(load.begin(), load.end()) - load.begin());
    assignments[rank].push_back(matrices[i].index);
    load[rank] += matrices[i].rows * matrices[i].cols;
  }
  return assignments;
}

// The custom framework: its collectives, and how it shards (rows, dim 0).
struct RowShardedFramework {
  Communicator* comm;
  std::vector<ParamView> params;
  std::vector<float> scratch;

  // Elements each rank holds of parameter i (torch.chunk of the rows).
  std::vector<int64_t> ShardSizes(int i) const {
    const int64_t rows = params[i].shape()[0], cols = params[i].shape()[1];
    std::vector<int64_t> sizes;
    for (int r = 0; r < comm->world_size(); ++r) {
      sizes.push_back(ChunkRange(rows, comm->world_size(), r).size() * cols);
    }
    return sizes;
  }

  // custom_gather_fn: all_gather, then cat along dim 0 (row-major: just the
  // ranks' shards one after another).
  absl::Status Gather(int i, int owner, const float* shard, float* full) {
    const std::vector<int64_t> sizes = ShardSizes(i);
    scratch.resize(std::accumulate(sizes.begin(), sizes.end(), int64_t{0}));
    MUON_RETURN_IF_ERROR(
        comm->AllGatherV(shard, sizes[comm->rank()], scratch.data(), sizes));
    if (full != nullptr) std::copy(scratch.begin(), scratch.end(), full);
    return absl::OkStatus();
  }

  // custom_redistribute_fn: the owner's matrix to everyone, each keeps its
  // own rows.
  absl::Status Redistribute(int i, int owner, const float* full, float* shard) {
    const std::vector<int64_t> sizes = ShardSizes(i);
    scratch.resize(std::accumulate(sizes.begin(), sizes.end(), int64_t{0}));
    if (full != nullptr) std::copy_n(full, scratch.size(), scratch.data());
    MUON_RETURN_IF_ERROR(
        comm->Broadcast(scratch.data(), scratch.size(), owner));
    const int64_t offset = std::accumulate(
        sizes.begin(), sizes.begin() + comm->rank(), int64_t{0});
    std::copy_n(scratch.data() + offset, sizes[comm->rank()], shard);
    return absl::OkStatus();
  }
};

}  // namespace

absl::Status RunCustom(RankContext& ctx) {
  // The framework sharded every matrix's rows over the ranks.
  const std::vector<ParamDef> mlp = Mlp();
  const Mesh mesh = Mesh::OneDim(ctx.world_size, "dp_shard");
  MUON_ASSIGN_OR_RETURN(
      LocalModel model,
      ShardModel(mlp, mesh, SamePlacements(mlp, {Placement::Shard(0)}),
                 ctx.rank));
  RowShardedFramework framework{ctx.world, model.params(), {}};

  DistributedConfig config;
  config.assign_fn = SizeAwareAssign;
  // The functions capture `framework`, which outlives the optimizer.
  config.gather_fn = [&framework](int i, int slice, int owner,
                                  const float* shard, float* full) {
    return framework.Gather(i, owner, shard, full);
  };
  config.redistribute_fn = [&framework](int i, int slice, int owner,
                                        const float* full, float* shard) {
    return framework.Redistribute(i, owner, full, shard);
  };
  // state: who this rank is and how the parameters lie (Shard(0) over a
  // 1-D mesh of every rank), the process group, the coordinator.
  config.state.rank = ctx.rank;
  config.state.world_size = ctx.world_size;
  config.state.mesh = mesh;
  const ParamPlacement rows{{Placement::Shard(0)}, /*sub_mesh=*/{}};
  config.state.param_placements.assign(mlp.size(), rows);
  config.state.communicator = ctx.world;
  config.state.coordinator = ctx.coordinator;
  config.state.incarnation = ctx.incarnation;

  MUON_ASSIGN_OR_RETURN(std::unique_ptr<Muon> optimizer,
                        Muon::Create(model.params(), ExampleOptions(), config));
  for (int step = 0; step < kSteps; ++step) {
    model.SetGrads(step);  // the framework's own gradient synchronization
    MUON_RETURN_IF_ERROR(optimizer->Step());
  }
  return model.CheckAgainstSingleDevice(mlp, ctx);
}

}  // namespace muon::examples

int main(int argc, char** argv) {
  return muon::examples::ExampleMain(argc, argv,
                                     {"custom", 4, muon::examples::RunCustom});
}
