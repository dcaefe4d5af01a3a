// Expert Parallel (EP): each rank holds COMPLETE experts.
//
//   experts_per_gpu = num_experts // world_size   # this rank's experts
//   optimizer = Muon(model.parameters(), lr=1e-3)  # no distributed_config
//
// The experts live in 3-D stacks [experts, rows, cols] (Parameter::
// expert_stack): each [rows, cols] slice is its own matrix. Experts are never
// gathered across ranks: whoever holds an expert orthogonalizes it. As in the
// Python form above, Muon::Create(params) with no config works here too. The
// config below adds one thing: the 2-D router, replicated on every rank, is
// orthogonalized once in the world instead of on every rank, and the
// coordinator checks that the ranks' experts fit together.
//
// This example writes the config DTensor style (CreateMeshConfig): the
// mesh, and per parameter the placements a DTensor would carry: expert
// stacks Shard(0) on ep (experts split over ranks), the router Replicate().
// (CreateAutoConfig with AutoConfigOptions::ep is the process-group
// spelling of the same layout; see ep_tp.cc.)
//
//   bazel run //examples/layouts:ep
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "common/layout.h"
#include "common/status_macros.h"
#include "examples/layouts/example_main.h"

namespace muon::examples {

absl::Status RunEp(RankContext& ctx) {
  // 8 experts, 2 per rank; the router on every rank.
  const std::vector<ParamDef> moe = MoE(8);
  const Mesh ep_mesh = Mesh::OneDim(ctx.world_size, "ep");
  std::vector<std::vector<Placement>> placements;
  for (const ParamDef& p : moe) {
    placements.push_back(
        {p.expert_stack() ? Placement::Shard(0) : Placement::Replicate()});
  }
  MUON_ASSIGN_OR_RETURN(LocalModel model,
                        ShardModel(moe, ep_mesh, placements, ctx.rank));

  // The DTensor view: mesh + placements of every parameter, in order.
  std::vector<ParamPlacement> layout;
  for (const std::vector<Placement>& p : placements) {
    layout.push_back(ParamPlacement{p, /*sub_mesh=*/{}});
  }
  MUON_ASSIGN_OR_RETURN(DistributedConfig config,
                        CreateMeshConfig(ep_mesh, layout, ctx.world,
                                         ctx.coordinator, ctx.incarnation));

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
                                     {"ep", 4, muon::examples::RunEp});
}
