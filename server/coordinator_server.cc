#include "server/coordinator_server.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <iostream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/host_port.h"
#include "common/status_macros.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "server/grpc_service.h"

namespace muon {
namespace {

// Plaintext, or TLS from the PEM files in `tls`.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const TlsFiles& tls) {
  if (tls.cert_file.empty() && tls.key_file.empty()) {
    return grpc::InsecureServerCredentials();
  }
  if (tls.cert_file.empty() || tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs both a certificate file and a key file");
  }
  MUON_ASSIGN_OR_RETURN(std::string cert, ReadPemFile(tls.cert_file));
  MUON_ASSIGN_OR_RETURN(std::string key, ReadPemFile(tls.key_file));
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({std::move(key), std::move(cert)});
  return grpc::SslServerCredentials(ssl);
}

// HTTP/2 settings of the coordinator's connections, for many long-lived,
// mostly idle ones (one per host agent or rank, each with a heartbeat
// stream):
// - no keepalive pings from the server: while they are on, gRPC's chttp2
//   transport re-arms the connection's keepalive timer on every read (one
//   timer cancel and insert per heartbeat). A silent host's ranks are
//   named lost by the coordinator's heartbeat timeout instead; a host that
//   vanished without closing its connection keeps its stream (a few KB)
//   until the coordinator stops.
// - no BDP (bandwidth-delay product) probing of what the server receives:
//   it sends a ping and arms a timer per burst of data read, i.e. per
//   heartbeat. The requests a coordinator receives are small (manifests
//   of at most a few MB, once per rank); the responses it sends are sized
//   by the client's own flow control, which is left as it is.
// Measured with tools/coordinator_load_bench (16,384 host streams, one
// heartbeat per second each): together 40% less coordinator CPU per
// heartbeat (docs/scale.md).
void AddHttp2Settings(grpc::ServerBuilder* builder) {
  builder->AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, INT_MAX);
}

// Start's checks of `options` that need no I/O (see Start's errors).
absl::Status CheckServerOptions(const CoordinatorServerOptions& options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("port ", options.port, " is outside [0, 65535]"));
  }
  if (options.host.empty()) {
    return absl::InvalidArgumentError("host is empty");
  }
  if (options.max_message_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("max_message_bytes is ",
                                                   options.max_message_bytes,
                                                   "; must be positive"));
  }
  // A blank secret is no secret (an empty one turns authentication off).
  if (!options.auth.job_secret.empty()) {
    MUON_RETURN_IF_ERROR(CheckJobSecret(options.auth.job_secret,
                                        "the coordinator's job secret"));
  }
  if (!options.auth.read_token.empty()) {
    MUON_RETURN_IF_ERROR(CheckJobSecret(options.auth.read_token,
                                        "the coordinator's read-only token"));
  }
  return absl::OkStatus();
}

}  // namespace

bool IsLoopbackHost(const std::string& host) {
  return absl::StartsWith(host, "127.") || host == "::1" || host == "[::1]" ||
         host == "localhost";
}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const CoordinatorServerOptions& options) {
  MUON_RETURN_IF_ERROR(CheckServerOptions(options));
  MUON_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                        ServerCredentials(options.tls));
  if (options.tls.cert_file.empty() && !IsLoopbackHost(options.host)) {
    std::cerr << "muon coordinator: warning: listening on " << options.host
              << " without TLS: secrets and plans travel in plaintext "
                 "(set a TLS certificate and key)"
              << std::endl;
  }
  CoordinatorService::Options service_options = options.service;
  service_options.max_response_bytes =
      std::min(service_options.max_response_bytes,
               static_cast<size_t>(options.max_message_bytes));
  auto service = std::make_unique<CoordinatorService>(service_options);
  auto grpc_service =
      std::make_unique<CoordinatorGrpcService>(service.get(), options.auth);

  grpc::EnableDefaultHealthCheckService(true);
  // Server reflection (grpc.reflection.v1alpha.ServerReflection): grpcurl
  // and grpc_cli list and call muon.v1.Coordinator without its .proto. The
  // plugin is process-wide: every server built after this call has it.
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int bound_port = 0;
  const std::string target = HostPort(options.host, options.port);
  builder.AddListeningPort(target, credentials, &bound_port);
  // gRPC sets SO_REUSEPORT by default: a second coordinator on the same
  // port would then share it silently. Refuse instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  AddHttp2Settings(&builder);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.RegisterService(grpc_service.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound_port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", target, " (address in use or not local?)"));
  }
  return std::unique_ptr<CoordinatorServer>(
      new CoordinatorServer(options.host, bound_port, std::move(service),
                            std::move(grpc_service), std::move(server)));
}

CoordinatorServer::CoordinatorServer(
    std::string host, int port, std::unique_ptr<CoordinatorService> service,
    std::unique_ptr<CoordinatorGrpcService> grpc_service,
    std::unique_ptr<grpc::Server> server)
    : host_(std::move(host)),
      port_(port),
      service_(std::move(service)),
      grpc_service_(std::move(grpc_service)),
      server_(std::move(server)) {}

CoordinatorServer::~CoordinatorServer() { Stop(); }

std::string CoordinatorServer::address() const {
  return HostPort(host_, port_);
}

void CoordinatorServer::Stop() {
  absl::MutexLock lock(&mu_);
  if (server_ == nullptr) return;
  // Wake handlers blocked in the core first so Shutdown need not wait.
  service_->Shutdown();
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server_->Wait();
  server_.reset();
}

}  // namespace muon
