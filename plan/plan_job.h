// The one planning entry point. Every planner of a job goes through
// PlanJob: the coordinator (server/coordinator_service.h, in the
// muon-coordinator daemon and embedded in rank 0), a trainer without a
// coordinator (client/muon.h's local path) and `muonctl plan` /
// `muonctl schedule` (tools/muonctl_lib.h). So for the same manifests and
// job id they produce the same plan, loads and hash.
//
// PlanJob runs, in order:
//   1. ValidateManifests (plan/manifest_validation.h): the ranks agree on
//      mesh, parameters, execution options and ns_steps;
//   2. PlannerOptions from the manifests: assignment policy and bucket size
//      from ExecutionOptions (PlanDefaults where they are unset), stream
//      schedule mode and prefetch depth from ExecutionOptions, the cost
//      model's Newton-Schulz iterations from RankManifest.ns_steps;
//   3. MakePlan (plan/planner.h): owners, buckets, loads, stream schedule
//      (plan/schedule.h) and the plan hash;
//   4. ValidatePlan: the plan covers every matrix exactly once, owners hold
//      a shard, loads and hash are consistent.
//
// Thread-safety: pure functions.
#ifndef MUON_PLAN_PLAN_JOB_H_
#define MUON_PLAN_PLAN_JOB_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "muon/v1/coordinator.pb.h"
#include "plan/manifest_validation.h"
#include "plan/planner.h"

namespace muon {

// The bucket bound of an overlap_backward job that sets none: torch
// DistributedDataParallel's bucket_cap_mb default, 25 MiB.
inline constexpr int64_t kOverlapBucketBytes = int64_t{25} << 20;

// What a job's manifests may leave to whoever plans it (the daemon's
// --policy and --bucket_size_bytes flags). Manifests that set a value win.
struct PlanDefaults {
  // Owner assignment policy when ExecutionOptions.assignment_policy is
  // empty.
  PlannerOptions::Policy policy =
      PlannerOptions::Policy::kLongestProcessingTimeFirst;
  // Bucket bound in fp32 bytes when ExecutionOptions.bucket_size_bytes is 0
  // (0 = one matrix per owner rank per bucket).
  int64_t bucket_size_bytes = 0;
};

// A planned job.
struct JobPlan {
  // The validated manifests: mesh, parameters, matrices and the boxes every
  // rank holds. Index i of layout.matrices is plan.matrices(i).
  JobLayout layout;
  // The plan, its stream schedule, and plan.hash set (PlanHash).
  v1::Plan plan;
};

// The PlannerOptions PlanJob plans `layout` with: job_id; policy and
// bucket_size_bytes from layout.execution, else `defaults`;
// async / prefetch_count from layout.execution; ns_steps =
// max(1, layout.ns_steps) (0 iterations are costed as 1, so that matrices
// still order by size).
// Errors: InvalidArgument when layout.execution.assignment_policy is not a
//   policy name ("execution.assignment_policy: ...").
absl::StatusOr<PlannerOptions> PlannerOptionsForJob(
    const JobLayout& layout, absl::string_view job_id,
    const PlanDefaults& defaults);

// Validates `manifests` (manifests[r] is rank r's), plans the job and
// checks the plan. `job_id` is copied into Plan.job_id and so covered by
// the hash.
// Errors:
//   InvalidArgument: the manifests are invalid or disagree (ValidateManifests;
//     the message names the parameter, rank and values), ns_steps out of
//     range or different across ranks, an unknown assignment policy, a
//     negative bucket size, or a matrix no rank holds.
//   Internal: the planner made a plan ValidatePlan rejects (a planner bug;
//     the message says which check failed).
absl::StatusOr<JobPlan> PlanJob(const std::vector<v1::RankManifest>& manifests,
                                absl::string_view job_id,
                                const PlanDefaults& defaults = PlanDefaults());

// PlanJob for the job a spec describes (muonctl plan), without building any
// rank's manifest: LayoutFromSpec, then the same planning and checks. Gives
// the plan (and hash) PlanJob gives for ManifestsFromSpec(spec) with
// job_id = spec.job_id(), in O(matrices + distinct layouts x ranks) memory.
// Errors: LayoutFromSpec's; then as PlanJob.
absl::StatusOr<JobPlan> PlanJobFromSpec(
    const v1::JobSpec& spec, const PlanDefaults& defaults = PlanDefaults());

// The planning half of PlanJob for an already validated layout: planner
// options (PlannerOptionsForJob), MakePlan, ValidatePlan.
// Errors: as PlanJob after validation.
absl::StatusOr<JobPlan> PlanLayout(JobLayout layout, absl::string_view job_id,
                                   const PlanDefaults& defaults);

}  // namespace muon

#endif  // MUON_PLAN_PLAN_JOB_H_
