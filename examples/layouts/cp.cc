// Context Parallel (CP): the sequence is split, the parameters are
// replicated.
//
//   config = create_auto_config(cp_process_group=dist.group.WORLD)
//   ...
//   loss.backward(); dist.all_reduce(param.grad, group=cp_pg)
//   optimizer.step()   # each rank orthogonalizes a subset, results exchanged
//
// After the gradient all-reduce every rank holds the same momentum; the cp
// group makes each matrix be orthogonalized by one rank and sent to the
// others, instead of by every rank.
//
//   bazel run //examples/layouts:cp
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "common/layout.h"
#include "common/status_macros.h"
#include "examples/layouts/example_main.h"

namespace muon::examples {

absl::Status RunCp(RankContext& ctx) {
  // A long-context model: parameters replicated on every CP rank.
  const std::vector<ParamDef> blocks = Transformer(2);
  LocalModel model;
  for (const ParamDef& p : blocks) model.AddFull(p);

  AutoConfigOptions options;
  options.cp = ctx.world;
  options.coordinator = ctx.coordinator;
  options.incarnation = ctx.incarnation;
  MUON_ASSIGN_OR_RETURN(DistributedConfig config,
                        CreateAutoConfig(model.params(), options));

  MUON_ASSIGN_OR_RETURN(std::unique_ptr<Muon> optimizer,
                        Muon::Create(model.params(), ExampleOptions(), config));
  for (int step = 0; step < kSteps; ++step) {
    // Each rank's backward on its part of the sequence, then the all-reduce:
    // every rank ends with the full gradient.
    model.SetGrads(step);
    MUON_RETURN_IF_ERROR(optimizer->Step());
  }
  return model.CheckAgainstSingleDevice(blocks, ctx);
}

}  // namespace muon::examples

int main(int argc, char** argv) {
  return muon::examples::ExampleMain(argc, argv,
                                     {"cp", 2, muon::examples::RunCp});
}
