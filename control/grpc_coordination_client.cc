#include "control/grpc_coordination_client.h"

#include <climits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordination/credentials.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/credentials.h"

namespace muon {
namespace {

constexpr int kMaxMessageBytes = 64 << 20;  // large manifests and plans

// grpc::Status -> absl::Status keeping the canonical code (the numbers are
// shared) and the server's message; transport failures name the RPC and the
// address.
absl::Status ToAbsl(const grpc::Status& status, const char* rpc,
                    const std::string& address, absl::Duration deadline) {
  if (status.ok()) return absl::OkStatus();
  const auto code = static_cast<absl::StatusCode>(status.error_code());
  if (code == absl::StatusCode::kUnavailable) {
    return absl::UnavailableError(
        absl::StrCat(rpc, ": coordinator at ", address,
                     " is unavailable: ", status.error_message()));
  }
  if (code == absl::StatusCode::kUnauthenticated) {
    // The coordinator refused the credentials (server/grpc_service.cc):
    // say which secret, and where it comes from.
    return absl::UnauthenticatedError(absl::StrCat(
        rpc, ": the coordinator at ", address,
        " refused this client's "
        "credentials (",
        status.error_message(),
        "): every rank and the "
        "coordinator must share one job secret (MUON_JOB_SECRET, or "
        "MUON_JOB_SECRET_FILE naming a mode-0600 file); muonctl passes the "
        "secret or a read-only token with --token_file"));
  }
  if (code == absl::StatusCode::kDeadlineExceeded &&
      status.error_message() == "Deadline Exceeded") {
    // Client-side deadline (server-side timeouts carry their own message).
    return absl::DeadlineExceededError(
        absl::StrCat(rpc, " to coordinator at ", address, " timed out after ",
                     absl::FormatDuration(deadline)));
  }
  return absl::Status(code, status.error_message());
}

// Plaintext, or TLS checked against the CA in security.tls_ca_file.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const GrpcClientSecurity& security, grpc::ChannelArguments* args) {
  if (security.tls_ca_file.empty()) return grpc::InsecureChannelCredentials();
  absl::StatusOr<std::string> ca = ReadPemFile(security.tls_ca_file);
  if (!ca.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("TLS CA file: ", ca.status().message()));
  }
  if (!security.tls_server_name.empty()) {
    args->SetSslTargetNameOverride(security.tls_server_name);
  }
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = *std::move(ca);
  return grpc::SslCredentials(ssl);
}

}  // namespace

void SetCoordinatorChannelArgs(grpc::ChannelArguments* args) {
  args->SetMaxReceiveMessageSize(kMaxMessageBytes);
  args->SetMaxSendMessageSize(kMaxMessageBytes);
  args->SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args->SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, INT_MAX);
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeCoordinatorChannel(
    const std::string& address, const GrpcClientSecurity& security) {
  if (address.empty()) {
    return absl::InvalidArgumentError("coordinator address is empty");
  }
  grpc::ChannelArguments args;
  SetCoordinatorChannelArgs(&args);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      ChannelCredentials(security, &args);
  if (!credentials.ok()) return credentials.status();
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(address, *credentials, args);
  if (channel == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot make a gRPC channel to \"", address, "\""));
  }
  return channel;
}

absl::StatusOr<std::unique_ptr<GrpcCoordinationClient>>
GrpcCoordinationClient::Create(const std::string& address,
                               const std::string& job_id,
                               absl::Duration rpc_timeout,
                               const GrpcClientSecurity& security) {
  if (rpc_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rpc_timeout is ", absl::FormatDuration(rpc_timeout), "; must be > 0"));
  }
  MUON_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                        MakeCoordinatorChannel(address, security));
  return std::unique_ptr<GrpcCoordinationClient>(new GrpcCoordinationClient(
      address, job_id, rpc_timeout, security.token, std::move(channel)));
}

GrpcCoordinationClient::GrpcCoordinationClient(
    std::string address, std::string job_id, absl::Duration rpc_timeout,
    std::string token, std::shared_ptr<grpc::Channel> channel)
    : address_(std::move(address)),
      job_id_(std::move(job_id)),
      rpc_timeout_(rpc_timeout),
      token_(std::move(token)),
      channel_(std::move(channel)),
      stub_(v1::Coordinator::NewStub(channel_)) {}

std::unique_ptr<grpc::ClientContext> GrpcCoordinationClient::NewContext(
    absl::Duration timeout) const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (!token_.empty()) {
    context->AddMetadata(kAuthorizationMetadataKey, BearerValue(token_));
  }
  return context;
}

template <typename Request, typename Response>
absl::StatusOr<Response> GrpcCoordinationClient::Call(
    grpc::Status (v1::Coordinator::Stub::*method)(grpc::ClientContext*,
                                                  const Request&, Response*),
    const char* name, Request request, absl::Duration timeout,
    bool wait_for_ready) const {
  if (request.job_id().empty()) request.set_job_id(job_id_);
  std::unique_ptr<grpc::ClientContext> context = NewContext(timeout);
  if (wait_for_ready) context->set_wait_for_ready(true);
  Response response;
  grpc::Status status = ((*stub_).*method)(context.get(), request, &response);
  if (!status.ok()) return ToAbsl(status, name, address_, timeout);
  return response;
}

absl::StatusOr<v1::JoinResponse> GrpcCoordinationClient::Join(
    const v1::JoinRequest& request) {
  const absl::Duration wait = request.timeout_ms() > 0
                                  ? absl::Milliseconds(request.timeout_ms())
                                  : absl::Seconds(60);
  // The coordinator may not listen yet: wait for it.
  return Call(&v1::Coordinator::Stub::Join, "Join", request,
              wait + rpc_timeout_, /*wait_for_ready=*/true);
}

absl::StatusOr<v1::HeartbeatResponse> GrpcCoordinationClient::Heartbeat(
    const v1::HeartbeatRequest& request) {
  return Call(&v1::Coordinator::Stub::Heartbeat, "Heartbeat", request,
              rpc_timeout_);
}

absl::Status GrpcCoordinationClient::ReportStep(const v1::StepReport& report) {
  return Call(&v1::Coordinator::Stub::ReportStep, "ReportStep", report,
              rpc_timeout_)
      .status();
}

absl::Status GrpcCoordinationClient::KeySet(const std::string& key,
                                            const std::string& value) {
  v1::KeySetRequest request;
  request.set_key(key);
  request.set_value(value);
  return Call(&v1::Coordinator::Stub::KeySet, "KeySet", std::move(request),
              rpc_timeout_)
      .status();
}

absl::StatusOr<std::string> GrpcCoordinationClient::KeyGet(
    const std::string& key, absl::Duration timeout) {
  if (timeout < absl::ZeroDuration()) timeout = absl::ZeroDuration();
  v1::KeyGetRequest request;
  request.set_key(key);
  request.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  absl::StatusOr<v1::KeyGetResponse> response =
      Call(&v1::Coordinator::Stub::KeyGet, "KeyGet", std::move(request),
           timeout + rpc_timeout_);
  if (!response.ok()) return response.status();
  return std::move(*response->mutable_value());
}

absl::StatusOr<v1::JobInfo> GrpcCoordinationClient::GetJob() {
  return Call(&v1::Coordinator::Stub::GetJob, "GetJob", v1::GetJobRequest(),
              rpc_timeout_);
}

absl::StatusOr<v1::ReplanResponse> GrpcCoordinationClient::Replan(
    const v1::ReplanRequest& request) {
  return Call(&v1::Coordinator::Stub::Replan, "Replan", request, rpc_timeout_);
}

absl::StatusOr<v1::Plan> GrpcCoordinationClient::GetPlan() {
  return Call(&v1::Coordinator::Stub::GetPlan, "GetPlan", v1::GetPlanRequest(),
              rpc_timeout_);
}

absl::StatusOr<v1::JobSpec> GrpcCoordinationClient::GetJobSpec() {
  return Call(&v1::Coordinator::Stub::GetJobSpec, "GetJobSpec",
              v1::GetJobSpecRequest(), rpc_timeout_);
}

absl::StatusOr<v1::GetAssignmentsResponse>
GrpcCoordinationClient::GetAssignments() {
  return Call(&v1::Coordinator::Stub::GetAssignments, "GetAssignments",
              v1::GetAssignmentsRequest(), rpc_timeout_);
}

absl::StatusOr<v1::ListRanksResponse> GrpcCoordinationClient::ListRanks() {
  return Call(&v1::Coordinator::Stub::ListRanks, "ListRanks",
              v1::ListRanksRequest(), rpc_timeout_);
}

absl::StatusOr<v1::GetReportsResponse> GrpcCoordinationClient::GetReports(
    int rank, int last_steps) {
  v1::GetReportsRequest request;
  request.set_rank(rank);
  request.set_last_steps(last_steps);
  return Call(&v1::Coordinator::Stub::GetReports, "GetReports",
              std::move(request), rpc_timeout_);
}

}  // namespace muon
