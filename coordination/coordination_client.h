// The agent's view of the coordinator: an abstract transport, so the client
// library never depends on gRPC directly (XLA's CoordinationClient pattern).
// It lives in coordination/, apart from both sides: client/ uses it, server/
// implements it in process, and neither includes the other.
// Implementations: GrpcCoordinationClient (control/grpc_coordination_client.h,
// a remote daemon or rank 0's embedded coordinator) and
// LocalCoordinationClient (server/local_coordination_client.h, calls the core
// in-process). Tests use fakes.
//
// Thread-safety: every method may be called from any thread concurrently.
#ifndef MUON_COORDINATION_COORDINATION_CLIENT_H_
#define MUON_COORDINATION_COORDINATION_CLIENT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "muon/v1/coordinator.pb.h"

namespace muon {

class CoordinationClient {
 public:
  virtual ~CoordinationClient() = default;

  // Registers a rank and blocks until every rank has joined and the plan is
  // made (or request.timeout_ms passes).
  // Errors:
  //   InvalidArgument: this or another rank's manifest is invalid or
  //     disagrees (the message names the parameter, rank and values); every
  //     rank of the job receives the same error.
  //   DeadlineExceeded: other ranks did not join in time.
  //   Unavailable: the coordinator cannot be reached.
  virtual absl::StatusOr<v1::JoinResponse> Join(
      const v1::JoinRequest& request) = 0;

  // Errors: NotFound (unknown rank), Aborted (stale incarnation),
  // Unavailable.
  virtual absl::StatusOr<v1::HeartbeatResponse> Heartbeat(
      const v1::HeartbeatRequest& request) = 0;

  // Errors: NotFound (unknown rank), Unavailable.
  virtual absl::Status ReportStep(const v1::StepReport& report) = 0;

  // Key-value rendezvous. Set overwrites. Get waits up to `timeout` for the
  // key to appear. Errors: DeadlineExceeded (key not set in time),
  // Unavailable.
  virtual absl::Status KeySet(const std::string& key,
                              const std::string& value) = 0;
  virtual absl::StatusOr<std::string> KeyGet(const std::string& key,
                                             absl::Duration timeout) = 0;

  // Read-only views (muonctl).
  virtual absl::StatusOr<v1::JobInfo> GetJob() = 0;
  virtual absl::StatusOr<v1::Plan> GetPlan() = 0;
  virtual absl::StatusOr<v1::GetAssignmentsResponse> GetAssignments() = 0;
  virtual absl::StatusOr<v1::ListRanksResponse> ListRanks() = 0;

  // The planned job's layout as a job spec (muon.v1.Coordinator.GetJobSpec).
  // Errors: FailedPrecondition (no plan yet), Unavailable; Unimplemented
  // from transports without it (this default, so test fakes need not
  // implement it).
  virtual absl::StatusOr<v1::JobSpec> GetJobSpec() {
    return absl::UnimplementedError(
        "GetJobSpec is not implemented by this CoordinationClient");
  }

  // The coordinator's kept step reports of `rank` (-1 = every rank), the
  // last `last_steps` of each (0 = all kept), by rank then step.
  // Errors: InvalidArgument (rank < -1 or last_steps < 0), NotFound (rank
  // never joined), Unavailable; Unimplemented from transports without it
  // (this default, so test fakes need not implement it).
  virtual absl::StatusOr<v1::GetReportsResponse> GetReports(int rank,
                                                            int last_steps) {
    (void)rank;
    (void)last_steps;
    return absl::UnimplementedError(
        "GetReports is not implemented by this CoordinationClient");
  }

  // The plan for the steps after request.step (re-planning from measured
  // times, ExecutionOptions.replan_every_steps); every rank asking at the
  // same step gets the same plan.
  // Errors: FailedPrecondition (re-planning off, or step not a positive
  // multiple of replan_every_steps, or the job failed), NotFound (unknown
  // rank), Aborted (stale incarnation), Unavailable; Unimplemented from
  // transports without it (this default).
  virtual absl::StatusOr<v1::ReplanResponse> Replan(
      const v1::ReplanRequest& request) {
    (void)request;
    return absl::UnimplementedError(
        "Replan is not implemented by this CoordinationClient");
  }
};

}  // namespace muon

#endif  // MUON_COORDINATION_COORDINATION_CLIENT_H_
