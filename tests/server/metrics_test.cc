// The daemon's Prometheus endpoint (server/metrics.h) fed by a real
// CoordinatorServer, scraped over a plain socket.
#include "server/metrics.h"

#include <unistd.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/wire_names.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator_server.h"
#include "tests/http_get.h"
#include "tests/server/test_specs.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::muon::testing::FourRankSpec;
using ::muon::testing::HttpGet;
using ::muon::testing::Manifests;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(MetricsTest, ServerWithMetrics_ReportStep_ScrapedValues) {
  absl::StatusOr<std::unique_ptr<CoordinatorMetrics>> metrics =
      CoordinatorMetrics::Start(MetricsOptions{});
  ASSERT_THAT(metrics, IsOk());
  ASSERT_GT((*metrics)->port(), 0);
  EXPECT_EQ((*metrics)->url(),
            absl::StrCat("http://127.0.0.1:", (*metrics)->port(), "/metrics"));

  CoordinatorServerOptions options;
  options.service.job_id = "metrics";
  options.service.observer = metrics->get();
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
      CoordinatorServer::Start(options);
  ASSERT_THAT(server, IsOk());
  CoordinatorService* service = (*server)->service();
  (*metrics)->Watch(service);

  const std::string before = HttpGet((*metrics)->port(), "/metrics");
  EXPECT_THAT(before, HasSubstr("200 OK"));
  EXPECT_THAT(before, HasSubstr("muon_job_state{state=\"waiting\"} 1"));
  EXPECT_THAT(before, HasSubstr("muon_plan_version -1"));

  const std::vector<v1::RankManifest> manifests = Manifests(FourRankSpec());
  std::vector<std::thread> threads;
  for (const v1::RankManifest& m : manifests) {
    threads.emplace_back([service, m] {
      v1::JoinRequest request;
      *request.mutable_manifest() = m;
      request.set_incarnation(100 + m.rank());
      request.set_timeout_ms(5000);
      EXPECT_THAT(service->Join(request), IsOk());
    });
  }
  for (std::thread& t : threads) t.join();

  v1::StepReport report;
  report.set_rank(2);
  report.set_incarnation(102);
  report.set_step(1);
  report.set_step_time_s(0.25);
  report.set_ns_flops(3e9);
  report.set_bytes_sent(4096);
  report.set_bytes_received(8192);
  report.set_reports_dropped(5);
  for (v1::OpKind op : SpecifiedValues<v1::OpKind>()) {
    v1::OpTiming* timing = report.add_ops();
    timing->set_op(op);
    timing->set_start_s(1.0);
    timing->set_end_s(1.002);  // 2 ms: in the (1.6 ms, 6.4 ms] bucket
  }
  ASSERT_THAT(service->ReportStep(report), IsOk());
  report.set_step(2);
  report.set_reports_dropped(7);  // the agent's total: +2
  ASSERT_THAT(service->ReportStep(report), IsOk());

  const std::string text = HttpGet((*metrics)->port(), "/metrics");
  EXPECT_THAT(text, HasSubstr("muon_step_time_seconds{rank=\"2\"} 0.25"));
  EXPECT_THAT(text, HasSubstr("muon_step_duration_seconds_count 2"));
  EXPECT_THAT(text, HasSubstr("muon_step_duration_seconds_sum 0.5"));
  for (const char* op : {"gather", "orthogonalize", "redistribute", "apply"}) {
    EXPECT_THAT(
        text, HasSubstr(absl::StrCat("muon_op_duration_seconds_count{op=\"", op,
                                     "\"} 2")));
  }
  EXPECT_THAT(text, HasSubstr("muon_op_duration_seconds_bucket{op=\"gather\","
                              "le=\"0.0016\"} 0"));
  EXPECT_THAT(text, HasSubstr("muon_op_duration_seconds_bucket{op=\"gather\","
                              "le=\"0.0064\"} 2"));
  EXPECT_THAT(text, HasSubstr("muon_newton_schulz_flops_total 6000000000"));
  EXPECT_THAT(text, HasSubstr("muon_bytes_sent_total 8192"));
  EXPECT_THAT(text, HasSubstr("muon_bytes_received_total 16384"));
  EXPECT_THAT(text, HasSubstr("muon_reports_dropped_total 7"));
  EXPECT_THAT(text, HasSubstr("muon_rank_state{state=\"running\"} 1"));
  EXPECT_THAT(text, HasSubstr("muon_rank_state{state=\"ready\"} 3"));
  EXPECT_THAT(text, HasSubstr("muon_rank_state{state=\"lost\"} 0"));
  EXPECT_THAT(text, HasSubstr("muon_job_state{state=\"running\"} 1"));
  EXPECT_THAT(text, HasSubstr("muon_job_state{state=\"waiting\"} 0"));
  EXPECT_THAT(text, HasSubstr("muon_job_generation 1"));
  EXPECT_THAT(text, HasSubstr("muon_plan_version 0"));
  EXPECT_THAT(text, Not(HasSubstr("muon_plan_version -1")));

  (*metrics)->Watch(nullptr);
  (*server)->Stop();
}

// OpKind numbers this build does not define all land in one "unknown"
// series: reports cannot add a series per number.
TEST(MetricsTest, UnknownOpKinds_OneUnknownSeries) {
  absl::StatusOr<std::unique_ptr<CoordinatorMetrics>> metrics =
      CoordinatorMetrics::Start(MetricsOptions{});
  ASSERT_THAT(metrics, IsOk());
  v1::StepReport report;
  report.set_rank(0);
  report.set_step_time_s(0.1);
  for (int number : {17, 18, 1 << 20}) {
    v1::OpTiming* timing = report.add_ops();
    timing->set_op(static_cast<v1::OpKind>(number));
    timing->set_start_s(1.0);
    timing->set_end_s(1.002);
  }
  (*metrics)->OnStepReport(report);
  const std::string text = HttpGet((*metrics)->port(), "/metrics");
  EXPECT_THAT(text,
              HasSubstr("muon_op_duration_seconds_count{op=\"unknown\"} 3"));
  EXPECT_THAT(text, Not(HasSubstr("unknown(")));
}

TEST(MetricsTest, Start_BadPort_ReturnsInvalidArgument) {
  MetricsOptions options;
  options.port = 70000;
  EXPECT_THAT(CoordinatorMetrics::Start(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("70000")));
}

}  // namespace
}  // namespace muon
