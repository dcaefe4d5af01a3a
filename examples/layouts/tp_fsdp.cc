// TP + FSDP hybrid: TP within a node, FSDP across nodes (2-D parallelism). Here
// 2 nodes x 2 TP ranks.
//
//   tp_pg = dist.new_group(
//       range(fsdp_rank * tp_size, (fsdp_rank + 1) * tp_size))
//   fsdp_pg = dist.new_group(range(tp_rank, world_size, tp_size))
//   model = parallelize_module(model, mesh, {...: ColwiseParallel()})
//   model = FSDP(model, process_group=fsdp_pg)
//   config = create_auto_config(tp_process_group=tp_pg,
//                               fsdp_process_group=fsdp_pg, tp_shard_dim=1)
//
// Every matrix is split on both dims: rows over FSDP, columns over TP; the
// owner gathers all four blocks.
//
//   bazel run //examples/layouts:tp_fsdp
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

absl::Status RunTpFsdp(RankContext& ctx) {
  constexpr int kTpSize = 2;
  const int fsdp_size = ctx.world_size / kTpSize;
  const int tp_rank = ctx.rank % kTpSize;
  const int fsdp_rank = ctx.rank / kTpSize;

  MUON_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> tp_pg,
                        ctx.world->Split(RankRange(fsdp_rank * kTpSize,
                                                   (fsdp_rank + 1) * kTpSize)));
  MUON_ASSIGN_OR_RETURN(
      std::unique_ptr<Communicator> fsdp_pg,
      ctx.world->Split(RankRange(tp_rank, ctx.world_size, kTpSize)));

  // TP (Shard(1)) inside FSDP (Shard(0)): mesh dp_shard x tp.
  const std::vector<ParamDef> blocks = Transformer(1);
  const Mesh mesh{{"dp_shard", "tp"}, {fsdp_size, kTpSize}};
  MUON_ASSIGN_OR_RETURN(
      LocalModel model,
      ShardModel(
          blocks, mesh,
          SamePlacements(blocks, {Placement::Shard(0), Placement::Shard(1)}),
          ctx.rank));

  AutoConfigOptions options;
  options.world = ctx.world;
  options.tp = tp_pg.get();
  options.tp_shard_dim = 1;
  options.fsdp = fsdp_pg.get();
  options.fsdp_shard_dim = 0;
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
                                     {"tp_fsdp", 4, muon::examples::RunTpFsdp});
}
