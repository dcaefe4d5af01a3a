// A running coordinator: the core CoordinatorService behind a gRPC server
// listening on host:port (plus gRPC's standard health service,
// grpc.health.v1.Health, reporting SERVING while up, and server reflection,
// grpc.reflection.v1alpha.ServerReflection, listing muon.v1.Coordinator).
//
// Used by the muon-coordinator daemon and by rank 0's process in embedded
// mode (where rank 0 may also call service() directly through
// LocalCoordinationClient).
//
// Lifecycle: Start (binds and serves) -> use -> Stop (wakes blocked Join and
// KeyGet calls with Unavailable, then shuts the server down; also run by the
// destructor).
// Thread-safety: every method may be called from any thread; Stop is
// idempotent.
#ifndef MUON_SERVER_COORDINATOR_SERVER_H_
#define MUON_SERVER_COORDINATOR_SERVER_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordination/credentials.h"
#include "server/coordinator_service.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace muon {

class CoordinatorGrpcService;

struct CoordinatorServerOptions {
  // Address to listen on. Defaults to loopback: exposing the coordinator on
  // other interfaces is an explicit choice.
  std::string host = "127.0.0.1";
  // Port; 0 picks a free one (read it back with port()).
  int port = 0;
  // The core service's options (job id, world size, timeouts, planner).
  CoordinatorService::Options service;
  // Tokens the server accepts (coordination/credentials.h); an empty job
  // secret serves without authentication (in-process tests only).
  CoordinatorAuth auth;
  // TLS: with cert_file and key_file set the server speaks TLS only
  // (gRPC SSL server credentials); empty: plaintext.
  TlsFiles tls;
  // Largest request accepted, bytes (gRPC's receive limit; responses are
  // bounded by the same value, and GetReports refuses a larger answer:
  // service.max_response_bytes is lowered to it). Must be positive.
  int max_message_bytes = 64 << 20;
};

// Whether `host` is a loopback address or name (127.0.0.0/8, ::1,
// "localhost"); binding anything else without TLS logs a warning.
bool IsLoopbackHost(const std::string& host);

class CoordinatorServer {
 public:
  // Creates the service and starts serving on options.host:options.port.
  // Errors:
  //   InvalidArgument: port outside [0, 65535], an empty host,
  //     max_message_bytes <= 0, a job secret or read token of only
  //     whitespace, a TLS cert without its key (or the reverse), unreadable
  //     PEM files (names them).
  //   Unavailable: the address cannot be bound (names it).
  // Binding a non-loopback host without TLS prints a warning to stderr.
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(
      const CoordinatorServerOptions& options);

  CoordinatorServer(const CoordinatorServer&) = delete;
  CoordinatorServer& operator=(const CoordinatorServer&) = delete;
  // Stops the server.
  ~CoordinatorServer();

  // The bound port (the chosen one when options.port was 0).
  int port() const { return port_; }
  // "host:port" ("[::1]:port" for IPv6 hosts), usable as a gRPC target.
  std::string address() const;
  // The core service; owned by this server, valid until destruction.
  CoordinatorService* service() { return service_.get(); }

  // Makes blocked Join/KeyGet calls return Unavailable, stops accepting
  // RPCs and waits for in-flight handlers (at most ~1 s before cancelling
  // them). Idempotent.
  void Stop();

 private:
  CoordinatorServer(std::string host, int port,
                    std::unique_ptr<CoordinatorService> service,
                    std::unique_ptr<CoordinatorGrpcService> grpc_service,
                    std::unique_ptr<grpc::Server> server);

  const std::string host_;
  const int port_;
  std::unique_ptr<CoordinatorService> service_;
  std::unique_ptr<CoordinatorGrpcService> grpc_service_;
  absl::Mutex mu_;
  std::unique_ptr<grpc::Server> server_ ABSL_GUARDED_BY(mu_);
};

}  // namespace muon

#endif  // MUON_SERVER_COORDINATOR_SERVER_H_
