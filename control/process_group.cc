#include "control/process_group.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "comm/gloo_communicator.h"
#include "comm/nccl_communicator.h"
#include "common/status_macros.h"
#include "control/grpc_coordination_client.h"

namespace muon {
namespace {

// Writes `contents` to `path` through a temporary file renamed over it, so
// a reader sees the whole file or none.
absl::Status WriteFileAtomically(const std::string& path,
                                 const std::string& contents) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream out(tmp);
    out << contents;
    if (!out.good()) {
      return absl::InternalError(absl::StrCat("cannot write file ", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

absl::Status WritePortFile(const std::string& path, int port) {
  return WriteFileAtomically(path, absl::StrCat(port, "\n"));
}

// The n-th exchange of this process on `path`: path.n (n from 1).
std::string NextExchangePath(const std::string& path) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* generations = new std::map<std::string, int>();
  absl::MutexLock lock(&mu);
  return absl::StrCat(path, ".", ++(*generations)[path]);
}

// Polls `path` until it exists (bounded by `timeout`) and returns its
// first line, checked to be host:port.
absl::StatusOr<std::string> ReadAddressFile(const std::string& path,
                                            absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration delay = absl::Milliseconds(20);
  while (true) {
    std::ifstream in(path);
    std::string line;
    if (in.good() && std::getline(in, line)) {
      if (absl::Status s = SplitHostPort(line).status(); !s.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("the coordinator address file ", path, " holds \"",
                         line, "\", not host:port (", s.message(), ")"));
      }
      return line;
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "rank 0 did not publish its coordinator's address in ", path,
          " within ", absl::FormatDuration(timeout),
          " (rank 0 has not started, or failed before its coordinator "
          "listened: see its output)"));
    }
    absl::SleepFor(std::min(delay, deadline - now));
    delay = std::min(delay * 2, absl::Milliseconds(200));
  }
}

// Closes a file descriptor on scope exit.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  const int fd_;
};

// getaddrinfo results, freed on scope exit.
struct AddrInfoList {
  addrinfo* head = nullptr;
  ~AddrInfoList() {
    if (head != nullptr) freeaddrinfo(head);
  }
};

// Resolves `host` (and `port`, 0 = none) for `socktype`.
// Errors: Unavailable naming the host and gai_strerror.
absl::Status Resolve(const std::string& host, int port, int socktype,
                     AddrInfoList* out) {
  addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = socktype;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &out->head);
  if (rc != 0 || out->head == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve host \"", host,
                     "\": ", rc != 0 ? gai_strerror(rc) : "no addresses"));
  }
  return absl::OkStatus();
}

std::string SockaddrToString(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf,
              sizeof(buf));
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr,
              buf, sizeof(buf));
  }
  return buf;
}

// Strips a gRPC target scheme ("dns:///", "dns:", "ipv4:", "ipv6:") from a
// coordinator address; nullopt for targets that are no TCP host:port
// ("unix:...").
std::optional<std::string> TcpTarget(const std::string& address) {
  std::string a = address;
  for (const char* scheme : {"dns:///", "dns:", "ipv4:", "ipv6:"}) {
    if (absl::StartsWith(a, scheme)) {
      a = a.substr(std::strlen(scheme));
      break;
    }
  }
  if (absl::StartsWith(a, "unix:") || absl::StartsWith(a, "unix-abstract:")) {
    return std::nullopt;
  }
  return a;
}

// Tries one TCP connection to `ai`, waiting at most `wait`. Returns 0 or the
// errno of the failure.
int TryConnect(const addrinfo* ai, absl::Duration wait) {
  const int fd =
      socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
             ai->ai_protocol);
  if (fd < 0) return errno;
  FdCloser closer(fd);
  if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) return 0;
  if (errno != EINPROGRESS) return errno;
  pollfd p{fd, POLLOUT, 0};
  const int n =
      poll(&p, 1, std::max<int64_t>(1, absl::ToInt64Milliseconds(wait)));
  if (n <= 0) return n == 0 ? ETIMEDOUT : errno;
  int err = 0;
  socklen_t len = sizeof(err);
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno;
  return err;
}

// Waits until host:port accepts TCP connections (the coordinator of rank 0
// may start after this rank, possibly on another host).
// Errors: DeadlineExceeded naming the address and the last error;
// Unavailable when the host does not resolve by the deadline.
absl::Status WaitForListener(const std::string& host, int port,
                             absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration delay = absl::Milliseconds(20);
  std::string last_error;
  while (true) {
    AddrInfoList addrs;
    absl::Status resolved = Resolve(host, port, SOCK_STREAM, &addrs);
    if (resolved.ok()) {
      for (const addrinfo* ai = addrs.head; ai != nullptr; ai = ai->ai_next) {
        const int err =
            TryConnect(ai, std::clamp(deadline - absl::Now(),
                                      absl::Milliseconds(1), absl::Seconds(2)));
        if (err == 0) return absl::OkStatus();
        last_error = std::strerror(err);
      }
    } else {
      last_error = std::string(resolved.message());
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the coordinator at ", host, ":", port,
          " did not accept connections within ", absl::FormatDuration(timeout),
          " (last error: ", last_error, ")"));
    }
    absl::SleepFor(std::min(delay, deadline - now));
    delay = std::min(delay * 2, absl::Milliseconds(500));
  }
}

// The host whose route picks Gloo's address: the coordinator's.
std::string CoordinatorHost(const ProcessGroupOptions& options) {
  const bool embeds = options.embed_coordinator && options.rank == 0;
  if (!options.coordinator_address.empty()) {
    std::optional<std::string> target = TcpTarget(options.coordinator_address);
    if (target.has_value()) {
      absl::StatusOr<std::pair<std::string, int>> hp = SplitHostPort(*target);
      if (hp.ok()) return hp->first;
    }
  }
  if (embeds && !options.embedded_host.empty()) return options.embedded_host;
  return "127.0.0.1";  // a unix socket or no address: this machine
}

}  // namespace

absl::StatusOr<std::pair<std::string, int>> SplitHostPort(
    const std::string& address) {
  std::string host;
  std::string port_text;
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() ||
        address[close + 1] != ':') {
      return absl::InvalidArgumentError(
          absl::StrCat("address \"", address, "\" is not [host]:port"));
    }
    host = address.substr(1, close - 1);
    port_text = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos ||
        address.find(':') != colon) {  // none, or a bare IPv6 address
      return absl::InvalidArgumentError(absl::StrCat(
          "address \"", address,
          "\" is not host:port (write IPv6 addresses as [addr]:port)"));
    }
    host = address.substr(0, colon);
    port_text = address.substr(colon + 1);
  }
  int port = 0;
  if (host.empty() || !absl::SimpleAtoi(port_text, &port) || port < 1 ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "address \"", address, "\": want host:port with a port in 1..65535"));
  }
  return std::make_pair(host, port);
}

absl::StatusOr<std::string> InterfaceIPv4Address(const std::string& ifname) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return absl::InternalError(
        absl::StrCat("getifaddrs: ", std::strerror(errno)));
  }
  std::set<std::string> names;
  bool found = false;
  std::string address;
  for (const ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_name == nullptr) continue;
    names.insert(a->ifa_name);
    if (ifname != a->ifa_name) continue;
    found = true;
    if (address.empty() && a->ifa_addr != nullptr &&
        a->ifa_addr->sa_family == AF_INET) {
      address = SockaddrToString(a->ifa_addr);
    }
  }
  freeifaddrs(list);
  if (!found) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GLOO_SOCKET_IFNAME: no network interface named \"", ifname,
        "\" on this host (interfaces: ", absl::StrJoin(names, ", "), ")"));
  }
  if (address.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GLOO_SOCKET_IFNAME: network interface \"", ifname,
                     "\" has no IPv4 address"));
  }
  return address;
}

absl::StatusOr<std::string> LocalAddressToward(const std::string& host) {
  if (host.empty()) {
    return absl::InvalidArgumentError(
        "LocalAddressToward: the coordinator host is empty");
  }
  AddrInfoList addrs;
  // Any port: connect() on a UDP socket only picks the route and the local
  // address; nothing is sent.
  MUON_RETURN_IF_ERROR(Resolve(host, 9, SOCK_DGRAM, &addrs));
  std::string last_error;
  for (const addrinfo* ai = addrs.head; ai != nullptr; ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    FdCloser closer(fd);
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      last_error = std::strerror(errno);
      continue;
    }
    sockaddr_storage local;
    socklen_t len = sizeof(local);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) {
      last_error = std::strerror(errno);
      continue;
    }
    std::string address = SockaddrToString(reinterpret_cast<sockaddr*>(&local));
    if (!address.empty()) return address;
  }
  return absl::UnavailableError(
      absl::StrCat("no route from this host to the coordinator host \"", host,
                   "\": ", last_error));
}

absl::StatusOr<std::string> SelectGlooHost(
    const std::string& gloo_host, const std::string& socket_ifname,
    const std::string& coordinator_host) {
  if (!gloo_host.empty()) return gloo_host;
  if (!socket_ifname.empty()) {
    // PyTorch accepts a comma-separated list (one Gloo device each); one
    // device here: the first.
    const std::string first =
        std::vector<std::string>(absl::StrSplit(socket_ifname, ','))[0];
    return InterfaceIPv4Address(first);
  }
  return LocalAddressToward(coordinator_host);
}

namespace {

std::string EnvString(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v == nullptr || *v == '\0' ? fallback : std::string(v);
}

// options.job_secret and options.tls, completed from the environment.
absl::Status FillSecurityFromEnv(ProcessGroupOptions& options) {
  if (!options.job_secret.empty()) {
    // Given explicitly: a blank secret is no secret.
    absl::Status valid =
        CheckJobSecret(options.job_secret, "ProcessGroupOptions.job_secret");
    if (!valid.ok()) {
      return absl::Status(valid.code(), absl::StrCat("rank ", options.rank,
                                                     ": ", valid.message()));
    }
  } else {
    absl::StatusOr<std::string> secret = JobSecretFromEnv();
    if (!secret.ok()) {
      return absl::Status(
          secret.status().code(),
          absl::StrCat("rank ", options.rank, ": ", secret.status().message()));
    }
    options.job_secret = *std::move(secret);
  }
  auto fill = [](std::string& field, const char* name) {
    if (field.empty()) field = EnvString(name, "");
  };
  fill(options.tls.ca_file, "MUON_TLS_CA_FILE");
  fill(options.tls.cert_file, "MUON_TLS_CERT_FILE");
  fill(options.tls.key_file, "MUON_TLS_KEY_FILE");
  return absl::OkStatus();
}

// `host` as the host part of host:port: an IPv6 address in brackets.
std::string FormatHostForAddress(const std::string& host) {
  if (absl::StrContains(host, ':') && !absl::StartsWith(host, "[")) {
    return absl::StrCat("[", host, "]");
  }
  return host;
}

// Rank 0's embedded coordinator (options.start_embedded_coordinator),
// its port written to options.port_file; pg->coordinator a local client.
absl::Status EmbedCoordinator(const ProcessGroupOptions& options,
                              ProcessGroup* pg) {
  if (!options.start_embedded_coordinator) {
    return absl::FailedPreconditionError(
        "rank 0: embed_coordinator is set but start_embedded_coordinator "
        "is not (depend on //server:embedded_coordinator and pass "
        "muon::StartEmbeddedCoordinator, or name a coordinator address)");
  }
  EmbeddedCoordinatorOptions embedded;
  embedded.host = options.embedded_host;
  embedded.port = options.embedded_port;
  if (!options.job_id.empty()) embedded.job_id = options.job_id;
  embedded.world_size = options.world_size;
  embedded.auth.job_secret = options.job_secret;
  embedded.tls = options.tls;
  if (options.job_secret.empty() && options.world_size > 1) {
    std::cerr << "muon: warning: no job secret (MUON_JOB_SECRET or "
                 "MUON_JOB_SECRET_FILE): rank 0's coordinator accepts "
                 "requests from any process that reaches it"
              << std::endl;
  }
  MUON_ASSIGN_OR_RETURN(pg->embedded_coordinator,
                        options.start_embedded_coordinator(embedded));
  if (!options.port_file.empty()) {
    MUON_RETURN_IF_ERROR(
        WritePortFile(options.port_file, pg->embedded_coordinator->port()));
  }
  const std::string address =
      absl::StrCat(FormatHostForAddress(options.embedded_host), ":",
                   pg->embedded_coordinator->port());
  pg->coordinator_address = address;
  if (options.address_exchange.enabled()) {
    if (absl::Status s = options.address_exchange.publish(address); !s.ok()) {
      return absl::Status(
          s.code(),
          absl::StrCat("rank 0: publishing the coordinator's "
                       "address ",
                       address, " in the job's store: ", s.message()));
    }
  }
  pg->coordinator = pg->embedded_coordinator->NewLocalClient();
  return absl::OkStatus();
}

// A gRPC client of options.coordinator_address, once something listens
// there (bounded by options.timeout).
absl::StatusOr<std::unique_ptr<CoordinationClient>> ConnectToCoordinator(
    const ProcessGroupOptions& options) {
  if (options.coordinator_address.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", options.rank,
        ": no coordinator address (pass --coordinator host:port, or embed "
        "the coordinator in rank 0)"));
  }
  std::optional<std::string> target = TcpTarget(options.coordinator_address);
  if (target.has_value()) {
    absl::StatusOr<std::pair<std::string, int>> hp = SplitHostPort(*target);
    if (hp.ok()) {
      absl::Status up = WaitForListener(hp->first, hp->second, options.timeout);
      if (!up.ok()) {
        return absl::Status(
            up.code(), absl::StrCat("rank ", options.rank, ": ", up.message()));
      }
    }
  }
  GrpcClientSecurity security;
  security.token = options.job_secret;
  security.tls_ca_file = options.tls.ca_file;
  MUON_ASSIGN_OR_RETURN(std::unique_ptr<GrpcCoordinationClient> client,
                        GrpcCoordinationClient::Create(
                            options.coordinator_address, options.job_id,
                            absl::Seconds(10), security));
  return std::unique_ptr<CoordinationClient>(std::move(client));
}

// The Gloo group of every rank, rendezvous through `coordinator`, bound to
// the address SelectGlooHost picks.
absl::StatusOr<std::unique_ptr<Communicator>> MakeGlooGroup(
    const ProcessGroupOptions& options, CoordinationClient* coordinator) {
  GlooOptions gloo;
  gloo.timeout = options.timeout;
  if (options.world_size > 1) {
    const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
    absl::StatusOr<std::string> host =
        SelectGlooHost(options.gloo_host, ifname == nullptr ? "" : ifname,
                       CoordinatorHost(options));
    if (!host.ok()) {
      return absl::Status(host.status().code(),
                          absl::StrCat("rank ", options.rank,
                                       ": choosing the address Gloo binds: ",
                                       host.status().message()));
    }
    gloo.hostname = *std::move(host);
  }
  return GlooCommunicator::Create(options.rank, options.world_size, coordinator,
                                  gloo);
}

// The NCCL group on options.cuda_device.
absl::StatusOr<std::unique_ptr<Communicator>> MakeNcclGroup(
    const ProcessGroupOptions& options, CoordinationClient* coordinator) {
  NcclOptions nccl;
  nccl.device = options.cuda_device;
  nccl.timeout = options.timeout;
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm =
      NcclCommunicator::Create(options.rank, options.world_size, coordinator,
                               nccl);
  if (!comm.ok()) {
    return absl::Status(
        comm.status().code(),
        absl::StrCat("rank ", options.rank, ": the NCCL group on cuda:",
                     options.cuda_device, ": ", comm.status().message()));
  }
  return std::unique_ptr<Communicator>(*std::move(comm));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ProcessGroup>> InitProcessGroup(
    const ProcessGroupOptions& original_options) {
  ProcessGroupOptions options = original_options;
  MUON_RETURN_IF_ERROR(FillSecurityFromEnv(options));
  if (options.world_size < 1 || options.rank < 0 ||
      options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " is out of range for world size ",
                     options.world_size));
  }
  if (options.backend == ProcessGroupBackend::kNccl &&
      options.cuda_device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, ": cuda_device ",
                     options.cuda_device, " is negative"));
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
    MUON_RETURN_IF_ERROR(EmbedCoordinator(options, pg.get()));
  } else {
    if (options.embed_coordinator && options.address_exchange.enabled()) {
      absl::StatusOr<std::string> address =
          options.address_exchange.lookup(options.timeout);
      if (!address.ok()) {
        return absl::Status(
            address.status().code(),
            absl::StrCat("rank ", options.rank,
                         ": the coordinator's address from the job's store: ",
                         address.status().message()));
      }
      options.coordinator_address = *std::move(address);
    }
    MUON_ASSIGN_OR_RETURN(pg->coordinator, ConnectToCoordinator(options));
    pg->coordinator_address = options.coordinator_address;
  }
  MUON_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> gloo_comm,
                        MakeGlooGroup(options, pg->coordinator.get()));
  if (options.backend == ProcessGroupBackend::kGloo) {
    pg->comm = std::move(gloo_comm);
    return pg;
  }
  // NCCL carries the data; Gloo stays as the control group (c10d's
  // arrangement for small host-side collectives).
  pg->control_comm = std::move(gloo_comm);
  MUON_ASSIGN_OR_RETURN(pg->comm,
                        MakeNcclGroup(options, pg->coordinator.get()));
  return pg;
}

CoordinatorAddressExchange FileAddressExchange(const std::string& path,
                                               int generation) {
  auto file = [path, generation] {
    return generation > 0 ? absl::StrCat(path, ".", generation)
                          : NextExchangePath(path);
  };
  CoordinatorAddressExchange exchange;
  exchange.publish = [file](const std::string& address) {
    return WriteFileAtomically(file(), address + "\n");
  };
  exchange.lookup = [file](absl::Duration timeout) {
    return ReadAddressFile(file(), timeout);
  };
  return exchange;
}

absl::StatusOr<ProcessGroupBackend> ParseProcessGroupBackend(
    absl::string_view name) {
  if (name == "gloo") return ProcessGroupBackend::kGloo;
  if (name == "nccl") return ProcessGroupBackend::kNccl;
  return absl::InvalidArgumentError(
      absl::StrCat("process group backend \"", name,
                   "\" is not supported (use \"gloo\" "
                   "for CPU tensors or \"nccl\" for CUDA tensors)"));
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

}  // namespace

namespace {

// ProcessGroupOptionsFromEnv's ranks: RANK and WORLD_SIZE into *o, and
// LOCAL_RANK (of LOCAL_WORLD_SIZE) as o->cuda_device.
absl::Status RanksFromEnv(ProcessGroupOptions* o) {
  MUON_ASSIGN_OR_RETURN(o->world_size, EnvInt("WORLD_SIZE", std::nullopt));
  MUON_ASSIGN_OR_RETURN(o->rank, EnvInt("RANK", std::nullopt));
  if (o->world_size < 1 || o->rank < 0 || o->rank >= o->world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment: RANK=", o->rank,
                     " is out of range for WORLD_SIZE=", o->world_size));
  }
  MUON_ASSIGN_OR_RETURN(const int local_world,
                        EnvInt("LOCAL_WORLD_SIZE", o->world_size));
  MUON_ASSIGN_OR_RETURN(const int local_rank, EnvInt("LOCAL_RANK", 0));
  if (local_world < 1 || local_world > o->world_size || local_rank < 0 ||
      local_rank >= local_world) {
    return absl::InvalidArgumentError(absl::StrCat(
        "environment: LOCAL_RANK=", local_rank, " / LOCAL_WORLD_SIZE=",
        local_world, " do not fit WORLD_SIZE=", o->world_size));
  }
  o->cuda_device = local_rank;
  return absl::OkStatus();
}

// ProcessGroupOptionsFromEnv's embedded coordinator at `master` when no
// daemon is named: on a port the kernel picks, handed over through
// MUON_COORDINATOR_FILE, or on MUON_COORDINATOR_PORT (default MASTER_PORT
// + 1, as torch.distributed's TCPStore listens on MASTER_PORT).
absl::Status EmbeddedCoordinatorFromEnv(const std::string& master,
                                        ProcessGroupOptions* o) {
  o->embed_coordinator = true;
  o->embedded_host = master;
  const std::string address_file = EnvString("MUON_COORDINATOR_FILE", "");
  if (!address_file.empty() && EnvString("MUON_COORDINATOR_PORT", "").empty()) {
    // A port the kernel picks, its address handed over through the file.
    o->embedded_port = 0;
    o->address_exchange = FileAddressExchange(address_file);
    return absl::OkStatus();
  }
  MUON_ASSIGN_OR_RETURN(const int master_port,
                        EnvInt("MASTER_PORT", std::nullopt));
  // Checked before master_port + 1 below (which overflows at INT_MAX).
  if (master_port < 1 || master_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment: MASTER_PORT=", master_port,
                     " is not a TCP port (1..65535)"));
  }
  // torch.distributed's TCPStore listens on MASTER_PORT in the same job, so
  // the coordinator takes the next port unless MUON_COORDINATOR_PORT says.
  MUON_ASSIGN_OR_RETURN(const int port,
                        EnvInt("MUON_COORDINATOR_PORT", master_port + 1));
  if (port < 1 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "environment: the coordinator port ", port,
        " (MUON_COORDINATOR_PORT, default MASTER_PORT + 1 with MASTER_PORT=",
        master_port, ") is not a TCP port (1..65535)"));
  }
  o->embedded_port = port;
  o->coordinator_address =
      absl::StrCat(FormatHostForAddress(master), ":", port);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ProcessGroupOptions> ProcessGroupOptionsFromEnv() {
  ProcessGroupOptions o;
  MUON_RETURN_IF_ERROR(RanksFromEnv(&o));
  o.job_id = EnvString("MUON_JOB_ID", "");
  const std::string daemon = EnvString("MUON_COORDINATOR", "");
  if (!daemon.empty()) {
    // Checked here, before any connection: a malformed address would
    // otherwise surface as a rendezvous failure of the first collective.
    const std::optional<std::string> tcp = TcpTarget(daemon);
    if (absl::Status s =
            tcp.has_value() ? SplitHostPort(*tcp).status() : absl::OkStatus();
        !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "environment variable MUON_COORDINATOR=\"", daemon,
          "\" is not host:port (", s.message(),
          "); it names a muon-coordinator daemon, e.g. 127.0.0.1:29400"));
    }
    o.coordinator_address = daemon;
    return o;
  }
  MUON_RETURN_IF_ERROR(
      EmbeddedCoordinatorFromEnv(EnvString("MASTER_ADDR", "127.0.0.1"), &o));
  return o;
}

}  // namespace muon
