// One thread that runs callbacks at given times: how the coordinator ends
// waiting Join and KeyGet calls at their deadlines without holding a thread
// per waiting call (gRPC's callback API completes them from whichever thread
// finishes them).
//
// Lifecycle: construct (starts the thread) -> Schedule from any thread ->
// Shutdown or destroy (joins the thread; callbacks not yet due are dropped).
// Thread-safety: every method may be called concurrently. Callbacks run on
// the timer's thread without its lock held, one at a time; they must not
// call Shutdown.
#ifndef MUON_SERVER_DEADLINE_TIMER_H_
#define MUON_SERVER_DEADLINE_TIMER_H_

#include <functional>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace muon {

class DeadlineTimer {
 public:
  DeadlineTimer();
  DeadlineTimer(const DeadlineTimer&) = delete;
  DeadlineTimer& operator=(const DeadlineTimer&) = delete;
  ~DeadlineTimer();

  // Runs `fn` once at (or shortly after) `when`; a time in the past runs it
  // as soon as possible. Dropped silently after Shutdown.
  void Schedule(absl::Time when, std::function<void()> fn);

  // Number of callbacks waiting to run.
  size_t pending() const;

  // Drops every pending callback and joins the thread. Idempotent.
  void Shutdown();

 private:
  void Run();

  mutable absl::Mutex mu_;
  std::multimap<absl::Time, std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace muon

#endif  // MUON_SERVER_DEADLINE_TIMER_H_
