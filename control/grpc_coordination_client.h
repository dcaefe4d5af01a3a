// CoordinationClient over gRPC: talks to a muon-coordinator daemon or to
// rank 0's embedded CoordinatorServer. Every RPC carries the token of
// GrpcClientSecurity (`authorization: Bearer <token>`, see
// coordination/credentials.h); the channel is plaintext unless a TLS CA file
// is given.
//
// Deadlines: every RPC gets rpc_timeout, except Join (request.timeout_ms, or
// 60 s when 0, plus rpc_timeout) and KeyGet (its timeout plus rpc_timeout),
// so the server's own wait ends first and its error (naming the missing
// ranks or key) is what the caller sees. Join waits for the channel to
// become ready (wait_for_ready) so ranks may start before the coordinator
// listens; other RPCs fail fast with Unavailable.
//
// Lifecycle: Create -> calls -> destroy (no background threads of ours).
// Thread-safety: every method may be called concurrently.
#ifndef MUON_CONTROL_GRPC_COORDINATION_CLIENT_H_
#define MUON_CONTROL_GRPC_COORDINATION_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordination/coordination_client.h"
#include "muon/v1/coordinator.grpc.pb.h"

namespace grpc {
class Channel;
class ChannelArguments;
class ClientContext;
}  // namespace grpc

namespace muon {

// How the client proves itself and checks the server.
struct GrpcClientSecurity {
  // The job secret (ranks) or the read-only token (muonctl); empty: none.
  std::string token;
  // PEM CA certificate to verify the coordinator's TLS certificate; empty:
  // plaintext.
  std::string tls_ca_file;
  // Name the server's certificate must carry, when it differs from the
  // address's host (gRPC's ssl_target_name_override).
  std::string tls_server_name;
};

// The arguments of every channel to the coordinator: messages up to 64 MiB
// either way (large manifests and plans), and no BDP (bandwidth-delay
// product) probing of the responses: gRPC's chttp2 transport would send a
// ping and arm a timer per burst of data read, i.e. per heartbeat answer
// (measured with tools/coordinator_load_bench: 25% of a host's heartbeat
// CPU, and the coordinator's ping acks). The receive window then stays at
// its initial size, which costs a large plan a few more round trips. No
// keepalive pings either: the transport would cancel and re-arm its
// keepalive timer on every read (12% of a host's heartbeat CPU, same
// bench); every call has its deadline and a host's heartbeat exchange its
// timeout, which find a silent coordinator.
void SetCoordinatorChannelArgs(grpc::ChannelArguments* args);

// A channel to the coordinator at `address` ("host:port", or
// "unix:/path" for a host agent's socket) with `security`'s TLS (the
// token is sent per call, not here) and SetCoordinatorChannelArgs. Does not
// connect yet.
// Errors: InvalidArgument for an empty address or an unreadable CA file
// (naming it).
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeCoordinatorChannel(
    const std::string& address, const GrpcClientSecurity& security);

class GrpcCoordinationClient final : public CoordinationClient {
 public:
  // Makes a client for the coordinator at `address` ("host:port") serving
  // job `job_id` (stamped on requests that carry no job id). Does not
  // connect yet: connection errors surface on the first RPC.
  // Errors:
  //   InvalidArgument: empty address or rpc_timeout <= 0; an unreadable CA
  //     file (names it).
  static absl::StatusOr<std::unique_ptr<GrpcCoordinationClient>> Create(
      const std::string& address, const std::string& job_id,
      absl::Duration rpc_timeout = absl::Seconds(10),
      const GrpcClientSecurity& security = GrpcClientSecurity());

  // Errors: as CoordinationClient; the server's codes and messages are kept;
  // Unavailable (names the address) when the coordinator cannot be reached;
  // DeadlineExceeded when the RPC itself timed out.
  absl::StatusOr<v1::JoinResponse> Join(
      const v1::JoinRequest& request) override;
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(
      const v1::HeartbeatRequest& request) override;
  absl::Status ReportStep(const v1::StepReport& report) override;
  absl::Status KeySet(const std::string& key,
                      const std::string& value) override;
  absl::StatusOr<std::string> KeyGet(const std::string& key,
                                     absl::Duration timeout) override;
  absl::StatusOr<v1::JobInfo> GetJob() override;
  absl::StatusOr<v1::Plan> GetPlan() override;
  absl::StatusOr<v1::JobSpec> GetJobSpec() override;
  absl::StatusOr<v1::GetAssignmentsResponse> GetAssignments() override;
  absl::StatusOr<v1::ListRanksResponse> ListRanks() override;
  absl::StatusOr<v1::GetReportsResponse> GetReports(int rank,
                                                    int last_steps) override;
  absl::StatusOr<v1::ReplanResponse> Replan(
      const v1::ReplanRequest& request) override;

  const std::string& address() const { return address_; }

 private:
  GrpcCoordinationClient(std::string address, std::string job_id,
                         absl::Duration rpc_timeout, std::string token,
                         std::shared_ptr<grpc::Channel> channel);
  // A context with the deadline and the authorization metadata.
  std::unique_ptr<grpc::ClientContext> NewContext(absl::Duration timeout) const;

  // One unary RPC: `method` of the stub with `request` (this client's job id
  // stamped when it carries none), the deadline `timeout` from now;
  // `wait_for_ready` waits for a coordinator that does not listen yet.
  // Returns the response, or the RPC's error as ToAbsl maps it (names
  // `name`, the address and the deadline).
  template <typename Request, typename Response>
  absl::StatusOr<Response> Call(
      grpc::Status (v1::Coordinator::Stub::*method)(grpc::ClientContext*,
                                                    const Request&, Response*),
      const char* name, Request request, absl::Duration timeout,
      bool wait_for_ready = false) const;

  const std::string address_;
  const std::string job_id_;
  const absl::Duration rpc_timeout_;
  const std::string token_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

}  // namespace muon

#endif  // MUON_CONTROL_GRPC_COORDINATION_CLIENT_H_
