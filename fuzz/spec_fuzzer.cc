// libFuzzer target: the job spec path of `muonctl plan` and tests, bytes
// in as JSON text: ParseJobSpecJson -> ValidateJobSpec -> ManifestsFromSpec
// -> PlanJob (manifest checks, planner, schedule, ValidatePlan) and the
// JSON round trip. Any uncaught exception, sanitizer report, leak or
// timeout is a bug: bad input must come back as a Status.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/spec.h"
#include "plan/plan_job.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view json(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<muon::v1::JobSpec> spec = muon::ParseJobSpecJson(json);
  if (!spec.ok()) return 0;
  // Serializing any parsed spec must work and parse back.
  const std::string again = muon::JobSpecToJson(*spec);
  if (!muon::ParseJobSpecJson(again).ok()) __builtin_trap();
  if (!muon::ValidateJobSpec(*spec).ok()) return 0;
  absl::StatusOr<std::vector<muon::v1::RankManifest>> manifests =
      muon::ManifestsFromSpec(*spec);
  // ValidateJobSpec said yes: expanding the spec must not fail.
  if (!manifests.ok()) __builtin_trap();
  absl::StatusOr<muon::JobPlan> plan =
      muon::PlanJob(*manifests, spec->job_id());
  (void)plan;
  return 0;
}
