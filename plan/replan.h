// Re-planning from measured times (ExecutionOptions.replan_every_steps).
//
// Every replan_every_steps steps the coordinator turns the ranks' step
// reports into a cost model (each rank's measured Newton-Schulz seconds per
// FLOP) and plans again with it (PlannerOptions::rank_seconds_per_flop):
// a rank that orthogonalizes slowly gets fewer FLOPs. Every rank asks for
// the plan at the same step boundary and gets the same one; each matrix's
// Newton-Schulz does not depend on its owner, so results stay bitwise
// identical to the first plan's.
//
// Thread-safety: pure functions.
#ifndef MUON_PLAN_REPLAN_H_
#define MUON_PLAN_REPLAN_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "muon/v1/coordinator.pb.h"
#include "plan/manifest_validation.h"
#include "plan/planner.h"

namespace muon {

// Per rank, its Newton-Schulz seconds per FLOP measured in the reports of
// steps > `after_step`: sum of its "orthogonalize" operations' seconds
// (end_s - start_s) / sum of their FLOPs (OpTiming.flops).
// `reports[r]` points to rank r's kept reports (any order; null or empty
// for none; not copied: the coordinator passes its rings). A rank
// without a measurement (it owned nothing, or no report arrived yet) gets
// the median of the measured ranks. Non-finite values are never used: an
// operation whose start_s, end_s or FLOPs is inf or NaN is skipped, and a
// rank's ratio counts as a measurement only when it is finite and > 0, so
// every value returned is finite and > 0 (what MakePlan accepts). Returns
// an empty vector when no rank has a measurement.
std::vector<double> MeasuredSecondsPerFlop(
    const std::vector<const std::vector<v1::StepReport>*>& reports,
    int64_t after_step);

// The plan for steps `step` + 1 on: MakePlan(layout, options) with
// options.rank_seconds_per_flop = `seconds_per_flop`, version
// current.version() + 1, first_step step + 1 and its hash. Returns
// `current` unchanged when the new owners and buckets equal the current
// ones (nothing to switch).
// Errors: MakePlan's (InvalidArgument).
absl::StatusOr<v1::Plan> ReplanWithMeasuredCosts(
    const JobLayout& layout, PlannerOptions options, const v1::Plan& current,
    const std::vector<double>& seconds_per_flop, int64_t step);

}  // namespace muon

#endif  // MUON_PLAN_REPLAN_H_
