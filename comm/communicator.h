// Collectives between the ranks of a process group: the data path of a
// distributed Muon step. One interface, several backends: Gloo over TCP
// (comm/gloo_communicator.h, CPU buffers), NCCL (comm/nccl_communicator.h,
// CUDA device buffers; built with --config=cuda) and an in-process backend
// for a world of one (comm/local_communicator.h). A method a backend lacks
// returns Unimplemented, never crashes.
//
// Contract (as torch.distributed): every rank of the group calls the same
// collectives in the same order with matching sizes. Buffers are float32,
// counts are in elements (not bytes). Every call is bounded by the
// backend's timeout; a failed or aborted peer makes the call return an error
// naming the peer rank when the backend knows it, never hang.
//
// Lifecycle: Create (backend-specific, may rendezvous) -> collectives ->
// destroy (or Abort from any thread to unblock pending calls).
//
// Collectives on streams (c10d's Work and ProcessGroup async_op=True): a
// collective can be enqueued on a device stream (device/stream.h) instead
// of run on the calling thread. Host backends (Gloo, local) run it as the
// host stream's work, on that stream's thread; NCCL enqueues it on the
// CUDA stream with no host wait. Either way its completion is an event
// that other streams wait on, and Work::Wait is the bounded host wait.
#ifndef MUON_COMM_COMMUNICATOR_H_
#define MUON_COMM_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "device/device.h"
#include "device/stream.h"

namespace muon {

// The completion of one collective enqueued on a stream (c10d's Work).
// Thread-compatible.
class Work {
 public:
  virtual ~Work() = default;
  // True once the collective has finished on its stream, with or without
  // an error.
  virtual bool IsCompleted() = 0;
  // Blocks the calling host thread until the collective has finished, at
  // most `timeout`, and returns its status.
  // Errors: DeadlineExceeded (names the collective, the backend and the
  // timeout); the collective's own error (names the peer when known).
  virtual absl::Status Wait(absl::Duration timeout) = 0;
  // Recorded on the stream after the collective: another stream's
  // WaitFor(event()) orders its later work after the collective.
  virtual device::Event* event() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  // This rank in the group, 0 <= rank() < world_size().
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // "gloo", "local", "nccl".
  virtual std::string backend() const = 0;
  // Where the buffers of this communicator's collectives live: the host
  // (Gloo, local) or the CUDA device of an NCCL communicator.
  virtual device::Device buffer_device() const {
    return device::Device::Host();
  }

  // The ranks of this group in the world it was split from, indexed by
  // rank() (torch.distributed.get_process_group_ranks). A group that was
  // not split is its own world: 0 .. world_size()-1.
  virtual std::vector<int> global_ranks() const {
    std::vector<int> ranks(world_size());
    for (int r = 0; r < world_size(); ++r) ranks[r] = r;
    return ranks;
  }

  // All-to-all(v): sends send_counts[p] elements to peer p, taken from
  // `send` packed in peer order, and receives recv_counts[p] elements from
  // peer p into `recv` packed in peer order. Both vectors have world_size()
  // entries; send_counts[q] on rank p must equal recv_counts[p] on rank q.
  // Zero counts and null buffers for zero totals are allowed.
  // Errors: InvalidArgument (wrong vector sizes), DeadlineExceeded,
  // Unavailable/Aborted (peer failed; names the peer when known).
  virtual absl::Status AllToAllV(const float* send,
                                 const std::vector<int64_t>& send_counts,
                                 float* recv,
                                 const std::vector<int64_t>& recv_counts) = 0;

  // AllToAllV in `stream`'s order, called from inside stream->Launch (the
  // step executor's exchanges). Host backends run it at once on the
  // calling thread (the host stream's own), blocking as AllToAllV; NCCL
  // enqueues it on the stream's CUDA stream and returns without waiting
  // (errors that happen on the GPU later surface in Work::Wait or the
  // stream's Synchronize). Buffers are memory of the stream's device and
  // must stay valid until the collective has finished.
  // Errors: those of AllToAllV; InvalidArgument when `stream`'s device is
  // not this backend's (host streams for Gloo and local, CUDA for NCCL).
  virtual absl::Status AllToAllVOnStream(
      device::Stream* stream, const float* send,
      const std::vector<int64_t>& send_counts, float* recv,
      const std::vector<int64_t>& recv_counts);

  // Enqueues AllToAllV on `stream` after its earlier work and returns the
  // collective's Work (torch.distributed.all_to_all_single with
  // async_op=True). `send` and `recv` must stay valid, and the count
  // vectors are copied.
  // Errors: those of Stream::Launch and Event::Record; InvalidArgument
  // (wrong vector sizes, another device). The collective's own errors come
  // from Work::Wait, except on a CUDA stream, whose Launch runs the
  // enqueue on the calling thread: there what fails while enqueueing (an
  // NCCL launch error, any error of a staged exchange, which runs whole
  // then) is returned by this call.
  absl::StatusOr<std::unique_ptr<Work>> EnqueueAllToAllV(
      device::Stream* stream, const float* send,
      const std::vector<int64_t>& send_counts, float* recv,
      const std::vector<int64_t>& recv_counts);

  // Errors the backend learned asynchronously (NCCL's
  // ncclCommGetAsyncError); OK for backends without any.
  virtual absl::Status AsyncError() { return absl::OkStatus(); }

  // All-gather(v): every rank contributes `send_count` elements; `recv`
  // receives recv_counts[p] elements of rank p, packed in rank order
  // (recv_counts[rank()] == send_count).
  virtual absl::Status AllGatherV(const float* send, int64_t send_count,
                                  float* recv,
                                  const std::vector<int64_t>& recv_counts) = 0;

  // Broadcast of `count` elements from `root` into `data` on every rank.
  virtual absl::Status Broadcast(float* data, int64_t count, int root) = 0;

  // Blocks until every rank of the group has entered the barrier.
  virtual absl::Status Barrier() = 0;

  // Point-to-point, matched by (peer, tag). Optional: Unimplemented.
  virtual absl::Status Send(const float* data, int64_t count, int peer,
                            uint32_t tag) {
    return absl::UnimplementedError(backend() + ": Send");
  }
  virtual absl::Status Recv(float* data, int64_t count, int peer,
                            uint32_t tag) {
    return absl::UnimplementedError(backend() + ": Recv");
  }

  // A communicator over the sub-group `ranks` (ranks of this group, sorted
  // ascending, containing rank()). Every rank of this group calls Split with
  // the same sequence of calls; ranks outside a sub-group pass its list too
  // only if they belong to it. Optional: Unimplemented.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> Split(
      const std::vector<int>& ranks) {
    return absl::UnimplementedError(backend() + ": Split");
  }

  // Makes pending and future calls fail fast (from any thread).
  virtual void Abort() = 0;
};

}  // namespace muon

#endif  // MUON_COMM_COMMUNICATOR_H_
