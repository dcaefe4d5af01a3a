// Streams and events: ordered queues of work on one device, and fences
// between them (CUDA's cudaStream_t / cudaEvent_t; XLA StreamExecutor's
// Stream and Event; PyTorch's c10::Stream and c10::Event).
//
// Work enqueued on one stream runs in order; work on different streams runs
// concurrently unless an event orders it: `event.Record(a)` captures all
// work enqueued on stream `a` so far, `b.WaitFor(event)` makes all work
// enqueued on `b` afterwards start only once that captured work has
// finished (cudaEventRecord / cudaStreamWaitEvent). The host waits with
// the bounded `Synchronize` of a stream or an event.
//
// Errors travel with the work, as CUDA's do: when work on a stream fails,
// the stream skips the work enqueued after it, completes the events
// recorded after it with that error, and a stream waiting on such an event
// takes the error too. The host sees the first error in `Synchronize`.
//
// Implementations: the host (device/host_stream.h: work runs on a thread of
// the stream's own) and CUDA (device/cuda_runtime.h).
#ifndef MUON_DEVICE_STREAM_H_
#define MUON_DEVICE_STREAM_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "device/device.h"

namespace muon {
namespace device {

class Stream;

// A fence in a stream's order. Thread-safe.
//
// States: never recorded (waiting on it is a no-op, Query is true) ->
// recorded (pending) -> complete (with the status of the work it captured).
// Recording again re-arms it; a wait binds to the latest Record before the
// wait was enqueued.
class Event {
 public:
  virtual ~Event() = default;

  // Captures the work enqueued on `stream` so far (cudaEventRecord). The
  // event and the stream must be on the same device.
  // Errors: InvalidArgument (another device); the CUDA error.
  virtual absl::Status Record(Stream* stream) = 0;

  // True once the captured work has finished (cudaEventQuery), whether it
  // failed or not; Synchronize returns its status.
  virtual bool Query() = 0;

  // Blocks the calling host thread until the captured work has finished,
  // at most `timeout`. Returns the status of that work.
  // Errors: DeadlineExceeded (names the event and the timeout); the first
  // error of the captured work.
  virtual absl::Status Synchronize(absl::Duration timeout) = 0;

  // Seconds from the completion of `earlier` to the completion of this
  // event (negative when this one completed first), both recorded and
  // complete: cudaEventElapsedTime for events of
  // Runtime::CreateTimingEvent (resolution about 0.5 us); the host clock at
  // each completion for host events.
  // Errors: InvalidArgument (`earlier` of another device or kind, or an
  // event created without timing); FailedPrecondition (either never
  // recorded or not complete yet); the CUDA error.
  virtual absl::StatusOr<double> SecondsSince(Event* earlier) = 0;

  virtual const std::string& name() const = 0;
};

// Work a stream runs in order. Host: the function is the work itself and
// runs on the stream's thread. CUDA: the function is called at once on the
// enqueuing thread and enqueues its device work on the stream's
// native_handle() (kernel launches, cuBLAS, NCCL); its Status reports
// enqueue errors. Either way a non-OK Status fails the stream.
using StreamFn = std::function<absl::Status()>;

// An ordered queue of work on one device. Thread-compatible: one thread
// enqueues at a time (the work itself runs wherever the implementation
// runs it).
class Stream {
 public:
  virtual ~Stream() = default;

  virtual Device device() const = 0;
  // A name for errors and traces ("comm", "compute", ...).
  virtual const std::string& name() const = 0;

  // Enqueues `fn` after all work enqueued so far. Work enqueued after a
  // failure is skipped (not run) until the failure has been returned by
  // Synchronize.
  // Errors: FailedPrecondition (the stream is shutting down); CUDA: fn's
  // own enqueue error.
  virtual absl::Status Launch(StreamFn fn) = 0;

  // Work enqueued after this call starts once the work `event` captured
  // has finished (cudaStreamWaitEvent); if that work failed, this stream
  // takes its error (also after the failing stream's Synchronize returned
  // it: re-record an event before waiting on it again). No-op for an event
  // never recorded.
  // Errors: InvalidArgument (another device); the CUDA error.
  virtual absl::Status WaitFor(Event* event) = 0;

  // Blocks the calling host thread until all work enqueued so far has
  // finished, at most `timeout`, and returns the first error of that work
  // (then clears it: work enqueued afterwards runs again).
  // Errors: DeadlineExceeded (names the stream and the timeout); the first
  // error of the stream's work since the previous Synchronize.
  virtual absl::Status Synchronize(absl::Duration timeout) = 0;

  // cudaStream_t for CUDA streams; nullptr for host streams.
  virtual void* native_handle() const = 0;
};

}  // namespace device
}  // namespace muon

#endif  // MUON_DEVICE_STREAM_H_
