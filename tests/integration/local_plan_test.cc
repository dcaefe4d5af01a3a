// A trainer without a coordinator plans through the same entry point
// (PlanJob: manifest checks, planner, ValidatePlan, hash) as one with a
// coordinator and as `muonctl plan`: for the same parameters and optimizer
// options, Muon's local path, Muon joined to a CoordinatorService, and
// PlanJobSpec of the equivalent spec give the same plan and hash, with
// ns_steps at its default and at 3.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "client/parameter.h"
#include "common/layout.h"
#include "common/spec.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "plan/plan_job.h"
#include "plan/planner.h"
#include "server/coordinator_service.h"
#include "server/local_coordination_client.h"
#include "tests/server/test_specs.h"
#include "tests/status_matchers.h"
#include "tools/muonctl_lib.h"

namespace muon {
namespace {

struct Shape {
  std::string name;
  int64_t rows;
  int64_t cols;
};

// Matrices of different costs, so that ns_steps shows in the loads.
const std::vector<Shape>& Shapes() {
  static const auto* shapes =
      new std::vector<Shape>{{"w1", 24, 8}, {"w2", 16, 40}, {"w3", 5, 7}};
  return *shapes;
}

std::vector<std::unique_ptr<Parameter>> MakeParams() {
  std::vector<std::unique_ptr<Parameter>> params;
  for (const Shape& s : Shapes()) {
    auto p = std::make_unique<Parameter>();
    p->name = s.name;
    p->local_shape = {s.rows, s.cols};
    p->data.assign(s.rows * s.cols, 0.5f);
    p->grad.assign(s.rows * s.cols, 0.25f);
    params.push_back(std::move(p));
  }
  return params;
}

std::vector<Parameter*> Raw(const std::vector<std::unique_ptr<Parameter>>& p) {
  std::vector<Parameter*> raw;
  for (const auto& x : p) raw.push_back(x.get());
  return raw;
}

// A world of one on a one-dim mesh, every parameter replicated; the
// execution options are DistributedConfig's defaults.
DistributedConfig WorldOfOne(CoordinationClient* coordinator) {
  DistributedConfig config;
  config.state.rank = 0;
  config.state.world_size = 1;
  config.state.mesh = Mesh::OneDim(1, "dp_shard");
  config.state.param_placements.assign(
      Shapes().size(), ParamPlacement{{Placement::Replicate()}, {}});
  config.state.coordinator = coordinator;
  config.state.incarnation = 1;
  config.state.join_timeout_ms = 10000;
  return config;
}

// The spec of the same job (job id empty, as Muon's local path plans it).
v1::JobSpec SameJobSpec(const MuonOptions& options) {
  std::vector<testing::TestParam> params;
  for (const Shape& s : Shapes()) {
    params.push_back({s.name, s.rows, s.cols, {"Replicate()"}});
  }
  v1::JobSpec spec = testing::MakeSpec({{"dp_shard", 1}}, params);
  spec.set_job_id("");
  spec.mutable_optimizer()->set_ns_steps(options.ns_steps);
  *spec.mutable_execution() = DistributedConfig().execution;
  return spec;
}

class LocalPlanTest : public ::testing::TestWithParam<int> {};

TEST_P(LocalPlanTest,
       MuonCreate_NoCoordinator_SamePlanAsCoordinatorAndMuonctl) {
  MuonOptions options;
  options.ns_steps = GetParam();

  // Local path: no coordinator.
  std::vector<std::unique_ptr<Parameter>> local_params = MakeParams();
  absl::StatusOr<std::unique_ptr<Muon>> local =
      Muon::Create(Raw(local_params), options, WorldOfOne(nullptr));
  ASSERT_THAT(local, IsOk());
  const v1::Plan local_plan = (*local)->plan();

  // The same trainer joined to a coordinator (serving the empty job id, as
  // the local path stamps no job id).
  CoordinatorService::Options service_options;
  service_options.job_id = "";
  service_options.world_size = 1;
  CoordinatorService service(service_options);
  LocalCoordinationClient client(&service);
  std::vector<std::unique_ptr<Parameter>> joined_params = MakeParams();
  absl::StatusOr<std::unique_ptr<Muon>> joined =
      Muon::Create(Raw(joined_params), options, WorldOfOne(&client));
  ASSERT_THAT(joined, IsOk());
  const v1::Plan joined_plan = (*joined)->plan();

  // muonctl plan of the equivalent spec.
  absl::StatusOr<JobPlan> offline = PlanJobSpec(SameJobSpec(options));
  ASSERT_THAT(offline, IsOk());

  EXPECT_FALSE(local_plan.hash().empty());
  EXPECT_EQ(local_plan.hash(), PlanHash(local_plan));
  EXPECT_EQ(local_plan.hash(), joined_plan.hash());
  EXPECT_EQ(local_plan.hash(), offline->plan.hash());
  // Through a coordinator, the rank holds the plan as it needs it: every
  // matrix and bucket, the compact schedule, no loads (PlanForRank).
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(
      PlanForRank(local_plan, 0), joined_plan))
      << local_plan.DebugString() << joined_plan.DebugString();
  // The loads are costed with the optimizer's ns_steps.
  double flops = 0;
  for (const Shape& s : Shapes()) {
    flops += NewtonSchulzFlops(s.rows, s.cols, options.ns_steps);
  }
  ASSERT_EQ(local_plan.loads_size(), 1);
  EXPECT_DOUBLE_EQ(local_plan.loads(0).ns_flops(), flops);
  joined->reset();  // stops its agent before the coordinator goes
}

INSTANTIATE_TEST_SUITE_P(NsSteps, LocalPlanTest, ::testing::Values(5, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("NsSteps", info.param);
                         });

}  // namespace
}  // namespace muon
