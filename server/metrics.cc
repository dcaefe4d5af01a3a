#include "server/metrics.h"

#include <algorithm>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/host_port.h"
#include "common/wire_names.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace muon {
namespace {

// 100 us to ~105 s, x4 per bucket: step and operation times in seconds.
prometheus::Histogram::BucketBoundaries SecondsBuckets() {
  prometheus::Histogram::BucketBoundaries b;
  for (double s = 1e-4; s < 200; s *= 4) b.push_back(s);
  return b;
}

// Registers counter family `name` with `help` and returns its one series
// (no labels).
prometheus::Counter* AddCounter(prometheus::Registry& registry,
                                const std::string& name,
                                const std::string& help) {
  prometheus::Family<prometheus::Counter>& family =
      prometheus::BuildCounter().Name(name).Help(help).Register(registry);
  return &family.Add({});
}

// Registers gauge family `name` with `help` and returns its one series
// (no labels).
prometheus::Gauge* AddGauge(prometheus::Registry& registry,
                            const std::string& name, const std::string& help) {
  prometheus::Family<prometheus::Gauge>& family =
      prometheus::BuildGauge().Name(name).Help(help).Register(registry);
  return &family.Add({});
}

}  // namespace

// The collectable the Exposer scrapes: refreshes the rank states, then
// returns the registry's families.
class CoordinatorMetrics::Scraper : public prometheus::Collectable {
 public:
  explicit Scraper(CoordinatorMetrics* metrics) : metrics_(metrics) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    metrics_->RefreshRankStates();
    return metrics_->registry_->Collect();
  }

 private:
  CoordinatorMetrics* const metrics_;
};

CoordinatorMetrics::CoordinatorMetrics(std::string host)
    : host_(std::move(host)),
      registry_(std::make_shared<prometheus::Registry>()) {
  step_time_ = &prometheus::BuildGauge()
                    .Name("muon_step_time_seconds")
                    .Help("Last step time of each rank, seconds.")
                    .Register(*registry_);
  step_duration_ = &prometheus::BuildHistogram()
                        .Name("muon_step_duration_seconds")
                        .Help("Step times of every rank, seconds.")
                        .Register(*registry_)
                        .Add({}, SecondsBuckets());
  op_duration_ = &prometheus::BuildHistogram()
                      .Name("muon_op_duration_seconds")
                      .Help(
                          "Duration of each optimizer operation (gather, "
                          "orthogonalize, redistribute, apply), seconds.")
                      .Register(*registry_);
  for (v1::OpKind op : SpecifiedValues<v1::OpKind>()) {
    op_series_[op] =
        &op_duration_->Add({{"op", WireName(op)}}, SecondsBuckets());
  }
  unknown_op_series_ =
      &op_duration_->Add({{"op", "unknown"}}, SecondsBuckets());
  ns_flops_ = AddCounter(*registry_, "muon_newton_schulz_flops_total",
                         "Newton-Schulz FLOPs reported by every rank.");
  bytes_sent_ = AddCounter(*registry_, "muon_bytes_sent_total",
                           "Bytes sent by every rank's optimizer steps.");
  bytes_received_ =
      AddCounter(*registry_, "muon_bytes_received_total",
                 "Bytes received by every rank's optimizer steps.");
  reports_dropped_ = AddCounter(*registry_, "muon_reports_dropped_total",
                                "Step reports the ranks' agents dropped.");
  rank_state_ = &prometheus::BuildGauge()
                     .Name("muon_rank_state")
                     .Help("Ranks in each state.")
                     .Register(*registry_);
  for (v1::RankState s : SpecifiedValues<v1::RankState>()) {
    rank_state_->Add({{"state", WireName(s)}});
  }
  job_state_ = &prometheus::BuildGauge()
                    .Name("muon_job_state")
                    .Help("1 for the job's current state, else 0.")
                    .Register(*registry_);
  for (v1::JobState s : SpecifiedValues<v1::JobState>()) {
    job_state_->Add({{"state", WireName(s)}}).Set(s == v1::JOB_STATE_WAITING);
  }
  generation_ = AddGauge(*registry_, "muon_job_generation",
                         "The job generation (1 for the first job).");
  generation_->Set(1);
  plan_version_ = AddGauge(*registry_, "muon_plan_version",
                           "Version of the plan in effect (0 at Join, n "
                           "after the n-th re-plan; -1 before a plan).");
  plan_version_->Set(-1);
}

absl::StatusOr<std::unique_ptr<CoordinatorMetrics>> CoordinatorMetrics::Start(
    const MetricsOptions& options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics port ", options.port, " is outside [0, 65535]"));
  }
  if (options.host.empty()) {
    return absl::InvalidArgumentError("metrics host is empty");
  }
  std::unique_ptr<CoordinatorMetrics> metrics(
      new CoordinatorMetrics(options.host));
  const std::string address = HostPort(options.host, options.port);
  try {
    metrics->exposer_ = std::make_unique<prometheus::Exposer>(address);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", e.what()));
  }
  const std::vector<int> ports = metrics->exposer_->GetListeningPorts();
  if (ports.empty() || ports[0] <= 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": no port bound"));
  }
  metrics->port_ = ports[0];
  metrics->scraper_ = std::make_shared<Scraper>(metrics.get());
  metrics->exposer_->RegisterCollectable(metrics->scraper_);
  return metrics;
}

CoordinatorMetrics::~CoordinatorMetrics() {
  exposer_.reset();  // no scrape runs after this
}

std::string CoordinatorMetrics::url() const {
  return absl::StrCat("http://", HostPort(host_, port_), "/metrics");
}

void CoordinatorMetrics::Watch(CoordinatorService* service) {
  absl::MutexLock lock(&watch_mu_);
  service_ = service;
}

void CoordinatorMetrics::RefreshRankStates() {
  absl::MutexLock lock(&watch_mu_);
  if (service_ == nullptr) return;
  const std::map<v1::RankState, int> counts = service_->RankStateCounts();
  for (v1::RankState s : SpecifiedValues<v1::RankState>()) {
    auto it = counts.find(s);
    rank_state_->Add({{"state", WireName(s)}})
        .Set(it == counts.end() ? 0 : it->second);
  }
}

void CoordinatorMetrics::OnStepReport(const v1::StepReport& report) {
  prometheus::Gauge* step_time = nullptr;
  {
    absl::MutexLock lock(&mu_);
    prometheus::Gauge*& series = step_time_series_[report.rank()];
    if (series == nullptr) {
      series = &step_time_->Add({{"rank", std::to_string(report.rank())}});
    }
    step_time = series;
  }
  step_time->Set(report.step_time_s());
  step_duration_->Observe(report.step_time_s());
  for (const v1::OpTiming& op : report.ops()) {
    if (op.op() == v1::OP_KIND_UNSPECIFIED) continue;
    // A number this build does not know (a newer agent's, or garbage) goes
    // to the one "unknown" series: a series per number would let reports
    // grow the registry without bound.
    auto known = op_series_.find(op.op());
    prometheus::Histogram& histogram =
        known != op_series_.end() ? *known->second : *unknown_op_series_;
    histogram.Observe(std::max(0.0, op.end_s() - op.start_s()));
  }
  if (report.ns_flops() > 0) ns_flops_->Increment(report.ns_flops());
  if (report.bytes_sent() > 0) {
    bytes_sent_->Increment(static_cast<double>(report.bytes_sent()));
  }
  if (report.bytes_received() > 0) {
    bytes_received_->Increment(static_cast<double>(report.bytes_received()));
  }
  int64_t dropped_increase = 0;
  {
    absl::MutexLock lock(&mu_);
    int64_t& last = dropped_[report.rank()];
    if (report.reports_dropped() > last) {
      dropped_increase = report.reports_dropped() - last;
      last = report.reports_dropped();
    }
  }
  if (dropped_increase > 0) {
    reports_dropped_->Increment(static_cast<double>(dropped_increase));
  }
}

void CoordinatorMetrics::OnJobState(v1::JobState state, int64_t generation) {
  for (v1::JobState s : SpecifiedValues<v1::JobState>()) {
    job_state_->Add({{"state", WireName(s)}}).Set(state == s ? 1 : 0);
  }
  generation_->Set(static_cast<double>(generation));
  if (state == v1::JOB_STATE_WAITING) {
    plan_version_->Set(-1);
    absl::MutexLock lock(&mu_);
    dropped_.clear();  // a new generation's agents count from 0
  }
}

void CoordinatorMetrics::OnPlan(int64_t version, absl::string_view hash) {
  plan_version_->Set(static_cast<double>(version));
}

}  // namespace muon
