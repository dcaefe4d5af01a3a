#include "device/host_stream.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"

namespace muon {
namespace device {
namespace {

// A copy of `s` that shares nothing with it. absl::Status shares its
// message through a reference count that Debian's Abseil (not built with
// ThreadSanitizer) changes out of TSan's sight, so a Status handed from
// one thread to another is copied deeply: each thread then owns its own.
absl::Status Detached(const absl::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(s.code(), std::string(s.message()));
}

// A wait bound for condition_variable::wait_for: a year at most (longer
// ones, infinite included, wait as long). libstdc++ adds it to now(): a
// saturated nanoseconds::max() overflowed into the past and a "never"
// timeout returned at once.
std::chrono::nanoseconds ToChrono(absl::Duration d) {
  constexpr absl::Duration kLongest = absl::Hours(24 * 365);
  if (d > kLongest) return absl::ToChronoNanoseconds(kLongest);
  return absl::ToChronoNanoseconds(d);
}

}  // namespace

HostEvent::HostEvent(std::string name)
    : state_(std::make_shared<State>(std::move(name))) {}

absl::Status HostEvent::Record(Stream* stream) {
  auto* host = dynamic_cast<HostStream*>(stream);
  if (host == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("host event \"", name(), "\" recorded on stream \"",
                     stream ? stream->name() : "null", "\" of device ",
                     stream ? stream->device().ToString() : "none"));
  }
  HostStream::Task task;
  task.kind = HostStream::Task::Kind::kRecord;
  task.event = state_;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    task.generation = ++state_->recorded;
  }
  const int64_t generation = task.generation;
  absl::Status queued = host->Enqueue(std::move(task));
  // Never left armed: a record that could not be queued completes now.
  if (!queued.ok()) state_->Complete(generation, queued);
  return queued;
}

int64_t HostEvent::recorded() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->recorded;
}

void HostEvent::State::Complete(int64_t generation,
                                const absl::Status& work_status) {
  // Notify with the lock held: a waiter that sees the completion may
  // destroy what it waited on as soon as it can lock.
  std::lock_guard<std::mutex> lock(mu);
  if (generation > completed) {
    completed = generation;
    if (!work_status.ok()) {
      failed[generation] = Detached(work_status);
      if (failed.size() > kKeptFailures) failed.erase(failed.begin());
    }
    completed_at = absl::Now();
  }
  cv.notify_all();
}

absl::Status HostEvent::State::StatusOfLocked(int64_t generation) const {
  const auto it = failed.find(generation);
  return it == failed.end() ? absl::OkStatus() : Detached(it->second);
}

absl::Status HostEvent::State::AwaitGeneration(int64_t generation) {
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return completed >= generation; });
  return StatusOfLocked(generation);
}

bool HostEvent::Query() {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->completed >= state_->recorded;
}

absl::Status HostEvent::Synchronize(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(state_->mu);
  const int64_t target = state_->recorded;
  if (!state_->cv.wait_for(lock, ToChrono(timeout),
                           [&] { return state_->completed >= target; })) {
    return absl::DeadlineExceededError(
        absl::StrCat("event \"", state_->name, "\": the work it captured did ",
                     "not finish within ", absl::FormatDuration(timeout)));
  }
  return state_->StatusOfLocked(target);
}

absl::StatusOr<absl::Time> HostEvent::State::CompletionTime() {
  std::lock_guard<std::mutex> lock(mu);
  if (recorded == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("event \"", name, "\" was never recorded"));
  }
  if (completed < recorded) {
    return absl::FailedPreconditionError(absl::StrCat(
        "event \"", name, "\": the work it captured has not finished"));
  }
  return completed_at;
}

absl::StatusOr<double> HostEvent::SecondsSince(Event* earlier) {
  auto* other = dynamic_cast<HostEvent*>(earlier);
  if (other == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host event \"", name(), "\" timed against \"",
        earlier ? earlier->name() : "null", "\", not a host event"));
  }
  absl::StatusOr<absl::Time> then = other->state_->CompletionTime();
  if (!then.ok()) return then.status();
  absl::StatusOr<absl::Time> now = state_->CompletionTime();
  if (!now.ok()) return now.status();
  return absl::ToDoubleSeconds(*now - *then);
}

HostStream::HostStream(std::string name) : name_(std::move(name)) {
  worker_ = std::thread([this] { WorkerLoop(); });
}

HostStream::~HostStream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
  }
  work_cv_.notify_all();
  worker_.join();
}

absl::Status HostStream::Enqueue(Task task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_) {
      return absl::FailedPreconditionError(
          absl::StrCat("stream \"", name_, "\" is shutting down"));
    }
    PushLocked(std::move(task));
    ++enqueued_;
  }
  work_cv_.notify_one();
  return absl::OkStatus();
}

void HostStream::PushLocked(Task task) {
  if (queued_ == ring_.size()) {
    std::vector<Task> grown(std::max<size_t>(16, 2 * ring_.size()));
    for (size_t i = 0; i < queued_; ++i) {
      grown[i] = std::move(ring_[(head_ + i) % ring_.size()]);
    }
    ring_ = std::move(grown);
    head_ = 0;
  }
  ring_[(head_ + queued_) % ring_.size()] = std::move(task);
  ++queued_;
}

HostStream::Task HostStream::PopLocked() {
  Task task = std::move(ring_[head_]);
  ring_[head_].fn = nullptr;
  ring_[head_].event = nullptr;
  head_ = (head_ + 1) % ring_.size();
  --queued_;
  return task;
}

absl::Status HostStream::Launch(StreamFn fn) {
  Task task;
  task.kind = Task::Kind::kRun;
  task.fn = std::move(fn);
  return Enqueue(std::move(task));
}

absl::Status HostStream::WaitFor(Event* event) {
  auto* host = dynamic_cast<HostEvent*>(event);
  if (host == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host stream \"", name_, "\" told to wait for event \"",
        event ? event->name() : "null", "\", which is not a host event"));
  }
  Task task;
  task.kind = Task::Kind::kWait;
  task.event = host->state_;
  task.generation = host->recorded();
  if (task.generation == 0) return absl::OkStatus();  // never recorded
  return Enqueue(std::move(task));
}

absl::Status HostStream::Synchronize(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  const int64_t target = enqueued_;
  if (!done_cv_.wait_for(lock, ToChrono(timeout),
                         [&] { return finished_ >= target; })) {
    return absl::DeadlineExceededError(
        absl::StrCat("stream \"", name_, "\": ", target - finished_, " of its ",
                     target, " enqueued operations did not finish within ",
                     absl::FormatDuration(timeout)));
  }
  absl::Status status = Detached(error_);
  if (finished_ == enqueued_) error_ = absl::OkStatus();
  return status;
}

absl::Status HostStream::RunTask(Task& task, const absl::Status& stream_error) {
  switch (task.kind) {
    case Task::Kind::kRun:
      if (!stream_error.ok()) return absl::OkStatus();  // skipped
      try {
        return task.fn();
      } catch (const std::exception& e) {
        return absl::InternalError(absl::StrCat(
            "stream \"", name_, "\": work threw an exception: ", e.what()));
      } catch (...) {
        return absl::InternalError(
            absl::StrCat("stream \"", name_, "\": work threw an exception"));
      }
    case Task::Kind::kRecord:
      task.event->Complete(task.generation, stream_error);
      return absl::OkStatus();
    case Task::Kind::kWait:
      return task.event->AwaitGeneration(task.generation);
  }
  return absl::OkStatus();
}

void HostStream::WorkerLoop() {
  while (true) {
    Task task;
    absl::Status stream_error;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return shutdown_ || queued_ > 0; });
      if (queued_ == 0) return;  // shut down with nothing left to run
      task = PopLocked();
      stream_error = Detached(error_);
    }
    absl::Status s = RunTask(task, stream_error);
    task.fn = nullptr;  // release captures before reporting progress
    task.event = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!s.ok() && error_.ok()) error_ = Detached(s);
      ++finished_;
    }
    done_cv_.notify_all();
  }
}

}  // namespace device
}  // namespace muon
