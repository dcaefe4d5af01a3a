// Tensor Parallel, with mixed sharding dimensions (column- and row-parallel
// layers in one model).
//
//   model = parallelize_module(model, device_mesh, {
//       "attention.qkv_proj": ColwiseParallel(),
//       "attention.out_proj": RowwiseParallel(),
//       "ffn.w1": ColwiseParallel(), "ffn.w2": RowwiseParallel()})
//   config = create_auto_config(tp_process_group=dist.group.WORLD,
//                               tp_shard_dim=1)
//
// Python needs one optimizer per shard dim for mixed layers; here one
// optimizer takes the dim of each parameter (tp_dim_per_param, parameter
// index -> tensor dim), tp_shard_dim being the default. This example's
// dims: column-parallel = dim 1, row-parallel = dim 0; give whatever dim your
// framework actually split.
//
//   bazel run //examples/layouts:tp
#include <map>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "common/layout.h"
#include "common/status_macros.h"
#include "examples/layouts/example_main.h"

namespace muon::examples {

absl::Status RunTp(RankContext& ctx) {
  const std::vector<ParamDef> blocks = Transformer(2);
  // The tp plan: which tensor dim each parameter is split on.
  std::map<int, int> tp_dim_per_param;
  std::vector<std::vector<Placement>> placements;
  for (int i = 0; i < static_cast<int>(blocks.size()); ++i) {
    const bool colwise = absl::StrContains(blocks[i].name, "qkv_proj") ||
                         absl::StrContains(blocks[i].name, "w1");
    tp_dim_per_param[i] = colwise ? 1 : 0;
    placements.push_back({Placement::Shard(tp_dim_per_param[i])});
  }
  // parallelize_module(...): this rank's slice of every matrix.
  const Mesh tp_mesh = Mesh::OneDim(ctx.world_size, "tp");
  MUON_ASSIGN_OR_RETURN(LocalModel model,
                        ShardModel(blocks, tp_mesh, placements, ctx.rank));

  AutoConfigOptions options;
  options.tp = ctx.world;
  options.tp_shard_dim = 1;
  options.tp_dim_per_param = tp_dim_per_param;
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
                                     {"tp", 2, muon::examples::RunTp});
}
