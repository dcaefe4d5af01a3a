// A coordinator hosted inside a trainer's process: rank 0's in embedded
// mode (rank 0 embeds the coordinator unless a muon-coordinator daemon is
// named). The interface lives in coordination/ so that client/
// (InitProcessGroup, control/process_group.h) can start, use and own one
// without linking the gRPC server: server/embedded_coordinator.h implements
// it (StartEmbeddedCoordinator), and only the binaries that embed the
// coordinator depend on that target. A trainer that talks to a remote
// muon-coordinator daemon links no server code.
//
// Who talks to whom: the hosting rank calls the coordinator in process
// through NewLocalClient(); the other ranks (and muonctl) reach it over
// gRPC at address().
//
// Lifecycle: an EmbeddedCoordinatorStarter starts it (bound and serving) ->
// use -> destroy it after every client made by NewLocalClient() (stops
// serving; blocked Join and KeyGet calls get Unavailable).
// Thread-safety: every method may be called concurrently.
#ifndef MUON_COORDINATION_EMBEDDED_COORDINATOR_H_
#define MUON_COORDINATION_EMBEDDED_COORDINATOR_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "coordination/coordination_client.h"
#include "coordination/credentials.h"

namespace muon {

class EmbeddedCoordinator {
 public:
  virtual ~EmbeddedCoordinator() = default;

  // The bound TCP port (the chosen one when the requested port was 0).
  virtual int port() const = 0;
  // "host:port", a gRPC target for the other ranks.
  virtual std::string address() const = 0;
  // A client calling this coordinator in process (no loopback RPC). It must
  // not outlive this object.
  virtual std::unique_ptr<CoordinationClient> NewLocalClient() = 0;
};

struct EmbeddedCoordinatorOptions {
  // Interface to listen on; loopback unless told otherwise.
  std::string host = "127.0.0.1";
  // Port; 0 picks a free one (read it back with port()).
  int port = 0;
  // The job it serves; requests naming another job are rejected.
  std::string job_id = "job";
  // Number of ranks; 0 = taken from the first Join.
  int world_size = 0;
  // Tokens accepted (coordination/credentials.h); an empty job secret
  // accepts any caller.
  CoordinatorAuth auth;
  // TLS certificate and key to serve with; empty: plaintext.
  TlsFiles tls;
};

// Starts an embedded coordinator. The standard one is
// muon::StartEmbeddedCoordinator (server/embedded_coordinator.h).
// Errors: InvalidArgument (empty host, port outside [0, 65535]);
//   Unavailable (the address cannot be bound; names it).
using EmbeddedCoordinatorStarter =
    std::function<absl::StatusOr<std::unique_ptr<EmbeddedCoordinator>>(
        const EmbeddedCoordinatorOptions&)>;

}  // namespace muon

#endif  // MUON_COORDINATION_EMBEDDED_COORDINATOR_H_
