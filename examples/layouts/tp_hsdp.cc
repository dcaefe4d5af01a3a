// TP + HSDP hybrid: tensor parallel + shard + replicate.
// Here 2 nodes x 4 ranks: TP pairs, FSDP over the 2 pairs of a node,
// replicas across the nodes (8 ranks).
//
//   tp_pg = dist.new_group(adjacent ranks)                # 0,1  2,3 ...
//   shard_pg = dist.new_group(same tp rank, this node)    # 0,2  1,3 ...
//   replicate_pg = dist.new_group(same id, every node)    # 0,4  1,5 ...
//   config = create_auto_config(tp_process_group=tp_pg,
//                               shard_process_group=shard_pg,
//                               replicate_process_group=replicate_pg,
//                               tp_shard_dim=1)
//
// Mesh dp_replicate x dp_shard x tp: [Replicate(), Shard(0), Shard(1)].
//
//   bazel run //examples/layouts:tp_hsdp
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

absl::Status RunTpHsdp(RankContext& ctx) {
  constexpr int kTpSize = 2;
  constexpr int kShardSize = 2;
  constexpr int kNodeSize = kTpSize * kShardSize;
  const int replicate_size = ctx.world_size / kNodeSize;
  const int tp_rank = ctx.rank % kTpSize;
  const int node_base = ctx.rank / kNodeSize * kNodeSize;
  const int local_id = ctx.rank % kNodeSize;

  const int tp_base = ctx.rank / kTpSize * kTpSize;
  MUON_ASSIGN_OR_RETURN(
      std::unique_ptr<Communicator> tp_pg,
      ctx.world->Split(RankRange(tp_base, tp_base + kTpSize)));
  MUON_ASSIGN_OR_RETURN(
      std::unique_ptr<Communicator> shard_pg,
      ctx.world->Split(
          RankRange(node_base + tp_rank, node_base + kNodeSize, kTpSize)));
  MUON_ASSIGN_OR_RETURN(
      std::unique_ptr<Communicator> replicate_pg,
      ctx.world->Split(RankRange(local_id, ctx.world_size, kNodeSize)));

  const std::vector<ParamDef> blocks = Transformer(1);
  const Mesh mesh{{"dp_replicate", "dp_shard", "tp"},
                  {replicate_size, kShardSize, kTpSize}};
  MUON_ASSIGN_OR_RETURN(
      LocalModel model,
      ShardModel(
          blocks, mesh,
          SamePlacements(blocks, {Placement::Replicate(), Placement::Shard(0),
                                  Placement::Shard(1)}),
          ctx.rank));

  AutoConfigOptions options;
  options.world = ctx.world;
  options.tp = tp_pg.get();
  options.tp_shard_dim = 1;
  options.fsdp = shard_pg.get();
  options.replicate = replicate_pg.get();
  options.coordinator = ctx.coordinator;
  options.incarnation = ctx.incarnation;
  MUON_ASSIGN_OR_RETURN(DistributedConfig config,
                        CreateAutoConfig(model.params(), options));

  MUON_ASSIGN_OR_RETURN(std::unique_ptr<Muon> optimizer,
                        Muon::Create(model.params(), ExampleOptions(), config));
  for (int step = 0; step < kSteps; ++step) {
    model.SetGrads(step);
    MUON_RETURN_IF_ERROR(optimizer->Step());
  }
  return model.CheckAgainstSingleDevice(blocks, ctx);
}

}  // namespace muon::examples

int main(int argc, char** argv) {
  return muon::examples::ExampleMain(argc, argv,
                                     {"tp_hsdp", 8, muon::examples::RunTpHsdp});
}
