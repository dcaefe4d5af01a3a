// NcclCommunicator: the Communicator for CUDA DEVICE float32 buffers over
// NCCL. Every float* passed to its collectives is a CUDA device pointer (or
// any pointer NCCL accepts: managed memory, host memory registered for
// device access) on options.device.
//
// Built only with --config=cuda (comm/nccl_communicator.cc). The default
// build links comm/nccl_communicator_stub.cc instead: Create returns
// Unimplemented and NcclDeviceCount returns 0, so callers and tests compile
// and link without the CUDA toolkit. This header includes no CUDA header;
// the implementation reaches NCCL and CUDA through comm/nccl_api.h (see
// there why).
//
// Who talks to whom: every rank of a group creates one NcclCommunicator on
// its own GPU. Create rendezvouses through the coordinator's key-value store
// (CoordinationClient::KeySet/KeyGet): rank 0 makes an ncclUniqueId and
// publishes it under "<options.prefix>/unique_id"; the other ranks read it.
// Collectives then go GPU to GPU through NCCL (NVLink, PCIe, network), never
// through the coordinator.
//
// Bounded calls: the NCCL communicator is non-blocking (ncclConfig_t
// blocking = 0), so no NCCL call blocks; every operation polls
// ncclCommGetAsyncError (and, for collectives, cudaStreamQuery on this
// communicator's stream) until it completes, fails, or options.timeout
// passes. There is no unbounded cudaStreamSynchronize anywhere. Each
// collective is enqueued on this communicator's own CUDA stream
// (cudaStreamNonBlocking, see stream()) and waited for before the call
// returns: the interface stays synchronous, and the caller's buffers may be
// reused as soon as a call returns OK (after an error, the receive buffers'
// contents are undefined). Work the caller enqueued on other
// streams is NOT waited for: finish writing the send buffers before the
// call (e.g. synchronize your stream, or enqueue your kernels on stream()).
//
// Lifecycle and states:
//
//   Create ──> kReady ──(error or timeout)──> kFailed: the NCCL communicator
//                │                             is aborted; later calls
//                │                             return FailedPrecondition
//                │                             naming the first error
//                └──(Abort, any thread)─────> kAborted: a pending call
//                                              returns Aborted within one
//                                              poll interval, the NCCL
//                                              communicator is aborted
//                                              (ncclCommAbort), later calls
//                                              return Aborted
//
// Peers of a failed or aborted rank are not told: their pending calls fail
// when NCCL notices (ncclRemoteError over the network) or at their own
// timeout (DeadlineExceeded), never hang.
//
// Destruction (no call may be pending): ncclCommFinalize, waited for at most
// options.timeout, then ncclCommDestroy; ncclCommAbort instead when the
// communicator failed or finalizing did not finish. Destroy the ranks of a
// group concurrently (as separate processes naturally do): finalizing may
// wait for the peers.
//
// Errors at the boundary: every NCCL or CUDA result other than success
// becomes an absl::Status whose message names the operation and rank, the
// failing expression and the library's own text:
//   "nccl AllToAllV on rank 2 (peer rank 3): ncclSend(send +
//    send_offsets[p], send_counts[p], kFloat32, p, comm, stream): unhandled
//    cuda error (run with NCCL_DEBUG=INFO for details); NCCL's last error:
//    <ncclGetLastError, process-wide, may concern another communicator>"
//   "nccl Create on rank 1: ncclCommInitRankConfig(&comm, world_size, id,
//    rank, config) (asynchronous result): invalid usage (...); NCCL's last
//    error: Duplicate GPU detected : rank 1 and rank 0 both on CUDA device
//    ..."
//   "nccl Create on rank 0: no usable GPU: cudaGetDeviceCount(&device_count):
//    cudaErrorInsufficientDriver: CUDA driver version is insufficient for
//    CUDA runtime version"
// (rank numbers are those of the group Create was called for, also inside
// Split groups, which add "(rank r of group <name>)"). Codes: ncclRemoteError
// and ncclSystemError -> Unavailable; ncclInvalidArgument -> InvalidArgument;
// ncclInvalidUsage -> FailedPrecondition (e.g. two ranks on one GPU); other
// NCCL errors and CUDA errors -> Internal (cudaErrorMemoryAllocation ->
// ResourceExhausted; no device / insufficient driver -> FailedPrecondition);
// a bound passed -> DeadlineExceeded naming the operation, rank and timeout.
//
// Thread-safety: collectives, Split and SplitByColor on one communicator are
// serialized by an internal mutex (the contract that all ranks call them in
// the same order is the caller's). Abort() and the accessors may be called
// from any thread at any time. Each call makes options.device current on the
// calling thread for its duration and restores the previous device.
#ifndef MUON_COMM_NCCL_COMMUNICATOR_H_
#define MUON_COMM_NCCL_COMMUNICATOR_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "coordination/coordination_client.h"
#include "device/cuda_runtime.h"

namespace muon {
namespace nccl_api {
struct UniqueId;  // comm/nccl_api.h (the CUDA build only)
}  // namespace nccl_api

struct NcclOptions {
  // CUDA device (ordinal among the visible devices) this rank runs on; the
  // NCCL communicator, its stream and its buffers live there.
  int device = 0;
  // Bound on the rendezvous and NCCL initialization in Create, on Split,
  // on every collective (from the call to completion on the GPU) and on
  // finalizing at destruction.
  absl::Duration timeout = absl::Seconds(60);
  // Key prefix in the coordinator's key-value store. Keys are never deleted,
  // so each group created on one coordinator needs its own prefix (e.g.
  // "nccl/<incarnation>"): a stale unique id would make Create time out.
  std::string prefix = "nccl";
  // The rank's own part of AllToAllV as a grouped ncclSend/ncclRecv to
  // itself instead of a device-to-device copy (NCCL allows send/recv to
  // self). Slower; it lets a world of one on a single GPU run the grouped
  // send/recv path that larger worlds use (NcclWorldOfOneTest sets it).
  // In-place and empty own parts are still skipped.
  bool exchange_self_through_nccl = false;
};

// Number of CUDA devices visible to this process (the device layer's
// count, device::CudaDeviceCount). 0 when built without --config=cuda, or
// when the CUDA runtime finds no device or fails; then `reason` (if
// non-null) says why.
inline int NcclDeviceCount(std::string* reason = nullptr) {
  return device::CudaDeviceCount(reason);
}

class NcclCommunicator : public Communicator {
 public:
  // NCCL_SPLIT_NOCOLOR: the color of a rank that joins no group in
  // SplitByColor.
  static constexpr int kNoColor = -1;

  // Joins the group as `rank` of `world_size` on options.device: rendezvous
  // for the ncclUniqueId under options.prefix (a world of one does not touch
  // the store), then ncclCommInitRankConfig (non-blocking), waited for until
  // every rank has joined or options.timeout passes (then the half-made
  // communicator is aborted). Also creates this communicator's CUDA stream
  // and a 4-byte device buffer for Barrier. `store` is not owned and must
  // outlive Create (it is not used afterwards).
  // Errors:
  //   Unimplemented: built without --config=cuda ("NCCL communicator: built
  //     without CUDA; build with --config=cuda").
  //   InvalidArgument: bad rank/world_size, null store, empty prefix,
  //     timeout under 1 ms, negative device or one beyond the visible
  //     devices (names the value), a malformed unique id in the store.
  //   FailedPrecondition: no GPU visible (names CUDA's message), or NCCL
  //     rejected the setup as invalid usage (e.g. two ranks of the group on
  //     one GPU: "Duplicate GPU detected").
  //   DeadlineExceeded: rank 0's unique id did not appear, or NCCL
  //     initialization did not finish (some rank did not join), in time.
  //   Unavailable: the coordinator failed, or NCCL's bootstrap network did.
  //   Internal: other CUDA/NCCL failures (their messages kept).
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      int rank, int world_size, CoordinationClient* store,
      const NcclOptions& options);

  ~NcclCommunicator() override;

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return "nccl"; }
  device::Device buffer_device() const override {
    return device::Device::Cuda(options_.device);
  }
  // Ranks of this group in the group Create was called for.
  std::vector<int> global_ranks() const override { return root_ranks_; }
  // The CUDA device of this communicator (options.device).
  int device() const { return options_.device; }
  // This communicator's CUDA stream (a cudaStream_t, created with
  // cudaStreamNonBlocking), for callers that want to order their kernels
  // with the collectives: work enqueued on it before a call runs before the
  // call's transfers. Owned by this communicator; valid until destruction
  // (also after Abort).
  void* stream() const { return stream_; }

  // All-to-all(v) of device buffers (see Communicator::AllToAllV): this
  // rank's share to itself is a cudaMemcpyAsync, then one NCCL group of
  // ncclSend/ncclRecv, one pair per peer with a non-zero count, at the
  // offsets of the packed layout. `send` and `recv` must not overlap.
  // Errors: InvalidArgument (see communicator_internal::CheckAllToAllV),
  // DeadlineExceeded, Unavailable (a peer or the network failed), Aborted,
  // FailedPrecondition (after an earlier error), Internal.
  absl::Status AllToAllV(const float* send,
                         const std::vector<int64_t>& send_counts, float* recv,
                         const std::vector<int64_t>& recv_counts) override;

  // The same NCCL group enqueued on `stream` (a CUDA stream of
  // options.device; c10d's ProcessGroupNCCL with the caller's stream)
  // instead of this communicator's own, with no host wait: returns once
  // NCCL has accepted the group (the non-blocking communicator left
  // ncclInProgress). Later GPU-side failures show in AsyncError, which
  // Work::Wait polls.
  // Errors: InvalidArgument (`stream` not a CUDA stream of options.device;
  // see CheckAllToAllV); as AllToAllV otherwise.
  absl::Status AllToAllVOnStream(
      device::Stream* stream, const float* send,
      const std::vector<int64_t>& send_counts, float* recv,
      const std::vector<int64_t>& recv_counts) override;

  // ncclCommGetAsyncError as a Status (naming the call); Aborted after
  // Abort; FailedPrecondition after an earlier error.
  absl::Status AsyncError() override;

  // All-gather(v): ncclAllGather when every count is equal (in place when
  // send == recv + rank * count), otherwise this rank's share by
  // cudaMemcpyAsync and one NCCL group of ncclSend/ncclRecv.
  // Errors: as AllToAllV (InvalidArgument: see CheckAllGatherV).
  absl::Status AllGatherV(const float* send, int64_t send_count, float* recv,
                          const std::vector<int64_t>& recv_counts) override;

  // ncclBroadcast, in place in `data` on every rank. Errors: as AllToAllV
  // (InvalidArgument: see CheckBroadcast).
  absl::Status Broadcast(float* data, int64_t count, int root) override;

  // ncclAllReduce (sum) of one float in a device buffer owned by this
  // communicator: returns when every rank has entered the barrier and the
  // reduction has completed on this GPU. Errors: as AllToAllV, less
  // InvalidArgument.
  absl::Status Barrier() override;

  // Point-to-point: ncclSend/ncclRecv of `count` floats with `peer`, each
  // waited for (a Send returns when the matching Recv has taken the data).
  // NCCL has no tags: messages between two ranks match in the order they
  // were issued and `tag` is ignored.
  // Errors: InvalidArgument (peer outside the group or this rank itself,
  // count < 0, null data with count > 0), and as AllToAllV.
  absl::Status Send(const float* data, int64_t count, int peer,
                    uint32_t tag) override;
  absl::Status Recv(float* data, int64_t count, int peer,
                    uint32_t tag) override;

  // A communicator over `ranks` (see Communicator::Split), made by
  // ncclCommSplit with color = a deterministic hash of `ranks` (the same in
  // every process) and key = this rank's position in `ranks`.
  //
  // ncclCommSplit is collective over THIS group: EVERY rank of this group
  // must call Split at the same point of its sequence of calls, each passing
  // the list of the sub-group it belongs to, so that the lists of one round
  // partition this group (e.g. on 4 ranks: ranks 0 and 1 call Split({0, 1})
  // while ranks 2 and 3 call Split({2, 3})). This is what communicator.h
  // asks of every backend; a rank that skips the round makes the others'
  // Split return DeadlineExceeded. Ranks that want no sub-group in a round
  // use SplitByColor(kNoColor, 0).
  //
  // After the split the members exchange their global ranks (an all-gather
  // on the new communicator), so a disagreement about the lists is reported
  // rather than silently forming another group. The result has its own
  // stream, shares nothing with this communicator and may outlive it; its
  // error messages name this group's prefix and the list
  // ("<prefix>/split<n>/<ranks joined by _>", n counting this group's earlier
  // splits).
  // Errors: InvalidArgument (see communicator_internal::CheckSplit; or the
  // group formed is not `ranks`: names both lists), DeadlineExceeded (some
  // rank of this group did not call), Aborted, FailedPrecondition, and as
  // Create.
  absl::StatusOr<std::unique_ptr<Communicator>> Split(
      const std::vector<int>& ranks) override;

  // ncclCommSplit semantics: the ranks of this group that pass the same
  // `color` (>= 0) form a new communicator, ordered by `key` (ties by rank in
  // this group). Every rank of this group must call it at the same point;
  // a rank passing kNoColor joins no group and gets a null pointer (OK). The
  // new communicator's global_ranks() come from an all-gather among its
  // members.
  // Errors: InvalidArgument (color < -1), DeadlineExceeded, Aborted,
  // FailedPrecondition, and as Create.
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> SplitByColor(int color,
                                                                 int key);

  // From any thread, idempotent: marks the communicator aborted, waits for
  // a pending call to notice (within one poll interval, < 1 ms; it returns
  // Aborted), then calls ncclCommAbort, which also stops this rank's
  // kernels still running on the GPU.
  void Abort() override;

 private:
  NcclCommunicator(int rank, int world_size, const NcclOptions& options,
                   std::vector<int> root_ranks, std::string group_name);

  // Create's argument checks (InvalidArgument prefixed with `where`): a
  // world size >= 1, a rank in it, a store, a prefix, a timeout >= 1 ms and
  // a device >= 0.
  static absl::Status CheckCreateArguments(const std::string& where, int rank,
                                           int world_size,
                                           const CoordinationClient* store,
                                           const NcclOptions& options);
  // FailedPrecondition (no usable or visible GPU, with the reason) or
  // InvalidArgument (`device` beyond the visible count), prefixed with
  // `where`.
  static absl::Status CheckDeviceVisible(const std::string& where, int device);
  // Create's rendezvous: rank 0 makes the ncclUniqueId and publishes it
  // hex-encoded under UniqueIdKey(prefix); the others wait for it until
  // `deadline`. Errors: NCCL's, the store's, DeadlineExceeded,
  // InvalidArgument (a value that is not a hex unique id).
  absl::Status ExchangeUniqueId(CoordinationClient* store, absl::Time deadline,
                                nccl_api::UniqueId* id);
  // Create's ncclCommInitRankConfig (non-blocking) with `id`, waited on
  // until `deadline`; the communicator is aborted on failure and kept in
  // comm_ on success.
  absl::Status InitComm(const nccl_api::UniqueId& id, absl::Time deadline);
  // Creates stream_ and barrier_buffer_ (options_.device must be current).
  absl::Status InitResources(absl::string_view op);
  // Waits until the NCCL communicator `comm` leaves ncclInProgress (after
  // ncclCommInitRankConfig / ncclCommSplit / ncclGroupEnd / a lone call /
  // ncclCommFinalize; `what` names it in errors), or `deadline`, or (with
  // check_aborted) Abort().
  absl::Status WaitCommReady(absl::string_view op, void* comm,
                             absl::string_view what, absl::Time deadline,
                             bool check_aborted);
  // Runs one collective: checks the state, makes the device current, calls
  // `enqueue` (which issues the NCCL/CUDA calls on stream_), waits for the
  // NCCL group and then stream_ to finish by the deadline; on failure aborts
  // the NCCL communicator and records the first error.
  absl::Status RunLocked(absl::string_view op,
                         const std::function<absl::Status()>& enqueue)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu_);
  // RunLocked without the wait for the stream: makes the device current,
  // calls `enqueue` and returns once NCCL has launched the calls (the
  // communicator left ncclInProgress) or `deadline`; on failure aborts the
  // NCCL communicator and records the first error.
  absl::Status LaunchLocked(absl::string_view op,
                            const std::function<absl::Status()>& enqueue,
                            absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu_);
  // AllToAllV's calls on `stream` (checks done by the caller).
  absl::Status EnqueueAllToAllVLocked(absl::string_view op, void* stream,
                                      const float* send,
                                      const std::vector<int64_t>& send_counts,
                                      float* recv,
                                      const std::vector<int64_t>& recv_counts)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu_);
  // Closes the NCCL group this thread opened with ncclGroupStart (also when
  // `body_status`, the status of the calls inside it, is an error: NCCL's
  // group state is per thread); returns body_status, else ncclGroupEnd's
  // error.
  absl::Status EndGroup(absl::string_view op, absl::Status body_status) const;
  absl::Status WaitStreamLocked(absl::string_view op, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu_);
  absl::Status CheckUsableLocked(absl::string_view op) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu_);
  // Records `status` as the first error (kFailed) unless aborted, aborts
  // the NCCL communicator, returns `status` (or Aborted after Abort()).
  absl::Status FailLocked(absl::string_view op, absl::Status status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu_);
  void AbortCommLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu_);
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> SplitLocked(
      absl::string_view op, int color, int key, std::string group_name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu_);
  // SplitLocked's checks of the new communicator `newcomm` (an ncclComm_t):
  // ready by `deadline` (or Abort()), its size in *count and this rank's
  // place in *user_rank, 0 <= *user_rank < *count. Errors: NCCL's,
  // DeadlineExceeded, Aborted, Internal (an impossible size or rank).
  absl::Status SplitCommShape(absl::string_view op, void* newcomm,
                              absl::Time deadline, int* count, int* user_rank);
  // The group over the split's communicator `newcomm` (this rank at
  // user_rank of count): its stream and buffer, and every member's rank in
  // the group Create was called for. On failure the child is aborted
  // (which destroys newcomm) and the error returned.
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> MakeSplitChild(
      absl::string_view op, void* newcomm, int count, int user_rank,
      std::string group_name);
  // All-gather of each member's global rank over this (new) communicator.
  absl::Status ExchangeRootRanks(absl::string_view op, int my_root_rank);

  // "nccl <op> on rank <g>[ (rank <r> of group <name>)][ (peer rank <p>)]: "
  // (p, a rank of this group, printed as its global rank; -1: none).
  std::string Where(absl::string_view op, int peer = -1) const;
  // Status for NCCL result `result` of `expr`: its ncclGetErrorString and
  // NCCL's last error message (ncclGetLastError).
  absl::Status NcclError(absl::string_view op, int peer, absl::string_view expr,
                         int result) const;
  // Status for CUDA error `error` of `expr`: cudaGetErrorName and
  // cudaGetErrorString.
  absl::Status CudaError(absl::string_view op, absl::string_view expr,
                         int error) const;

  const int rank_;
  const int world_size_;
  const NcclOptions options_;
  // root_ranks_[r]: rank r of this group in the group Create was called for.
  std::vector<int> root_ranks_;
  // "" for a group made by Create; "<prefix>/split<n>/<ranks>" for Split.
  const std::string group_name_;

  // Set once before the communicator is published; owned. stream_ is a
  // cudaStream_t, barrier_buffer_ a device float.
  void* stream_ = nullptr;
  float* barrier_buffer_ = nullptr;

  std::atomic<bool> aborted_{false};

  // Serializes collectives, splits and the NCCL communicator's teardown.
  absl::Mutex op_mu_;
  // The ncclComm_t; null once aborted or destroyed.
  void* comm_ ABSL_GUARDED_BY(op_mu_) = nullptr;
  // First error (kFailed); OK while kReady.
  absl::Status failed_ ABSL_GUARDED_BY(op_mu_);
  // Count of earlier Splits (names sub-groups in messages).
  int splits_ ABSL_GUARDED_BY(op_mu_) = 0;
};

}  // namespace muon

#endif  // MUON_COMM_NCCL_COMMUNICATOR_H_
