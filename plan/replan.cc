#include "plan/replan.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/status_macros.h"

namespace muon {

namespace {

// Rank `ring`'s Newton-Schulz seconds per FLOP over its reports of steps >
// `after_step`, or 0 when it has no usable measurement. An operation whose
// start_s, end_s, seconds or FLOPs is not finite (a corrupt or hostile
// report: inf, NaN) is skipped, and a ratio that is not finite and > 0
// (sums overflowing to inf, a quotient underflowing to 0) is no
// measurement: either would make MakePlan refuse the cost model at every
// re-plan.
double RankSecondsPerFlop(const std::vector<v1::StepReport>& ring,
                          int64_t after_step) {
  double seconds = 0, flops = 0;
  for (const v1::StepReport& report : ring) {
    if (report.step() <= after_step) continue;
    for (const v1::OpTiming& op : report.ops()) {
      if (op.op() != v1::OP_KIND_ORTHOGONALIZE) continue;
      const double elapsed = op.end_s() - op.start_s();
      if (!std::isfinite(elapsed) || !std::isfinite(op.flops()) ||
          !(op.flops() > 0)) {
        continue;
      }
      seconds += std::max(0.0, elapsed);
      flops += op.flops();
    }
  }
  if (!(flops > 0) || !(seconds > 0)) return 0;
  const double ratio = seconds / flops;
  return std::isfinite(ratio) && ratio > 0 ? ratio : 0;
}

}  // namespace

std::vector<double> MeasuredSecondsPerFlop(
    const std::vector<const std::vector<v1::StepReport>*>& reports,
    int64_t after_step) {
  const size_t world = reports.size();
  std::vector<double> measured(world, 0.0);
  std::vector<double> known;
  for (size_t r = 0; r < world; ++r) {
    if (reports[r] == nullptr) continue;
    measured[r] = RankSecondsPerFlop(*reports[r], after_step);
    if (measured[r] > 0) known.push_back(measured[r]);
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
