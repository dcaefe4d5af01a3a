#include "server/coordinator_server.h"

#include <chrono>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "server/grpc_service.h"

namespace muon {
namespace {

constexpr int kMaxMessageBytes = 64 << 20;  // large manifests and plans

std::string HostPort(const std::string& host, int port) {
  if (absl::StrContains(host, ':') && !absl::StartsWith(host, "[")) {
    return absl::StrCat("[", host, "]:", port);  // IPv6 literal
  }
  return absl::StrCat(host, ":", port);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const CoordinatorServerOptions& options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("port ", options.port, " is outside [0, 65535]"));
  }
  if (options.host.empty()) {
    return absl::InvalidArgumentError("host is empty");
  }
  auto service = std::make_unique<CoordinatorService>(options.service);
  auto grpc_service = std::make_unique<CoordinatorGrpcService>(service.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int bound_port = 0;
  const std::string target = HostPort(options.host, options.port);
  builder.AddListeningPort(target, grpc::InsecureServerCredentials(),
                           &bound_port);
  // gRPC sets SO_REUSEPORT by default: a second coordinator on the same
  // port would then share it silently. Refuse instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
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
