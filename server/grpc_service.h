// The gRPC face of the coordinator: one handler per RPC of
// muon.v1.Coordinator on gRPC's callback API, each checking the caller's
// credentials, converting nothing but status (the core already speaks the
// proto messages) and delegating to CoordinatorService. Join and KeyGet hold
// no thread while they wait: the core completes them (XLA's "RPC handler"
// layer, without its thread per waiting call).
//
// Authentication (coordination/credentials.h): with a job secret set, every
// RPC must carry `authorization: Bearer <job secret>`; the read-only RPCs
// (GetJob, GetPlan, GetJobSpec, GetAssignments, ListRanks, GetReports) also
// accept the read-only token. Missing or wrong: UNAUTHENTICATED "missing or
// invalid credentials" (nothing about the job); the read-only token on a rank
// RPC: PERMISSION_DENIED.
//
// Lifecycle: construct over a service that outlives it, register with a
// grpc::ServerBuilder, destroy after the server has shut down.
// Thread-safety: handlers run concurrently on gRPC's threads; the core is
// thread-safe.
#ifndef MUON_SERVER_GRPC_SERVICE_H_
#define MUON_SERVER_GRPC_SERVICE_H_

#include "absl/status/status.h"
#include "coordination/credentials.h"
#include "grpcpp/grpcpp.h"
#include "muon/v1/coordinator.grpc.pb.h"
#include "server/coordinator_service.h"

namespace muon {

// absl::Status -> grpc::Status keeping the canonical code and the message.
grpc::Status ToGrpcStatus(const absl::Status& status);
// grpc::Status -> absl::Status keeping the canonical code and the message.
absl::Status FromGrpcStatus(const grpc::Status& status);

class CoordinatorGrpcService final : public v1::Coordinator::CallbackService {
 public:
  CoordinatorGrpcService(CoordinatorService* service, CoordinatorAuth auth)
      : service_(service), auth_(std::move(auth)) {}

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* context,
                                 const v1::JoinRequest* request,
                                 v1::JoinResponse* response) override;
  grpc::ServerUnaryReactor* HostJoin(grpc::CallbackServerContext* context,
                                     const v1::HostJoinRequest* request,
                                     v1::JoinResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* ReportStep(
      grpc::CallbackServerContext* context, const v1::StepReport* request,
      v1::ReportStepResponse* response) override;
  grpc::ServerUnaryReactor* HostHeartbeat(
      grpc::CallbackServerContext* context,
      const v1::HostHeartbeatRequest* request,
      v1::HeartbeatResponse* response) override;
  // One reactor per stream: reads a request, answers it, reads the next.
  grpc::ServerBidiReactor<v1::HostHeartbeatRequest, v1::HeartbeatResponse>*
  HostHeartbeatStream(grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* ReportSteps(
      grpc::CallbackServerContext* context, const v1::StepReports* request,
      v1::ReportStepResponse* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest* request,
                                   v1::JobInfo* response) override;
  grpc::ServerUnaryReactor* GetPlan(grpc::CallbackServerContext* context,
                                    const v1::GetPlanRequest* request,
                                    v1::Plan* response) override;
  grpc::ServerUnaryReactor* GetJobSpec(grpc::CallbackServerContext* context,
                                       const v1::GetJobSpecRequest* request,
                                       v1::JobSpec* response) override;
  grpc::ServerUnaryReactor* GetAssignments(
      grpc::CallbackServerContext* context,
      const v1::GetAssignmentsRequest* request,
      v1::GetAssignmentsResponse* response) override;
  grpc::ServerUnaryReactor* ListRanks(grpc::CallbackServerContext* context,
                                      const v1::ListRanksRequest* request,
                                      v1::ListRanksResponse* response) override;
  grpc::ServerUnaryReactor* GetReports(
      grpc::CallbackServerContext* context,
      const v1::GetReportsRequest* request,
      v1::GetReportsResponse* response) override;
  grpc::ServerUnaryReactor* Replan(grpc::CallbackServerContext* context,
                                   const v1::ReplanRequest* request,
                                   v1::ReplanResponse* response) override;
  grpc::ServerUnaryReactor* KeySet(grpc::CallbackServerContext* context,
                                   const v1::KeySetRequest* request,
                                   v1::KeySetResponse* response) override;
  grpc::ServerUnaryReactor* KeyGet(grpc::CallbackServerContext* context,
                                   const v1::KeyGetRequest* request,
                                   v1::KeyGetResponse* response) override;

 private:
  enum class Access { kRank, kRead };
  // OK when the call's token grants `access` (see the file comment).
  absl::Status Authorize(const grpc::CallbackServerContext* context,
                         Access access) const;

  CoordinatorService* const service_;  // Not owned.
  const CoordinatorAuth auth_;
};

}  // namespace muon

#endif  // MUON_SERVER_GRPC_SERVICE_H_
