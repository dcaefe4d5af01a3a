#include "client/grpc_coordination_client.h"

#include <utility>

#include "absl/strings/str_cat.h"
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

template <typename Request>
Request WithJobId(const Request& request, const std::string& job_id) {
  Request out = request;
  if (out.job_id().empty()) out.set_job_id(job_id);
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcCoordinationClient>>
GrpcCoordinationClient::Create(const std::string& address,
                               const std::string& job_id,
                               absl::Duration rpc_timeout,
                               const GrpcClientSecurity& security) {
  if (address.empty()) {
    return absl::InvalidArgumentError("coordinator address is empty");
  }
  if (rpc_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rpc_timeout is ", absl::FormatDuration(rpc_timeout), "; must be > 0"));
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      ChannelCredentials(security, &args);
  if (!credentials.ok()) return credentials.status();
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(address, *credentials, args);
  if (channel == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot make a gRPC channel to \"", address, "\""));
  }
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

absl::StatusOr<v1::JoinResponse> GrpcCoordinationClient::Join(
    const v1::JoinRequest& request) {
  const absl::Duration wait = request.timeout_ms() > 0
                                  ? absl::Milliseconds(request.timeout_ms())
                                  : absl::Seconds(60);
  const absl::Duration deadline = wait + rpc_timeout_;
  std::unique_ptr<grpc::ClientContext> context = NewContext(deadline);
  context->set_wait_for_ready(true);  // the coordinator may not listen yet
  v1::JoinResponse response;
  grpc::Status status =
      stub_->Join(context.get(), WithJobId(request, job_id_), &response);
  if (!status.ok()) return ToAbsl(status, "Join", address_, deadline);
  return response;
}

absl::StatusOr<v1::HeartbeatResponse> GrpcCoordinationClient::Heartbeat(
    const v1::HeartbeatRequest& request) {
  std::unique_ptr<grpc::ClientContext> context = NewContext(rpc_timeout_);
  v1::HeartbeatResponse response;
  grpc::Status status =
      stub_->Heartbeat(context.get(), WithJobId(request, job_id_), &response);
  if (!status.ok()) return ToAbsl(status, "Heartbeat", address_, rpc_timeout_);
  return response;
}

absl::Status GrpcCoordinationClient::ReportStep(const v1::StepReport& report) {
  std::unique_ptr<grpc::ClientContext> context = NewContext(rpc_timeout_);
  v1::ReportStepResponse response;
  grpc::Status status =
      stub_->ReportStep(context.get(), WithJobId(report, job_id_), &response);
  return ToAbsl(status, "ReportStep", address_, rpc_timeout_);
}

absl::Status GrpcCoordinationClient::KeySet(const std::string& key,
                                            const std::string& value) {
  v1::KeySetRequest request;
  request.set_job_id(job_id_);
  request.set_key(key);
  request.set_value(value);
  std::unique_ptr<grpc::ClientContext> context = NewContext(rpc_timeout_);
  v1::KeySetResponse response;
  grpc::Status status = stub_->KeySet(context.get(), request, &response);
  return ToAbsl(status, "KeySet", address_, rpc_timeout_);
}

absl::StatusOr<std::string> GrpcCoordinationClient::KeyGet(
    const std::string& key, absl::Duration timeout) {
  if (timeout < absl::ZeroDuration()) timeout = absl::ZeroDuration();
  v1::KeyGetRequest request;
  request.set_job_id(job_id_);
  request.set_key(key);
  request.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  const absl::Duration deadline = timeout + rpc_timeout_;
  std::unique_ptr<grpc::ClientContext> context = NewContext(deadline);
  v1::KeyGetResponse response;
  grpc::Status status = stub_->KeyGet(context.get(), request, &response);
  if (!status.ok()) return ToAbsl(status, "KeyGet", address_, deadline);
  return std::move(*response.mutable_value());
}

absl::StatusOr<v1::JobInfo> GrpcCoordinationClient::GetJob() {
  v1::GetJobRequest request;
  request.set_job_id(job_id_);
  std::unique_ptr<grpc::ClientContext> context = NewContext(rpc_timeout_);
  v1::JobInfo response;
  grpc::Status status = stub_->GetJob(context.get(), request, &response);
  if (!status.ok()) return ToAbsl(status, "GetJob", address_, rpc_timeout_);
  return response;
}

absl::StatusOr<v1::ReplanResponse> GrpcCoordinationClient::Replan(
    const v1::ReplanRequest& request) {
  std::unique_ptr<grpc::ClientContext> context = NewContext(rpc_timeout_);
  v1::ReplanResponse response;
  grpc::Status status =
      stub_->Replan(context.get(), WithJobId(request, job_id_), &response);
  if (!status.ok()) return ToAbsl(status, "Replan", address_, rpc_timeout_);
  return response;
}

absl::StatusOr<v1::Plan> GrpcCoordinationClient::GetPlan() {
  v1::GetPlanRequest request;
  request.set_job_id(job_id_);
  std::unique_ptr<grpc::ClientContext> context = NewContext(rpc_timeout_);
  v1::Plan response;
  grpc::Status status = stub_->GetPlan(context.get(), request, &response);
  if (!status.ok()) return ToAbsl(status, "GetPlan", address_, rpc_timeout_);
  return response;
}

absl::StatusOr<v1::GetAssignmentsResponse>
GrpcCoordinationClient::GetAssignments() {
  v1::GetAssignmentsRequest request;
  request.set_job_id(job_id_);
  std::unique_ptr<grpc::ClientContext> context = NewContext(rpc_timeout_);
  v1::GetAssignmentsResponse response;
  grpc::Status status =
      stub_->GetAssignments(context.get(), request, &response);
  if (!status.ok()) {
    return ToAbsl(status, "GetAssignments", address_, rpc_timeout_);
  }
  return response;
}

absl::StatusOr<v1::ListRanksResponse> GrpcCoordinationClient::ListRanks() {
  v1::ListRanksRequest request;
  request.set_job_id(job_id_);
  std::unique_ptr<grpc::ClientContext> context = NewContext(rpc_timeout_);
  v1::ListRanksResponse response;
  grpc::Status status = stub_->ListRanks(context.get(), request, &response);
  if (!status.ok()) return ToAbsl(status, "ListRanks", address_, rpc_timeout_);
  return response;
}

absl::StatusOr<v1::GetReportsResponse> GrpcCoordinationClient::GetReports(
    int rank, int last_steps) {
  v1::GetReportsRequest request;
  request.set_job_id(job_id_);
  request.set_rank(rank);
  request.set_last_steps(last_steps);
  std::unique_ptr<grpc::ClientContext> context = NewContext(rpc_timeout_);
  v1::GetReportsResponse response;
  grpc::Status status = stub_->GetReports(context.get(), request, &response);
  if (!status.ok()) return ToAbsl(status, "GetReports", address_, rpc_timeout_);
  return response;
}

}  // namespace muon
