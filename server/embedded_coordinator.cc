#include "server/embedded_coordinator.h"

#include <string>
#include <utility>

#include "common/status_macros.h"
#include "server/coordinator_server.h"
#include "server/local_coordination_client.h"

namespace muon {
namespace {

class ServerEmbeddedCoordinator final : public EmbeddedCoordinator {
 public:
  explicit ServerEmbeddedCoordinator(std::unique_ptr<CoordinatorServer> server)
      : server_(std::move(server)) {}

  int port() const override { return server_->port(); }
  std::string address() const override { return server_->address(); }
  std::unique_ptr<CoordinationClient> NewLocalClient() override {
    return std::make_unique<LocalCoordinationClient>(server_->service());
  }

 private:
  const std::unique_ptr<CoordinatorServer> server_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<EmbeddedCoordinator>> StartEmbeddedCoordinator(
    const EmbeddedCoordinatorOptions& options) {
  CoordinatorServerOptions server_options;
  server_options.host = options.host;
  server_options.port = options.port;
  server_options.service.job_id = options.job_id;
  server_options.service.world_size = options.world_size;
  server_options.auth = options.auth;
  server_options.tls = options.tls;
  MUON_ASSIGN_OR_RETURN(std::unique_ptr<CoordinatorServer> server,
                        CoordinatorServer::Start(server_options));
  return std::unique_ptr<EmbeddedCoordinator>(
      new ServerEmbeddedCoordinator(std::move(server)));
}

}  // namespace muon
