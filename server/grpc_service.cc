#include "server/grpc_service.h"

#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace muon {
namespace {

// Runs a synchronous core call after `check` and finishes the reactor.
template <typename Response, typename Call>
grpc::ServerUnaryReactor* Handle(grpc::CallbackServerContext* context,
                                 const absl::Status& check, Response* response,
                                 Call&& call) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!check.ok()) {
    reactor->Finish(ToGrpcStatus(check));
    return reactor;
  }
  auto result = call();
  if (!result.ok()) {
    reactor->Finish(ToGrpcStatus(result.status()));
    return reactor;
  }
  *response = *std::move(result);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

// A callback for the core's asynchronous calls that finishes the reactor.
template <typename Response>
auto Finisher(grpc::ServerUnaryReactor* reactor, Response* response) {
  return [reactor, response](absl::StatusOr<Response> result) {
    if (!result.ok()) {
      reactor->Finish(ToGrpcStatus(result.status()));
      return;
    }
    *response = *std::move(result);
    reactor->Finish(grpc::Status::OK);
  };
}

// A handler whose service call completes later: `start(done)` hands the
// service Finisher(reactor, response) once `authorized` is OK; otherwise
// the call finishes with that error.
template <typename Response, typename Start>
grpc::ServerUnaryReactor* HandleAsync(grpc::CallbackServerContext* context,
                                      const absl::Status& authorized,
                                      Response* response, Start start) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!authorized.ok()) {
    reactor->Finish(ToGrpcStatus(authorized));
    return reactor;
  }
  start(Finisher(reactor, response));
  return reactor;
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

absl::Status CoordinatorGrpcService::Authorize(
    const grpc::CallbackServerContext* context, Access access) const {
  if (auth_.job_secret.empty()) return absl::OkStatus();
  const auto& metadata = context->client_metadata();
  auto it = metadata.find(kAuthorizationMetadataKey);
  absl::string_view token;
  if (it != metadata.end()) {
    const absl::string_view value(it->second.data(), it->second.size());
    if (absl::StartsWith(value, "Bearer ")) token = value.substr(7);
  }
  if (ConstantTimeEquals(token, auth_.job_secret)) return absl::OkStatus();
  const bool read_token =
      !auth_.read_token.empty() && ConstantTimeEquals(token, auth_.read_token);
  if (read_token && access == Access::kRead) return absl::OkStatus();
  // Never log the token itself.
  service_->Log(
      absl::StrCat("event=rejected reason=",
                   read_token ? "read_only_token" : "unauthenticated",
                   " credentials=", token.empty() ? "missing" : "invalid",
                   " peer=", LogValue(context->peer())));
  if (read_token) {
    return absl::PermissionDeniedError(
        "this token is read-only; rank RPCs need the job secret");
  }
  return absl::UnauthenticatedError("missing or invalid credentials");
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::Join(
    grpc::CallbackServerContext* context, const v1::JoinRequest* request,
    v1::JoinResponse* response) {
  return HandleAsync(context, Authorize(context, Access::kRank), response,
                     [&](auto done) { service_->JoinAsync(*request, done); });
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::HostJoin(
    grpc::CallbackServerContext* context, const v1::HostJoinRequest* request,
    v1::JoinResponse* response) {
  return HandleAsync(
      context, Authorize(context, Access::kRank), response,
      [&](auto done) { service_->HostJoinAsync(*request, done); });
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::KeyGet(
    grpc::CallbackServerContext* context, const v1::KeyGetRequest* request,
    v1::KeyGetResponse* response) {
  return HandleAsync(context, Authorize(context, Access::kRank), response,
                     [&](auto done) { service_->KeyGetAsync(*request, done); });
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::Heartbeat(
    grpc::CallbackServerContext* context, const v1::HeartbeatRequest* request,
    v1::HeartbeatResponse* response) {
  return Handle(context, Authorize(context, Access::kRank), response,
                [&] { return service_->Heartbeat(*request); });
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::ReportStep(
    grpc::CallbackServerContext* context, const v1::StepReport* request,
    v1::ReportStepResponse* response) {
  return Handle(context, Authorize(context, Access::kRank), response,
                [&] { return service_->ReportStep(*request); });
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::HostHeartbeat(
    grpc::CallbackServerContext* context,
    const v1::HostHeartbeatRequest* request, v1::HeartbeatResponse* response) {
  return Handle(context, Authorize(context, Access::kRank), response,
                [&] { return service_->HostHeartbeat(*request); });
}

namespace {

// A host's heartbeat stream: one request read at a time, answered before
// the next is read; a refused credential or a failed heartbeat ends the
// stream with its status. Deletes itself when gRPC is done with it.
class HostHeartbeatReactor final
    : public grpc::ServerBidiReactor<v1::HostHeartbeatRequest,
                                     v1::HeartbeatResponse> {
 public:
  HostHeartbeatReactor(CoordinatorService* service,
                       const absl::Status& authorized)
      : service_(service) {
    if (!authorized.ok()) {
      Finish(ToGrpcStatus(authorized));
      return;
    }
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the host closed its side (or the stream broke)
      Finish(grpc::Status::OK);
      return;
    }
    absl::StatusOr<v1::HeartbeatResponse> result =
        service_->HostHeartbeat(request_);
    if (!result.ok()) {
      Finish(ToGrpcStatus(result.status()));
      return;
    }
    response_ = *std::move(result);
    StartWrite(&response_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "the heartbeat stream broke"));
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  CoordinatorService* const service_;
  v1::HostHeartbeatRequest request_;
  v1::HeartbeatResponse response_;
};

}  // namespace

grpc::ServerBidiReactor<v1::HostHeartbeatRequest, v1::HeartbeatResponse>*
CoordinatorGrpcService::HostHeartbeatStream(
    grpc::CallbackServerContext* context) {
  return new HostHeartbeatReactor(service_, Authorize(context, Access::kRank));
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::ReportSteps(
    grpc::CallbackServerContext* context, const v1::StepReports* request,
    v1::ReportStepResponse* response) {
  return Handle(context, Authorize(context, Access::kRank), response,
                [&] { return service_->ReportSteps(*request); });
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::Replan(
    grpc::CallbackServerContext* context, const v1::ReplanRequest* request,
    v1::ReplanResponse* response) {
  return Handle(context, Authorize(context, Access::kRank), response,
                [&] { return service_->Replan(*request); });
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::KeySet(
    grpc::CallbackServerContext* context, const v1::KeySetRequest* request,
    v1::KeySetResponse* response) {
  return Handle(context, Authorize(context, Access::kRank), response,
                [&] { return service_->KeySet(*request); });
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::GetJob(
    grpc::CallbackServerContext* context, const v1::GetJobRequest* request,
    v1::JobInfo* response) {
  return Handle(context, Authorize(context, Access::kRead), response,
                [&] { return service_->GetJob(*request); });
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::GetPlan(
    grpc::CallbackServerContext* context, const v1::GetPlanRequest* request,
    v1::Plan* response) {
  return Handle(context, Authorize(context, Access::kRead), response,
                [&] { return service_->GetPlan(*request); });
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::GetJobSpec(
    grpc::CallbackServerContext* context, const v1::GetJobSpecRequest* request,
    v1::JobSpec* response) {
  return Handle(context, Authorize(context, Access::kRead), response,
                [&] { return service_->GetJobSpec(*request); });
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::GetAssignments(
    grpc::CallbackServerContext* context,
    const v1::GetAssignmentsRequest* request,
    v1::GetAssignmentsResponse* response) {
  return Handle(context, Authorize(context, Access::kRead), response,
                [&] { return service_->GetAssignments(*request); });
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::ListRanks(
    grpc::CallbackServerContext* context, const v1::ListRanksRequest* request,
    v1::ListRanksResponse* response) {
  return Handle(context, Authorize(context, Access::kRead), response,
                [&] { return service_->ListRanks(*request); });
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::GetReports(
    grpc::CallbackServerContext* context, const v1::GetReportsRequest* request,
    v1::GetReportsResponse* response) {
  return Handle(context, Authorize(context, Access::kRead), response,
                [&] { return service_->GetReports(*request); });
}

}  // namespace muon
