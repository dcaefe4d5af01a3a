// Debug mode: sequential execution for debugging.
//
//   config = create_auto_config(fsdp_process_group=dist.group.WORLD)
//   config.execution.async_gpu_parallelism = False  # Sequential execution
//   config.execution.prefetch_count = 0             # Disable prefetching
//
// Sequential mode runs one bucket at a time, owners in rank order, each
// operation finished before the next starts, so per-operation timings and
// prints are exact. It gives the same bits as the async mode. (Today's
// engine is sequential either way; the async engine comes later, and this
// is how to switch it off.)
//
//   bazel run //examples/layouts:debug
#include <cstdio>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "common/layout.h"
#include "common/status_macros.h"
#include "examples/layouts/example_main.h"

namespace muon::examples {

absl::Status RunDebug(RankContext& ctx) {
  const std::vector<ParamDef> mlp = Mlp();
  const Mesh fsdp_mesh = Mesh::OneDim(ctx.world_size, "dp_shard");
  MUON_ASSIGN_OR_RETURN(
      LocalModel model,
      ShardModel(mlp, fsdp_mesh, SamePlacements(mlp, {Placement::Shard(0)}),
                 ctx.rank));

  AutoConfigOptions options;
  options.fsdp = ctx.world;
  options.coordinator = ctx.coordinator;
  options.incarnation = ctx.incarnation;
  MUON_ASSIGN_OR_RETURN(DistributedConfig config,
                        CreateAutoConfig(model.params(), options));
  // Override for debugging (simplest execution).
  config.execution.set_async_gpu_parallelism(false);
  config.execution.set_prefetch_count(0);

  MUON_ASSIGN_OR_RETURN(std::unique_ptr<Muon> optimizer,
                        Muon::Create(model.params(), ExampleOptions(), config));
  if (ctx.rank == 0) {
    for (const auto& m : optimizer->plan().matrices()) {
      std::printf("[debug] %s [%lld, %lld] is orthogonalized by rank %d\n",
                  m.param().c_str(), static_cast<long long>(m.rows()),
                  static_cast<long long>(m.cols()), m.owner());
    }
  }
  for (int step = 0; step < kSteps; ++step) {
    model.SetGrads(step);
    if (ctx.rank == 0) std::printf("[debug] rank 0 starting step %d\n", step);
    MUON_RETURN_IF_ERROR(optimizer->Step());
    if (ctx.rank == 0) {
      const StepStats& stats = optimizer->last_step_stats();
      std::printf(
          "[debug] rank 0 finished step %d: %d matrices orthogonalized "
          "here, %zu timed operations\n",
          step, stats.matrices_orthogonalized, stats.ops.size());
      std::fflush(stdout);
    }
  }
  return model.CheckAgainstSingleDevice(mlp, ctx);
}

}  // namespace muon::examples

int main(int argc, char** argv) {
  return muon::examples::ExampleMain(argc, argv,
                                     {"debug", 2, muon::examples::RunDebug});
}
