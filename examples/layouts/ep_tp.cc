// EP + TP hybrid (TP-sharded experts): each expert is itself TP-sharded. Here 2
// expert groups x 2 TP ranks (4 ranks, 4 experts).
//
//   expert_id = rank // tp_size; tp_rank = rank % tp_size
//   tp_pg = dist.new_group([expert_id * tp_size + i for i in range(tp_size)])
//   model = parallelize_module(model, mesh, {"experts": ColwiseParallel()})
//   config = create_auto_config(tp_process_group=tp_pg, tp_shard_dim=1)
//
// Gather within TP, never across EP. In C++ the ep group is passed as well
// (mesh ep x tp): it tells the runtime which ranks hold other experts, so it
// can check the layout and never gather across it. Expert stacks are
// [Shard(0), Shard(2)] (experts over ep, each slice's columns over tp); the
// 2-D router is [Replicate(), Shard(1)].
//
//   bazel run //examples/layouts:ep_tp
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

absl::Status RunEpTp(RankContext& ctx) {
  constexpr int kTpSize = 2;
  const int ep_size = ctx.world_size / kTpSize;
  const int expert_group = ctx.rank / kTpSize;
  const int tp_rank = ctx.rank % kTpSize;

  MUON_ASSIGN_OR_RETURN(
      std::unique_ptr<Communicator> tp_pg,
      ctx.world->Split(
          RankRange(expert_group * kTpSize, (expert_group + 1) * kTpSize)));
  MUON_ASSIGN_OR_RETURN(
      std::unique_ptr<Communicator> ep_pg,
      ctx.world->Split(RankRange(tp_rank, ctx.world_size, kTpSize)));

  const std::vector<ParamDef> moe = MoE(4);
  const Mesh mesh{{"ep", "tp"}, {ep_size, kTpSize}};
  std::vector<std::vector<Placement>> placements;
  for (const ParamDef& p : moe) {
    if (p.expert_stack()) {
      placements.push_back({Placement::Shard(0), Placement::Shard(2)});
    } else {
      placements.push_back({Placement::Replicate(), Placement::Shard(1)});
    }
  }
  MUON_ASSIGN_OR_RETURN(LocalModel model,
                        ShardModel(moe, mesh, placements, ctx.rank));

  AutoConfigOptions options;
  options.world = ctx.world;
  options.ep = ep_pg.get();
  options.tp = tp_pg.get();
  options.tp_shard_dim = 1;  // of each [rows, cols] matrix (slice)
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
  return model.CheckAgainstSingleDevice(moe, ctx);
}

}  // namespace muon::examples

int main(int argc, char** argv) {
  return muon::examples::ExampleMain(argc, argv,
                                     {"ep_tp", 4, muon::examples::RunEpTp});
}
