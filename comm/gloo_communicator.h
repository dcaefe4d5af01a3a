// GlooCommunicator: the Communicator for CPU float32 buffers over Gloo's
// TCP transport.
//
// Who talks to whom: every rank of a group creates one GlooCommunicator.
// Create rendezvouses through the coordinator's key-value store
// (CoordinationClient::KeySet/KeyGet, via CoordinationStore, keys under
// options.prefix) to swap TCP addresses, then connects a full mesh of TCP
// pairs; collectives then go rank to rank over those sockets, never through
// the coordinator.
//
// Lifecycle and states:
//
//   Create ──> kReady ──(collective error)──> kFailed: later calls return
//                │                             FailedPrecondition naming
//                │                             the first error
//                └──(Abort, any thread)─────> kAborted: pending calls are
//                                              unblocked, later calls return
//                                              Aborted; peers see their
//                                              connections reset and fail
//                                              fast (Unavailable naming this
//                                              rank)
//
// Destroy when no call is pending (Abort first to unblock one).
//
// Errors at the boundary: every Gloo exception becomes an absl::Status whose
// message keeps Gloo's own text and names the operation and rank:
//   "gloo AllToAllV on rank 2 (peer rank 3): <gloo what()>"
// (rank numbers are those of the group Create was called for, also inside
// Split groups). Gloo timeouts -> DeadlineExceeded; other Gloo I/O errors
// (peer closed or reset the connection) -> Unavailable, naming the peer when
// Gloo's message carries its address; Gloo assertions -> Internal;
// rendezvous errors keep the store's code (DeadlineExceeded when a peer never
// joined).
//
// Thread-safety: collectives and Split on one communicator are serialized by
// an internal mutex (the contract that all ranks call them in the same order
// is the caller's). Abort() and the accessors may be called from any thread
// at any time.
#ifndef MUON_COMM_GLOO_COMMUNICATOR_H_
#define MUON_COMM_GLOO_COMMUNICATOR_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "coordination/coordination_client.h"

namespace gloo {
class Context;
namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace muon {

class CoordinationStore;

struct GlooOptions {
  // Address (or host name) the TCP transport listens on and advertises to
  // peers: an address of this host that the other ranks can reach. The
  // default keeps all traffic on loopback (one host); InitProcessGroup
  // passes the address SelectGlooHost picks (control/process_group.h).
  std::string hostname = "127.0.0.1";
  // Bound on the rendezvous in Create/Split and on every collective (values
  // above 24 h are capped there; there is no "no timeout").
  absl::Duration timeout = absl::Seconds(60);
  // Key prefix in the coordinator's key-value store. Keys are never deleted,
  // so each group created on one coordinator needs its own prefix (e.g.
  // "gloo/<incarnation>"); Split derives sub-prefixes from it.
  std::string prefix = "gloo";
};

class GlooCommunicator : public Communicator {
 public:
  // Joins the group as `rank` of `world_size`: rendezvous under
  // options.prefix, then a TCP connection to every other rank. Blocks until
  // every rank has called Create with the same world_size and prefix, or
  // options.timeout passes. A world of one needs no rendezvous (and does not
  // touch the store). `store_client` is not owned and must outlive this
  // communicator and every communicator Split from it.
  // Process-wide side effect: with world_size > 1, the first Create sets
  // SIGPIPE to ignored if it still has the default action, because Gloo
  // writes to sockets without MSG_NOSIGNAL and a peer resetting its
  // connection would otherwise kill this process instead of failing a call.
  // Errors:
  //   InvalidArgument: bad rank/world_size, null store_client, empty
  //     hostname or prefix, timeout under 1 ms (names the value).
  //   Internal: options.hostname is no address of this host (the message
  //     names it).
  //   DeadlineExceeded: some rank did not join (or connect) in time.
  //   Unavailable: the coordinator or a peer failed during the rendezvous.
  //   Internal: Gloo rejected the setup (its message kept).
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Create(
      int rank, int world_size, CoordinationClient* store_client,
      const GlooOptions& options);

  ~GlooCommunicator() override;

  GlooCommunicator(const GlooCommunicator&) = delete;
  GlooCommunicator& operator=(const GlooCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return "gloo"; }
  // The key prefix of this group (options.prefix, or a Split's sub-prefix).
  const std::string& prefix() const { return options_.prefix; }

  // gloo::alltoallv. Zero counts and null buffers with zero totals are
  // allowed. Every collective below is bounded by options.timeout.
  // Errors: InvalidArgument (vector sizes, negative counts, null buffer with
  // a non-zero total, send_counts[rank] != recv_counts[rank]),
  // DeadlineExceeded, Unavailable, Aborted, FailedPrecondition (after an
  // earlier error), Internal.
  absl::Status AllToAllV(const float* send,
                         const std::vector<int64_t>& send_counts, float* recv,
                         const std::vector<int64_t>& recv_counts) override;

  // gloo::allgatherv (ring). Errors: as AllToAllV (InvalidArgument also
  // when recv_counts[rank] != send_count).
  absl::Status AllGatherV(const float* send, int64_t send_count, float* recv,
                          const std::vector<int64_t>& recv_counts) override;

  // gloo::broadcast (binomial tree), in place in `data` on every rank.
  // Errors: as AllToAllV (InvalidArgument for a root outside the group).
  absl::Status Broadcast(float* data, int64_t count, int root) override;

  // Dissemination barrier (log2(world_size) rounds of zero-byte messages).
  // Errors: as AllToAllV, less InvalidArgument.
  absl::Status Barrier() override;

  // A GlooCommunicator over `ranks` (see Communicator::Split), rendezvoused
  // under "<prefix>/split<n>/<ranks joined by _>", where n counts this
  // group's earlier Splits with the same list, so repeated and concurrent
  // (disjoint) splits never share keys. Shares this communicator's TCP
  // device, store client and options; the result may outlive this
  // communicator. Blocks until every rank of `ranks` has called Split with
  // the same list. A failed rendezvous (a member that never calls) breaks
  // this communicator, as a failed collective does: the members number
  // their splits alike, so a retry could meet another split's keys.
  // Errors: InvalidArgument (see communicator_internal::CheckSplit), as
  // Create otherwise, Aborted.
  absl::StatusOr<std::unique_ptr<Communicator>> Split(
      const std::vector<int>& ranks) override;

  // Ranks of this group in the group Create was called for.
  std::vector<int> global_ranks() const override { return root_ranks_; }

  // Best effort, from any thread, idempotent: marks the communicator
  // aborted, cancels a pending rendezvous, resets every TCP connection (so
  // peers fail fast instead of waiting for their timeouts) and interrupts a
  // pending collective, waiting at most options.timeout for it to return
  // Aborted.
  void Abort() override;

 private:
  class InflightScope;

  GlooCommunicator(int rank, int world_size, CoordinationClient* client,
                   const GlooOptions& options, std::vector<int> root_ranks,
                   bool subgroup,
                   std::shared_ptr<gloo::transport::Device> device);

  // Rendezvous through `store` under options_.prefix and connects the full
  // mesh; `op` names the operation in errors ("Create", "Split").
  absl::Status Connect(absl::string_view op, CoordinationStore& store);
  // After a rendezvous timeout: which ranks (of the root group) have not
  // published their Gloo address under options_.prefix in `store`, e.g.
  // "ranks 2, 3 of 4 have not joined the rendezvous (not started, exited,
  // or cannot reach the coordinator)"; empty when every key is there or
  // the store cannot tell. Reads the keys of the first 65 ranks at most
  // (the message then says which were checked).
  std::string MissingRanks(CoordinationStore& store) const;
  // Best effort: publishes under AddressesKey(rank_) how this rank's TCP
  // pairs print their addresses, which is how peers' Gloo error messages
  // name this rank.
  void PublishAddresses(CoordinationStore& store);
  std::string AddressesKey(int rank) const;
  // The peer whose address ("[host]:port") occurs in `message`, or -1
  // (best effort; reads peers' published addresses on first use, without
  // waiting: at most 64 reads, started within one second, none for a
  // message naming no address).
  int FindPeer(const std::string& message);

  // Runs `fn`, converting any exception to a Status that names `op`.
  absl::Status RunGloo(absl::string_view op, const std::function<void()>& fn);
  // RunGloo for a collective: Aborted if aborted meanwhile (Gloo returns
  // quietly from an interrupted wait); the first error moves to kFailed.
  // The ...Locked methods are called with op_mu_ held.
  absl::Status RunCollectiveLocked(absl::string_view op,
                                   const std::function<void()>& fn);
  absl::Status CheckUsableLocked(absl::string_view op) const;
  uint32_t NextTagLocked();
  // "gloo <op> on rank <r>[ (rank <g> of group <prefix>)][ (peer rank p)]: ".
  std::string Where(absl::string_view op, int peer) const;

  const int rank_;
  const int world_size_;
  CoordinationClient* const client_;  // Not owned.
  const GlooOptions options_;
  const std::chrono::milliseconds timeout_;
  // root_ranks_[r]: rank r of this group in the group Create was called for.
  const std::vector<int> root_ranks_;
  // Whether this group came from Split (errors then also name the group).
  const bool subgroup_;
  // For Split's rendezvous; Abort cancels it.
  const std::unique_ptr<CoordinationStore> store_;
  // Null for a world of one. Set before the communicator is published and
  // read-only after, so used without a lock.
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;

  std::atomic<bool> aborted_{false};

  // The locks are std::mutex, not absl::Mutex: Debian's Abseil is not
  // instrumented, so ThreadSanitizer (--config=tsan) would not see
  // absl::Mutex's waits and would report the data they guard.
  std::mutex peer_mu_;
  // peer_addresses_[p]: how Gloo prints peer p's end of the connection to
  // this rank; "" until learned. Guarded by peer_mu_.
  std::vector<std::string> peer_addresses_;

  // Serializes collectives and Split.
  mutable std::mutex op_mu_;
  uint32_t next_tag_ = 0;  // guarded by op_mu_
  // Count of earlier Splits per joined rank list. Guarded by op_mu_.
  std::map<std::string, int> split_counts_;
  // First collective error (kFailed), OK while kReady. Guarded by op_mu_.
  absl::Status failed_;

  // Buffers of the pending collective, for Abort to interrupt their waits.
  // Acquired after op_mu_. Guarded by inflight_mu_; inflight_cv_ is
  // notified when the collective clears them.
  std::mutex inflight_mu_;
  std::condition_variable inflight_cv_;
  std::vector<gloo::transport::UnboundBuffer*> inflight_;
};

}  // namespace muon

#endif  // MUON_COMM_GLOO_COMMUNICATOR_H_
