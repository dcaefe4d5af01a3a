#include "comm/communicator.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "device/runtime.h"

namespace muon {
namespace {

// A Work whose completion is an event recorded after the collective.
class EventWork final : public Work {
 public:
  EventWork(Communicator* comm, std::unique_ptr<device::Event> event,
            std::string what)
      : comm_(comm), event_(std::move(event)), what_(std::move(what)) {}

  bool IsCompleted() override { return event_->Query(); }

  absl::Status Wait(absl::Duration timeout) override {
    // Polls the event and the backend's asynchronous errors (a failed NCCL
    // peer never completes the event), backing off from 10 us to 1 ms.
    const absl::Time deadline = absl::Now() + timeout;
    absl::Duration pause = absl::Microseconds(10);
    while (!event_->Query()) {
      if (absl::Status async = comm_->AsyncError(); !async.ok()) return async;
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            what_, ": not finished within ", absl::FormatDuration(timeout)));
      }
      absl::SleepFor(pause);
      pause = std::min(pause * 2, absl::Milliseconds(1));
    }
    // An aborted NCCL communicator's kernels exit and the event completes
    // with no CUDA error, the data half written: the backend's error says
    // so (as c10d checks ncclCommGetAsyncError before trusting an event).
    if (absl::Status async = comm_->AsyncError(); !async.ok()) return async;
    return event_->Synchronize(absl::ZeroDuration());
  }

  device::Event* event() override { return event_.get(); }

 private:
  Communicator* const comm_;  // Not owned.
  const std::unique_ptr<device::Event> event_;
  const std::string what_;
};

}  // namespace

absl::Status Communicator::AllToAllVOnStream(
    device::Stream* stream, const float* send,
    const std::vector<int64_t>& send_counts, float* recv,
    const std::vector<int64_t>& recv_counts) {
  if (stream == nullptr || !stream->device().is_host()) {
    return absl::InvalidArgumentError(
        absl::StrCat(backend(), " AllToAllV on rank ", rank(), ": stream \"",
                     stream ? stream->name() : "null", "\" is on ",
                     stream ? stream->device().ToString() : "no device",
                     "; this backend runs on host streams"));
  }
  return AllToAllV(send, send_counts, recv, recv_counts);
}

absl::StatusOr<std::unique_ptr<Work>> Communicator::EnqueueAllToAllV(
    device::Stream* stream, const float* send,
    const std::vector<int64_t>& send_counts, float* recv,
    const std::vector<int64_t>& recv_counts) {
  const std::string what =
      absl::StrCat(backend(), " AllToAllV on rank ", rank(), " (stream \"",
                   stream ? stream->name() : "null", "\")");
  if (stream == nullptr)
    return absl::InvalidArgumentError(what + ": no stream");
  absl::StatusOr<device::Runtime*> runtime =
      device::GetRuntime(stream->device());
  if (!runtime.ok()) return runtime.status();
  absl::StatusOr<std::unique_ptr<device::Event>> event =
      (*runtime)->CreateEvent(what);
  if (!event.ok()) return event.status();
  absl::Status launched =
      stream->Launch([this, stream, send, send_counts, recv, recv_counts] {
        return AllToAllVOnStream(stream, send, send_counts, recv, recv_counts);
      });
  if (!launched.ok()) return launched;
  if (absl::Status recorded = (*event)->Record(stream); !recorded.ok()) {
    return recorded;
  }
  return std::unique_ptr<Work>(new EventWork(this, *std::move(event), what));
}

}  // namespace muon
