#include "server/deadline_timer.h"

#include <utility>

#include "absl/time/clock.h"

namespace muon {

DeadlineTimer::DeadlineTimer() : thread_([this] { Run(); }) {}

DeadlineTimer::~DeadlineTimer() { Shutdown(); }

void DeadlineTimer::Schedule(absl::Time when, std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  if (shutdown_) return;
  queue_.emplace(when, std::move(fn));
}

size_t DeadlineTimer::pending() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

void DeadlineTimer::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
    queue_.clear();
  }
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) {
    thread_.join();
  }
}

void DeadlineTimer::Run() {
  absl::MutexLock lock(&mu_);
  while (!shutdown_) {
    const absl::Time now = absl::Now();
    if (!queue_.empty() && queue_.begin()->first <= now) {
      std::function<void()> fn = std::move(queue_.begin()->second);
      queue_.erase(queue_.begin());
      mu_.Unlock();
      fn();
      mu_.Lock();
      continue;
    }
    // Sleep until the earliest deadline, a new earlier one, or shutdown.
    const absl::Time earliest =
        queue_.empty() ? absl::InfiniteFuture() : queue_.begin()->first;
    const size_t size = queue_.size();
    auto changed = [this, size, earliest]() {
      mu_.AssertReaderHeld();
      return shutdown_ || queue_.size() != size ||
             (!queue_.empty() && queue_.begin()->first < earliest);
    };
    mu_.AwaitWithDeadline(absl::Condition(&changed), earliest);
  }
}

}  // namespace muon
