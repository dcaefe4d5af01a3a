#include "plan/plan_job.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace muon {

absl::StatusOr<PlannerOptions> PlannerOptionsForJob(
    const JobLayout& layout, absl::string_view job_id,
    const PlanDefaults& defaults) {
  const v1::ExecutionOptions& execution = layout.execution;
  PlannerOptions options;
  options.job_id = std::string(job_id);
  options.policy = defaults.policy;
  if (!execution.assignment_policy().empty()) {
    absl::StatusOr<PlannerOptions::Policy> policy =
        ParsePolicy(execution.assignment_policy());
    if (!policy.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "execution.assignment_policy: ", policy.status().message()));
    }
    options.policy = *policy;
  }
  options.bucket_size_bytes = execution.bucket_size_bytes() != 0
                                  ? execution.bucket_size_bytes()
                                  : defaults.bucket_size_bytes;
  options.async = execution.async_gpu_parallelism();
  options.prefetch_count = execution.prefetch_count();
  options.reverse_buckets = execution.overlap_backward();
  // Buckets of one matrix per owner would wait for every owner's first
  // gradient: with overlap, byte-bounded buckets (torch DDP's default
  // bucket_cap_mb, 25 MiB) unless the job sets its own bound.
  if (options.reverse_buckets && options.bucket_size_bytes == 0) {
    options.bucket_size_bytes = kOverlapBucketBytes;
  }
  options.ns_steps = std::max(1, layout.ns_steps);
  return options;
}

absl::StatusOr<JobPlan> PlanJob(const std::vector<v1::RankManifest>& manifests,
                                absl::string_view job_id,
                                const PlanDefaults& defaults) {
  MUON_ASSIGN_OR_RETURN(JobLayout layout, ValidateManifests(manifests));
  return PlanLayout(std::move(layout), job_id, defaults);
}

absl::StatusOr<JobPlan> PlanJobFromSpec(const v1::JobSpec& spec,
                                        const PlanDefaults& defaults) {
  MUON_ASSIGN_OR_RETURN(JobLayout layout, LayoutFromSpec(spec));
  return PlanLayout(std::move(layout), spec.job_id(), defaults);
}

absl::StatusOr<JobPlan> PlanLayout(JobLayout layout, absl::string_view job_id,
                                   const PlanDefaults& defaults) {
  JobPlan job;
  job.layout = std::move(layout);
  MUON_ASSIGN_OR_RETURN(PlannerOptions options,
                        PlannerOptionsForJob(job.layout, job_id, defaults));
  MUON_ASSIGN_OR_RETURN(job.plan, MakePlan(job.layout, options));
  absl::Status valid = ValidatePlan(job.plan, job.layout);
  if (!valid.ok()) {
    return absl::InternalError(
        absl::StrCat("planner produced an invalid plan: ", valid.message()));
  }
  return job;
}

}  // namespace muon
