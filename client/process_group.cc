#include "client/process_group.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/gloo_communicator.h"
#include "client/grpc_coordination_client.h"
#include "common/status_macros.h"

namespace muon {
namespace {

absl::Status WritePortFile(const std::string& path, int port) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream out(tmp);
    out << port << "\n";
    if (!out.good()) {
      return absl::InternalError(absl::StrCat("cannot write port file ", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ProcessGroup>> InitProcessGroup(
    const ProcessGroupOptions& options) {
  if (options.world_size < 1 || options.rank < 0 ||
      options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " is out of range for world size ",
                     options.world_size));
  }
  auto pg = std::make_unique<ProcessGroup>();
  pg->rank = options.rank;
  pg->world_size = options.world_size;
  pg->incarnation =
      options.incarnation != 0
          ? options.incarnation
          : (static_cast<uint64_t>(getpid()) << 32) ^
                static_cast<uint64_t>(absl::GetCurrentTimeNanos());
  if (options.embed_coordinator && options.rank == 0) {
    if (!options.start_embedded_coordinator) {
      return absl::FailedPreconditionError(
          "rank 0: embed_coordinator is set but start_embedded_coordinator "
          "is not (depend on //server:embedded_coordinator and pass "
          "muon::StartEmbeddedCoordinator, or name a coordinator address)");
    }
    EmbeddedCoordinatorOptions embedded;
    embedded.host = options.embedded_host;
    embedded.port = options.embedded_port;
    embedded.job_id = options.job_id;
    embedded.world_size = options.world_size;
    MUON_ASSIGN_OR_RETURN(pg->embedded_coordinator,
                          options.start_embedded_coordinator(embedded));
    if (!options.port_file.empty()) {
      MUON_RETURN_IF_ERROR(
          WritePortFile(options.port_file, pg->embedded_coordinator->port()));
    }
    pg->coordinator = pg->embedded_coordinator->NewLocalClient();
  } else {
    if (options.coordinator_address.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", options.rank,
          ": no coordinator address (pass --coordinator host:port, or embed "
          "the coordinator in rank 0)"));
    }
    MUON_ASSIGN_OR_RETURN(pg->coordinator,
                          GrpcCoordinationClient::Create(
                              options.coordinator_address, options.job_id));
  }
  GlooOptions gloo;
  gloo.timeout = options.timeout;
  MUON_ASSIGN_OR_RETURN(
      pg->comm, GlooCommunicator::Create(options.rank, options.world_size,
                                         pg->coordinator.get(), gloo));
  return pg;
}

}  // namespace muon
