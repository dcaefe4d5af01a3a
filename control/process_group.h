// Starting a rank of a distributed Muon job: the C++ counterpart of
// torch.distributed.init_process_group. Connects the rank to the
// coordinator (a separate muon-coordinator daemon, or one embedded in
// rank 0's process) and builds the Gloo process group over TCP, whose
// rendezvous goes through the coordinator's key-value store. Gloo binds the
// address of the interface that reaches the coordinator's host, or of the
// interface GLOO_SOCKET_IFNAME names (SelectGlooHost), so ranks on several
// hosts reach each other; on one machine that is 127.0.0.1.
//
// This target links no gRPC server: a rank that talks to a remote daemon
// needs none. To embed the coordinator in rank 0, also depend on
// //server:embedded_coordinator and pass its starter:
//   options.embed_coordinator = true;
//   options.start_embedded_coordinator = muon::StartEmbeddedCoordinator;
//
// Lifecycle: InitProcessGroup -> use comm/coordinator (e.g. Muon::Create) ->
// destroy the ProcessGroup (stops an embedded coordinator last).
#ifndef MUON_CONTROL_PROCESS_GROUP_H_
#define MUON_CONTROL_PROCESS_GROUP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "coordination/coordination_client.h"
#include "coordination/credentials.h"
#include "coordination/embedded_coordinator.h"

namespace muon {

// Which collectives carry the step's data (torch.distributed's backend).
enum class ProcessGroupBackend {
  // Gloo over TCP on host memory: CPU parameters.
  kGloo,
  // NCCL on CUDA device ProcessGroupOptions::cuda_device: CUDA parameters.
  // A Gloo group over the same ranks comes with it for the step's control
  // values (ProcessGroup::control_comm), as c10d keeps Gloo beside NCCL.
  kNccl,
};

// "gloo" or "nccl" (torch.distributed's spellings).
// Errors: InvalidArgument naming the value and the choices.
absl::StatusOr<ProcessGroupBackend> ParseProcessGroupBackend(
    absl::string_view name);

// Where rank 0 publishes the address of the coordinator it embeds and the
// other ranks find it: the job's key-value store (torch.distributed's
// TCPStore under torchrun, through the C ABI; a file in muonrun's private
// directory on one node: FileAddressExchange). With one, rank 0 binds a
// port the kernel picks, so no fixed port can be held by another job.
// InitProcessGroup calls `publish` on rank 0 once the coordinator listens,
// and `lookup` once on every other rank, on the calling thread.
struct CoordinatorAddressExchange {
  // Rank 0: stores `address` ("host:port"). Errors: the store's.
  std::function<absl::Status(const std::string& address)> publish;
  // Other ranks: waits up to `timeout` for the address rank 0 published.
  // Errors: DeadlineExceeded (nothing published: rank 0 has not started,
  // or failed before its coordinator listened); the store's.
  std::function<absl::StatusOr<std::string>(absl::Duration timeout)> lookup;

  bool enabled() const { return publish && lookup; }
};

// The exchange through a file on a file system every rank sees (muonrun's
// private directory on one node): rank 0 writes "host:port" to `path`
// atomically (a temporary file renamed), the others poll for it (20 ms to
// 200 ms apart). The file is path.<generation>; generation 0 (the
// default) numbers the exchanges of this process on `path` in the order
// they are used (1, 2, ...), so a job that initializes its process group
// again, the same number of times on every rank, never reads an address of
// before. (Ranks run as threads of one process pass one generation > 0.)
// The files must not exist before the job: a lookup takes whatever address
// is there (muonrun's private directory is new for every run).
// Errors of lookup: DeadlineExceeded naming the file; InvalidArgument when
// its content is not host:port.
CoordinatorAddressExchange FileAddressExchange(const std::string& path,
                                               int generation = 0);

struct ProcessGroupOptions {
  int rank = 0;
  int world_size = 1;
  // The job id stamped on requests. Empty (the default) means "the
  // coordinator's job": a muon-coordinator daemon started with any --job_id
  // accepts the ranks; an explicit id that differs from the daemon's is
  // rejected (InvalidArgument naming both). Rank 0's embedded coordinator
  // serves "job" when this is empty.
  std::string job_id;
  // host:port of the coordinator. Empty on rank 0 with embed_coordinator.
  std::string coordinator_address;
  // Rank 0 hosts the coordinator in-process (the default of the main job);
  // the other ranks connect to coordinator_address. Needs
  // start_embedded_coordinator on rank 0.
  bool embed_coordinator = false;
  // Starts rank 0's embedded coordinator: muon::StartEmbeddedCoordinator
  // (//server:embedded_coordinator, which links the gRPC server). Unused
  // unless embed_coordinator is set on rank 0.
  EmbeddedCoordinatorStarter start_embedded_coordinator;
  // Embedded coordinator: interface and port (0 = a free port).
  std::string embedded_host = "127.0.0.1";
  int embedded_port = 0;
  // Embedded coordinator: file to write the bound port to (atomically), so
  // a launcher can hand the address to the other ranks. Empty = none.
  std::string port_file;
  // With embed_coordinator: rank 0 publishes its coordinator's address
  // (embedded_host:bound port) here and the other ranks look it up instead
  // of using coordinator_address. Disabled (empty) by default.
  CoordinatorAddressExchange address_exchange;
  // Address Gloo binds and advertises to its peers: an address of the
  // interface that reaches the other hosts. Empty = the address of the
  // interface named by GLOO_SOCKET_IFNAME if set, else of the interface
  // that routes to the coordinator's host (127.0.0.1 on one machine); see
  // SelectGlooHost.
  std::string gloo_host;
  // Bound on rendezvous and every collective.
  absl::Duration timeout = absl::Seconds(60);
  // The data path's collectives; kNccl runs them on CUDA device
  // `cuda_device` (an ordinal among the visible devices; torchrun's
  // convention is LOCAL_RANK, which ProcessGroupOptionsFromEnv sets).
  ProcessGroupBackend backend = ProcessGroupBackend::kGloo;
  int cuda_device = 0;
  // Fresh per process start (heartbeats carry it). 0 = derived from pid and
  // time.
  uint64_t incarnation = 0;
  // The job secret every coordinator RPC carries and rank 0's embedded
  // coordinator requires (coordination/credentials.h). Empty = taken from
  // MUON_JOB_SECRET or MUON_JOB_SECRET_FILE; when those are unset too, no
  // secret: an embedded coordinator then accepts any caller that reaches it
  // and says so on stderr (muonrun always sets one). A secret of only
  // whitespace, here or in those variables, is refused (InvalidArgument).
  std::string job_secret;
  // TLS (PEM files): ca_file verifies the coordinator (MUON_TLS_CA_FILE);
  // cert_file and key_file make rank 0's embedded coordinator serve TLS
  // (MUON_TLS_CERT_FILE, MUON_TLS_KEY_FILE). Empty = taken from those
  // variables; unset = plaintext.
  TlsFiles tls;
};

struct ProcessGroup {
  int rank = 0;
  int world_size = 1;
  // host:port of the coordinator this rank talks to (rank 0 with an
  // embedded one: its host and bound port), e.g. for `muonctl --coordinator`.
  std::string coordinator_address;
  uint64_t incarnation = 0;
  // Destruction order matters: members are destroyed bottom-up, so the
  // communicator goes first and the embedded coordinator last.
  std::unique_ptr<EmbeddedCoordinator> embedded_coordinator;  // rank 0 only
  std::unique_ptr<CoordinationClient> coordinator;
  // The data path: Gloo, or NCCL with options.backend == kNccl.
  std::unique_ptr<Communicator> comm;
  // With NCCL: a Gloo group over the same ranks for the control values
  // (DistributedState::control_communicator); nullptr with Gloo, whose
  // `comm` serves both.
  std::unique_ptr<Communicator> control_comm;

  // The host-memory group for control values: control_comm, else comm.
  Communicator* control() const {
    return control_comm != nullptr ? control_comm.get() : comm.get();
  }
};

// A rank that connects to a coordinator first waits (up to
// options.timeout) until its TCP port accepts connections, so ranks may be
// started in any order, on any host (as torchrun starts them).
// With backend kNccl the NCCL group joins after the Gloo group, through the
// same coordinator's key-value store.
// Errors: InvalidArgument (rank out of range, no coordinator address on a
// rank that does not embed one, GLOO_SOCKET_IFNAME names no interface with
// an IPv4 address, a negative cuda_device, a blank job secret or one read
// from the environment: JobSecretFromEnv, CheckJobSecret); those of
// NcclCommunicator::Create with kNccl (Unimplemented in a build without
// --config=cuda; FailedPrecondition without that GPU); FailedPrecondition
// (embed_coordinator on rank 0 without start_embedded_coordinator); the
// starter's errors (e.g. Unavailable: the port cannot be bound); Unavailable /
// DeadlineExceeded when the coordinator or a peer cannot be reached within
// options.timeout, or there is no route to the coordinator's host.
absl::StatusOr<std::unique_ptr<ProcessGroup>> InitProcessGroup(
    const ProcessGroupOptions& options);

// ProcessGroupOptions from torchrun's environment (the variables torchrun
// and muonrun set; env:// of torch.distributed):
//   RANK, WORLD_SIZE: required integers, 0 <= RANK < WORLD_SIZE.
//   MASTER_ADDR (default 127.0.0.1), MASTER_PORT (required unless
//     MUON_COORDINATOR is set): rank 0 embeds the coordinator listening on
//     MASTER_ADDR:(MASTER_PORT + 1) (torch.distributed's TCPStore holds
//     MASTER_PORT itself), or on MUON_COORDINATOR_PORT when set; the other
//     ranks connect to it.
//   MUON_COORDINATOR_FILE (muonrun sets it on one node): rank 0 embeds the
//     coordinator on MASTER_ADDR at a port the kernel picks and writes its
//     address to this file (FileAddressExchange); the other ranks read it
//     there. Ignored when MUON_COORDINATOR_PORT is set.
//   MUON_COORDINATOR: host:port of a muon-coordinator daemon instead (no
//     rank embeds one).
//   MUON_JOB_ID: the job id (default empty: the coordinator's job).
//   LOCAL_RANK, LOCAL_WORLD_SIZE: checked when present (integers, in
//     range); cuda_device = LOCAL_RANK (0 when unset).
// `start_embedded_coordinator` is left empty: the caller sets it (it links
// the gRPC server).
// Errors: InvalidArgument naming the variable and its value (missing, not
// an integer, out of range).
absl::StatusOr<ProcessGroupOptions> ProcessGroupOptionsFromEnv();

// Choosing the address Gloo binds (ProcessGroupOptions::gloo_host), the
// rule of Gloo and PyTorch:
//   1. `gloo_host` when not empty (taken as is);
//   2. else, when `socket_ifname` (GLOO_SOCKET_IFNAME) is not empty, the
//      IPv4 address of that network interface (the first name of a
//      comma-separated list);
//   3. else the local address the kernel would use to reach
//      `coordinator_host` (the address of the interface on the route to it:
//      127.0.0.1 when the coordinator is on loopback, 192.0.2.2 on a host
//      whose route to 192.0.2.1 leaves through 192.0.2.2).
// `coordinator_host` is a host name or an IPv4/IPv6 address without port or
// brackets; a wildcard (0.0.0.0) routes to loopback, so a coordinator bound
// to one needs GLOO_SOCKET_IFNAME or gloo_host on several hosts. Sends no
// packet.
// Errors:
//   InvalidArgument: the interface does not exist (names it and lists the
//     interfaces there are) or has no IPv4 address; empty coordinator_host.
//   Unavailable: coordinator_host does not resolve, or there is no route to
//     it (names the host and the system's message).
absl::StatusOr<std::string> SelectGlooHost(const std::string& gloo_host,
                                           const std::string& socket_ifname,
                                           const std::string& coordinator_host);

// The IPv4 address (dotted quad) of network interface `ifname` (getifaddrs).
// Errors: InvalidArgument naming the interface (absent, or no IPv4 address).
absl::StatusOr<std::string> InterfaceIPv4Address(const std::string& ifname);

// The local address the kernel picks to reach `host` (a name, resolved with
// getaddrinfo, or a numeric IPv4/IPv6 address): a UDP socket connect()ed to
// it and getsockname(); no packet is sent.
// Errors: InvalidArgument (empty host); Unavailable (does not resolve, no
// route), naming the host.
absl::StatusOr<std::string> LocalAddressToward(const std::string& host);

// Splits "host:port", "[v6addr]:port" into host (without brackets) and
// port. Errors: InvalidArgument naming the address (no port, port not in
// 1..65535).
absl::StatusOr<std::pair<std::string, int>> SplitHostPort(
    const std::string& address);

}  // namespace muon

#endif  // MUON_CONTROL_PROCESS_GROUP_H_
