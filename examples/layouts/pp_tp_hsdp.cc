// Full 4-D parallelism (PP + TP + HSDP): pipeline stages, each stage TP-sharded
// and HSDP-wrapped. Here 2 stages x 2 shard x 2 TP on 8 ranks (replicate size
// world / 8: 1 here, 2 with --nproc 16).
//
//   config = create_auto_config(pp_process_group=pp_pg, pp_stage_id=pp_rank,
//       pp_num_stages=pp_size, tp_process_group=tp_pg, tp_shard_dim=1,
//       shard_process_group=shard_pg, replicate_process_group=replicate_pg)
//
// Ranks are laid out in the standard mesh order pp x dp_replicate x dp_shard
// x tp (torch's init_device_mesh order, tp fastest), not with replicate
// fastest; build your groups in the standard order. Parameters:
// [Replicate(), Replicate(), Shard(0), Shard(1)] on their stage's sub-mesh.
//
//   bazel run //examples/layouts:pp_tp_hsdp
#include <algorithm>
#include <memory>
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

int StageOfLayer(int layer, int num_layers, int num_stages) {
  const int per_stage = std::max(1, num_layers / num_stages);
  return std::min(layer / per_stage, num_stages - 1);
}

}  // namespace

absl::Status RunPpTpHsdp(RankContext& ctx) {
  constexpr int kPpSize = 2, kShardSize = 2, kTpSize = 2;
  const int replicate_size = ctx.world_size / (kPpSize * kShardSize * kTpSize);
  const int stage_size = replicate_size * kShardSize * kTpSize;

  // Position in the 4-D grid (pp, replicate, shard, tp).
  const int pp_rank = ctx.rank / stage_size;
  const int replicate_rank = ctx.rank / (kShardSize * kTpSize) % replicate_size;
  const int shard_rank = ctx.rank / kTpSize % kShardSize;
  const int tp_rank = ctx.rank % kTpSize;

  // One process group per dim: the ranks that differ only in that position.
  const int tp_base = ctx.rank - tp_rank;
  const int shard_base = ctx.rank - shard_rank * kTpSize;
  const int replicate_base = ctx.rank - replicate_rank * kShardSize * kTpSize;
  MUON_ASSIGN_OR_RETURN(
      std::unique_ptr<Communicator> pp_pg,
      ctx.world->Split(
          RankRange(ctx.rank % stage_size, ctx.world_size, stage_size)));
  MUON_ASSIGN_OR_RETURN(
      std::unique_ptr<Communicator> replicate_pg,
      ctx.world->Split(RankRange(replicate_base, replicate_base + stage_size,
                                 kShardSize * kTpSize)));
  MUON_ASSIGN_OR_RETURN(
      std::unique_ptr<Communicator> shard_pg,
      ctx.world->Split(
          RankRange(shard_base, shard_base + kShardSize * kTpSize, kTpSize)));
  MUON_ASSIGN_OR_RETURN(
      std::unique_ptr<Communicator> tp_pg,
      ctx.world->Split(RankRange(tp_base, tp_base + kTpSize)));

  // 3 transformer blocks: stage 0 gets block 0, stage 1 blocks 1 and 2.
  const std::vector<ParamDef> blocks = Transformer(3);
  const int num_layers = static_cast<int>(blocks.size()) / 4;
  const Mesh mesh{{"pp", "dp_replicate", "dp_shard", "tp"},
                  {kPpSize, replicate_size, kShardSize, kTpSize}};
  std::vector<SubMesh> stage_of_param;
  for (int i = 0; i < static_cast<int>(blocks.size()); ++i) {
    stage_of_param.push_back(
        SubMesh{{/*pp dim*/ 0}, {StageOfLayer(i / 4, num_layers, kPpSize)}});
  }
  MUON_ASSIGN_OR_RETURN(
      LocalModel stage_model,
      ShardModel(blocks, mesh,
                 SamePlacements(blocks,
                                {Placement::Replicate(), Placement::Replicate(),
                                 Placement::Shard(0), Placement::Shard(1)}),
                 ctx.rank, stage_of_param));

  AutoConfigOptions options;
  options.world = ctx.world;
  options.pp = pp_pg.get();
  options.pp_stage = pp_rank;
  options.pp_num_stages = kPpSize;
  options.tp = tp_pg.get();
  options.tp_shard_dim = 1;
  options.fsdp = shard_pg.get();
  options.replicate = replicate_pg.get();
  options.coordinator = ctx.coordinator;
  options.incarnation = ctx.incarnation;
  MUON_ASSIGN_OR_RETURN(DistributedConfig config,
                        CreateAutoConfig(stage_model.params(), options));

  MUON_ASSIGN_OR_RETURN(
      std::unique_ptr<Muon> optimizer,
      Muon::Create(stage_model.params(), ExampleOptions(), config));
  for (int step = 0; step < kSteps; ++step) {
    stage_model.SetGrads(step);
    MUON_RETURN_IF_ERROR(optimizer->Step());
  }
  return stage_model.CheckAgainstSingleDevice(blocks, ctx);
}

}  // namespace muon::examples

int main(int argc, char** argv) {
  return muon::examples::ExampleMain(
      argc, argv, {"pp_tp_hsdp", 8, muon::examples::RunPpTpHsdp});
}
