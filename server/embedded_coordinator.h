// Rank 0's embedded coordinator: the standard EmbeddedCoordinatorStarter
// (coordination/embedded_coordinator.h). It runs a CoordinatorServer (the
// core service behind gRPC on host:port, plus the gRPC health service) in
// the trainer's process; the hosting rank calls the core directly through
// LocalCoordinationClient, the other ranks connect over gRPC.
//
// Only binaries that embed the coordinator depend on this target (it links
// the gRPC server); pass it to InitProcessGroup through
// ProcessGroupOptions::start_embedded_coordinator.
//
// Lifecycle and thread-safety: as EmbeddedCoordinator.
#ifndef MUON_SERVER_EMBEDDED_COORDINATOR_H_
#define MUON_SERVER_EMBEDDED_COORDINATOR_H_

#include <memory>

#include "absl/status/statusor.h"
#include "coordination/embedded_coordinator.h"

namespace muon {

// Starts a coordinator serving options.job_id for options.world_size ranks
// on options.host:options.port, with the CoordinatorService defaults
// otherwise (server/coordinator_service.h).
// Errors:
//   InvalidArgument: port outside [0, 65535] or an empty host.
//   Unavailable: the address cannot be bound (names it).
absl::StatusOr<std::unique_ptr<EmbeddedCoordinator>> StartEmbeddedCoordinator(
    const EmbeddedCoordinatorOptions& options);

}  // namespace muon

#endif  // MUON_SERVER_EMBEDDED_COORDINATOR_H_
