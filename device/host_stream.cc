#include "device/host_stream.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"

namespace muon {
namespace device {
namespace {

std::chrono::nanoseconds ToChrono(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return std::chrono::hours(24 * 365);
  return absl::ToChronoNanoseconds(d);
}

}  // namespace

absl::Status HostEvent::Record(Stream* stream) {
  auto* host = dynamic_cast<HostStream*>(stream);
  if (host == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("host event \"", name_, "\" recorded on stream \"",
                     stream ? stream->name() : "null", "\" of device ",
                     stream ? stream->device().ToString() : "none"));
  }
  HostStream::Task task;
  task.kind = HostStream::Task::Kind::kRecord;
  task.event = this;
  task.generation = Arm();
  return host->Enqueue(std::move(task));
}

int64_t HostEvent::recorded() const {
  std::lock_guard<std::mutex> lock(mu_);
  return recorded_;
}

int64_t HostEvent::Arm() {
  std::lock_guard<std::mutex> lock(mu_);
  return ++recorded_;
}

void HostEvent::Complete(int64_t generation, const absl::Status& status) {
  // Notify with the lock held: a waiter that sees the completion may
  // destroy the event (and its condition variable) as soon as it can lock.
  std::lock_guard<std::mutex> lock(mu_);
  if (generation > completed_) {
    completed_ = generation;
    status_ = status;
  }
  cv_.notify_all();
}

absl::Status HostEvent::AwaitGeneration(int64_t generation) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return completed_ >= generation; });
  return status_;
}

bool HostEvent::Query() {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_ >= recorded_;
}

absl::Status HostEvent::Synchronize(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  const int64_t target = recorded_;
  if (!cv_.wait_for(lock, ToChrono(timeout),
                    [&] { return completed_ >= target; })) {
    return absl::DeadlineExceededError(
        absl::StrCat("event \"", name_, "\": the work it captured did not ",
                     "finish within ", absl::FormatDuration(timeout)));
  }
  return status_;
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
  task.event = host;
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
  absl::Status status = error_;
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
      stream_error = error_;
    }
    absl::Status s = RunTask(task, stream_error);
    task.fn = nullptr;  // release captures before reporting progress
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!s.ok() && error_.ok()) error_ = std::move(s);
      ++finished_;
    }
    done_cv_.notify_all();
  }
}

}  // namespace device
}  // namespace muon
