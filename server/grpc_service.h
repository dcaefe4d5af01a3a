// The gRPC face of the coordinator: one handler per RPC of
// muon.v1.Coordinator, each converting nothing but status (the core already
// speaks the proto messages) and delegating to CoordinatorService. No state
// and no locks here (XLA's "RPC handler" layer).
//
// Lifecycle: construct over a service that outlives it, register with a
// grpc::ServerBuilder, destroy after the server has shut down.
// Thread-safety: handlers run concurrently on gRPC's threads; the core is
// thread-safe.
#ifndef MUON_SERVER_GRPC_SERVICE_H_
#define MUON_SERVER_GRPC_SERVICE_H_

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "muon/v1/coordinator.grpc.pb.h"
#include "server/coordinator_service.h"

namespace muon {

// absl::Status -> grpc::Status keeping the canonical code and the message.
grpc::Status ToGrpcStatus(const absl::Status& status);
// grpc::Status -> absl::Status keeping the canonical code and the message.
absl::Status FromGrpcStatus(const grpc::Status& status);

class CoordinatorGrpcService final : public v1::Coordinator::Service {
 public:
  explicit CoordinatorGrpcService(CoordinatorService* service)
      : service_(service) {}

  grpc::Status Join(grpc::ServerContext* context,
                    const v1::JoinRequest* request,
                    v1::JoinResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context,
                         const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;
  grpc::Status ReportStep(grpc::ServerContext* context,
                          const v1::StepReport* request,
                          v1::ReportStepResponse* response) override;
  grpc::Status GetJob(grpc::ServerContext* context,
                      const v1::GetJobRequest* request,
                      v1::JobInfo* response) override;
  grpc::Status GetPlan(grpc::ServerContext* context,
                       const v1::GetPlanRequest* request,
                       v1::Plan* response) override;
  grpc::Status GetAssignments(grpc::ServerContext* context,
                              const v1::GetAssignmentsRequest* request,
                              v1::GetAssignmentsResponse* response) override;
  grpc::Status ListRanks(grpc::ServerContext* context,
                         const v1::ListRanksRequest* request,
                         v1::ListRanksResponse* response) override;
  grpc::Status GetReports(grpc::ServerContext* context,
                          const v1::GetReportsRequest* request,
                          v1::GetReportsResponse* response) override;
  grpc::Status KeySet(grpc::ServerContext* context,
                      const v1::KeySetRequest* request,
                      v1::KeySetResponse* response) override;
  grpc::Status KeyGet(grpc::ServerContext* context,
                      const v1::KeyGetRequest* request,
                      v1::KeyGetResponse* response) override;

 private:
  CoordinatorService* const service_;  // Not owned.
};

}  // namespace muon

#endif  // MUON_SERVER_GRPC_SERVICE_H_
