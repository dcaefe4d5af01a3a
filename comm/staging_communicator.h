// StagingCommunicator: collectives over buffers of one device (a CUDA GPU)
// run by a communicator of host memory (Gloo), as c10d's Gloo backend runs
// collectives on CUDA tensors: each call copies its device input into host
// staging memory, runs the host collective there, and copies the result
// back to the device before it returns. It lets several rank processes
// share one GPU (NCCL refuses two ranks on one device) and CUDA parameters
// train over Gloo, at the cost of two device-host copies per collective.
//
// The stream-ordered all-to-all (AllToAllVOnStream, from inside the
// stream's Launch, which for CUDA runs on the enqueuing thread) first waits
// for the stream's earlier work, then stages, exchanges and copies back on
// the calling thread, so work enqueued on the stream afterwards sees the
// result; the enqueuing thread blocks for the exchange, as Gloo does.
// Staging memory is page-locked host memory from the runtime's
// pinned_host_allocator() (as c10d pins its CPU copies of CUDA tensors),
// so the copies run by DMA at the bus's rate (pageable host memory when
// page-locked memory runs out); it is grown to the largest collective so
// far and reused.
#ifndef MUON_COMM_STAGING_COMMUNICATOR_H_
#define MUON_COMM_STAGING_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "device/memory.h"
#include "device/runtime.h"

namespace muon {

// Lifecycle: Create -> collectives -> destroy. Thread-safety: calls are
// serialized by a mutex (the staging memory is shared); Abort may be called
// from any thread at any time.
class StagingCommunicator final : public Communicator {
 public:
  // Stages through host memory for the collectives of `host` (buffers in
  // host memory: buffer_device() is the host; not owned, outlives this
  // communicator) on buffers of `runtime`'s device (not owned, outlives
  // it). `stream_wait` bounds the wait for a stream's earlier work in
  // AllToAllVOnStream (seconds).
  // Errors: InvalidArgument (null arguments; `host` whose buffers are not
  // host memory; `runtime` on the host, where no staging is needed).
  static absl::StatusOr<std::unique_ptr<StagingCommunicator>> Create(
      Communicator* host, device::Runtime* runtime,
      absl::Duration stream_wait = absl::Minutes(30));

  int rank() const override { return host_->rank(); }
  int world_size() const override { return host_->world_size(); }
  // The host backend's name with "+staged" ("gloo+staged").
  std::string backend() const override;
  // The runtime's device: where the buffers of every collective live.
  device::Device buffer_device() const override { return runtime_->device(); }
  std::vector<int> global_ranks() const override {
    return host_->global_ranks();
  }

  // As Communicator's, on buffers of buffer_device(); errors are the host
  // collective's, the device copies' (CUDA's), or InvalidArgument for bad
  // counts (the checks every backend shares, before any copy).
  absl::Status AllToAllV(const float* send,
                         const std::vector<int64_t>& send_counts, float* recv,
                         const std::vector<int64_t>& recv_counts) override;
  // `stream` must be on buffer_device() (InvalidArgument naming it);
  // DeadlineExceeded when its earlier work does not finish within
  // stream_wait.
  absl::Status AllToAllVOnStream(
      device::Stream* stream, const float* send,
      const std::vector<int64_t>& send_counts, float* recv,
      const std::vector<int64_t>& recv_counts) override;
  absl::Status AllGatherV(const float* send, int64_t send_count, float* recv,
                          const std::vector<int64_t>& recv_counts) override;
  absl::Status Broadcast(float* data, int64_t count, int root) override;
  absl::Status Barrier() override { return host_->Barrier(); }
  absl::Status AsyncError() override { return host_->AsyncError(); }
  // The host group's Split, staged the same way (the new communicator owns
  // the host sub-group).
  absl::StatusOr<std::unique_ptr<Communicator>> Split(
      const std::vector<int>& ranks) override;
  void Abort() override { host_->Abort(); }

 private:
  StagingCommunicator(Communicator* host, device::Runtime* runtime,
                      absl::Duration stream_wait)
      : host_(host), runtime_(runtime), stream_wait_(stream_wait) {}

  // Grows the staging buffers to at least `send` and `recv` floats.
  // Errors: those of the pinned host allocator (ResourceExhausted, CUDA's).
  absl::Status Reserve(int64_t send, int64_t recv);
  // A local failure (staging memory, a device copy, the stream's earlier
  // work) before the host collective: aborts the host communicator, so
  // that the peers, which are in or entering the collective, fail at once
  // (their connections are reset) instead of at their timeout, and returns
  // `status` saying so. The communicator is then unusable (Aborted).
  absl::Status FailedBeforeExchange(absl::Status status);
  // With mu_ held: `sent` floats of device memory `send` into the send
  // staging, `exchange(host_send, host_recv)` (the host collective), then
  // `received` floats of the receive staging into device memory `recv`.
  template <typename Exchange>
  absl::Status Staged(const float* send, int64_t sent, float* recv,
                      int64_t received, Exchange&& exchange);
  absl::Status AllToAllVLocked(const float* send,
                               const std::vector<int64_t>& send_counts,
                               float* recv,
                               const std::vector<int64_t>& recv_counts);

  std::unique_ptr<Communicator> owned_;  // a Split's host sub-group
  Communicator* const host_;
  device::Runtime* const runtime_;
  const absl::Duration stream_wait_;
  std::mutex mu_;
  // Page-locked host memory (runtime_->pinned_host_allocator()).
  device::DeviceBuffer<float> send_staging_;  // guarded by mu_
  device::DeviceBuffer<float> recv_staging_;  // guarded by mu_
};

}  // namespace muon

#endif  // MUON_COMM_STAGING_COMMUNICATOR_H_
