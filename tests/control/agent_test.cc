// Tests of control/agent.h: reporting never blocks the step (a coordinator
// that hangs, fails or is gone only makes reports drop, counted), Stop is
// bounded, and a rank whose agent stops heart-beating is marked lost within
// the coordinator's timeout.
#include "control/agent.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/spec.h"
#include "common/wire_names.h"
#include "control/grpc_coordination_client.h"
#include "coordination/coordination_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator_server.h"
#include "server/coordinator_service.h"
#include "server/local_coordination_client.h"
#include "tests/control/agent_test_util.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

int CountSubstr(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

// A transport whose ReportStep blocks until Release() (when made blocking)
// or fails with Unavailable (when made failing); Heartbeat succeeds. Keeps
// the reports it was given.
class FakeClient : public CoordinationClient {
 public:
  enum class Mode { kOk, kBlock, kFail };
  explicit FakeClient(Mode mode) : mode_(mode) {}

  absl::StatusOr<v1::JoinResponse> Join(const v1::JoinRequest&) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(
      const v1::HeartbeatRequest&) override {
    absl::MutexLock lock(&mu_);
    ++heartbeats_;
    return v1::HeartbeatResponse();
  }
  absl::Status ReportStep(const v1::StepReport& report) override {
    {
      absl::MutexLock lock(&mu_);
      received_.push_back(report);
    }
    if (!entered_.HasBeenNotified()) entered_.Notify();
    if (mode_ == Mode::kBlock) released_.WaitForNotification();
    if (mode_ == Mode::kFail) {
      return absl::UnavailableError("fake coordinator is gone");
    }
    return absl::OkStatus();
  }
  absl::Status KeySet(const std::string&, const std::string&) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<std::string> KeyGet(const std::string&,
                                     absl::Duration) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<v1::JobInfo> GetJob() override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<v1::Plan> GetPlan() override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<v1::GetAssignmentsResponse> GetAssignments() override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<v1::ListRanksResponse> ListRanks() override {
    return absl::UnimplementedError("fake");
  }

  // Waits (bounded) for the first ReportStep call.
  bool WaitEntered() {
    return entered_.WaitForNotificationWithTimeout(absl::Seconds(5));
  }
  void Release() { released_.Notify(); }
  std::vector<v1::StepReport> received() {
    absl::MutexLock lock(&mu_);
    return received_;
  }
  int heartbeats() {
    absl::MutexLock lock(&mu_);
    return heartbeats_;
  }

 private:
  const Mode mode_;
  absl::Notification entered_;
  absl::Notification released_;
  absl::Mutex mu_;
  std::vector<v1::StepReport> received_ ABSL_GUARDED_BY(mu_);
  int heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
};

// Calls Report `n` times; returns the time they took.
absl::Duration ReportMany(Agent& agent, int n, int64_t first_step) {
  std::vector<v1::StepReport> reports;
  for (int i = 0; i < n; ++i) reports.push_back(StepReportFor(first_step + i));
  const absl::Time start = absl::Now();
  for (v1::StepReport& r : reports) agent.Report(std::move(r));
  return absl::Now() - start;
}

TEST(AgentTest, Report_ReportStepBlocked_ReturnsAtOnceAndCountsDropped) {
  FakeClient client(FakeClient::Mode::kBlock);
  Agent::Options options;
  options.report_queue_capacity = 8;
  Agent agent(&client, /*rank=*/3, /*incarnation=*/77, options);
  agent.Start();
  agent.Report(StepReportFor(0));
  ASSERT_TRUE(client.WaitEntered());  // step 0 is in flight, blocked

  const absl::Duration took = ReportMany(agent, 1000, 1);
  EXPECT_LT(took, absl::Milliseconds(50));
  // 8 fit in the queue behind the blocked one; the other 992 are dropped.
  EXPECT_EQ(agent.reports_dropped(), 1000 - 8);
  EXPECT_EQ(agent.reports_sent(), 0);

  client.Release();
  ASSERT_TRUE(WaitFor([&] { return agent.reports_sent() == 9; }));
  const absl::Time stop_start = absl::Now();
  agent.Stop(absl::Milliseconds(200));
  EXPECT_LT(absl::Now() - stop_start, absl::Seconds(1));
  std::vector<v1::StepReport> received = client.received();
  ASSERT_EQ(received.size(), 9u);
  EXPECT_EQ(received[0].step(), 0);
  EXPECT_EQ(received[0].reports_dropped(), 0);  // popped before any drop
  EXPECT_EQ(received[0].rank(), 3);
  EXPECT_EQ(received[0].incarnation(), 77u);
  for (size_t i = 1; i < received.size(); ++i) {
    EXPECT_EQ(received[i].step(), static_cast<int64_t>(i));
    EXPECT_EQ(received[i].reports_dropped(), 992);
  }
}

TEST(AgentTest, Report_ReportStepFails_ReturnsAtOnceAndCountsDropped) {
  FakeClient client(FakeClient::Mode::kFail);
  Agent::Options options;
  options.report_queue_capacity = 4;
  Agent agent(&client, 0, 1, options);
  agent.Start();
  const absl::Duration took = ReportMany(agent, 1000, 0);
  EXPECT_LT(took, absl::Milliseconds(50));
  // Every report is dropped: by a full queue or by its failed RPC.
  ASSERT_TRUE(WaitFor([&] { return agent.reports_dropped() == 1000; }));
  EXPECT_EQ(agent.reports_sent(), 0);
  // Each sent report carries the count of the drops before it.
  std::vector<v1::StepReport> received = client.received();
  ASSERT_FALSE(received.empty());
  for (size_t i = 1; i < received.size(); ++i) {
    EXPECT_GT(received[i].reports_dropped(), received[i - 1].reports_dropped());
  }
  agent.Stop(absl::Milliseconds(100));
  EXPECT_EQ(agent.reports_dropped(), 1000);
}

TEST(AgentTest, Stop_ReportsStillQueued_DropsThemWithinTimeout) {
  FakeClient client(FakeClient::Mode::kBlock);
  Agent::Options options;
  options.report_queue_capacity = 16;
  Agent agent(&client, 0, 1, options);
  agent.Start();
  agent.Report(StepReportFor(0));
  ASSERT_TRUE(client.WaitEntered());
  ReportMany(agent, 10, 1);
  // Release the blocked RPC only after Stop has given up on the queue; Stop
  // then returns once that RPC is back.
  std::thread releaser([&] {
    absl::SleepFor(absl::Milliseconds(150));
    client.Release();
  });
  const absl::Time start = absl::Now();
  agent.Stop(absl::Milliseconds(100));
  const absl::Duration took = absl::Now() - start;
  releaser.join();
  EXPECT_GE(took, absl::Milliseconds(100));
  EXPECT_LT(took, absl::Seconds(1));
  EXPECT_EQ(agent.reports_sent(), 1);
  EXPECT_EQ(agent.reports_dropped(), 10);
}

TEST(AgentTest, Start_Heartbeats_SentEveryInterval) {
  FakeClient client(FakeClient::Mode::kOk);
  Agent::Options options;
  options.heartbeat_interval = absl::Milliseconds(10);
  Agent agent(&client, 0, 1, options);
  agent.Start();
  EXPECT_TRUE(WaitFor([&] { return client.heartbeats() >= 5; }));
  const absl::Time start = absl::Now();
  agent.Stop();
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
  const int after_stop = client.heartbeats();
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(client.heartbeats(), after_stop);
}

// `world_size` ranks' agents (incarnations `incarnation` + rank) joined to
// one in-process CoordinatorService with `heartbeat_timeout`.
struct LocalJob {
  LocalJob(absl::Duration heartbeat_timeout, const Agent::Options& options,
           uint64_t incarnation, int world_size = 2)
      : service([&] {
          CoordinatorService::Options o;
          o.job_id = "agent";
          o.heartbeat_timeout = heartbeat_timeout;
          return o;
        }()) {
    for (int r = 0; r < world_size; ++r) {
      clients.push_back(std::make_unique<LocalCoordinationClient>(&service));
      agents.push_back(std::make_unique<Agent>(clients.back().get(), r,
                                               incarnation + r, options));
    }
    JoinAll(agents, RankManifests(world_size));
  }

  CoordinatorService service;
  std::vector<std::unique_ptr<LocalCoordinationClient>> clients;
  std::vector<std::unique_ptr<Agent>> agents;
};

// The acceptance test: a step never waits on the report queue, even
// with the coordinator stopped; Stop stays bounded.
TEST(AgentTest, Report_CoordinatorStopped_NeverBlocksAndStopBounded) {
  CoordinatorServerOptions server_options;
  server_options.service.job_id = "agent";
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
      CoordinatorServer::Start(server_options);
  ASSERT_THAT(server, IsOk());
  const std::string address = (*server)->address();

  std::vector<std::unique_ptr<GrpcCoordinationClient>> clients;
  std::vector<std::unique_ptr<Agent>> agents;
  Agent::Options options;
  options.heartbeat_interval = absl::Milliseconds(20);
  options.report_queue_capacity = 8;
  for (int r = 0; r < 2; ++r) {
    absl::StatusOr<std::unique_ptr<GrpcCoordinationClient>> c =
        GrpcCoordinationClient::Create(address, "agent", absl::Seconds(1));
    ASSERT_THAT(c, IsOk());
    clients.push_back(*std::move(c));
    agents.push_back(
        std::make_unique<Agent>(clients.back().get(), r, 500 + r, options));
  }
  JoinAll(agents, RankManifests(2));
  for (auto& a : agents) a->Start();
  Agent& agent = *agents[0];

  // While the coordinator is up, reports arrive.
  agent.Report(StepReportFor(0));
  ASSERT_TRUE(WaitFor([&] { return agent.reports_sent() == 1; }));
  LocalCoordinationClient local((*server)->service(), "agent");
  absl::StatusOr<v1::GetReportsResponse> kept = local.GetReports(0, 0);
  ASSERT_THAT(kept, IsOk());
  ASSERT_EQ(kept->reports_size(), 1);
  EXPECT_EQ(kept->reports(0).ops_size(), 4);

  (*server)->Stop();
  server->reset();

  // Steps keep going: 1000 reports in well under a step's time, one at a
  // time no slower than the first batch.
  absl::Duration worst;
  for (int i = 0; i < 1000; ++i) {
    v1::StepReport r = StepReportFor(1 + i);
    const absl::Time start = absl::Now();
    agent.Report(std::move(r));
    worst = std::max(worst, absl::Now() - start);
  }
  EXPECT_LT(worst, absl::Milliseconds(5));
  EXPECT_LT(ReportMany(agent, 1000, 2000), absl::Milliseconds(50));
  // Nothing more got through; everything new is dropped.
  EXPECT_TRUE(WaitFor([&] { return agent.reports_dropped() == 2000; }))
      << agent.reports_dropped();
  EXPECT_EQ(agent.reports_sent(), 1);

  // Stop: the drain timeout plus at most one RPC deadline (1 s here; an
  // unreachable coordinator fails at once).
  for (auto& a : agents) {
    const absl::Time start = absl::Now();
    a->Stop(absl::Milliseconds(200));
    EXPECT_LT(absl::Now() - start, absl::Milliseconds(200) + absl::Seconds(1));
  }
}

// The acceptance test: a rank whose heartbeats stop is marked lost
// within the timeout (200 ms here; agents beat every 20 ms).
TEST(AgentTest, Heartbeats_AgentStopped_RankLostWithinTimeout) {
  Agent::Options options;
  options.heartbeat_interval = absl::Milliseconds(20);
  options.leave_on_stop = false;  // Stop stands for a crash here
  LocalJob job(absl::Milliseconds(200), options, 900);
  CoordinatorService& service = job.service;
  std::vector<std::unique_ptr<Agent>>& agents = job.agents;
  for (auto& a : agents) a->Start();

  auto states = [&] {
    std::vector<std::string> out;
    absl::StatusOr<v1::ListRanksResponse> ranks =
        service.ListRanks(v1::ListRanksRequest());
    EXPECT_THAT(ranks, IsOk());
    if (ranks.ok()) {
      for (const v1::RankStatus& s : ranks->ranks())
        out.push_back(WireName(s.state()));
    }
    return out;
  };
  // Two timeouts of heart-beating: nobody lost.
  absl::SleepFor(absl::Milliseconds(400));
  EXPECT_THAT(states(), ::testing::ElementsAre("ready", "ready"));

  agents[1]->Stop(absl::ZeroDuration());  // its last beat was <= 20 ms ago
  const absl::Time stopped = absl::Now();
  std::vector<std::string> now_states;
  ASSERT_TRUE(WaitFor(
      [&] {
        now_states = states();
        return now_states.size() == 2 && now_states[1] == "lost";
      },
      absl::Seconds(3)));
  const absl::Duration to_lost = absl::Now() - stopped;
  EXPECT_THAT(now_states, ::testing::ElementsAre("ready", "lost"));
  EXPECT_GE(to_lost, absl::Milliseconds(200) - absl::Milliseconds(40));
  EXPECT_LT(to_lost, absl::Milliseconds(200 + 300)) << "lost detected late";
  agents[0]->Stop();
}

// A rank's own failure (not a communication error) is reported; the coordinator
// makes it the job error and the other rank's agent gets it with its next
// heartbeat and runs its abort callback.
TEST(AgentTest, OnStepFailed_OwnError_ReportedOtherRankAbortsNamingIt) {
  LocalJob job(absl::Milliseconds(300), Agent::Options(), 700);
  std::vector<std::unique_ptr<Agent>>& agents = job.agents;
  EXPECT_EQ(agents[0]->heartbeat_timeout(), absl::Milliseconds(300));
  EXPECT_EQ(agents[0]->heartbeat_interval(), absl::Milliseconds(60));
  std::atomic<int> aborts{0};
  agents[1]->SetAbortCallback([&] { ++aborts; });
  for (auto& a : agents) a->Start();

  const absl::Status own =
      absl::InvalidArgumentError("rank 0: parameter \"w\" has a NaN gradient");
  EXPECT_EQ(agents[0]->OnStepFailed(own), own);
  ASSERT_TRUE(
      WaitFor([&] { return !agents[1]->job_error().ok(); }, absl::Seconds(1)));
  EXPECT_THAT(
      agents[1]->job_error(),
      StatusIs(absl::StatusCode::kAborted,
               AllOf(HasSubstr("rank 0 failed"), HasSubstr("NaN gradient"))));
  EXPECT_EQ(agents[1]->failed_rank(), 0);
  EXPECT_TRUE(WaitFor([&] { return aborts.load() == 1; }));
  // A communication error on rank 1 now names rank 0 at once.
  EXPECT_THAT(agents[1]->OnStepFailed(absl::UnavailableError("peer reset")),
              StatusIs(absl::StatusCode::kAborted,
                       AllOf(HasSubstr("rank 1: step failed: rank 0 failed"),
                             HasSubstr("this rank saw: peer reset"))));
  EXPECT_EQ(aborts.load(), 1);  // once
}

// A job error seen before the abort callback is set (the optimizer sets
// it after the agent started, once its communicators exist): the callback
// set afterwards runs at once, so the first collective fails instead of
// waiting out its timeout.
TEST(AgentTest, SetAbortCallback_AfterJobError_RunsAtOnce) {
  LocalJob job(absl::Milliseconds(300), Agent::Options(), 750);
  std::vector<std::unique_ptr<Agent>>& agents = job.agents;
  for (auto& a : agents) a->Start();
  EXPECT_EQ(agents[0]->OnOwnFailure(absl::InternalError("rank 0: broken")),
            absl::InternalError("rank 0: broken"));
  ASSERT_TRUE(
      WaitFor([&] { return !agents[1]->job_error().ok(); }, absl::Seconds(1)));
  std::atomic<int> aborts{0};
  agents[1]->SetAbortCallback([&] { ++aborts; });
  // At once, or by the heartbeat thread that published the job error just
  // now (it runs the abort after releasing its lock): once either way.
  EXPECT_TRUE(WaitFor([&] { return aborts.load() == 1; }, absl::Seconds(1)));
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(aborts.load(), 1);
}

// OnOwnFailure: a failure of this rank's own with a transport code (a
// Replan RPC that failed here) is reported at once and returned unchanged,
// where OnStepFailed would wait for the coordinator to name a peer.
TEST(AgentTest, OnOwnFailure_TransportCode_ReportedAndReturnedUnchanged) {
  LocalJob job(absl::Milliseconds(300), Agent::Options(), 700);
  std::vector<std::unique_ptr<Agent>>& agents = job.agents;
  std::atomic<int> aborts{0};
  agents[0]->SetAbortCallback([&] { ++aborts; });
  for (auto& a : agents) a->Start();
  const absl::Status own = absl::UnavailableError(
      "rank 0: re-planning after step 4 failed: connection refused");
  EXPECT_EQ(agents[0]->OnOwnFailure(own), own);
  EXPECT_EQ(aborts.load(), 1);
  ASSERT_TRUE(
      WaitFor([&] { return !agents[1]->job_error().ok(); }, absl::Seconds(1)));
  EXPECT_THAT(agents[1]->job_error(),
              StatusIs(absl::StatusCode::kAborted,
                       AllOf(HasSubstr("rank 0 failed"),
                             HasSubstr("re-planning after step 4"))));
  EXPECT_EQ(agents[0]->OnOwnFailure(absl::OkStatus()), absl::OkStatus());
}

// ConfirmPlanHash reads two hashes per rank (rank 0's and the next rank's), not
// every rank's; a rank whose plan differs is named, and the coordinator makes
// it the job error so that the ranks whose own neighbours agree learn it too.
TEST(AgentTest, ConfirmPlanHash_OneRankDiffers_NamedAndJobFailsForAll) {
  // Three ranks, rank 2 differs: rank 0 reads rank 1 (agrees) and returns
  // OK; rank 1 reads rank 0 and rank 2; rank 2 reads rank 0.
  LocalJob job(absl::Milliseconds(300), Agent::Options(), 800,
               /*world_size=*/3);
  CoordinatorService& service = job.service;
  std::vector<std::unique_ptr<Agent>>& agents = job.agents;
  std::vector<absl::Status> results(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      results[r] = agents[r]->ConfirmPlanHash(r == 2 ? "bbbb" : "aaaa", 3,
                                              absl::Seconds(5));
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_THAT(results[0], IsOk());
  EXPECT_THAT(results[1], StatusIs(absl::StatusCode::kFailedPrecondition,
                                   HasSubstr("rank 2 holds plan bbbb")));
  EXPECT_THAT(results[2], StatusIs(absl::StatusCode::kFailedPrecondition,
                                   HasSubstr("rank 0 holds plan aaaa")));
  absl::StatusOr<v1::JobInfo> info = service.GetJob(v1::GetJobRequest());
  ASSERT_THAT(info, IsOk());
  EXPECT_EQ(info->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(info->error(), HasSubstr("every rank must run the same plan"));
  // Rank 0, whose neighbours agreed, learns the job error by heartbeat.
  agents[0]->Start();
  ASSERT_TRUE(
      WaitFor([&] { return !agents[0]->job_error().ok(); }, absl::Seconds(2)));
  EXPECT_THAT(agents[0]->job_error(),
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr("every rank must run the same plan")));
}

// A communication error while a peer died: the coordinator names the peer
// (lost after the heartbeat timeout), within 2x the timeout.
TEST(AgentTest, OnStepFailed_CommErrorPeerCrashed_NamesPeerWithinTwiceTimeout) {
  Agent::Options options;
  options.leave_on_stop = false;  // Stop stands for a crash
  LocalJob job(absl::Milliseconds(300), options, 800);
  std::vector<std::unique_ptr<Agent>>& agents = job.agents;
  for (auto& a : agents) a->Start();
  agents[1]->Stop(absl::ZeroDuration());
  const absl::Time crashed = absl::Now();
  absl::Status s =
      agents[0]->OnStepFailed(absl::UnavailableError("connection reset"));
  EXPECT_LT(absl::Now() - crashed, absl::Milliseconds(600));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kAborted,
                          AllOf(HasSubstr("rank 0: step failed: rank 1 lost"),
                                HasSubstr("no heartbeat"))));
}

// A dead coordinator is noticed within the heartbeat timeout and said once;
// reports are dropped and counted, and the step path never waits.
TEST(AgentTest, Heartbeats_CoordinatorDies_NoticedOnceWithinTimeout) {
  CoordinatorServerOptions server_options;
  server_options.service.job_id = "agent";
  server_options.service.heartbeat_timeout = absl::Milliseconds(300);
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
      CoordinatorServer::Start(server_options);
  ASSERT_THAT(server, IsOk());
  const std::string address = (*server)->address();
  std::vector<std::unique_ptr<GrpcCoordinationClient>> clients;
  std::vector<std::unique_ptr<Agent>> agents;
  for (int r = 0; r < 2; ++r) {
    absl::StatusOr<std::unique_ptr<GrpcCoordinationClient>> c =
        GrpcCoordinationClient::Create(address, "agent",
                                       absl::Milliseconds(200));
    ASSERT_THAT(c, IsOk());
    clients.push_back(*std::move(c));
    agents.push_back(std::make_unique<Agent>(clients.back().get(), r, 600 + r,
                                             Agent::Options()));
  }
  JoinAll(agents, RankManifests(2));
  for (auto& a : agents) a->Start();
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_FALSE(agents[0]->coordinator_unreachable());

  ::testing::internal::CaptureStderr();
  (*server)->Stop();
  server->reset();
  const absl::Time died = absl::Now();
  ASSERT_TRUE(WaitFor([&] { return agents[0]->coordinator_unreachable(); },
                      absl::Seconds(3)));
  // The timeout, plus a heartbeat in flight when it died (bounded by the
  // client's 200 ms RPC deadline), plus an interval, plus slack.
  EXPECT_LT(absl::Now() - died,
            absl::Milliseconds(300) + absl::Milliseconds(200) +
                absl::Milliseconds(60) + absl::Milliseconds(300));
  absl::SleepFor(absl::Milliseconds(400));  // more failed heartbeats
  agents[0]->Report(StepReportFor(1));
  for (auto& a : agents) a->Stop(absl::Milliseconds(100));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(CountSubstr(err, "rank 0: the coordinator has been unreachable"), 1)
      << err;
  EXPECT_EQ(agents[0]->reports_dropped(), 1);
  EXPECT_TRUE(agents[0]->job_error().ok());  // no job error: training goes on
}

// Forwards to a service that a test can swap (a restarted coordinator).
class SwitchableClient final : public CoordinationClient {
 public:
  explicit SwitchableClient(CoordinatorService* service)
      : local_(std::make_unique<LocalCoordinationClient>(service)) {}
  void Switch(CoordinatorService* service) {
    absl::MutexLock lock(&mu_);
    local_ = std::make_unique<LocalCoordinationClient>(service);
  }
  absl::StatusOr<v1::JoinResponse> Join(
      const v1::JoinRequest& request) override {
    absl::MutexLock lock(&mu_);
    return local_->Join(request);
  }
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(
      const v1::HeartbeatRequest& request) override {
    absl::MutexLock lock(&mu_);
    return local_->Heartbeat(request);
  }
  absl::Status ReportStep(const v1::StepReport& report) override {
    absl::MutexLock lock(&mu_);
    return local_->ReportStep(report);
  }
  absl::Status KeySet(const std::string& key,
                      const std::string& value) override {
    absl::MutexLock lock(&mu_);
    return local_->KeySet(key, value);
  }
  absl::StatusOr<std::string> KeyGet(const std::string& key,
                                     absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    return local_->KeyGet(key, timeout);
  }
  absl::StatusOr<v1::JobInfo> GetJob() override {
    absl::MutexLock lock(&mu_);
    return local_->GetJob();
  }
  absl::StatusOr<v1::Plan> GetPlan() override {
    absl::MutexLock lock(&mu_);
    return local_->GetPlan();
  }
  absl::StatusOr<v1::GetAssignmentsResponse> GetAssignments() override {
    absl::MutexLock lock(&mu_);
    return local_->GetAssignments();
  }
  absl::StatusOr<v1::ListRanksResponse> ListRanks() override {
    absl::MutexLock lock(&mu_);
    return local_->ListRanks();
  }

 private:
  absl::Mutex mu_;
  std::unique_ptr<LocalCoordinationClient> local_;
};

// A restarted coordinator (it no longer knows the rank) is detected at the next
// heartbeat and said once; training goes on.
TEST(AgentTest, Heartbeats_CoordinatorRestarted_DetectedOnceAtNextBeat) {
  CoordinatorService::Options service_options;
  service_options.job_id = "agent";
  service_options.heartbeat_timeout = absl::Seconds(5);
  CoordinatorService first(service_options);
  CoordinatorService restarted(service_options);
  std::vector<std::unique_ptr<SwitchableClient>> clients;
  std::vector<std::unique_ptr<Agent>> agents;
  Agent::Options options;
  options.heartbeat_interval = absl::Milliseconds(20);
  for (int r = 0; r < 2; ++r) {
    clients.push_back(std::make_unique<SwitchableClient>(&first));
    agents.push_back(
        std::make_unique<Agent>(clients.back().get(), r, 300 + r, options));
  }
  JoinAll(agents, RankManifests(2));
  for (auto& a : agents) a->Start();
  absl::SleepFor(absl::Milliseconds(60));
  EXPECT_FALSE(agents[0]->coordinator_unreachable());
  ::testing::internal::CaptureStderr();
  for (auto& c : clients) c->Switch(&restarted);
  ASSERT_TRUE(WaitFor([&] { return agents[0]->coordinator_unreachable(); },
                      absl::Seconds(1)));  // not the 5 s timeout
  absl::SleepFor(absl::Milliseconds(100));
  for (auto& a : agents) a->Stop(absl::Milliseconds(100));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(CountSubstr(err, "rank 0: the coordinator no longer knows"), 1)
      << err;
  EXPECT_THAT(err, HasSubstr("it was restarted"));
  EXPECT_TRUE(agents[0]->job_error().ok());
}

}  // namespace
}  // namespace muon
