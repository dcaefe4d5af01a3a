// FSDP: every matrix sharded along dim 0 over all ranks.
//
//   model = FSDP(model)
//   config = create_auto_config(fsdp_process_group=dist.group.WORLD)
//   optimizer = Muon(model.parameters(), lr=1e-3, distributed_config=config)
//
// Shards follow torch.chunk (fc3 [10, 12] over 4 ranks: 3, 3, 3 and 1 rows).
// Each step gathers every matrix's update to one owner rank, which runs
// Newton-Schulz once, and sends each rank its rows of the result.
//
//   bazel run //examples/layouts:fsdp
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "common/layout.h"
#include "common/status_macros.h"
#include "examples/layouts/example_main.h"

namespace muon::examples {

absl::Status RunFsdp(RankContext& ctx) {
  // FSDP(model): this rank's rows of every matrix (Shard(0) over the world).
  const std::vector<ParamDef> mlp = Mlp();
  const Mesh fsdp_mesh = Mesh::OneDim(ctx.world_size, "dp_shard");
  MUON_ASSIGN_OR_RETURN(
      LocalModel model,
      ShardModel(mlp, fsdp_mesh, SamePlacements(mlp, {Placement::Shard(0)}),
                 ctx.rank));

  // create_auto_config(fsdp_process_group=dist.group.WORLD)
  AutoConfigOptions options;
  options.fsdp = ctx.world;
  options.fsdp_shard_dim = 0;
  options.coordinator = ctx.coordinator;
  options.incarnation = ctx.incarnation;
  MUON_ASSIGN_OR_RETURN(DistributedConfig config,
                        CreateAutoConfig(model.params(), options));

  MUON_ASSIGN_OR_RETURN(std::unique_ptr<Muon> optimizer,
                        Muon::Create(model.params(), ExampleOptions(), config));
  for (int step = 0; step < kSteps; ++step) {
    model.SetGrads(step);  // loss.backward(): FSDP reduce-scatters
    MUON_RETURN_IF_ERROR(optimizer->Step());
  }
  return model.CheckAgainstSingleDevice(mlp, ctx);
}

}  // namespace muon::examples

int main(int argc, char** argv) {
  return muon::examples::ExampleMain(argc, argv,
                                     {"fsdp", 4, muon::examples::RunFsdp});
}
