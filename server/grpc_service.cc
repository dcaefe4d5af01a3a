#include "server/grpc_service.h"

#include <string>
#include <utility>

namespace muon {
namespace {

// Runs a core call and moves its value into the gRPC response.
template <typename Response, typename Call>
grpc::Status Handle(Response* response, Call&& call) {
  auto result = call();
  if (!result.ok()) return ToGrpcStatus(result.status());
  *response = *std::move(result);
  return grpc::Status::OK;
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // Canonical codes share their numbers in Abseil and gRPC.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

grpc::Status CoordinatorGrpcService::Join(grpc::ServerContext*,
                                          const v1::JoinRequest* request,
                                          v1::JoinResponse* response) {
  return Handle(response, [&] { return service_->Join(*request); });
}

grpc::Status CoordinatorGrpcService::Heartbeat(
    grpc::ServerContext*, const v1::HeartbeatRequest* request,
    v1::HeartbeatResponse* response) {
  return Handle(response, [&] { return service_->Heartbeat(*request); });
}

grpc::Status CoordinatorGrpcService::ReportStep(
    grpc::ServerContext*, const v1::StepReport* request,
    v1::ReportStepResponse* response) {
  return Handle(response, [&] { return service_->ReportStep(*request); });
}

grpc::Status CoordinatorGrpcService::GetJob(grpc::ServerContext*,
                                            const v1::GetJobRequest* request,
                                            v1::JobInfo* response) {
  return Handle(response, [&] { return service_->GetJob(*request); });
}

grpc::Status CoordinatorGrpcService::GetPlan(grpc::ServerContext*,
                                             const v1::GetPlanRequest* request,
                                             v1::Plan* response) {
  return Handle(response, [&] { return service_->GetPlan(*request); });
}

grpc::Status CoordinatorGrpcService::GetAssignments(
    grpc::ServerContext*, const v1::GetAssignmentsRequest* request,
    v1::GetAssignmentsResponse* response) {
  return Handle(response, [&] { return service_->GetAssignments(*request); });
}

grpc::Status CoordinatorGrpcService::ListRanks(
    grpc::ServerContext*, const v1::ListRanksRequest* request,
    v1::ListRanksResponse* response) {
  return Handle(response, [&] { return service_->ListRanks(*request); });
}

grpc::Status CoordinatorGrpcService::GetReports(
    grpc::ServerContext*, const v1::GetReportsRequest* request,
    v1::GetReportsResponse* response) {
  return Handle(response, [&] { return service_->GetReports(*request); });
}

grpc::Status CoordinatorGrpcService::KeySet(grpc::ServerContext*,
                                            const v1::KeySetRequest* request,
                                            v1::KeySetResponse* response) {
  return Handle(response, [&] { return service_->KeySet(*request); });
}

grpc::Status CoordinatorGrpcService::KeyGet(grpc::ServerContext*,
                                            const v1::KeyGetRequest* request,
                                            v1::KeyGetResponse* response) {
  return Handle(response, [&] { return service_->KeyGet(*request); });
}

}  // namespace muon
