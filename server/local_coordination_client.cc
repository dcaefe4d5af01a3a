#include "server/local_coordination_client.h"

#include <utility>

namespace muon {
namespace {

// Stamps `job_id` on a request that carries none.
template <typename Request>
Request WithJobId(const Request& request, const std::string& job_id) {
  Request out = request;
  if (out.job_id().empty()) out.set_job_id(job_id);
  return out;
}

}  // namespace

absl::StatusOr<v1::JoinResponse> LocalCoordinationClient::Join(
    const v1::JoinRequest& request) {
  // This rank shares the coordinator's process (an embedded coordinator).
  service_->NoteInProcessRank(request.has_manifest()
                                  ? request.manifest().rank()
                                  : request.compact().rank());
  return service_->Join(WithJobId(request, job_id_));
}

absl::StatusOr<v1::HeartbeatResponse> LocalCoordinationClient::Heartbeat(
    const v1::HeartbeatRequest& request) {
  return service_->Heartbeat(WithJobId(request, job_id_));
}

absl::Status LocalCoordinationClient::ReportStep(const v1::StepReport& report) {
  return service_->ReportStep(WithJobId(report, job_id_)).status();
}

absl::Status LocalCoordinationClient::KeySet(const std::string& key,
                                             const std::string& value) {
  v1::KeySetRequest request;
  request.set_job_id(job_id_);
  request.set_key(key);
  request.set_value(value);
  return service_->KeySet(request).status();
}

absl::StatusOr<std::string> LocalCoordinationClient::KeyGet(
    const std::string& key, absl::Duration timeout) {
  v1::KeyGetRequest request;
  request.set_job_id(job_id_);
  request.set_key(key);
  request.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  absl::StatusOr<v1::KeyGetResponse> response = service_->KeyGet(request);
  if (!response.ok()) return response.status();
  return std::move(*response->mutable_value());
}

absl::StatusOr<v1::ReplanResponse> LocalCoordinationClient::Replan(
    const v1::ReplanRequest& request) {
  return service_->Replan(WithJobId(request, job_id_));
}

absl::StatusOr<v1::JobInfo> LocalCoordinationClient::GetJob() {
  v1::GetJobRequest request;
  request.set_job_id(job_id_);
  return service_->GetJob(request);
}

absl::StatusOr<v1::JobSpec> LocalCoordinationClient::GetJobSpec() {
  v1::GetJobSpecRequest request;
  request.set_job_id(job_id_);
  return service_->GetJobSpec(request);
}

absl::StatusOr<v1::Plan> LocalCoordinationClient::GetPlan() {
  v1::GetPlanRequest request;
  request.set_job_id(job_id_);
  return service_->GetPlan(request);
}

absl::StatusOr<v1::GetAssignmentsResponse>
LocalCoordinationClient::GetAssignments() {
  v1::GetAssignmentsRequest request;
  request.set_job_id(job_id_);
  return service_->GetAssignments(request);
}

absl::StatusOr<v1::ListRanksResponse> LocalCoordinationClient::ListRanks() {
  v1::ListRanksRequest request;
  request.set_job_id(job_id_);
  return service_->ListRanks(request);
}

absl::StatusOr<v1::GetReportsResponse> LocalCoordinationClient::GetReports(
    int rank, int last_steps) {
  v1::GetReportsRequest request;
  request.set_job_id(job_id_);
  request.set_rank(rank);
  request.set_last_steps(last_steps);
  return service_->GetReports(request);
}

}  // namespace muon
