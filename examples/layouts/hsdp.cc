// HSDP (Hybrid Sharded Data Parallel): FSDP within a node, replicas across
// nodes. Here 2 "nodes" of 2 ranks.
//
//   shard_pg = dist.new_group(ranks of this node)
//   replicate_pg = dist.new_group(the same local rank on every node)
//   model = FSDP(model, sharding_strategy=HYBRID_SHARD,
//                process_group=(shard_pg, replicate_pg))
//   config = create_auto_config(shard_process_group=shard_pg,
//                               replicate_process_group=replicate_pg)
//
// The mesh is dp_replicate x dp_shard: Replicate() across nodes, Shard(0)
// within one.
//
//   bazel run //examples/layouts:hsdp
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

absl::Status RunHsdp(RankContext& ctx) {
  constexpr int kGpusPerNode = 2;
  const int num_nodes = ctx.world_size / kGpusPerNode;
  const int node = ctx.rank / kGpusPerNode;
  const int local_rank = ctx.rank % kGpusPerNode;

  // The process groups (dist.new_group).
  MUON_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> shard_pg,
                        ctx.world->Split(RankRange(node * kGpusPerNode,
                                                   (node + 1) * kGpusPerNode)));
  MUON_ASSIGN_OR_RETURN(
      std::unique_ptr<Communicator> replicate_pg,
      ctx.world->Split(RankRange(local_rank, ctx.world_size, kGpusPerNode)));

  // FSDP(HYBRID_SHARD): rows sharded within the node, replicated across.
  const std::vector<ParamDef> mlp = Mlp();
  const Mesh mesh{{"dp_replicate", "dp_shard"}, {num_nodes, kGpusPerNode}};
  MUON_ASSIGN_OR_RETURN(LocalModel model,
                        ShardModel(mlp, mesh,
                                   SamePlacements(mlp, {Placement::Replicate(),
                                                        Placement::Shard(0)}),
                                   ctx.rank));

  AutoConfigOptions options;
  options.world = ctx.world;  // several groups: name the one spanning all
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
  return model.CheckAgainstSingleDevice(mlp, ctx);
}

}  // namespace muon::examples

int main(int argc, char** argv) {
  return muon::examples::ExampleMain(argc, argv,
                                     {"hsdp", 4, muon::examples::RunHsdp});
}
