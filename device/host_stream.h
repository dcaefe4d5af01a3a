// The host implementation of streams and events (device/stream.h), the
// host platform of XLA's StreamExecutor in spirit: each stream owns one
// thread that runs its work in order, so work on two streams really runs
// concurrently and only events order it. Work never runs inline on the
// enqueuing thread: a missing event wait shows as a data race (which
// ThreadSanitizer reports) or a wrong result, never as an accident of
// timing that hides it.
//
// Built on std::mutex and std::condition_variable only (not absl::Mutex),
// so that ThreadSanitizer sees every ordering edge a stream or an event
// makes.
#ifndef MUON_DEVICE_HOST_STREAM_H_
#define MUON_DEVICE_HOST_STREAM_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "device/stream.h"

namespace muon {
namespace device {

class HostStream;

// A host event. Records of one event come from one stream at a time (a
// wait binds to a record generation; generations complete in order). The
// event's state is shared with the work queued on streams, so an event may
// be destroyed while a stream still holds a record or a wait of it.
class HostEvent final : public Event {
 public:
  explicit HostEvent(std::string name);

  // Errors: InvalidArgument (`stream` is not a host stream); the stream's
  // Launch errors (the event then completes at once with that error).
  absl::Status Record(Stream* stream) override;
  bool Query() override;
  // Errors: DeadlineExceeded; the captured work's first error.
  absl::Status Synchronize(absl::Duration timeout) override;
  // The host clock at the two completions (the recording stream's thread
  // reads it when the work before the record has finished).
  // Errors: InvalidArgument (not a host event); FailedPrecondition (never
  // recorded, or not complete).
  absl::StatusOr<double> SecondsSince(Event* earlier) override;
  const std::string& name() const override { return state_->name; }

 private:
  friend class HostStream;
  // What records and waits queued on streams refer to.
  struct State {
    explicit State(std::string n) : name(std::move(n)) {}
    // Blocks until `generation` is complete; returns the status of the
    // work it captured.
    absl::Status AwaitGeneration(int64_t generation);
    // Called by the recording stream's thread when the work before the
    // record of `generation` has finished with `status`.
    void Complete(int64_t generation, const absl::Status& status);
    // completed_at of the latest record. Errors: FailedPrecondition (never
    // recorded, or not complete).
    absl::StatusOr<absl::Time> CompletionTime();

    // The status of completed `generation`: its failure when failed is
    // one of the last kKeptFailures failed generations, else OK. Called
    // with mu held.
    absl::Status StatusOfLocked(int64_t generation) const;

    // Failed generations remembered for waits bound to them (a later
    // record's status never answers an earlier one's wait).
    static constexpr size_t kKeptFailures = 64;

    const std::string name;
    std::mutex mu;
    std::condition_variable cv;
    int64_t recorded = 0;   // guarded by mu
    int64_t completed = 0;  // guarded by mu
    // The failed generations among the last completed ones and their
    // errors (at most kKeptFailures, oldest dropped); guarded by mu.
    std::map<int64_t, absl::Status> failed;
    // When generation `completed` completed; guarded by mu.
    absl::Time completed_at = absl::InfinitePast();
  };

  // The generation a wait enqueued now binds to (0: never recorded).
  int64_t recorded() const;

  const std::shared_ptr<State> state_;
};

// A host stream: a FIFO of work run by its own thread.
//
// Lifecycle: construct (starts the thread) -> Launch / WaitFor / Record ->
// destroy (runs what is queued, skipping work after a failure, and joins).
class HostStream final : public Stream {
 public:
  explicit HostStream(std::string name);
  ~HostStream() override;
  HostStream(const HostStream&) = delete;
  HostStream& operator=(const HostStream&) = delete;

  Device device() const override { return Device::Host(); }
  const std::string& name() const override { return name_; }
  absl::Status Launch(StreamFn fn) override;
  // Errors: InvalidArgument (`event` is not a host event).
  absl::Status WaitFor(Event* event) override;
  absl::Status Synchronize(absl::Duration timeout) override;
  void* native_handle() const override { return nullptr; }

 private:
  friend class HostEvent;
  struct Task {
    enum class Kind { kRun, kRecord, kWait };
    Kind kind = Kind::kRun;
    StreamFn fn;
    std::shared_ptr<HostEvent::State> event;  // kRecord and kWait
    int64_t generation = 0;
  };

  absl::Status Enqueue(Task task);
  // The queue is a ring over ring_ that only grows (doubling), so that a
  // warm stream enqueues without allocating. Called with mu_ held.
  void PushLocked(Task task);
  Task PopLocked();
  void WorkerLoop();
  // Runs one task on the worker thread; returns its error (OK when the
  // task was skipped or succeeded).
  absl::Status RunTask(Task& task, const absl::Status& stream_error);

  const std::string name_;
  std::mutex mu_;
  std::condition_variable work_cv_;  // the worker waits for tasks
  std::condition_variable done_cv_;  // Synchronize waits for progress
  std::vector<Task> ring_;           // guarded by mu_
  size_t head_ = 0;                  // guarded by mu_; index of the oldest
  size_t queued_ = 0;                // guarded by mu_; tasks in the ring
  int64_t enqueued_ = 0;             // guarded by mu_
  int64_t finished_ = 0;             // guarded by mu_
  bool shutdown_ = false;            // guarded by mu_
  absl::Status error_;               // guarded by mu_
  std::thread worker_;
};

}  // namespace device
}  // namespace muon

#endif  // MUON_DEVICE_HOST_STREAM_H_
