#include "client/process_group.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>

#include "absl/strings/numbers.h"
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

namespace {

// The integer value of environment variable `name`; `fallback` when unset
// (nullopt fallback = required).
absl::StatusOr<int> EnvInt(const char* name, std::optional<int> fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    if (fallback.has_value()) return *fallback;
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable ", name,
                     " is not set (torchrun and muonrun set "
                     "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)"));
  }
  int x = 0;
  if (!absl::SimpleAtoi(v, &x)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "environment variable ", name, "=\"", v, "\" is not an integer"));
  }
  return x;
}

std::string EnvString(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v == nullptr || *v == '\0' ? fallback : std::string(v);
}

}  // namespace

absl::StatusOr<ProcessGroupOptions> ProcessGroupOptionsFromEnv() {
  ProcessGroupOptions o;
  MUON_ASSIGN_OR_RETURN(o.world_size, EnvInt("WORLD_SIZE", std::nullopt));
  MUON_ASSIGN_OR_RETURN(o.rank, EnvInt("RANK", std::nullopt));
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment: RANK=", o.rank,
                     " is out of range for WORLD_SIZE=", o.world_size));
  }
  MUON_ASSIGN_OR_RETURN(const int local_world,
                        EnvInt("LOCAL_WORLD_SIZE", o.world_size));
  MUON_ASSIGN_OR_RETURN(const int local_rank, EnvInt("LOCAL_RANK", 0));
  if (local_world < 1 || local_world > o.world_size || local_rank < 0 ||
      local_rank >= local_world) {
    return absl::InvalidArgumentError(absl::StrCat(
        "environment: LOCAL_RANK=", local_rank, " / LOCAL_WORLD_SIZE=",
        local_world, " do not fit WORLD_SIZE=", o.world_size));
  }
  o.job_id = EnvString("MUON_JOB_ID", "job");
  const std::string daemon = EnvString("MUON_COORDINATOR", "");
  if (!daemon.empty()) {
    o.coordinator_address = daemon;
    return o;
  }
  const std::string master = EnvString("MASTER_ADDR", "127.0.0.1");
  MUON_ASSIGN_OR_RETURN(const int master_port,
                        EnvInt("MASTER_PORT", std::nullopt));
  // torch.distributed's TCPStore listens on MASTER_PORT in the same job, so
  // the coordinator takes the next port unless MUON_COORDINATOR_PORT says.
  MUON_ASSIGN_OR_RETURN(const int port,
                        EnvInt("MUON_COORDINATOR_PORT", master_port + 1));
  if (master_port < 1 || master_port > 65535 || port < 1 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "environment: MASTER_PORT=", master_port, " / coordinator port ", port,
        " is not a TCP port (1..65535)"));
  }
  o.embed_coordinator = true;
  o.embedded_host = master;
  o.embedded_port = port;
  o.coordinator_address = absl::StrCat(master, ":", port);
  return o;
}

}  // namespace muon
