#include "plan/replan.h"

#include <algorithm>
#include <utility>

#include "common/status_macros.h"

namespace muon {

std::vector<double> MeasuredSecondsPerFlop(
    const std::vector<const std::vector<v1::StepReport>*>& reports,
    int64_t after_step) {
  const size_t world = reports.size();
  std::vector<double> measured(world, 0.0);
  std::vector<double> known;
  for (size_t r = 0; r < world; ++r) {
    double seconds = 0, flops = 0;
    if (reports[r] == nullptr) continue;
    for (const v1::StepReport& report : *reports[r]) {
      if (report.step() <= after_step) continue;
      for (const v1::OpTiming& op : report.ops()) {
        if (op.op() != v1::OP_KIND_ORTHOGONALIZE || !(op.flops() > 0)) continue;
        seconds += std::max(0.0, op.end_s() - op.start_s());
        flops += op.flops();
      }
    }
    if (flops > 0 && seconds > 0) {
      measured[r] = seconds / flops;
      known.push_back(measured[r]);
    }
  }
  if (known.empty()) return {};
  std::sort(known.begin(), known.end());
  const double median = known[known.size() / 2];
  for (double& m : measured) {
    if (!(m > 0)) m = median;
  }
  return measured;
}

namespace {

// Whether two plans have the same owners and buckets.
bool SameAssignment(const v1::Plan& a, const v1::Plan& b) {
  if (a.matrices_size() != b.matrices_size() ||
      a.buckets_size() != b.buckets_size()) {
    return false;
  }
  for (int i = 0; i < a.matrices_size(); ++i) {
    if (a.matrices(i).owner() != b.matrices(i).owner() ||
        a.matrices(i).bucket() != b.matrices(i).bucket()) {
      return false;
    }
  }
  for (int k = 0; k < a.buckets_size(); ++k) {
    if (a.buckets(k).SerializeAsString() != b.buckets(k).SerializeAsString()) {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<v1::Plan> ReplanWithMeasuredCosts(
    const JobLayout& layout, PlannerOptions options, const v1::Plan& current,
    const std::vector<double>& seconds_per_flop, int64_t step) {
  options.rank_seconds_per_flop = seconds_per_flop;
  MUON_ASSIGN_OR_RETURN(v1::Plan plan, MakePlan(layout, options));
  if (SameAssignment(plan, current)) return current;
  plan.set_version(current.version() + 1);
  plan.set_first_step(step + 1);
  plan.set_hash(PlanHash(plan));
  return plan;
}

}  // namespace muon
