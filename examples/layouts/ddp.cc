// DDP, which needs no special config; this example passes the optional one.
//
//   model = DDP(model)                      # full replica on every rank
//   config = create_auto_config(cp_process_group=dist.group.WORLD)
//   optimizer = Muon(model.parameters(), lr=1e-3, distributed_config=config)
//
// DDP replicates the model and all-reduces gradients, so Muon works with no
// config at all (every rank then orthogonalizes every matrix itself). With
// the DDP group in the config (AutoConfigOptions::ddp, Replicate() on a
// dp_replicate mesh dim; `cp` would do the same) each matrix is
// orthogonalized once in the world and the result sent to every replica.
//
//   bazel run //examples/layouts:ddp
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "common/layout.h"
#include "common/status_macros.h"
#include "examples/layouts/example_main.h"

namespace muon::examples {

absl::Status RunDdp(RankContext& ctx) {
  // DDP(model): every rank holds the whole model.
  const std::vector<ParamDef> mlp = Mlp();
  LocalModel model;
  for (const ParamDef& p : mlp) model.AddFull(p);

  // Optional: split the orthogonalization work over the DDP group.
  AutoConfigOptions options;
  options.ddp = ctx.world;
  options.coordinator = ctx.coordinator;
  options.incarnation = ctx.incarnation;
  MUON_ASSIGN_OR_RETURN(DistributedConfig config,
                        CreateAutoConfig(model.params(), options));

  MUON_ASSIGN_OR_RETURN(std::unique_ptr<Muon> optimizer,
                        Muon::Create(model.params(), ExampleOptions(), config));
  for (int step = 0; step < kSteps; ++step) {
    model.SetGrads(step);  // loss.backward(): DDP all-reduces the gradients
    MUON_RETURN_IF_ERROR(optimizer->Step());
  }
  return model.CheckAgainstSingleDevice(mlp, ctx);
}

}  // namespace muon::examples

int main(int argc, char** argv) {
  return muon::examples::ExampleMain(argc, argv,
                                     {"ddp", 2, muon::examples::RunDdp});
}
