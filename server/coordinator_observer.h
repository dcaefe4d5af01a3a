// Hooks through which CoordinatorService reports what happens to a job:
// structured log lines (CoordinatorLog) and events for metrics
// (CoordinatorObserver). server/ itself depends on neither glog nor
// Prometheus: the muon-coordinator daemon logs through glog and exports
// Prometheus metrics (server/metrics.h); tests capture both; rank 0's
// embedded coordinator sets neither.
#ifndef MUON_SERVER_COORDINATOR_OBSERVER_H_
#define MUON_SERVER_COORDINATOR_OBSERVER_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/strings/string_view.h"
#include "muon/v1/coordinator.pb.h"

namespace muon {

// Receives one structured log line, key=value pairs separated by spaces and
// starting with "event=NAME" (e.g. "event=join rank=3 world_size=8
// manifest=compact joined=4"); values holding spaces or quotes are quoted
// and C-escaped. Called from RPC threads, possibly under the service's
// lock: keep it short and never call back into the service.
using CoordinatorLog = std::function<void(absl::string_view line)>;

// Metric events of a CoordinatorService. Every method has an empty default
// body. Called from RPC threads, possibly concurrently; OnJobState and
// OnPlan (rare) with the service's lock held, OnStepReport without it.
// Implementations synchronize themselves, never block and never call back
// into the service.
class CoordinatorObserver {
 public:
  virtual ~CoordinatorObserver() = default;

  // A step report the service accepted (ReportStep returned OK): step time
  // in seconds, per-operation timings in seconds (OpTiming start_s/end_s),
  // Newton-Schulz FLOPs, bytes sent and received, reports_dropped (the
  // agent's running total).
  virtual void OnStepReport(const v1::StepReport& report) {}

  // The job's state became `state`; `generation` is the job generation (1
  // first).
  virtual void OnJobState(v1::JobState state, int64_t generation) {}

  // A plan took effect: the first plan of a generation, or a re-plan that
  // changed owners. `version` is Plan.version, `hash` Plan.hash.
  virtual void OnPlan(int64_t version, absl::string_view hash) {}
};

// Formats one value of a log line: as is when it has no space, quote,
// backslash or '=' (and is not empty), else "C-escaped" in double quotes.
std::string LogValue(absl::string_view value);

}  // namespace muon

#endif  // MUON_SERVER_COORDINATOR_OBSERVER_H_
