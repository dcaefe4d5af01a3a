// The muon-coordinator daemon's Prometheus endpoint: a CoordinatorObserver
// that turns step reports, job states and plans into Prometheus metrics,
// served in the text exposition format (0.0.4) at http://HOST:PORT/metrics
// by prometheus-cpp's Exposer (civetweb).
//
// Metrics (units in the names: seconds, bytes, FLOPs):
//   muon_step_time_seconds{rank}                gauge, last step time
//   muon_step_duration_seconds                  histogram, every step time
//   muon_op_duration_seconds{op}                histogram per operation
//     (op = the OpKind's wire name, "gather", ..., common/wire_names.h,
//     or "unknown" for every number this build does not define;
//     OpTiming end_s - start_s of every op of every report)
//   muon_newton_schulz_flops_total              counter (StepReport.ns_flops)
//   muon_bytes_sent_total, muon_bytes_received_total  counters
//   muon_reports_dropped_total                  counter: increases of the
//     agents' StepReport.reports_dropped totals
//   muon_rank_state{state}                      gauge: ranks in each state
//     ("joining", "ready", "running", "lost", "failed", "finished"), read
//     from the watched service's ListRanks at each scrape
//   muon_job_state{state}                       gauge: 1 for the job's state
//     ("waiting", "planned", "running", "finished", "failed"), else 0
//   muon_job_generation                         gauge
//   muon_plan_version                           gauge: Plan.version (0 for
//     the Join plan, n after the n-th re-plan); -1 before the first plan
//
// Only the daemon links this (and Prometheus); the embedded coordinator's
// users do not.
//
// Lifecycle: Start (binds, serves) -> pass as
// CoordinatorService::Options::observer -> Watch(service) once the service
// exists -> Watch(nullptr) before the service is destroyed -> destroy (stops
// serving).
// Thread-safety: every method may be called from any thread.
#ifndef MUON_SERVER_METRICS_H_
#define MUON_SERVER_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "muon/v1/coordinator.pb.h"
#include "server/coordinator_observer.h"
#include "server/coordinator_service.h"

namespace prometheus {
class Counter;
class Exposer;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace muon {

struct MetricsOptions {
  // Address the HTTP endpoint listens on (loopback by default).
  std::string host = "127.0.0.1";
  // Port; 0 picks a free one (read it back with port()).
  int port = 0;
};

class CoordinatorMetrics : public CoordinatorObserver {
 public:
  // Creates the metrics and serves them at http://host:port/metrics.
  // Errors:
  //   InvalidArgument: port outside [0, 65535] or an empty host.
  //   Unavailable: the address cannot be bound (names it and the reason).
  static absl::StatusOr<std::unique_ptr<CoordinatorMetrics>> Start(
      const MetricsOptions& options);

  CoordinatorMetrics(const CoordinatorMetrics&) = delete;
  CoordinatorMetrics& operator=(const CoordinatorMetrics&) = delete;
  ~CoordinatorMetrics() override;

  // The bound port (the chosen one when options.port was 0).
  int port() const { return port_; }
  // "http://host:port/metrics".
  std::string url() const;

  // Reads rank states from `service` (ListRanks) at each scrape; null stops
  // (rank state gauges then keep their last values). Not owned: call
  // Watch(nullptr) before destroying it.
  void Watch(CoordinatorService* service);

  // CoordinatorObserver.
  void OnStepReport(const v1::StepReport& report) override;
  void OnJobState(v1::JobState state, int64_t generation) override;
  void OnPlan(int64_t version, absl::string_view hash) override;

 private:
  class Scraper;
  CoordinatorMetrics(std::string host);
  // Sets muon_rank_state from the watched service (scrape thread).
  void RefreshRankStates();

  const std::string host_;
  int port_ = 0;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Gauge>* step_time_ = nullptr;
  prometheus::Histogram* step_duration_ = nullptr;
  prometheus::Family<prometheus::Histogram>* op_duration_ = nullptr;
  // op_duration_'s series of the known operations, registered up front so
  // that a report does not look them up (a label map per op).
  std::map<v1::OpKind, prometheus::Histogram*> op_series_;
  // op_duration_'s series {op="unknown"}: every OpKind number not in
  // op_series_.
  prometheus::Histogram* unknown_op_series_ = nullptr;
  prometheus::Counter* ns_flops_ = nullptr;
  prometheus::Counter* bytes_sent_ = nullptr;
  prometheus::Counter* bytes_received_ = nullptr;
  prometheus::Counter* reports_dropped_ = nullptr;
  prometheus::Family<prometheus::Gauge>* rank_state_ = nullptr;
  prometheus::Family<prometheus::Gauge>* job_state_ = nullptr;
  prometheus::Gauge* generation_ = nullptr;
  prometheus::Gauge* plan_version_ = nullptr;

  absl::Mutex mu_;  // never held while calling the service
  // Each rank's last StepReport.reports_dropped.
  std::map<int, int64_t> dropped_ ABSL_GUARDED_BY(mu_);
  // Each rank's series of step_time_, looked up once per rank.
  std::map<int, prometheus::Gauge*> step_time_series_ ABSL_GUARDED_BY(mu_);

  absl::Mutex watch_mu_;  // held while the scrape reads the service
  CoordinatorService* service_ ABSL_GUARDED_BY(watch_mu_) = nullptr;

  std::shared_ptr<Scraper> scraper_;
  std::unique_ptr<prometheus::Exposer> exposer_;  // last: stopped first
};

}  // namespace muon

#endif  // MUON_SERVER_METRICS_H_
