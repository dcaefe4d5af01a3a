// FSDP, variant: parameters sharded along dim 1 (columns), e.g. FSDP2's
// fully_shard(model, shard_placement_fn=lambda p: Shard(1)).
//
//   config = create_auto_config(fsdp_process_group=dist.group.WORLD)
//   # C++: AutoConfigOptions{.fsdp = world, .fsdp_shard_dim = 1}
//
// Column shards are strided in row-major memory; the runtime packs them.
// fc1 [16, 13] over 4 ranks: 4, 4, 4 and 1 columns.
//
//   bazel run //examples/layouts:fsdp_shard1
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "common/layout.h"
#include "common/status_macros.h"
#include "examples/layouts/example_main.h"

namespace muon::examples {

absl::Status RunFsdpShard1(RankContext& ctx) {
  // fully_shard with Shard(1): this rank's columns of every matrix.
  const std::vector<ParamDef> mlp = Mlp();
  const Mesh fsdp_mesh = Mesh::OneDim(ctx.world_size, "dp_shard");
  MUON_ASSIGN_OR_RETURN(
      LocalModel model,
      ShardModel(mlp, fsdp_mesh, SamePlacements(mlp, {Placement::Shard(1)}),
                 ctx.rank));

  AutoConfigOptions options;
  options.fsdp = ctx.world;
  options.fsdp_shard_dim = 1;  // the tensor dim FSDP split
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
  return muon::examples::ExampleMain(
      argc, argv, {"fsdp_shard1", 4, muon::examples::RunFsdpShard1});
}
