// Pipeline Parallel: layers split into stages, one stage per rank; each stage
// optimizes its own layers.
//
//   stage_model = get_stage_model(full_model, stage_id, num_stages)
//   config = create_auto_config(pp_process_group=dist.group.WORLD,
//                               pp_stage_id=stage_id, pp_num_stages=num_stages)
//   optimizer = Muon(stage_model.parameters(), lr=1e-3,
//                    distributed_config=config)
//
// A rank passes only its stage's parameters. The coordinator still sees the
// whole model (every stage joins the same job): it checks that the stages
// fit together and plans each stage's matrices on that stage's ranks; no
// matrix is ever gathered across stages.
//
//   bazel run //examples/layouts:pp
#include <algorithm>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "common/layout.h"
#include "common/status_macros.h"
#include "examples/layouts/example_main.h"

namespace muon::examples {
namespace {

// get_stage_model's split: layers_per_stage = num_layers // num_stages,
// the last stage takes the remainder.
int StageOfLayer(int layer, int num_layers, int num_stages) {
  const int per_stage = std::max(1, num_layers / num_stages);
  return std::min(layer / per_stage, num_stages - 1);
}

}  // namespace

absl::Status RunPp(RankContext& ctx) {
  const int num_stages = ctx.world_size;  // one rank per stage
  const int stage_id = ctx.rank;

  // The full model is fc1, fc2, fc3: stage 0 gets fc1, stage 1 fc2 and fc3.
  const std::vector<ParamDef> mlp = Mlp();
  const Mesh pp_mesh = Mesh::OneDim(num_stages, "pp");
  std::vector<SubMesh> stage_of_param;
  for (int layer = 0; layer < static_cast<int>(mlp.size()); ++layer) {
    const int stage = StageOfLayer(layer, mlp.size(), num_stages);
    stage_of_param.push_back(SubMesh{{/*pp dim*/ 0}, {stage}});
  }
  // get_stage_model(...): only this stage's layers, whole on this rank.
  MUON_ASSIGN_OR_RETURN(
      LocalModel stage_model,
      ShardModel(mlp, pp_mesh, SamePlacements(mlp, {Placement::Replicate()}),
                 ctx.rank, stage_of_param));

  AutoConfigOptions options;
  options.pp = ctx.world;
  options.pp_stage = stage_id;
  options.pp_num_stages = num_stages;
  options.coordinator = ctx.coordinator;
  options.incarnation = ctx.incarnation;
  MUON_ASSIGN_OR_RETURN(DistributedConfig config,
                        CreateAutoConfig(stage_model.params(), options));

  MUON_ASSIGN_OR_RETURN(
      std::unique_ptr<Muon> optimizer,
      Muon::Create(stage_model.params(), ExampleOptions(), config));
  for (int step = 0; step < kSteps; ++step) {
    stage_model.SetGrads(step);  // after the 1F1B schedule's backward passes
    MUON_RETURN_IF_ERROR(optimizer->Step());
  }
  return stage_model.CheckAgainstSingleDevice(mlp, ctx);
}

}  // namespace muon::examples

int main(int argc, char** argv) {
  return muon::examples::ExampleMain(argc, argv,
                                     {"pp", 2, muon::examples::RunPp});
}
