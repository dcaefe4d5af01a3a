// Single GPU (the baseline): no distributed configuration.
//
//   optimizer = Muon(model.parameters(), lr=1e-3, momentum=0.95)
//
// Without a DistributedConfig muon::Muon takes the single-device path: the
// same step function as every distributed layout, on a world of one.
//
//   bazel run //examples/layouts:single_device
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "client/muon.h"
#include "common/status_macros.h"
#include "examples/layouts/example_main.h"

namespace muon::examples {

absl::Status RunSingleDevice(RankContext& ctx) {
  // The whole model lives on this device.
  const std::vector<ParamDef> mlp = Mlp();
  LocalModel model;
  for (const ParamDef& p : mlp) model.AddFull(p);

  // Muon(model.parameters(), ...): no distributed config.
  MUON_ASSIGN_OR_RETURN(std::unique_ptr<Muon> optimizer,
                        Muon::Create(model.params(), ExampleOptions()));
  for (int step = 0; step < kSteps; ++step) {
    model.SetGrads(step);  // loss.backward()
    MUON_RETURN_IF_ERROR(optimizer->Step());
  }
  return model.CheckAgainstSingleDevice(mlp, ctx);
}

}  // namespace muon::examples

int main(int argc, char** argv) {
  return muon::examples::ExampleMain(
      argc, argv, {"single_device", 1, muon::examples::RunSingleDevice});
}
