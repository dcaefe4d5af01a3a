// Helpers of the control plane's tests: manifests of a small job, joining
// agents from threads, step reports, and a bounded wait.
#ifndef MUON_TESTS_CONTROL_AGENT_TEST_UTIL_H_
#define MUON_TESTS_CONTROL_AGENT_TEST_UTIL_H_

#include <memory>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/spec.h"
#include "common/wire_names.h"
#include "control/agent.h"
#include "gtest/gtest.h"
#include "muon/v1/coordinator.pb.h"
#include "tests/status_matchers.h"

namespace muon {

// A step report with one timing per operation kind.
inline v1::StepReport StepReportFor(int64_t step) {
  v1::StepReport report;
  report.set_step(step);
  report.set_step_time_s(0.01);
  for (v1::OpKind op : SpecifiedValues<v1::OpKind>()) {
    v1::OpTiming* t = report.add_ops();
    t->set_op(op);
    t->set_start_s(1.0);
    t->set_end_s(2.0);
    t->set_bytes(1 << 20);
  }
  return report;
}

// Polls `done` every millisecond for up to `timeout`.
template <typename Pred>
bool WaitFor(Pred done, absl::Duration timeout = absl::Seconds(5)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

// `world_size` ranks over dp_shard=world_size with one replicated 4 x 4
// parameter.
inline std::vector<v1::RankManifest> RankManifests(int world_size) {
  v1::JobSpec spec;
  spec.set_job_id("agent");
  v1::MeshDim* dim = spec.mutable_mesh()->add_dims();
  dim->set_name("dp_shard");
  dim->set_size(world_size);
  v1::ParamSpec* p = spec.add_params();
  p->set_name("w");
  p->add_shape(4);
  p->add_shape(4);
  p->add_placements("Replicate()");
  absl::StatusOr<std::vector<v1::RankManifest>> m = ManifestsFromSpec(spec);
  EXPECT_THAT(m, IsOk());
  return m.ok() ? *m : std::vector<v1::RankManifest>();
}

// Joins every agent from its own thread (timeout 3 s each).
inline void JoinAll(std::vector<std::unique_ptr<Agent>>& agents,
                    const std::vector<v1::RankManifest>& manifests) {
  std::vector<std::thread> threads;
  for (size_t r = 0; r < agents.size(); ++r) {
    threads.emplace_back(
        [&, r] { EXPECT_THAT(agents[r]->Join(manifests[r], 3000), IsOk()); });
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace muon

#endif  // MUON_TESTS_CONTROL_AGENT_TEST_UTIL_H_
