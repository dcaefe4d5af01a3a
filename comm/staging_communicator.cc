#include "comm/staging_communicator.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/local_communicator.h"
#include "common/status_macros.h"

namespace muon {
namespace {

int64_t Total(const std::vector<int64_t>& counts) {
  return std::accumulate(counts.begin(), counts.end(), int64_t{0});
}

constexpr int64_t kFloat = static_cast<int64_t>(sizeof(float));

}  // namespace

absl::StatusOr<std::unique_ptr<StagingCommunicator>>
StagingCommunicator::Create(Communicator* host, device::Runtime* runtime,
                            absl::Duration stream_wait) {
  if (host == nullptr || runtime == nullptr) {
    return absl::InvalidArgumentError(
        "StagingCommunicator: host and runtime must be non-null");
  }
  if (!host->buffer_device().is_host()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StagingCommunicator: the ", host->backend(),
        " communicator exchanges ", host->buffer_device().ToString(),
        " memory; staging needs one of host memory (gloo)"));
  }
  if (runtime->device().is_host()) {
    return absl::InvalidArgumentError(
        "StagingCommunicator: the runtime is the host's; host buffers need "
        "no staging (use the host communicator)");
  }
  return std::unique_ptr<StagingCommunicator>(
      new StagingCommunicator(host, runtime, stream_wait));
}

std::string StagingCommunicator::backend() const {
  return absl::StrCat(host_->backend(), "+staged");
}

absl::Status StagingCommunicator::Reserve(int64_t send, int64_t recv) {
  for (auto [buffer, floats] : {std::make_pair(&send_staging_, send),
                                std::make_pair(&recv_staging_, recv)}) {
    if (buffer->size() >= floats) continue;
    *buffer = device::DeviceBuffer<float>();  // freed before the larger one
    absl::StatusOr<device::DeviceBuffer<float>> pinned =
        device::DeviceBuffer<float>::Allocate(runtime_->pinned_host_allocator(),
                                              floats);
    // Out of page-locked memory (a limit of its own, RLIMIT_MEMLOCK in a
    // container): pageable memory still works, with slower copies.
    if (absl::IsResourceExhausted(pinned.status())) {
      pinned = device::DeviceBuffer<float>::Allocate(device::HostAllocator(),
                                                     floats);
    }
    if (!pinned.ok()) return pinned.status();
    *buffer = *std::move(pinned);
  }
  return absl::OkStatus();
}

absl::Status StagingCommunicator::FailedBeforeExchange(absl::Status status) {
  host_->Abort();
  return absl::Status(
      status.code(),
      absl::StrCat(backend(), " on rank ", rank(), ": ", status.message(),
                   " (before the exchange: aborted the host communicator, so "
                   "that the peers fail now instead of at their timeout)"));
}

template <typename Exchange>
absl::Status StagingCommunicator::Staged(const float* send, int64_t sent,
                                         float* recv, int64_t received,
                                         Exchange&& exchange) {
  absl::Status staged = Reserve(sent, received);
  if (staged.ok()) {
    staged = runtime_->CopyToHost(send_staging_.data(), send, sent * kFloat);
  }
  if (!staged.ok()) return FailedBeforeExchange(std::move(staged));
  MUON_RETURN_IF_ERROR(exchange(send_staging_.data(), recv_staging_.data()));
  return runtime_->CopyFromHost(recv, recv_staging_.data(), received * kFloat);
}

absl::Status StagingCommunicator::AllToAllVLocked(
    const float* send, const std::vector<int64_t>& send_counts, float* recv,
    const std::vector<int64_t>& recv_counts) {
  MUON_RETURN_IF_ERROR(communicator_internal::CheckAllToAllV(
      backend(), rank(), world_size(), send, send_counts, recv, recv_counts));
  return Staged(send, Total(send_counts), recv, Total(recv_counts),
                [&](const float* host_send, float* host_recv) {
                  return host_->AllToAllV(host_send, send_counts, host_recv,
                                          recv_counts);
                });
}

absl::Status StagingCommunicator::AllToAllV(
    const float* send, const std::vector<int64_t>& send_counts, float* recv,
    const std::vector<int64_t>& recv_counts) {
  std::lock_guard<std::mutex> lock(mu_);
  return AllToAllVLocked(send, send_counts, recv, recv_counts);
}

absl::Status StagingCommunicator::AllToAllVOnStream(
    device::Stream* stream, const float* send,
    const std::vector<int64_t>& send_counts, float* recv,
    const std::vector<int64_t>& recv_counts) {
  if (stream == nullptr || stream->device() != buffer_device()) {
    return absl::InvalidArgumentError(absl::StrCat(
        backend(), " AllToAllVOnStream on rank ", rank(), ": the stream ",
        stream == nullptr ? std::string("is null")
                          : absl::StrCat("\"", stream->name(), "\" is on ",
                                         stream->device().ToString()),
        "; this communicator's buffers are on ", buffer_device().ToString()));
  }
  // The device input is written by the stream's earlier work.
  if (absl::Status s = stream->Synchronize(stream_wait_); !s.ok()) {
    return FailedBeforeExchange(std::move(s));
  }
  std::lock_guard<std::mutex> lock(mu_);
  return AllToAllVLocked(send, send_counts, recv, recv_counts);
}

absl::Status StagingCommunicator::AllGatherV(
    const float* send, int64_t send_count, float* recv,
    const std::vector<int64_t>& recv_counts) {
  std::lock_guard<std::mutex> lock(mu_);
  MUON_RETURN_IF_ERROR(communicator_internal::CheckAllGatherV(
      backend(), rank(), world_size(), send, send_count, recv, recv_counts));
  return Staged(send, send_count, recv, Total(recv_counts),
                [&](const float* host_send, float* host_recv) {
                  return host_->AllGatherV(host_send, send_count, host_recv,
                                           recv_counts);
                });
}

absl::Status StagingCommunicator::Broadcast(float* data, int64_t count,
                                            int root) {
  std::lock_guard<std::mutex> lock(mu_);
  MUON_RETURN_IF_ERROR(communicator_internal::CheckBroadcast(
      backend(), rank(), world_size(), data, count, root));
  absl::Status staged = Reserve(count, 0);
  if (staged.ok() && rank() == root) {
    staged = runtime_->CopyToHost(send_staging_.data(), data, count * kFloat);
  }
  if (!staged.ok()) return FailedBeforeExchange(std::move(staged));
  MUON_RETURN_IF_ERROR(host_->Broadcast(send_staging_.data(), count, root));
  if (rank() == root) return absl::OkStatus();  // its data is unchanged
  return runtime_->CopyFromHost(data, send_staging_.data(), count * kFloat);
}

absl::StatusOr<std::unique_ptr<Communicator>> StagingCommunicator::Split(
    const std::vector<int>& ranks) {
  MUON_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> sub, host_->Split(ranks));
  std::unique_ptr<StagingCommunicator> staged(
      new StagingCommunicator(sub.get(), runtime_, stream_wait_));
  staged->owned_ = std::move(sub);
  return std::unique_ptr<Communicator>(std::move(staged));
}

}  // namespace muon
