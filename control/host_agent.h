// The host agent: one host's link to the coordinator, as torchelastic's
// per-node agent (torchrun) is one per node. muonrun runs it; the host's
// ranks reach the coordinator through it (their MUON_COORDINATOR is its
// Unix socket) with the coordinator's own gRPC service, so a rank's Agent
// is the same with or without it. The coordinator then holds one
// connection, one join and one heartbeat per host instead of per rank.
//
//   ranks' Join        -> gathered until every local rank is in, then one
//                         HostJoin; its one response goes to all of them
//                         (a request for full manifests, too: they rejoin);
//                         a rank joining again later (a new optimizer) is
//                         sent alone
//   ranks' Heartbeat   -> noted (last seen, incarnation) and answered from
//                         the last host heartbeat's response; one carrying
//                         an error or a leave goes out at once
//   heartbeat thread   -> one host heartbeat per interval (a message on one
//                         HostHeartbeatStream; a HostHeartbeat call where
//                         the coordinator has no streams) for the ranks
//                         heard from within 1.5 intervals, then the queued
//                         step reports in ReportSteps batches (<= 1024)
//   ranks' ReportStep  -> queued (at most 4096; beyond: ResourceExhausted,
//                         which the rank's Agent counts as dropped)
//   every other call   -> forwarded as is (KeySet/KeyGet, Replan, GetPlan,
//                         ListRanks, ...) with its metadata and deadline
//
// Failure story (the heartbeat timeout T, the interval T/5 at most 1 s):
//   - a rank's process ends (muonrun reaps it: RankExited) with a failure:
//     reported at once as that rank's error, naming how it ended (retried
//     until the coordinator has it); every rank of the job aborts naming
//     it;
//   - a rank stops heartbeating but lives (stopped, hung): left out of the
//     host heartbeats after 1.5 intervals; the coordinator names it lost
//     within T + 2.5 intervals + T/10 (1.6T) of its last heartbeat, and
//     the host's other ranks hear it one interval later (the relay);
//   - the host dies (muonrun and its ranks): its heartbeats stop and the
//     coordinator names every rank of the host lost after T (a rank left
//     out of the last heartbeats passes T first; the coordinator waits
//     for the host rather than name it alone);
//   - the coordinator dies: the host heartbeat fails and the ranks'
//     heartbeats get its error, so each rank's Agent says once that the
//     coordinator is unreachable (after T) and training goes on.
//
// The socket lives in muonrun's private directory (mode 0700): only the
// job's user reaches it. The ranks' authorization metadata (the job
// secret) is forwarded, and the agent's own batched calls carry the last
// one a rank sent.
//
// Thread-safety: RankExited and the counters may be called from any
// thread; Shutdown is idempotent (the destructor calls it).
#ifndef MUON_CONTROL_HOST_AGENT_H_
#define MUON_CONTROL_HOST_AGENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "control/grpc_coordination_client.h"

namespace muon {

class HostAgent {
 public:
  struct Options {
    // The coordinator, "host:port", and how to reach it (TLS CA; the token
    // is taken from the ranks' calls).
    std::string coordinator;
    GrpcClientSecurity security;
    // Where the host's ranks connect: "unix:/path" (or "127.0.0.1:0" in
    // tests; port 0 = the kernel picks, address() says which).
    std::string listen;
    // The host's name in the coordinator's logs and errors ("node 1").
    std::string host;
    // The global ranks that join through this agent (1 to 1024 distinct).
    std::vector<int> ranks;
    // Heartbeat interval; zero = a fifth of the coordinator's heartbeat
    // timeout (from the Join response), at most 1 s.
    absl::Duration heartbeat_interval = absl::ZeroDuration();
    // Deadline of the agent's own calls (HostHeartbeat, ReportSteps).
    absl::Duration rpc_timeout = absl::Seconds(10);
  };

  // Listens on options.listen and starts the heartbeat thread.
  // Errors: InvalidArgument (no ranks, more than 1024, a duplicate or
  // negative rank, an empty coordinator or listen address, naming the
  // value); Unavailable when it cannot listen (names the address).
  static absl::StatusOr<std::unique_ptr<HostAgent>> Start(Options options);
  ~HostAgent();

  // The address the ranks connect to (listen, with the port picked).
  const std::string& address() const;

  // Rank `rank`'s process ended. With `failed` (a non-zero exit or a
  // signal; `how` says which, "killed by signal 9 (SIGKILL)"), the
  // heartbeat thread sends it at once as the rank's error ("its process
  // (pid P) on <host> ended: <how>"), again each interval until the
  // coordinator has it (after the rank's join, if that is in flight);
  // before the host's ranks have all joined, their waiting Joins fail at
  // once naming it. Either way the rank is left out of later heartbeats.
  // Never blocks on the coordinator. Unknown ranks are ignored.
  void RankExited(int rank, int64_t pid, bool failed, const std::string& how);

  // How long the host's other ranks take to hear of a failure the
  // coordinator knows and end on their own: three heartbeat intervals (the
  // relay, the rank's beat, slack); zero before the first join. muonrun
  // waits this long before it stops them, so that each says what failed.
  absl::Duration settle_time() const;

  // Stops listening and the heartbeat thread; calls in flight finish.
  void Shutdown();

  // Host heartbeats and step reports sent; reports dropped (queue full or
  // ReportSteps failed).
  int64_t heartbeats_sent() const;
  // Of those, the ones sent on the host's HostHeartbeatStream.
  int64_t heartbeats_streamed() const;
  int64_t reports_sent() const;
  int64_t reports_dropped() const;

  class Impl;

 private:
  explicit HostAgent(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace muon

#endif  // MUON_CONTROL_HOST_AGENT_H_
