// A CoordinationClient that calls a CoordinatorService in the same process:
// rank 0 in embedded mode (its own coordinator, no loopback RPC) and tests.
// Same semantics and errors as GrpcCoordinationClient, minus Unavailable for
// transport failures.
//
// Lifecycle: construct over a service that outlives the client.
// Thread-safety: every method may be called concurrently (the service is
// thread-safe).
#ifndef MUON_SERVER_LOCAL_COORDINATION_CLIENT_H_
#define MUON_SERVER_LOCAL_COORDINATION_CLIENT_H_

#include <string>

#include "coordination/coordination_client.h"
#include "server/coordinator_service.h"

namespace muon {

class LocalCoordinationClient final : public CoordinationClient {
 public:
  // `job_id` is stamped on every request (empty = the service's job).
  LocalCoordinationClient(CoordinatorService* service, std::string job_id = "")
      : service_(service), job_id_(std::move(job_id)) {}

  // Sets request.job_id to this client's job id when it is empty.
  absl::StatusOr<v1::JoinResponse> Join(
      const v1::JoinRequest& request) override;
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(
      const v1::HeartbeatRequest& request) override;
  absl::Status ReportStep(const v1::StepReport& report) override;
  absl::Status KeySet(const std::string& key,
                      const std::string& value) override;
  absl::StatusOr<std::string> KeyGet(const std::string& key,
                                     absl::Duration timeout) override;
  absl::StatusOr<v1::JobInfo> GetJob() override;
  absl::StatusOr<v1::Plan> GetPlan() override;
  absl::StatusOr<v1::JobSpec> GetJobSpec() override;
  absl::StatusOr<v1::GetAssignmentsResponse> GetAssignments() override;
  absl::StatusOr<v1::ListRanksResponse> ListRanks() override;
  absl::StatusOr<v1::GetReportsResponse> GetReports(int rank,
                                                    int last_steps) override;
  absl::StatusOr<v1::ReplanResponse> Replan(
      const v1::ReplanRequest& request) override;

 private:
  CoordinatorService* const service_;  // Not owned.
  const std::string job_id_;
};

}  // namespace muon

#endif  // MUON_SERVER_LOCAL_COORDINATION_CLIENT_H_
